"""The ``prune`` record, and what it says of the commits that older records name.

``kernos prune`` (:mod:`kernos.prune`) rewrites the history: it deletes
snapshots and gives the kept ones after them new commit ids.  The records
written before it still name the old ids.  A ``prune`` record, appended and
synced before the branch moves (as an op's record is), says what became of
them::

    {"type": "prune", "from": OLD_HEAD, "to": NEW_HEAD,
     "pruned": [commit, ...],          the commits deleted, oldest first
     "rewritten": [[old, new], ...],   kept commits that got new ids, oldest first
     "tags": {"moved": [[ref, old, new], ...], "deleted": [[ref, old], ...]},
     "policy": {"keep_last": N, "keep_daily": D, "keep_tags": [...]},
     "kept": K}

:class:`Prunes` answers, for a commit a record names, what it is now: the
same commit, a new id, or pruned (and by which record).  Only the prune
records *after* the naming record apply, in chain order, so several prunes
compose.  A voided prune (its process died before the branch moved) applies
to nothing.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernos.audit.log import AuditLog
    from kernos.store.retention import Plan, Policy

__all__ = ["Prunes", "Pruning", "record_body"]


def record_body(plan: Plan, policy: Policy) -> dict[str, Any]:
    """The ``prune`` record of ``plan`` (without ``index``, ``prev``, ``hash``)."""
    return {
        "type": "prune", "from": plan.head, "to": plan.new_head,
        "pruned": list(plan.pruned),
        "rewritten": [[old, new] for old, new in plan.rewritten.items()],
        "tags": {"moved": [[ref, old, new] for ref, (old, new) in plan.tags.items()
                           if new is not None],
                 "deleted": [[ref, old] for ref, (old, new) in plan.tags.items()
                             if new is None]},
        "policy": policy.to_json(), "kept": len(plan.selection.kept),
    }


@dataclass(frozen=True, kw_only=True)
class Pruning:
    """One prune record, parsed."""

    index: int
    """Its index in the chain."""
    at: str
    """When it was appended."""
    source: str
    """HEAD before (``from``)."""
    target: str
    """HEAD after (``to``)."""
    pruned: frozenset[str]
    """The commits it deleted."""
    rewritten: dict[str, str]
    """Old id -> new id of the kept commits it rewrote."""

    @classmethod
    def parse(cls, index: int, record: dict[str, Any]) -> Pruning | None:
        """The prune record at ``index``, or None if it is malformed."""
        source, target = record.get("from"), record.get("to")
        pruned, rewritten = record.get("pruned"), record.get("rewritten")
        if not (_is_id(source) and _is_id(target) and type(pruned) is list
                and type(rewritten) is list and all(_is_id(c) for c in pruned)
                and all(type(pair) is list and len(pair) == 2 and all(map(_is_id, pair))
                        for pair in rewritten)):
            return None
        return cls(index=index, at=str(record.get("at")), source=str(source),
                   target=str(target), pruned=frozenset(pruned),
                   rewritten={str(old): str(new) for old, new in rewritten})

    def moves(self, commit: str) -> str | None:
        """What this prune made of ``commit``: its id after (None: pruned)."""
        if commit in self.pruned:
            return None
        return self.rewritten.get(commit, commit)


class Prunes:
    """The prune records of a chain, to resolve the commits that records name."""

    def __init__(self, records: Iterable[tuple[int, dict[str, Any]]]) -> None:
        self.prunings: list[Pruning] = []
        self.malformed: list[int] = []
        """Indices of prune records that could not be parsed (verify reports them)."""
        for index, record in sorted(records, key=lambda item: item[0]):
            parsed = Pruning.parse(index, record)
            if parsed is None:
                self.malformed.append(index)
            else:
                self.prunings.append(parsed)
        self._indices = [pruning.index for pruning in self.prunings]

    @classmethod
    def from_log(cls, log: AuditLog) -> Prunes:
        """The prune records of ``log`` that were not voided."""
        return cls((entry.index, log.read(entry.index)) for entry in log.entries
                   if entry.type == "prune" and not entry.voided)

    def __bool__(self) -> bool:
        return bool(self.prunings)

    def at(self, index: int) -> Pruning | None:
        """The prune record at ``index`` (None: there is none, or it is malformed)."""
        position = bisect.bisect_left(self._indices, index)
        if position < len(self._indices) and self._indices[position] == index:
            return self.prunings[position]
        return None

    def resolve(self, commit: str, after: int) -> tuple[str | None, int | None]:
        """What ``commit``, named by record ``after``, is now.

        ``(its id now, None)`` if no prune touched it; ``(its new id, P)`` if
        prune record P renamed it last; ``(None, P)`` if prune record P
        deleted it.
        """
        by = None
        for pruning in self.prunings[bisect.bisect_right(self._indices, after):]:
            moved = pruning.moves(commit)
            if moved is None:
                return None, pruning.index
            if moved != commit:
                commit, by = moved, pruning.index
        return commit, by


def _is_id(value: object) -> bool:
    return (type(value) is str and len(value) == 40
            and all(c in "0123456789abcdef" for c in value))
