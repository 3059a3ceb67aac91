"""One op against an image: the code runs, then the op commits or rolls back.

An :class:`Op` wraps a :class:`~kernos.transaction.Transaction` with the
image as its participant.  The caller runs the op's code against the
namespace between ``image.begin()`` and ``op.commit()`` / ``op.abort()``.

Commit, step by step:

1. *What changed?*  Names added, deleted or rebound are found by identity
   against the last commit.  Names the op's code could have mutated in place
   are its reach (see ``kernos.analysis``).  Everything else is untouched and
   keeps its stored group as is: no pickling, no hashing, no new objects.
2. *Pickle* the affected names one by one; when more than one is affected,
   note which objects each reaches, and store names that share objects as
   one group so identity survives a restore.
3. *Write* the new chunks, group trees, the manifest, the root tree and the
   commit object.  None of it is reachable yet.
4. *Publish*: move the branch ref (an atomic rename).  That is the commit
   point; the reply that says "committed" is sent only after it.

Abort puts back the exact objects of the last commit for names that were
added, deleted or rebound, and reloads from the snapshot any group in the
op's reach whose pickled form no longer matches what is stored.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernos import _faults
from kernos._time import utc_now
from kernos.analysis import Reach
from kernos.audit.record import AuditParticipant
from kernos.errors import CommitFailed, KernosError, OpVetoed, RestoreError
from kernos.personal import created_subjects
from kernos.serialize.kinds import carries_no_identity
from kernos.serialize.pickler import Pickled, SharingRecord
from kernos.serialize.summary import describe, type_name
from kernos.store.snapshots import (
    SnapshotWriter,
    StoredGroup,
    StoredPart,
    chunk_ids,
    commit_message,
    read_group,
    read_snapshot,
)
from kernos.transaction import Status, Transaction

if TYPE_CHECKING:
    from kernos.events.bus import Event
    from kernos.image import GroupState, Image, NameMeta, Progress

__all__ = ["AbortReport", "CheckoutReport", "CommitReport", "Op"]

_MISSING = object()
_ATOMIC = frozenset({str, bytes, int, float, complex, bool, type(None)})


@dataclass(kw_only=True)
class CommitReport:
    """What a committed op changed, for the reply and the history."""

    op: int
    commit: str
    principal: str
    kind: str
    added: list[str]
    changed: list[str]
    deleted: list[str]
    committed_at: str
    unpersisted: list[dict[str, Any]] = field(default_factory=list)
    bytes_written: int = 0
    image_bytes: int = 0
    """The image's size after the op: the sum of its stored groups' sizes."""
    history_bytes: int = 0
    """The history's size after the op (see :meth:`Image.history_bytes`)."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    reach: str = ""
    audit: dict[str, Any] = field(default_factory=dict)
    """The op's audit record: its ``index`` and ``hash``."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """The committed events, as external subscribers receive them."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(kw_only=True)
class AbortReport:
    """What a rollback had to undo."""

    op: int
    removed: list[str]
    rebound: list[str]
    reloaded: list[str]


@dataclass(kw_only=True)
class CheckoutReport:
    ref: str
    commit: str
    op: int | None
    names: int
    bytes: int


class Op:
    """An op in flight.  Finish it with exactly one of :meth:`commit` or :meth:`abort`."""

    def __init__(self, image: Image, *, op: int, principal: str, source: str | None,
                 kind: str, reach: Reach) -> None:
        self.image = image
        self.id = op
        self.principal = principal
        self.source = source
        self.kind = kind
        self.reach = reach
        self.started = time.perf_counter()
        self.note = ""
        self.facts: dict[str, Any] = {}
        """Extra facts for the snapshot manifest (for example, which tool versions ran)."""
        self.vetoes: list[str] = []
        """Reasons this op must not commit (a capability denial, a breached limit)."""
        self.veto_status = "vetoed"
        """The audit status of a vetoed op (``denied``, ``failed``, ...)."""
        self.events: list[tuple[Event, Any]] = []
        """Events emitted so far, with the payload as the audit log stores it."""
        self.event_depth = 0
        """How deep event delivery is right now (see kernos.events.bus)."""
        self.grants_used: dict[str, str] = {}
        """Grant id -> capability, for every grant the op's principals used."""
        self.denied: list[dict[str, Any]] = []
        """Capabilities that were refused (bounded by the runtime)."""
        self.environ: list[list[str | None]] = []
        """Environment variables its own code read: [name, SHA-256 of the value or None]."""
        self.clock: list[int] = []
        """The op's own code's clock readings, in ns (see kernos.determinism), for its audit."""
        self.effects: list[dict[str, Any]] = []
        """External effects this op queued, or recorded (see kernos.effects), for its audit."""
        self.key: str | None = None
        """An idempotency key from the op's sender, kept in its audit record."""
        self.llm_calls: list[dict[str, Any]] = []
        """The op's LLM calls (kernos.llm), failed ones too, for its audit record."""
        self.outcome: tuple[str, dict[str, str] | None] = ("rolled back", None)
        """(status, error) of an op that did not commit, for its audit record."""
        self.report_draft: CommitReport | None = None
        self.report: CommitReport | None = None
        self.abort_report: AbortReport | None = None
        self._adopted: dict[str, tuple[StoredGroup, tuple[object, ...]]] = {}
        self._adopted_meta: dict[str, NameMeta] = {}
        self._participant = _ImageParticipant(self)
        self._audit = AuditParticipant(self, image.audit)
        self.transaction = Transaction(op=op, principal=principal)
        self.transaction.join(self._participant)
        self.transaction.join(self._audit)

    @property
    def status(self) -> Status:
        return self.transaction.status

    def scan_everything(self, why: str = "a full scan was requested") -> None:
        """Check every value at commit, not only those in the op's reach."""
        self.reach = Reach.all(why)

    def touch(self, *names: str) -> None:
        """Add names the op changed in place to its reach (the runtime's own state, say)."""
        self.reach = self.reach.union(Reach(frozenset(names)))

    def veto(self, reason: str, *, status: str = "vetoed") -> None:
        """Make this op roll back at commit, whatever its code did with the error.

        ``status`` is what its audit record will say (a denial wins over others).
        """
        self.vetoes.append(reason)
        if self.veto_status != "denied":
            self.veto_status = status

    def act_as(self, principal: str, kind: str) -> None:
        """Attribute this op to another principal (a cell that runs as an agent)."""
        self.principal = principal
        self.transaction.principal = principal
        self.kind = kind

    def commit(self) -> CommitReport:
        """Write the snapshot; on failure the image is rolled back and CommitFailed raised.

        A vetoed op is rolled back instead and raises :class:`OpVetoed`.
        """
        if self.vetoes:
            vetoed = OpVetoed.from_op(self)
            self.abort(status=self.veto_status, error=vetoed)
            raise vetoed
        try:
            self.transaction.commit()
        except KernosError:
            raise
        except BaseException as error:
            raise CommitFailed(self.id, error) from error
        finally:
            self.image._release()
        assert self.report is not None
        audit = self.image.audit
        index = self._audit.index
        assert index is not None
        audit.published = index
        self.report.audit = {"index": index, "hash": audit.entries[index].hash}
        record = self._audit.record
        assert record is not None
        self.report.events = [audit.resolve_event(event, record) for event in record["events"]]
        return self.report

    def abort(self, *, status: str | None = None,
              error: BaseException | tuple[str, str] | None = None) -> AbortReport:
        """Put the namespace back exactly as the last commit left it.

        ``status`` and ``error`` are what the audit record says about why
        (by default derived from ``error``: interrupted, denied, failed).
        """
        self.outcome = outcome(self, status, error)
        try:
            self.transaction.abort()
        finally:
            self.image._release()
        assert self.abort_report is not None
        return self.abort_report

    def commit_id(self) -> str | None:
        """The id of the commit being written (from the commit phase on)."""
        sha = self._participant.commit_sha
        return None if sha is None else sha.hex()

    @property
    def sealed(self) -> frozenset[str]:
        """Data subjects this op tagged: its code is stored sealed for them."""
        return created_subjects()

    def checkout(self, ref: str, progress: Progress | None = None) -> CheckoutReport:
        """Make the namespace equal to snapshot ``ref``, as part of this op.

        History is not rewritten: committing this op records a new snapshot
        whose groups are the old snapshot's own trees.
        """
        from kernos.image import NameMeta
        from kernos.store.workspace import op_of

        image = self.image
        workspace = image.workspace
        commit = workspace.resolve(ref)
        snapshot = read_snapshot(workspace, commit)
        groups = {key: read_group(workspace, key, tree)
                  for key, tree in snapshot.group_trees.items()}
        values, failed = image.load_groups(groups, progress)
        if failed:
            raise RestoreError(
                f"{ref} cannot be checked out: {', '.join(sorted(failed))} could not be "
                "loaded. Nothing was changed.", names=tuple(sorted(failed)))
        for name in image.persisted_names():
            if name not in values:
                image.unbind(name)
        for name, value in values.items():
            image.bind(name, value)
        self._adopted = {key: (stored, tuple(values[name] for name in stored.names))
                         for key, stored in groups.items()}
        self._adopted_meta = {name: NameMeta.from_json(data)
                              for name, data in snapshot.manifest.get("names", {}).items()}
        self.kind = "checkout"
        self.note = f"checkout {commit.hex()[:12]}"
        return CheckoutReport(ref=ref, commit=commit.hex(), op=op_of(snapshot.data),
                              names=len(values), bytes=sum(g.size for g in groups.values()))


class _UnionFind:
    def __init__(self, items: list[str]) -> None:
        self.parent = {item: item for item in items}

    def find(self, item: str) -> str:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: str, b: str) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a != root_b:
            self.parent[max(root_a, root_b)] = min(root_a, root_b)

    def groups(self) -> list[list[str]]:
        found: dict[str, list[str]] = {}
        for item in self.parent:
            found.setdefault(self.find(item), []).append(item)
        return [sorted(members) for members in found.values()]


class _ImageParticipant:
    """Moves the image's snapshot history with the op."""

    def __init__(self, op: Op) -> None:
        self.op = op
        self.writer: SnapshotWriter | None = None
        self.commit_sha: bytes | None = None
        self._published = False
        self._state: dict[str, Any] = {}

    def sort_key(self) -> str:
        return "~kernos.image"  # votes last: its publish is the commit point

    # -- two-phase commit ------------------------------------------------------

    def tpc_begin(self, txn: Transaction) -> None:
        image = self.op.image
        self.writer = SnapshotWriter(image.workspace, image.cache)
        image.workspace.objects.begin()

    def commit(self, txn: Transaction) -> None:
        self._prepare()

    def tpc_vote(self, txn: Transaction) -> None:
        assert self.writer is not None and self.commit_sha is not None
        _faults.point("sealed")

    def tpc_finish(self, txn: Transaction) -> None:
        assert self.writer is not None and self.commit_sha is not None
        started = time.perf_counter()
        self.writer.publish(self.commit_sha)
        self._published = True
        image = self.op.image
        image.head = self.commit_sha
        image.head_op = self.op.id
        image.groups = self._state["groups"]
        image.group_of = {name: key for key, state in image.groups.items()
                          for name in state.stored.names}
        image.meta = self._state["meta"]
        image.committed = self._state["current"]
        report = self._state["report"]
        report.timings_ms["publish"] = (time.perf_counter() - started) * 1000
        report.timings_ms["total"] = (time.perf_counter() - self.op.started) * 1000
        self.op.report = report

    def tpc_abort(self, txn: Transaction) -> None:
        if self.writer is not None and not self._published:
            self.op.image.workspace.objects.discard()

    def abort(self, txn: Transaction) -> None:
        self.op.abort_report = self._rollback()

    # -- commit work -----------------------------------------------------------

    def _prepare(self) -> None:
        op = self.op
        image = op.image
        writer = self.writer
        assert writer is not None
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        current = image.persisted_names()
        committed = image.committed
        added = [name for name in current if name not in committed]
        deleted = [name for name in committed if name not in current]
        rebound = {name for name in current
                   if name in committed and current[name] is not committed[name]}
        reach = image.expand(op.reach, current)
        touched = set(current) if reach.everything else reach.names & current.keys()
        dirty = set(added) | rebound | touched

        final: dict[str, GroupState] = {}
        claimed: set[str] = set()
        from kernos.image import GroupState

        for key, (stored, values) in op._adopted.items():
            names = set(stored.names)
            intact = all(current.get(name, _MISSING) is value
                         for name, value in zip(stored.names, values, strict=True))
            if intact and not names & touched:
                final[key] = GroupState(stored=stored)
                claimed |= names
        for key, state in image.groups.items():
            names = set(state.stored.names)
            if names & claimed:
                continue
            unchanged = all(current.get(name, _MISSING) is committed.get(name, _MISSING)
                            for name in names)
            if state.load_error is not None and unchanged:
                final[key] = state  # still the placeholders of a failed restore: keep the data
                claimed |= names
            elif not names & (dirty | set(deleted)):
                final[key] = state
                claimed |= names
        affected = sorted(name for name in current if name not in claimed)
        timings["analyze"] = (time.perf_counter() - clock) * 1000

        clock = time.perf_counter()
        individual, components = self._pickle(affected, current)
        _faults.point("serialize")
        timings["serialize"] = (time.perf_counter() - clock) * 1000

        clock = time.perf_counter()
        new_parts: dict[str, tuple[Pickled, StoredGroup]] = {}
        for members in components:
            if len(members) == 1:
                pickled = individual[members[0]]
            else:
                pickled = image.serializer.dump([(name, current[name]) for name in members],
                                                op=op.id)
            stored = writer.group(members, pickled, op=op.id)
            final[stored.key] = GroupState(
                stored=stored, live_transients=[t.obj for t in pickled.transients])
            for name in members:
                new_parts[name] = (individual[name], stored)
        _faults.point("objects")

        meta, changed = self._metadata(current, new_parts, final, rebound)
        report = CommitReport(
            op=op.id, commit="", principal=op.principal, kind=op.kind,
            added=sorted(added), changed=sorted(changed - set(added)), deleted=sorted(deleted),
            committed_at=utc_now(),
            unpersisted=[info for name in sorted(changed)
                         for info in final[meta[name].group].stored.unpersisted
                         if info["name"] == name],
            reach="everything: " + reach.why if reach.everything else f"{len(touched)} names",
        )
        manifest = {
            "format": 1,
            "op": op.id,
            "principal": op.principal,
            "kind": op.kind,
            "note": op.note,
            "committed_at": report.committed_at,
            "changes": {"added": report.added, "changed": report.changed,
                        "deleted": report.deleted},
            "names": {name: meta[name].to_json() for name in sorted(meta)},
        }
        if op.facts:
            manifest["facts"] = op.facts
        sealed = op.sealed
        if sealed:
            manifest["sealed_for"] = sorted(sealed)
        self.op.report_draft = report
        self.commit_sha = writer.commit(
            groups=[state.stored for state in final.values()], manifest=manifest,
            source=_sealed_source(sealed) if sealed and op.source is not None else op.source,
            parent=image.head,
            message=_message(op), author=f"{op.principal} <{op.principal}@kernos.invalid>",
        )
        timings["write"] = (time.perf_counter() - clock) * 1000
        report.commit = self.commit_sha.hex()
        report.bytes_written = writer.bytes_written
        report.image_bytes = sum(state.stored.size for state in final.values())
        report.history_bytes = image.history_grew(writer.bytes_written)
        report.timings_ms = timings
        self._state = {"groups": final, "meta": meta, "current": current, "report": report}

    def _pickle(self, names: list[str], current: dict[str, object]
                ) -> tuple[dict[str, Pickled], list[list[str]]]:
        """Pickle each name alone; find which names share objects."""
        serializer = self.op.image.serializer
        # Recording costs a Python call per object, so only values that can share
        # objects at all are recorded, and only if two or more of them are affected.
        shareable = {name for name in names
                     if type(current[name]) not in _ATOMIC and not carries_no_identity(
                         current[name], serializer.is_by_value)}
        record = SharingRecord() if len(shareable) > 1 else None
        sharing = _UnionFind(names)
        individual = {}
        for name in names:
            pickled = serializer.dump([(name, current[name])], op=self.op.id,
                                      record=record if name in shareable else None)
            individual[name] = pickled
            for other in pickled.touched_owners:
                sharing.union(name, other)
        return individual, sharing.groups()

    def _metadata(
        self,
        current: dict[str, object],
        new_parts: dict[str, tuple[Pickled, StoredGroup]],
        final: dict[str, GroupState],
        rebound: set[str],
    ) -> tuple[dict[str, NameMeta], set[str]]:
        from kernos.image import NameMeta

        image = self.op.image
        writer = self.writer
        assert writer is not None
        group_of = {name: key for key, state in final.items() for name in state.stored.names}
        old = image.meta
        meta: dict[str, NameMeta] = {}
        changed: set[str] = set()
        now = utc_now()
        for name, value in current.items():
            if name in new_parts:
                pickled, stored = new_parts[name]
                digest = _content_hash(pickled, stored, writer)
                size = len(pickled.stream) + sum(view.nbytes for view in pickled.buffers)
            elif name in self.op._adopted_meta and group_of[name] in self.op._adopted:
                adopted = self.op._adopted_meta[name]
                digest, size = adopted.hash, adopted.size
            else:
                kept = old[name]
                meta[name] = (kept if kept.group == group_of[name]
                              else NameMeta(**{**kept.to_json(), "group": group_of[name]}))
                continue
            previous = old.get(name)
            # A rebound name holding a live resource holds a *new* one (another
            # connection), even though both pickle to the same placeholder record.
            new_resource = name in rebound and name in new_parts and bool(
                new_parts[name][0].transients)
            if previous is not None and previous.hash == digest and not new_resource:
                meta[name] = NameMeta(**{**previous.to_json(), "group": group_of[name]})
                continue
            changed.add(name)
            meta[name] = NameMeta(
                group=group_of[name], type=type_name(value), summary=describe(value),
                size=size, hash=digest, version=(previous.version + 1) if previous else 1,
                op=self.op.id, principal=self.op.principal, changed_at=now,
            )
        return meta, changed

    # -- rollback --------------------------------------------------------------

    def _rollback(self) -> AbortReport:
        image = self.op.image
        committed = image.committed
        removed = [name for name in image.persisted_names() if name not in committed]
        for name in removed:
            image.unbind(name)
        rebound = []
        for name, value in committed.items():
            if image.lookup(name, _MISSING) is not value:
                image.bind(name, value)
                rebound.append(name)
        reach = image.expand(self.op.reach, committed)
        names = set(committed) if reach.everything else reach.names & committed.keys()
        keys = {image.group_of[name] for name in names if name in image.group_of}
        stale = {key: image.groups[key].stored for key in sorted(keys)
                 if image.groups[key].load_error is None and not self._matches(image.groups[key])}
        reloaded: list[str] = []
        if stale:
            live = {key: image.groups[key].live_transients for key in stale}
            values, _failed = image.load_groups(stale, live=live)
            for name, value in values.items():
                image.bind(name, value)
                committed[name] = value
                reloaded.append(name)
        return AbortReport(op=self.op.id, removed=sorted(removed), rebound=sorted(rebound),
                           reloaded=sorted(reloaded))

    def _matches(self, state: GroupState) -> bool:
        """Whether the group's live values still pickle to exactly what is stored."""
        image = self.op.image
        stored = state.stored
        try:
            pickled = image.serializer.dump(
                [(name, image.committed[name]) for name in stored.names], op=self.op.id)
        except Exception:
            return False
        if len(pickled.buffers) != len(stored.buffers):
            return False
        parts = [(memoryview(pickled.stream), stored.stream)]
        parts += list(zip(pickled.buffers, stored.buffers, strict=True))
        for data, part in parts:
            if len(data) != part.size or chunk_ids(data, image.cache) != part.chunks:
                return False
        return True


def _content_hash(pickled: Pickled, stored: StoredGroup, writer: SnapshotWriter) -> str:
    """A stable content hash of one name: its stream plus the ids of its buffer chunks."""
    digest = hashlib.blake2b(pickled.stream, digest_size=16)
    if len(stored.names) == 1:
        parts: tuple[StoredPart, ...] = stored.buffers
    else:
        parts = tuple(writer.part(view, readonly=view.readonly) for view in pickled.buffers)
    for part in parts:
        for sha in part.chunks:
            digest.update(sha)
    return digest.hexdigest()


def _sealed_source(subjects: frozenset[str]) -> str:
    return (f"# The code of this op tagged personal data of {', '.join(sorted(subjects))}, so it "
            "is kept\n# only in the audit log, sealed under those subjects' keys (see "
            "kernos.personal).\n")


def outcome(op: Op, status: str | None,
            error: BaseException | tuple[str, str] | None) -> tuple[str, dict[str, str] | None]:
    """The audit status and error of an op that did not commit."""
    if isinstance(error, BaseException):
        name, message = type(error).__name__, str(error)
    elif error is not None:
        name, message = error
    else:
        name = message = ""
    if status is None:
        if op.vetoes:
            status = op.veto_status
        elif name == "KeyboardInterrupt":
            status = "interrupted"
        elif name in ("CapabilityDenied", "OpVetoed") and op.denied:
            status = "denied"
        elif name:
            status = "failed"
        else:
            status = "rolled back"
    shown = {"kind": name[:120], "message": message[:500]} if name else None
    return status, shown


def _message(op: Op) -> str:
    if op.note:
        headline = op.note
    elif op.sealed:
        headline = "(code sealed: it tagged personal data)"
    else:
        lines = [line.strip() for line in (op.source or "").splitlines() if line.strip()]
        headline = lines[0] if lines else f"({op.kind})"
        if len(headline) > 60:
            headline = headline[:57] + "..."
        if len(lines) > 1:
            headline += f" (+{len(lines) - 1} lines)"
    return commit_message(op=op.id, principal=op.principal, kind=op.kind, headline=headline)
