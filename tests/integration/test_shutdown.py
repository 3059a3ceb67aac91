"""A kernel asked to shut down exits quietly, however its threads are scheduled.

The kernel runs as a real process started from a connection file, with its
stderr captured: a command that starts a kernel for itself (``kernos
grants`` on a workspace with none running) passes that stderr on to the
user, so a traceback printed while the kernel exits is a traceback the user
sees.
"""

from __future__ import annotations

import contextlib
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


def _shut_down_while(cell_source: str, tmp_path: Path) -> tuple[str, dict | None, str]:
    """Run ``cell_source`` (it prints "sleeping" when its own code runs), shut the kernel
    down through jupyter_client meanwhile; the kernel's stderr, the cell's reply (None if
    none came) and the cell's message id."""
    import os
    import queue

    from jupyter_client import KernelManager

    log = tmp_path / "kernel.stderr"
    manager = KernelManager(kernel_name="kernos", transport="ipc",
                            ip=str(tmp_path / "kernel-ipc"))
    with open(log, "w") as stderr:
        manager.start_kernel(env=dict(os.environ, KERNOS_WORKSPACE=str(tmp_path / "ws")),
                             stderr=stderr)
    client = manager.client()
    client.start_channels()
    reply = None
    try:
        client.wait_for_ready(timeout=120)
        cell = client.execute(cell_source)
        while True:  # the cell's own code is running once it prints
            message = client.get_iopub_msg(timeout=60)
            if (message["msg_type"] == "stream" and "sleeping" in message["content"]["text"]
                    and message["parent_header"].get("msg_id") == cell):
                break
        manager.shutdown_kernel(now=False)  # an interrupt, then a shutdown request
        with contextlib.suppress(queue.Empty):
            reply = client.get_shell_msg(timeout=10)
    finally:
        client.stop_channels()
        if manager.has_kernel:
            manager.shutdown_kernel(now=True)
    return log.read_text(), reply, cell


def test_shutdown_while_a_cell_runs_replies_to_it_and_prints_no_traceback(
        tmp_path: Path) -> None:
    """jupyter_client's ``shutdown_kernel`` interrupts the running cell, then asks the
    kernel to go: the cell's reply must leave before the shell channel closes, not meet a
    closed socket (``ZMQError``) on the kernel's stderr."""
    text, reply, cell = _shut_down_while(
        "import time; print('sleeping', flush=True); time.sleep(30)", tmp_path)
    assert "Traceback" not in text and "ZMQError" not in text, text
    assert reply is not None, f"the interrupted cell got no reply; the kernel said: {text}"
    assert reply["parent_header"]["msg_id"] == cell
    assert reply["content"]["status"] == "error", reply["content"]  # interrupted, rolled back


def test_a_shutdown_request_that_does_not_interrupt_the_cell_prints_no_traceback(
        tmp_path: Path) -> None:
    """A client that sends only ``shutdown_request`` (no interrupt) while a cell runs
    longer than the shutdown waits (``REPLY_WAIT``): the cell's reply then meets a closed
    shell channel, which the kernel says in one line, not a traceback, and it exits."""
    from kernos.kernel.leaving import REPLY_WAIT

    with raw_kernel(tmp_path, {"KERNOS_WORKSPACE": str(tmp_path / "ws")}) as (process,
                                                                               client):
        cell = client.execute(f"import time; print('sleeping', flush=True); "
                              f"time.sleep({REPLY_WAIT + 2})")
        while True:  # the cell's own code is running once it prints
            message = client.get_iopub_msg(timeout=60)
            if (message["msg_type"] == "stream" and "sleeping" in message["content"]["text"]
                    and message["parent_header"].get("msg_id") == cell):
                break
        client.shutdown()
        stderr = process.communicate(timeout=60)[1]
    assert process.returncode == 0, (process.returncode, stderr)
    assert "Traceback" not in stderr and "ZMQError" not in stderr, stderr
