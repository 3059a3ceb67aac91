"""The harness client library (``kernos.client``) against real kernel processes.

Each test starts its own kernel through ``KernosManager`` / ``run_kernel`` /
``KernosClient.start`` and drives it over the Jupyter protocol.  Every
scenario runs under a deadline (``DEADLINE``), so a client that hangs fails
the test instead of stalling the suite.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from client_support import committed
from client_support import run as run_until
from kernos.client import (
    AsyncKernosClient,
    KernelDied,
    KernosClient,
    KernosManager,
    NoKernelRunning,
    ObjectInfo,
    OpResult,
    RequestError,
    retry_on_conflict,
    run_kernel,
)
from kernos.client._liveness import process_exists
from kernos.harness.protocol import VERSION

pytestmark = pytest.mark.kernel

DEADLINE = 120.0
Result = TypeVar("Result")


def run(scenario: Coroutine[Any, Any, Result], deadline: float = DEADLINE) -> Result:
    return run_until(scenario, deadline)


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while process_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not process_exists(pid)


# -- round trip, typed results, a second client ----------------------------------------

def test_round_trip_with_typed_results_and_a_second_client_sees_the_same_state(
        tmp_path: Path) -> None:
    workspace = tmp_path / "ws"

    async def scenario() -> None:
        async with run_kernel(workspace) as (manager, client):
            assert client.kernel_info["protocol"] == VERSION
            hello = await client.hello()
            assert hello["protocol"] == VERSION and Path(hello["workspace"]) == workspace

            result = committed(await client.op("prices = {'a': 1, 'b': 2}\nlen(prices)"))
            assert isinstance(result, OpResult) and result.added == ["prices"]
            assert result.value is not None and result.value.has_json
            assert result.value.json == 2 and result.versions["prices"] == 1
            failed = await client.op("prices['c'] = 3\nraise ValueError('bad tick')")
            # An op that raised is a result that says so, not an exception.
            assert not failed.committed and failed.error is not None
            assert failed.error.data["type"] == "ValueError" and failed.op is not None

            [listed] = await client.objects()
            assert isinstance(listed, ObjectInfo)
            assert (listed.name, listed.type, listed.version) == ("prices", "dict", 1)
            shown = await client.object("prices")
            assert shown.preview is not None and shown.preview.json == {"a": 1, "b": 2}

            # A second client, in the middle of the session, through <workspace>/kernel.json.
            async with await AsyncKernosClient.connect(workspace) as second:
                assert second.pid == manager.pid
                assert await second.objects() == await client.objects()
                assert await second.versions(["prices", "nothing"]) == {
                    "prices": 1, "nothing": None}
                committed(await second.op("prices['c'] = 3"))
                assert await client.versions(["prices"]) == {"prices": 2}
                assert [entry["op"] for entry in await client.log()] == [
                    entry["op"] for entry in await second.log()]

            # A request in an older protocol version is refused, clearly.
            reply = await client.send_raw({"v": VERSION - 1, "action": "hello"})
            assert reply["status"] == "error", reply
            error = RequestError.from_reply(reply)
            assert error.kind == "protocol" and error.data["supported"] == [VERSION]
            assert f"version {VERSION}" in error.message
            with pytest.raises(RequestError) as refused:
                await client.request("frobnicate")
            assert refused.value.kind == "malformed"
            # ... and refusing it did not hurt the client.
            assert (await client.versions(["prices"]))["prices"] == 2

            # A kernel that stops answering (its process exists) is reported once its
            # heartbeat has been silent for the client's grace period.
            watcher = await AsyncKernosClient.connect(workspace)
            watcher.heartbeat_grace = 1.0
            assert manager.pid is not None
            os.kill(manager.pid, signal.SIGSTOP)
            try:
                with pytest.raises(KernelDied, match="stopped answering its heartbeat"):
                    await asyncio.wait_for(watcher.versions(["prices"]), 10)
            finally:
                os.kill(manager.pid, signal.SIGCONT)
            await watcher.close()
            assert (await client.versions(["prices"]))["prices"] == 2

    run(scenario())


# -- many requests in flight -----------------------------------------------------------

def test_fifty_concurrent_requests_from_one_client_each_get_their_own_reply(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws") as (manager, client):
            second = await manager.client()
            ops = [client.op(f"v{number} = {number} * 3\nv{number}") for number in range(50)]
            reads = [client.versions([f"v{number}"]) for number in range(0, 50, 5)]
            others = [second.op(f"w{number} = -{number}\nw{number}") for number in range(10)]
            results = await asyncio.gather(*ops, *reads, *others)
            mine, versions, theirs = results[:50], results[50:60], results[60:]
            for number, result in enumerate(mine):
                assert isinstance(result, OpResult)
                committed(result)
                assert result.added == [f"v{number}"]
                assert result.value is not None and result.value.json == number * 3
            for number, result in enumerate(theirs):
                assert isinstance(result, OpResult) and result.value is not None
                assert result.value.json == -number
            for position, seen in enumerate(versions):
                assert isinstance(seen, dict) and list(seen) == [f"v{position * 5}"]
            numbers = [result.op for result in results if isinstance(result, OpResult)]
            assert len(set(numbers)) == 60
            await second.close()

    run(scenario())



def test_a_reply_that_arrives_while_the_client_sends_its_next_request_is_still_read(
        tmp_path: Path) -> None:
    # The race behind a hang under CPU load: a reply lands on the client's socket while its
    # event loop is busy, and the loop's next step sends a request before it polls.  That
    # send must not hide the reply from the client's reader (jupyter_client's own send did:
    # it goes around the asyncio socket, so the reader slept on with every reply unread).
    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws") as (_manager, client):
            committed(await client.op("a = 1"))
            loop = asyncio.get_running_loop()
            for _ in range(3):
                first = asyncio.ensure_future(client.versions(["a"]))
                await asyncio.sleep(0)  # first's request goes out
                # Next turn of the loop: blocked while first's reply arrives, then second
                # is sent, before the loop looks at its sockets again.
                loop.call_soon(time.sleep, 1.0)
                second = asyncio.ensure_future(client.versions(["a"]))
                both = await asyncio.wait_for(asyncio.gather(first, second), 30)
                assert both == [{"a": 1}, {"a": 1}]

    run(scenario())

# -- kill -9 in the middle of a run ----------------------------------------------------

def test_kill_9_mid_run_raises_kernel_died_and_a_restart_keeps_every_acknowledged_op(
        tmp_path: Path) -> None:
    workspace = tmp_path / "ws"

    async def scenario() -> None:
        manager = KernosManager(workspace)
        try:
            await manager.start()
            client = await manager.client()
            acknowledged: list[int] = []

            async def writer() -> None:
                for number in range(10_000):
                    result = await client.op(f"n{number} = {number}", key=f"write-{number}")
                    if result.committed:
                        acknowledged.append(number)

            writing = asyncio.ensure_future(writer())
            while len(acknowledged) < 5:
                await asyncio.sleep(0.01)
            # An op that is running when the kernel dies, with the writer's next op queued.
            slow = asyncio.ensure_future(client.op("import time\nslow = 1\ntime.sleep(60)"))
            await asyncio.sleep(0.3)
            pid = manager.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            for pending in (writing, slow):
                with pytest.raises(KernelDied) as died:
                    await asyncio.wait_for(pending, 10)
                assert "died" in str(died.value) and str(pid) in str(died.value)
            assert time.monotonic() - killed < 5, "KernelDied came late"
            # The client stays dead: it never sends to the next process.
            with pytest.raises(KernelDied):
                await client.versions(["n0"])
            # The killed kernel could not withdraw kernel.json; connect() sees it is stale.
            assert (workspace / "kernel.json").exists()
            with pytest.raises(NoKernelRunning, match="not running"):
                await AsyncKernosClient.connect(workspace)

            await manager.restart()
            assert manager.pid != pid
            client = await manager.client()
            names = [f"n{number}" for number in acknowledged] + ["slow"]
            versions = await client.versions(names)
            assert versions.pop("slow") is None
            assert versions == {name: 1 for name in versions}
            total = committed(await client.op("sum([" + ", ".join(versions) + "])"))
            assert total.value is not None and total.value.json == sum(acknowledged)
        finally:
            await manager.shutdown()
        assert not (workspace / "kernel.json").exists()

    run(scenario())


# -- the context manager always shuts the kernel down -----------------------------------

@pytest.mark.parametrize("ending", ["exception", "cancellation"])
def test_run_kernel_shuts_the_kernel_down_however_the_block_ends(
        tmp_path: Path, ending: str) -> None:
    workspace = tmp_path / "ws"
    started: list[int] = []

    async def body() -> None:
        async with run_kernel(workspace) as (manager, client):
            assert manager.pid is not None
            started.append(manager.pid)
            committed(await client.op("x = 1"))
            if ending == "exception":
                raise ValueError("the harness failed")
            await client.op("import time\ntime.sleep(60)")

    async def scenario() -> None:
        if ending == "exception":
            with pytest.raises(ValueError, match="the harness failed"):
                await body()
            return
        task = asyncio.ensure_future(body())
        while not started:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # the sleeping op is running
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())
    [pid] = started
    assert wait_gone(pid), f"kernel {pid} outlived run_kernel"
    assert not (workspace / "kernel.json").exists()


# -- events: committed only ------------------------------------------------------------

def test_subscribe_receives_committed_events_only_and_resumes_from_its_cursor(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws") as (manager, client):
            watcher = await manager.client()
            live = await watcher.subscribe(topic="orders.*")
            first = committed(await client.op(
                "events.emit('orders.created', {'id': 1})\n"
                "events.emit('stock.moved', {'id': 'ignored'})"))
            rolled_back = await client.op("events.emit('orders.created', {'id': 2})\n"
                                          "raise RuntimeError('cancelled')")
            assert not rolled_back.committed and rolled_back.events == []
            third = committed(await client.op("events.emit('orders.paid', {'id': 3})"))

            received = [await live.get(timeout=30), await live.get(timeout=30)]
            # Had the rolled-back op's event been sent, it would have come before id 3.
            assert [event["payload"]["id"] for event in received] == [1, 3]
            assert [event["op"] for event in received] == [first.op, third.op]
            assert received[1]["seq"] == third.events[0]["seq"]
            with pytest.raises(TimeoutError):
                await live.get(timeout=0.3)
            cursor = live.cursor
            assert cursor is not None and cursor >= received[1]["seq"]
            await live.close()

            # The durable log agrees, and a new subscription resumes after the cursor.
            pulled, _ = await client.events(since=0, topic="orders.*")
            assert [event["payload"]["id"] for event in pulled] == [1, 3]
            committed(await client.op("events.emit('orders.created', {'id': 4})"))
            resumed = await watcher.subscribe(since=cursor, topic="orders.*")
            assert [(await resumed.get(timeout=30))["payload"]["id"]] == [4]
            backlog = await watcher.subscribe(since=0, topic="orders.*")
            ids = [(await backlog.get(timeout=30))["payload"]["id"] for _ in range(3)]
            assert ids == [1, 3, 4]
            await backlog.close()
            await resumed.close()

    run(scenario())


# -- optimistic concurrency ------------------------------------------------------------

def test_retry_on_conflict_with_two_writers_loses_no_update(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws") as (manager, client):
            other = await manager.client()
            # None from versions() ("no such name") is a precondition too: it must not exist.
            seen = await client.versions(["counter"])
            assert seen == {"counter": None}
            committed(await client.op("counter = 0", expect_versions=seen))
            stale = await client.op("counter = 100", expect_versions=seen)
            assert stale.conflict and stale.versions["counter"] == 1
            assert (await client.op("counter = -1", predicate="counter > 5")).conflict

            conflicts = 0
            both_read = asyncio.Barrier(2)

            async def increment(writer: AsyncKernosClient, first: list[bool]) -> None:
                async def attempt() -> OpResult:
                    nonlocal conflicts
                    versions = await writer.versions(["counter"])           # read
                    current = await writer.object("counter")
                    assert current.preview is not None
                    if first:                                                # both read alike
                        first.clear()
                        await both_read.wait()
                    result = await writer.op(f"counter = {current.preview.json + 1}",
                                             expect_versions=versions)      # act
                    conflicts += result.conflict
                    return result

                for _ in range(10):
                    committed(await retry_on_conflict(attempt, attempts=100))

            await asyncio.gather(increment(client, [True]), increment(other, [True]))
            assert conflicts >= 1
            final = await client.object("counter")
            assert final.preview is not None and final.preview.json == 20
            await other.close()

    run(scenario())


# -- the blocking facade ---------------------------------------------------------------

def test_sync_facade_round_trip_kill_restart_subscribe_and_retry(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace) as client:
        pid = client.manager.pid
        assert pid is not None and client.manager.is_alive()
        committed(client.op("total = 10"))
        [info] = client.objects()
        assert info.name == "total" and info.version == 1

        stream = client.subscribe()
        committed(client.op("events.emit('totals.changed', {'total': 10})"))
        assert next(iter(stream))["payload"] == {"total": 10}
        stream.close()

        with KernosClient.connect(workspace) as second:
            assert second.versions(["total"]) == {"total": 1}

        client.manager.kill()
        assert not client.manager.is_alive()
        with pytest.raises(KernelDied):
            client.status()
        client.manager.restart()
        assert client.manager.pid != pid
        assert client.versions(["total"]) == {"total": 1}

        rival_wrote: list[bool] = []

        def attempt() -> OpResult:
            seen = client.versions(["total"])
            value = client.object("total").preview
            assert value is not None
            if not rival_wrote:           # someone else writes between our read and act
                rival_wrote.append(True)
                committed(client.op("total = 1000"))
            return client.op(f"total = {value.json + 1}", expect_versions=seen)

        result = client.retry_on_conflict(attempt)
        committed(result)
        assert client.op("total").value.json == 1001  # type: ignore[union-attr]
        new_pid = client.manager.pid
    assert new_pid is not None and wait_gone(new_pid)
    assert not process_exists(pid)
