"""Random kill -9 torture, bounded for the suite (``bench/torture.py`` runs 500 kills).

Thirty kernels are killed (a third of them at a crash point of the write path
chosen at random, the rest by SIGKILL at a random instant) while three clients
send ops with idempotency keys.  After each kill: verify and ``git fsck`` are
clean, every acknowledged op is there once, no op is half there, and ops in
flight at the kill run at most once when resent under their key.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from torture import torture  # noqa: E402


def test_thirty_random_kills_break_no_invariant(tmp_path: Path) -> None:
    tally = asyncio.run(torture(tmp_path / "ws", kills=30, clients=3, seed=18,
                                progress=False))
    assert tally.violations == []
    assert tally.kills == 30 and tally.acknowledged > 30
    assert tally.crash_points > 0 and tally.resent > 0  # both kinds of kill, and resends
