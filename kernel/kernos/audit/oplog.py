"""Every op, also those that wrote no snapshot: the history's gaps, from the audit log.

An op gets its number when it begins (the highest number the audit chain
holds, plus one: ``AuditLog.last_op``), and numbers are never reused.  Every
op leaves an audit record, but only an op that committed a change writes a
snapshot, so the snapshots' op numbers have gaps: an op that rolled back
(``failed``, ``denied``, ``vetoed``, ``interrupted``, ``rejected``,
``conflict``, ``rolled back``), one that changed nothing (``read-only``: its
record names the snapshot it ran on), one whose kernel died while it ran (a
``died`` record), one whose commit never became visible (``voided``).

:func:`unrecorded_ops` reads those from the chain, :func:`every_op` merges
them with the snapshots (``kernos log --all``), :func:`gap_note` says what the
gaps of a plain log are (:func:`missing_ops`), and :func:`what_happened` tells one op's story
(``kernos show @N`` of an op that wrote no snapshot).  :func:`headline`
describes what an op ran in one line, readable also for the requests a
harness sends (recorded as JSON).
"""

from __future__ import annotations

import json
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from kernos.audit.log import AuditLog
from kernos.history import LogEntry
from kernos.history import log as snapshot_log
from kernos.store.workspace import Workspace

__all__ = ["OpOutcome", "every_op", "gap_note", "headline", "missing_ops", "unrecorded_ops",
           "what_happened"]

_ROLLED_BACK = ("rolled back", "failed", "denied", "vetoed", "interrupted", "rejected",
                "conflict")


@dataclass(frozen=True, kw_only=True)
class OpOutcome:
    """An op that wrote no snapshot, as its audit record tells it."""

    op: int
    """Its number."""
    outcome: str
    """``read-only``, ``died``, ``voided``, or the status of an op that rolled back
    (``failed``, ``denied``, ``vetoed``, ``interrupted``, ``rejected``, ``conflict``,
    ``rolled back``)."""
    principal: str
    """Who ran it."""
    kind: str
    """cell, harness, loop, ..."""
    when: str
    """When it finished (or, for ``died``, started), UTC ISO 8601."""
    what: str
    """What it ran, in one line (:func:`headline`)."""
    error: str
    """Why it did not commit (``kind: message``), empty if it did."""
    commit: str | None
    """For ``read-only``: the snapshot it ran on (still the image)."""
    index: int
    """Its audit record."""

    def entry(self) -> LogEntry:
        """As a row of the log (``kernos log --all``)."""
        return LogEntry(commit=self.commit or "", op=self.op, principal=self.principal,
                        kind=self.kind, committed_at=self.when, headline=self.what,
                        outcome=self.outcome, error=self.error)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "outcome": self.outcome, "principal": self.principal,
                "kind": self.kind, "when": self.when, "what": self.what,
                "error": self.error or None, "commit": self.commit, "record": self.index}


def headline(record: dict[str, Any]) -> str:
    """What an op record's op ran, in one line: its code's first line (``(+N lines)``),
    a harness request in words (``call TOOL(a=1)``, ``checkout ref=@3``), or why the
    code cannot be shown."""
    code = record.get("code")
    if not isinstance(code, dict):
        return f"({record.get('kind') or 'op'})"
    if code.get("sealed"):
        return "(code sealed: it tagged personal data)"
    text = code.get("text")
    if not isinstance(text, str):
        return f"({record.get('kind') or 'op'}: code of {code.get('size', '?')} bytes, stored " \
               "apart)"
    request = _request(text) if record.get("kind") in ("harness", "supervisor") else None
    if request is not None:
        return request
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("%%agent "):
        lines = lines[1:]  # the agent's own code (the record's principal names the agent)
    if not lines:
        return f"({record.get('kind') or 'op'}: no code)"
    first = lines[0] if len(lines[0]) <= 60 else lines[0][:57] + "..."
    return first + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else "")


def _request(text: str) -> str | None:
    """A harness request recorded as JSON (``{"tool": ..., "arguments": ...}`` or
    ``{"action": ..., ...}``), in words; None for anything else."""
    try:
        request = json.loads(text)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    if isinstance(request.get("tool"), str):
        arguments = request.get("arguments")
        shown = ", ".join(f"{key}={_short(value)}" for key, value in arguments.items()) \
            if isinstance(arguments, dict) else ""
        return _cut(f"call {request['tool']}({shown})")
    action = request.get("action")
    if not isinstance(action, str) and action is not None:
        return None
    rest = {key: value for key, value in request.items() if key != "action"}
    kind = rest.pop("kind", None)
    words = (action or "request").replace("_", " ")
    if kind is not None:  # a refused request: the kind of refusal
        words = f"refused {words} ({kind})"
    shown = " ".join(f"{key}={_short(value)}" for key, value in sorted(rest.items()))
    return _cut(words + (f" {shown}" if shown else ""))


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 30 else text[:27] + "..."


def _cut(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _error(record: dict[str, Any]) -> str:
    error = record.get("error")
    if not isinstance(error, dict):
        return ""
    return " ".join(f"{error.get('kind')}: {error.get('message')}".split())


def unrecorded_ops(log: AuditLog, *, after: int = 0,
                   only: Container[int] | None = None) -> dict[int, OpOutcome]:
    """The ops the chain records that wrote no snapshot, by number: those numbered over
    ``after``, and in ``only`` if given (only their records are read from disk)."""
    found: dict[int, OpOutcome] = {}
    for entry in log.entries:
        if entry.op is None or entry.op <= after or (only is not None and entry.op not in only):
            continue
        if entry.type == "op":
            if entry.status == "committed" and not (entry.unchanged or entry.voided):
                continue  # it wrote a snapshot (the log lists it, or a prune deleted it)
            record = log.read(entry.index)
            if entry.voided:
                outcome = "voided"
            elif entry.status == "committed":
                outcome = "read-only"
            else:
                outcome = str(entry.status)
            found[entry.op] = OpOutcome(
                op=entry.op, outcome=outcome, principal=str(record.get("principal")),
                kind=str(record.get("kind")), when=str(record.get("finished_at") or ""),
                what=headline(record),
                error=_error(record) if outcome != "voided" else
                "its commit was never published (the process died first)",
                commit=entry.commit if outcome == "read-only" else None, index=entry.index)
        elif entry.type == "died" and entry.op not in found:
            record = log.read(entry.index)
            found[entry.op] = OpOutcome(
                op=entry.op, outcome="died", principal=str(record.get("principal")),
                kind=str(record.get("kind")), when=str(record.get("started_at") or ""),
                what=headline(record), error="its kernel died while it ran: rolled back",
                commit=None, index=entry.index)
    return found


def every_op(workspace: Workspace, log: AuditLog, *, limit: int | None = None
             ) -> list[LogEntry]:
    """The newest ``limit`` ops, newest first: the snapshots, and the ops that wrote none."""
    snapshots = snapshot_log(workspace, limit=limit)
    oldest = min((entry.op for entry in snapshots if entry.op is not None), default=0)
    complete = limit is None or len(snapshots) < limit
    others = [outcome.entry() for outcome in
              unrecorded_ops(log, after=0 if complete else oldest).values()]
    merged = sorted([*snapshots, *others], key=lambda entry: -(entry.op or 0))
    return merged if limit is None else merged[:limit]


def missing_ops(entries: list[LogEntry]) -> list[int]:
    """The op numbers between the oldest and the newest of ``entries`` that none of them has."""
    numbers = sorted(entry.op for entry in entries if entry.op is not None)
    listed = set(numbers)
    return [op for op in range(numbers[0], numbers[-1]) if op not in listed] if numbers else []


def gap_note(missing: list[int], log: AuditLog) -> str | None:
    """What the ops ``missing`` from a log of snapshots became, in one line (None: none)."""
    if not missing:
        return None
    known = unrecorded_ops(log, only=set(missing))
    counts: dict[str, int] = {}
    for op in missing:
        outcome = known[op].outcome if op in known else "not in this audit log (before " \
            "a fork, or pruned)"
        group = "rolled back" if outcome in _ROLLED_BACK else outcome
        counts[group] = counts.get(group, 0) + 1
    said = ", ".join(f"{count} {what}" for what, count in counts.items())
    shown = ", ".join(str(op) for op in missing[:8]) + (" ..." if len(missing) > 8 else "")
    which = f"ops {shown}" if len(missing) > 1 else f"op {shown}"
    return f"{which} wrote no snapshot: {said}; `kernos log --all` lists every op"


def what_happened(log: AuditLog, op: int) -> str | None:
    """Why op ``op`` has no snapshot, in one sentence; None if the chain has no such op
    that wrote none."""
    outcome = unrecorded_ops(log, only=(op,)).get(op)
    if outcome is None:
        return None
    ran = f"it ran {outcome.what!r} as {outcome.principal}"
    if outcome.outcome == "read-only":
        stayed = (f"; the image stayed as the snapshot {outcome.commit[:12]} (`kernos show "
                  f"{outcome.commit[:12]}`)") if outcome.commit else ""
        return f"op {op} changed nothing (read-only: {ran}), so it wrote no snapshot{stayed}"
    if outcome.outcome == "died":
        return f"op {op} was running when its kernel died, and was rolled back ({ran})"
    if outcome.outcome == "voided":
        return (f"op {op} was voided: {outcome.error} ({ran}); nothing of it is in the "
                "image")
    because = f": {outcome.error}" if outcome.error else ""
    how = "rolled back" if outcome.outcome == "rolled back" else \
        f"{outcome.outcome} and was rolled back"
    return f"op {op} {how}{because} ({ran}); it wrote no snapshot"
