"""The README's main job: `kernos demo` runs the whole seed demonstration and every check holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.slow]


def test_the_demo_passes_every_check(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kernos.cli", "demo", "--workspace",
                           str(tmp_path / "demo")], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "DEMO FAILED" not in done.stdout + done.stderr
    for claim in ("conflict", "KernelDied", "exactly as before the kill", "verified",
                  "the payment ran once", "hash for hash", "the replay executed no effect",
                  "the circuit opened", "the new kernel resumed the loop by itself",
                  "each iteration committed exactly once, in order, across the kill"):
        assert claim in done.stdout, claim
    assert done.stdout.count("[ok]") >= 29
    payments = (tmp_path / "demo-payments.jsonl").read_text().splitlines()
    assert len(payments) == 1  # paid once, and not again by the replays
