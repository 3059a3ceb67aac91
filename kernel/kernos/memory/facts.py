"""Semantic memory: the facts a principal stored, kept in the image.

A :class:`Facts` value lives under :func:`facts_name` (``kernos:memory:<principal>``)
in the image's system names, so a fact stored in an op that rolls back is gone
with it, and facts survive restarts as the snapshot does.  :func:`remember`
appends to it; the index copies it (``MemoryIndex.sync_semantic``).

Facts are plain text: a ``personal()`` value is refused (its subject could not
be erased from a fact), so store personal data in a ``personal()`` name instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kernos._time import utc_now
from kernos.errors import UsageError

__all__ = ["MAX_FACT_CHARS", "Fact", "Facts", "facts_name", "remember"]

MAX_FACT_CHARS = 8192
MAX_TAGS = 16
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


def facts_name(principal: str) -> str:
    """The image's system name that holds ``principal``'s facts."""
    return f"kernos:memory:{principal}"


@dataclass(frozen=True, kw_only=True)
class Fact:
    """One stored fact."""

    id: int
    """Its number among its principal's facts, from 1, never reused."""
    text: str
    """The fact."""
    tags: tuple[str, ...] = ()
    """Tags for filtering and ranking (indexed with the text)."""
    op: int | None = None
    """The op that stored it."""
    at: str = ""
    """When it was stored (UTC, ISO 8601)."""


@dataclass(kw_only=True)
class Facts:
    """A principal's facts, in the order they were stored."""

    items: list[Fact] = field(default_factory=list)
    """The facts."""
    next_id: int = 1
    """The id the next fact gets."""


def remember(facts: Facts, fact: object, *, tags: object = (),
             op: int | None = None, at: str | None = None) -> Fact:
    """Append ``fact`` (a non-empty str) with ``tags`` (names) to ``facts``; returns it.

    ``at`` is when (default: now); the runtime passes the op's recorded clock, so
    that a replay stores the same fact."""
    if type(fact) is not str:
        raise UsageError(
            f"remember() takes the fact as a str, not {type(fact).__name__}; personal data "
            "belongs in a personal() value, never in memory, so that it can be erased")
    text = fact.strip()
    if not text or len(text) > MAX_FACT_CHARS:
        raise UsageError(f"a fact must be 1 to {MAX_FACT_CHARS} characters; "
                         f"this one has {len(text)}")
    if isinstance(tags, str) or not isinstance(tags, (list, tuple, set, frozenset)):
        raise UsageError("tags must be a list of names, e.g. tags=['orders', 'q3']")
    checked = []
    for tag in tags:
        if type(tag) is not str or not _TAG.fullmatch(tag):
            raise UsageError(f"the tag {tag!r} is not a name (letters, digits, _ . -, "
                             "at most 64 characters)")
        checked.append(tag)
    if len(checked) > MAX_TAGS:
        raise UsageError(f"a fact takes at most {MAX_TAGS} tags, not {len(checked)}")
    made = Fact(id=facts.next_id, text=text, tags=tuple(checked), op=op,
                at=utc_now() if at is None else at)
    facts.items.append(made)
    facts.next_id += 1
    return made
