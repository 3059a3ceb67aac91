"""What the inspector's reads add to the image's metadata: a value's shape, the newest ops
(those that wrote no snapshot too), and one op that wrote none, with its code.

The metadata (``Image.meta``) says what a name held when its op committed; these look at
the live value only where that is cheap and runs no code of the image's (the length of a
builtin container, the ``shape`` of a numpy array or pandas frame), and at the audit
chain for the ops the history has no snapshot of.
"""

from __future__ import annotations

import re
from typing import Any

from kernos import history
from kernos.audit.log import AuditLog
from kernos.audit.oplog import unrecorded_ops
from kernos.store.workspace import Workspace

__all__ = ["newest_ops", "op_without_snapshot", "shape_of"]

_SIZED = (list, tuple, dict, set, frozenset, str, bytes, bytearray)
"""Builtin types whose ``len`` is theirs (a subclass's ``__len__`` could run anything)."""
_ARRAYS = ("numpy", "pandas")
"""Modules whose values' ``shape`` is a plain attribute (a tuple of ints)."""
OP_REF = re.compile(r"@(\d+)")


def shape_of(value: object) -> list[int] | None:
    """``[len]`` of a builtin container or string, an array's or frame's shape, else None.

    Never runs the image's code: a subclass of a builtin, or a class of the image's own,
    gets None (its ``__len__`` is its author's)."""
    kind = type(value)
    if kind in _SIZED:
        return [len(value)]  # type: ignore[arg-type]
    module = getattr(kind, "__module__", "") or ""
    if module.split(".", 1)[0] in _ARRAYS:
        shape = getattr(value, "shape", None)
        if isinstance(shape, tuple) and all(type(n) is int for n in shape):
            return list(shape)
    return None


def newest_ops(workspace: Workspace, audit: AuditLog, limit: int) -> list[history.LogEntry]:
    """The newest ``limit`` ops, newest first: snapshots and the ops that wrote none.

    Op numbers are never reused, so only the records of the last ``limit`` numbers are
    read, however many read-only ops the chain holds (the sidebar asks after every op)."""
    snapshots = history.log(workspace, limit=limit)
    newest = max([audit.last_op, *(entry.op or 0 for entry in snapshots[:1])])
    others = [outcome.entry() for outcome in
              unrecorded_ops(audit, after=max(0, newest - limit)).values()]
    merged = sorted([*snapshots, *others], key=lambda entry: -(entry.op or 0))
    return merged[:limit]


def op_without_snapshot(audit: AuditLog, ref: str) -> dict[str, Any] | None:
    """``show``'s answer for ``@N`` when op N wrote no snapshot (it read only, or rolled
    back): who ran what, and what became of it, from its audit record; None if ``ref`` is
    not ``@N`` or the chain has no such op."""
    match = OP_REF.fullmatch(ref.strip())
    if match is None:
        return None
    op = int(match.group(1))
    outcome = unrecorded_ops(audit, only=(op,)).get(op)
    if outcome is None:
        return None
    code = audit.read(outcome.index).get("code")
    text = code.get("text") if isinstance(code, dict) and not code.get("sealed") else None
    return {"commit": None, "op": op, "principal": outcome.principal, "kind": outcome.kind,
            "committed_at": outcome.when, "message": outcome.what,
            "code": text if isinstance(text, str) else None, "names": {}, "unpersisted": [],
            "outcome": outcome.outcome, "error": outcome.error or None}
