"""The escape corpus: every payload, by category (see ``payload`` for what they are)."""

from __future__ import annotations

from security.corpus_bombs import BOMBS
from security.corpus_effects import EFFECTS
from security.corpus_reach import REACH
from security.payload import Payload

CORPUS: list[Payload] = REACH + EFFECTS + BOMBS
CATEGORIES = ("frames", "format", "dunder", "imports", "reduce", "baseexception", "swallow",
              "typeconfusion", "namespaces", "timebombs", "resources")


def ids(payloads: list[Payload]) -> list[str]:
    """``category-index`` for each payload (index counted within its category, from 1)."""
    counts: dict[str, int] = {}
    names = []
    for payload in payloads:
        counts[payload.category] = counts.get(payload.category, 0) + 1
        names.append(f"{payload.category}-{counts[payload.category]}")
    return names
