"""Harness ops are interrupted like cells: SIGINT stops an op's body, never its commit.

Real kernels through the client: a client interrupts its own op by key (on the
control channel, while the shell is busy with the op), a plain SIGINT stops
whichever op body runs, an interrupt aimed at an op that is not running hits
nothing, and a SIGINT that arrives while an op commits (its sync slowed to
1.5 s) is dropped: the op commits.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from kernos.client import AsyncKernosClient, run_kernel

pytestmark = pytest.mark.kernel

SLOW = "import time\nx = 1\nfor _ in range(1200):\n    time.sleep(0.05)\nx = 2"


def _sigint_by_default() -> None:
    """In the child, before it runs Python: SIGINT as a terminal's Ctrl-C delivers it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def _until_running(client: AsyncKernosClient, key: str) -> dict[str, object]:
    """Interrupt ``key`` as soon as its body runs."""
    for _ in range(600):
        reply = await client.interrupt(key=key)
        if reply["interrupted"]:
            return reply
        await asyncio.sleep(0.05)
    raise AssertionError(f"op {key} never ran: {reply}")


def test_an_op_is_interrupted_by_its_key_and_rolls_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws") as (manager, owner):
            other = await AsyncKernosClient.connect(tmp_path / "ws")
            try:
                assert (await owner.op("x = 0")).committed
                assert (await other.interrupt(key="slow")) == {
                    "interrupted": False, "running": None,
                    "reason": "that op's body is not running (it has not started, or it is "
                              "committing, or it ended)"}
                slow = asyncio.ensure_future(owner.op(SLOW, key="slow"))
                reply = await _until_running(other, "slow")
                result = await asyncio.wait_for(slow, 30)
                assert result.status == "interrupted" and result.op == reply["op"]
                assert "KeyboardInterrupt" in (result.error.data.get("type", "")
                                               if result.error else "")
                assert (await owner.op("x")).value.json == 0  # rolled back
                # Never committed, so its key is free: a resend runs.
                assert (await owner.op("x = 3", key="slow")).committed
                # A plain SIGINT (Jupyter's interrupt) stops whichever op body runs.
                slow = asyncio.ensure_future(owner.op(SLOW, key="plain"))
                await asyncio.sleep(0.5)
                assert manager.pid is not None
                os.kill(manager.pid, signal.SIGINT)
                assert (await asyncio.wait_for(slow, 30)).status == "interrupted"
                assert (await owner.op("x")).value.json == 3
                assert (await other.interrupt(op=10**6))["interrupted"] is False
                assert "exactly one" in (await other.interrupt())["error"]
            finally:
                await other.close()

    asyncio.run(asyncio.wait_for(scenario(), 180))


def test_a_sigint_during_the_commit_is_dropped_and_the_op_commits(tmp_path: Path) -> None:
    env = {"KERNOS_GROUP_COMMIT": "off", "KERNOS_PAUSE_AT": "tail.sync:1.5"}

    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws", env=env) as (manager, owner):
            other = await AsyncKernosClient.connect(tmp_path / "ws")
            try:
                committing = asyncio.ensure_future(owner.op("y = 1", key="c"))
                await asyncio.sleep(0.7)  # in its commit's (slowed) sync
                assert (await other.interrupt(key="c"))["interrupted"] is False
                assert manager.pid is not None
                os.kill(manager.pid, signal.SIGINT)
                result = await asyncio.wait_for(committing, 30)
                assert result.committed, result.error
                assert (await owner.op("y")).value.json == 1
                assert await manager.is_alive()
            finally:
                await other.close()

    asyncio.run(asyncio.wait_for(scenario(), 180))


def test_ctrl_c_on_kernos_run_interrupts_its_op_in_a_running_kernel(tmp_path: Path) -> None:
    """The CLI's op in a kernel others share: Ctrl-C stops that op (by the key the CLI
    gave it), not the kernel and not anyone else's op."""
    import subprocess
    import sys

    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws") as (manager, owner):
            assert (await owner.op("x = 0")).committed
            started = tmp_path / "started"
            code = f"import pathlib\npathlib.Path({str(started)!r}).touch()\n{SLOW}"
            # Started in the background by a shell (as CI may run the suite), this process
            # ignores SIGINT, and so would the CLI it starts: Python raises
            # KeyboardInterrupt only where SIGINT was not ignored when it started.
            cli = subprocess.Popen(
                [sys.executable, "-m", "kernos.cli", "run", "-w", str(tmp_path / "ws"), code],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                preexec_fn=_sigint_by_default)
            try:
                for _ in range(1200):  # until its op's body runs
                    if started.exists():
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)
                cli.send_signal(signal.SIGINT)
                _out, err = await asyncio.to_thread(cli.communicate, timeout=60)
            finally:
                if cli.poll() is None:
                    cli.kill()
            assert cli.returncode != 0
            assert "interrupted in the running kernel and rolled back" in err, err
            assert (await owner.op("x")).value.json == 0
            assert await manager.is_alive()

    asyncio.run(asyncio.wait_for(scenario(), 180))
