"""Random kill -9 torture, bounded for the suite (``bench/torture.py`` runs 500 kills;
``scripts/long-tests`` runs it).

Fifteen kernels are killed (a third of them at a crash point of the write path
chosen at random, the rest by SIGKILL at a random instant) while three clients
send a mixed workload with idempotency keys: human ops that emit events, agent
ops under a spend budget and an LLM token budget (recorded calls, answered
offline), pure tool calls, external effects and checkouts.  After each kill:
verify and ``git fsck`` are clean, a replay of the ops since the last check
reproduces their snapshots, every acknowledged op is there once with its
event, no op is half there, every effect ran at most once and is done or in
doubt, no budget is overspent, and ops in flight at the kill run at most once
when resent under their key.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from torture import torture  # noqa: E402


def test_fifteen_random_kills_break_no_invariant(tmp_path: Path) -> None:
    tally = asyncio.run(torture(tmp_path / "ws", kills=15, clients=3, seed=18,
                                progress=False))
    assert tally.violations == []
    assert tally.kills == 15 and sum(tally.acknowledged.values()) > 15
    assert tally.crash_points > 0 and tally.resent > 0  # both kinds of kill, and resends
    # Every kind of op was acknowledged, and checked, under kills.
    assert set(tally.acknowledged) == {"human", "spend", "llm", "tool", "effect"}
    assert tally.checkouts > 0 and len(tally.effects) > 0 and tally.replayed > 30
    assert set(tally.effects.values()) <= {"done", "in-doubt"}
