"""Group commit through a real kernel: harness ops that queue while a sync runs share the
next one, and no reply says "committed" before its op is durable (I2).

``KERNOS_PAUSE_AT=tail.sync:SECONDS`` makes every sync of the commit tail take that long
(a slow disk), so the test knows which ops arrive while one runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kernos.client import AsyncKernosClient, KernosClient, run_kernel
from support import assert_workspace_sound

pytestmark = pytest.mark.kernel

SYNC = 0.5


async def four_ops(workspace: Path, env: dict[str, str]) -> tuple[list[float], float,
                                                               dict[str, int]]:
    """Client 0 sends an op; while its sync runs, clients 1-3 send theirs.  The seconds
    from the first send to each reply, the total, and the kernel's commit counters."""
    async with run_kernel(workspace, env=env) as (_manager, owner):
        assert (await owner.op("n = 0")).committed
        clients = [await AsyncKernosClient.connect(workspace) for _ in range(4)]
        try:
            started = time.monotonic()
            done: list[float] = [0.0] * 4

            async def send(index: int) -> None:
                result = await clients[index].op("n += 1")
                assert result.committed, result
                done[index] = time.monotonic() - started

            first = asyncio.ensure_future(send(0))
            await asyncio.sleep(SYNC / 3)
            await asyncio.gather(first, *(send(index) for index in range(1, 4)))
            total = time.monotonic() - started
        finally:
            for client in clients:
                await client.close()
        value = (await owner.op("n")).value
        assert value is not None and value.json == 4
        return done, total, (await owner.status())["commits"]


def test_ops_queued_during_a_sync_share_the_next_one(tmp_path: Path) -> None:
    done, total, commits = asyncio.run(
        four_ops(tmp_path / "ws", {"KERNOS_PAUSE_AT": f"tail.sync:{SYNC}"}))
    assert min(done) >= SYNC  # no reply before a sync covered its op
    # Two syncs for the four ops (client 0's, then one for the three that queued), not four.
    assert total < 3 * SYNC, (done, total)
    assert commits["small"] == 5 and commits["syncs"] <= 3, commits


def test_without_group_commit_each_op_waits_for_its_own_sync(tmp_path: Path) -> None:
    done, total, commits = asyncio.run(four_ops(
        tmp_path / "ws", {"KERNOS_PAUSE_AT": f"tail.sync:{SYNC}", "KERNOS_GROUP_COMMIT": "off"}))
    assert min(done) >= SYNC and total >= 4 * SYNC, (done, total)
    assert commits["small"] == commits["syncs"] == 5, commits


def test_a_cell_after_a_grouped_op_waits_for_its_sync(kernel_factory: Any) -> None:
    """A cell (any request but a harness op) first makes the commits before it durable,
    so its output never shows an op that a crash could still take back."""
    kernel = kernel_factory(env={"KERNOS_PAUSE_AT": f"tail.sync:{SYNC}"})
    assert kernel.run("n = 0").committed
    results: list[Any] = []
    with KernosClient.connect(kernel.workspace) as client:
        time.sleep(0.3)  # the kernel idles and folds: then only a sync makes the op durable
        grouped = threading.Thread(target=lambda: results.append(client.op("n = 1")))
        grouped.start()
        time.sleep(SYNC / 3)
        started = time.monotonic()
        cell = kernel.run("print(n)")
        waited = time.monotonic() - started
        grouped.join(30)
    assert results and results[0].committed
    assert cell.stdout.strip() == "1" and waited >= SYNC / 2, (cell.stdout, waited)


def test_kill_9_while_a_group_waits_for_its_sync(kernel_factory: Any) -> None:
    """SIGKILL while grouped ops wait for their sync: the ops acknowledged before are
    there, the waiting ones were never acknowledged (there or not, whole), and the
    workspace verifies and passes ``git fsck``."""
    kernel = kernel_factory(env={"KERNOS_PAUSE_AT": "tail.sync:5"})
    assert kernel.run("log = []").committed
    outcomes: list[Any] = []
    with KernosClient.connect(kernel.workspace) as client:
        assert client.op("log.append(1)").committed  # acknowledged after its sync (5 s)
        time.sleep(0.3)

        def send(value: int) -> None:
            try:
                outcomes.append(client.op(f"log.append({value})"))
            except Exception as error:
                outcomes.append(error)

        waiting = [threading.Thread(target=send, args=(value,)) for value in (2, 3)]
        for thread in waiting:
            thread.start()
        time.sleep(1.0)  # both committed to the tail, their sync paused
        kernel.kill9()
        for thread in waiting:
            thread.join(30)
    assert len(outcomes) == 2 and not any(
        getattr(outcome, "committed", False) for outcome in outcomes), outcomes

    again = kernel_factory(kernel.workspace)
    log = again.value("log")
    assert log in ([1], [1, 2], [1, 2, 3]), log  # a prefix: never 3 without 2
    assert_workspace_sound(again.workspace)
