"""How an op becomes an audit record: the op's transaction participant.

:class:`AuditParticipant` joins every op's transaction.  It sorts before the
image's participant, so its phases run first:

``tpc_begin``
    records in the op's facts where the chain stands (``binding()``), so the
    snapshot's manifest binds every record before it;
``tpc_vote``
    appends the op's record, status ``committed`` with the new commit's id,
    and syncs it; the image's ``tpc_finish`` then moves the branch, which is
    the commit point, so an acknowledged op always has its record;
``tpc_abort``
    if the record was already written, appends a ``void`` record for it (or,
    on a disk too full for one, takes the record back: ``AuditLog.retract``);
``abort``
    appends the record of an op that did not commit (rolled back, failed,
    interrupted, denied, vetoed), unless ``tpc_abort`` already closed it.

Once the op committed, :meth:`AuditParticipant.published` publishes its
record's events and tells the op's report where its record is.  What the
record says of an op is what :class:`AuditedOp` reads: the op
(``kernos.op.Op``) sits above the audit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

from kernos._time import utc_now
from kernos.audit.canonical import canonical
from kernos.audit.log import INLINE_CODE_BYTES, INLINE_PAYLOAD_BYTES, AuditLog
from kernos.audit.markers import subjects_of
from kernos.personal import created_subjects
from kernos.transaction import Transaction

__all__ = ["AuditParticipant", "AuditedOp", "code_field", "event_fields"]

MAX_DENIALS = 20


class _Event(Protocol):
    """An emitted event, as a record lists it (``kernos.events.bus.Event``)."""

    @property
    def topic(self) -> str: ...

    @property
    def principal(self) -> str: ...

    @property
    def depth(self) -> int: ...


class _Changes(Protocol):
    """What a committed op changed (``kernos.op.CommitReport``)."""

    added: list[str]
    changed: list[str]
    deleted: list[str]
    image_bytes: int
    history_bytes: int
    unchanged: bool


class _Report(_Changes, Protocol):
    """The committed op's report, which :meth:`AuditParticipant.published` completes."""

    audit: dict[str, Any]
    events: list[dict[str, Any]]


class AuditedOp(Protocol):
    """What an op's audit record says of it: the fields of ``kernos.op.Op`` it reads."""

    @property
    def id(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def principal(self) -> str: ...

    @property
    def source(self) -> str | None: ...

    @property
    def facts(self) -> dict[str, Any]: ...

    @property
    def grants_used(self) -> dict[str, str]: ...

    @property
    def denied(self) -> list[dict[str, Any]]: ...

    @property
    def file_access(self) -> list[dict[str, Any]]: ...

    @property
    def events(self) -> Sequence[tuple[_Event, Any]]: ...

    @property
    def effects(self) -> list[dict[str, Any]]: ...

    @property
    def clock(self) -> list[int]: ...

    @property
    def environ(self) -> list[list[str | None]]: ...

    @property
    def key(self) -> str | None: ...

    @property
    def llm_calls(self) -> list[dict[str, Any]]: ...

    @property
    def recalls(self) -> list[tuple[dict[str, Any], str, frozenset[str]]]: ...

    @property
    def outcome(self) -> tuple[str, dict[str, str] | None]: ...

    @property
    def failure(self) -> dict[str, str] | None: ...

    @property
    def report_draft(self) -> _Changes | None: ...

    def commit_id(self) -> str | None: ...


def code_field(log: AuditLog, source: str | None,
               subjects: frozenset[str]) -> dict[str, Any] | None:
    """How a record holds an op's code: inline, by reference, or sealed for its subjects."""
    if source is None:
        return None
    data = source.encode("utf-8", "surrogatepass")
    if subjects:
        sealed = log.keyring.seal(sorted(subjects), data)
        return {"sealed": sorted(subjects), "ref": log.store_payload(sealed), "size": len(data)}
    field: dict[str, Any] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    if len(data) <= INLINE_CODE_BYTES:
        field["text"] = source
    else:
        field["ref"] = log.store_payload(data)
    return field


def event_fields(log: AuditLog, op: AuditedOp) -> list[dict[str, Any]]:
    """The op's events as the record holds them, numbered from the log's next sequence."""
    first = log.next_seq
    out = []
    for number, (event, stored) in enumerate(op.events):
        item: dict[str, Any] = {"seq": first + number, "topic": event.topic,
                                "principal": event.principal, "depth": event.depth}
        subjects = subjects_of(stored)
        data = canonical(stored)
        if subjects or len(data) > INLINE_PAYLOAD_BYTES:
            item["ref"] = log.store_payload(data)
            if subjects:
                item["subjects"] = sorted(subjects)
        else:
            item["payload"] = stored
        out.append(item)
    return out


class AuditParticipant:
    """Writes the op's audit record at the right moment of its transaction."""

    def __init__(self, op: AuditedOp, log: AuditLog) -> None:
        self.op = op
        self.log = log
        self.index: int | None = None
        self.record: dict[str, Any] | None = None
        """The record written for a committed op."""
        self.closed = False
        self.started_at = utc_now()

    def sort_key(self) -> str:
        return "~kernos.audit"  # before "~kernos.image": the record precedes the commit point

    def _body(self, *, status: str, commit: str | None,
              error: dict[str, str] | None) -> dict[str, Any]:
        op = self.op
        committed = status == "committed"
        report = op.report_draft
        body = {
            "type": "op", "op": op.id, "kind": op.kind, "principal": op.principal,
            "status": status, "error": error,
            "code": code_field(self.log, op.source, created_subjects()),
            "grants": {"used": [{"id": grant, "capability": capability}
                                for grant, capability in sorted(op.grants_used.items())],
                       "denied": op.denied[:MAX_DENIALS]},
            "changes": ({"added": report.added, "changed": report.changed,
                         "deleted": report.deleted}
                        if committed and report is not None else None),
            "events": event_fields(self.log, op) if committed else [],
            "attempted_events": 0 if committed else len(op.events),
            "effects": list(op.effects) if committed else [],
            "commit": commit,
            "started_at": self.started_at,
            "finished_at": utc_now(),
        }
        if committed and report is not None:  # absent otherwise, like ``key``
            body["sizes"] = {"image": report.image_bytes, "history": report.history_bytes}
        if committed and report is not None and report.unchanged:
            body["unchanged"] = True  # no snapshot: ``commit`` is the last one, still the image
        if op.clock:  # absent otherwise, like ``key``
            body["clock"] = list(op.clock)
        if op.environ:
            body["environ"] = [list(read) for read in op.environ]
        if op.key is not None:  # absent otherwise: older records hash as they always did
            body["key"] = op.key
        if op.llm_calls:  # absent otherwise, like ``key``
            body["llm"] = [dict(call) for call in op.llm_calls]
        if "loop" in op.facts:  # an agent's loop iteration (kernos.agents.loop)
            body["loop"] = dict(op.facts["loop"])
        if op.file_access:  # absent otherwise, like ``key`` (kernos.agents.files)
            body["file_access"] = [dict(access) for access in op.file_access]
        if op.recalls:  # absent otherwise, like ``key``; sealed when it holds a subject's text
            body["memory"] = [{"request": request, "answer": code_field(self.log, answer, subjects)}
                              for request, answer, subjects in op.recalls]
        for name in ("circuit", "circuit_skipped"):  # the supervisor's (absent otherwise)
            if name in op.facts:
                body[name] = op.facts[name]
        return body

    # -- two-phase commit ----------------------------------------------------------

    def tpc_begin(self, txn: Transaction) -> None:
        self.op.facts["audit"] = self.log.binding()

    def commit(self, txn: Transaction) -> None:
        pass

    def tpc_vote(self, txn: Transaction) -> None:
        commit = self.op.commit_id()
        # An op kept although its code raised (on_error = keep) says so in ``error``.
        # Made durable with the snapshot (Workspace.set_head): a copy in its tail frame,
        # or synced with its pack before the ref moves.
        record = self.log.append(self._body(status="committed", commit=commit,
                                            error=self.op.failure), sync=False)
        self.index = record["index"]
        self.record = record

    def tpc_finish(self, txn: Transaction) -> None:
        pass

    def published(self, report: _Report) -> None:
        """After the commit: publish the record's events, and say in ``report`` where the
        record is (``audit``: its index and hash) and what the events are as external
        subscribers receive them."""
        index = self.index
        record = self.record
        assert index is not None and record is not None
        self.log.published = index
        report.audit = {"index": index, "hash": self.log.entries[index].hash}
        report.events = [self.log.resolve_event(event, record) for event in record["events"]]

    def tpc_abort(self, txn: Transaction) -> None:
        if self.index is not None and not self.closed:
            self.closed = True
            try:
                self.log.append({"type": "void", "voids": self.index, "op": self.op.id,
                                 "reason": "the commit failed after its record was written"})
            except OSError:
                # A full disk has no room for the void: the record is taken back instead,
                # so that the chain never names a commit that did not happen as done.
                self.log.retract(self.index)

    def abort(self, txn: Transaction) -> None:
        if self.closed:
            return
        self.closed = True
        status, error = self.op.outcome
        if error is None and txn.failure is not None:
            # The commit itself failed: the record says why, as the user was told.
            error = {"kind": type(txn.failure).__name__[:120],
                     "message": str(txn.failure)[:500]}
        self.log.append(self._body(status=status, commit=None, error=error))
