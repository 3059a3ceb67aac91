"""The ``kernos`` command as the tests run it: the installed script, or ``python -m kernos.cli``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["kernos", "ok"]


def kernos(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``kernos ARGS`` and capture what it says (five minutes at most)."""
    script = Path(sys.executable).with_name("kernos")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kernos.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """The output of a run that must have succeeded (exit status 0)."""
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout
