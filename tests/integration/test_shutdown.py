"""A kernel asked to shut down exits quietly, however its threads are scheduled.

The kernel runs as a real process started from a connection file, with its
stderr captured: a command that starts a kernel for itself (``kernos
grants`` on a workspace with none running) passes that stderr on to the
user, so a traceback printed while the kernel exits is a traceback the user
sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

pytestmark = pytest.mark.kernel

SLOW_IDLE = Path(__file__).with_name("kernels") / "slow_idle.py"


def test_shutdown_with_a_slow_control_thread_prints_no_traceback(tmp_path: Path) -> None:
    connection, _ = write_connection_file(str(tmp_path / "connection.json"),
                                          transport="ipc", ip=str(tmp_path / "k"))
    env = dict(os.environ, KERNOS_WORKSPACE=str(tmp_path / "ws"))
    process = subprocess.Popen([sys.executable, str(SLOW_IDLE), "-f", connection],
                               stderr=subprocess.PIPE, text=True, env=env)
    client = BlockingKernelClient(connection_file=connection)
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        reply = client.execute("x = 1", reply=True, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        client.shutdown()
        stderr = process.communicate(timeout=60)[1]
    finally:
        client.stop_channels()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, (process.returncode, stderr)
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
