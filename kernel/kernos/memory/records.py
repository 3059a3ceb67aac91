"""The shapes memory hands around: a readable name, a recalled memory, a recall's scope.

:class:`WorkingItem` is what the working layer is fed (a name, its type, a
preview); :class:`Memory` is one entry a recall returns; :class:`Scope` is the
one visibility rule both rankings (words in :mod:`kernos.memory.index`,
meaning in :mod:`kernos.memory.vectors`) apply: a principal's own entries of
the layers asked for, and the human's names its grants let it read.  They live
here, below the index, the vectors and the context renderer, which all read
them; :mod:`kernos.memory.index` re-exports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HUMAN", "Memory", "Scope", "WorkingItem"]

HUMAN = "human"


@dataclass(frozen=True, kw_only=True)
class WorkingItem:
    """A readable name of a namespace, as the working layer holds it."""

    name: str
    """The variable's name."""
    type: str
    """Its type's name."""
    preview: str
    """A short preview (cut to PREVIEW_CHARS)."""


@dataclass(frozen=True, kw_only=True)
class Memory:
    """One entry returned by recall."""

    entry: int
    """Its id in the index (stable until the index is rebuilt)."""
    kind: str
    """working, episodic or semantic."""
    principal: str
    """Whose it is: who made it for an episodic entry (the op's principal for the op, the
    emitter for an event, the caller for an LLM exchange), the namespace's owner for a
    working one, the fact's author for a semantic one."""
    text: str
    """The indexed text."""
    title: str
    """A one-line label (``op 12 committed``, ``event orders.new``, ``x: int``, ``fact 3``)."""
    score: float
    """Lower is better.  Matched by words only (embeddings off): the bm25 rank as SQLite
    reports it (negative).  With embeddings on: minus the reciprocal rank fusion,
    ``-sum(1 / (60 + rank))`` over the words' and the meaning's rankings (between about
    -0.033 and 0)."""
    op: int | None = None
    """The op, for episodic entries (and the op that stored a fact)."""
    name: str | None = None
    """The variable, for working entries."""
    at: str | None = None
    """When (UTC)."""
    status: str | None = None
    """For episodic entries, the op's status (``void`` once a void record names it)."""
    matched: str = "text"
    """How it was found: ``text`` (shares a word with the query), ``meaning`` (its vector
    is near the query's, no word shared in the ranking) or ``both``."""


@dataclass(frozen=True, kw_only=True)
class Scope:
    """What a recall may see: the one visibility rule of both rankings."""

    principal: str
    """Who asks."""
    kinds: frozenset[str]
    """The layers asked for."""
    may_read: Callable[[str], bool] | None = None
    """Which of the human's names the asker may read (None: none of them)."""

    def reads_human_names(self) -> bool:
        # Only the human's names: another agent's namespace is never another's to read,
        # whatever its names are called.
        return "working" in self.kinds and self.may_read is not None and self.principal != HUMAN

    def admits(self, kind: str, owner: str, name: str | None) -> bool:
        """Whether an entry (its layer, its principal, its variable) may be returned."""
        if owner == self.principal:
            return kind in self.kinds
        return (self.reads_human_names() and owner == HUMAN and kind == "working"
                and name is not None and self.may_read is not None and self.may_read(name))

    def candidates_sql(self) -> tuple[str, list[str]]:
        """A WHERE clause on ``entries e`` for the entries :meth:`admits` may let through."""
        marks = ",".join("?" * len(self.kinds))
        where = f"(e.principal = ? AND e.kind IN ({marks}))"
        params = [self.principal, *sorted(self.kinds)]
        if self.reads_human_names():
            where += " OR (e.principal = ? AND e.kind = 'working')"
            params.append(HUMAN)
        return where, params
