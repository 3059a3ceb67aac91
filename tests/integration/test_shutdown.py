"""A kernel asked to shut down exits quietly, however its threads are scheduled.

The kernel runs as a real process started from a connection file, with its
stderr captured: a command that starts a kernel for itself (``kernos
grants`` on a workspace with none running) passes that stderr on to the
user, so a traceback printed while the kernel exits is a traceback the user
sees.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support import raw_kernel

pytestmark = pytest.mark.kernel

SLOW_IDLE = Path(__file__).with_name("kernels") / "slow_idle.py"


def test_shutdown_with_a_slow_control_thread_prints_no_traceback(tmp_path: Path) -> None:
    with raw_kernel(tmp_path, {"KERNOS_WORKSPACE": str(tmp_path / "ws")},
                    str(SLOW_IDLE)) as (process, client):
        reply = client.execute("x = 1", reply=True, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        client.shutdown()
        stderr = process.communicate(timeout=60)[1]
    assert process.returncode == 0, (process.returncode, stderr)
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
