"""Kernos kernels through a real Enterprise Gateway on loopback: the same client, the same
results, the same ``KernelDied``.

Cells (``execute_request`` over the gateway's websocket) commit and roll back with
their ``metadata["kernos"]`` report; harness ops and ``kernos_request``s work
through ``KernosManager(name, gateway=URL)``; eight workspaces driven at once each
keep their own state and history on disk; a kernel SIGKILLed on the gateway's host
makes its client raise ``KernelDied``, and a restart through the gateway brings back
the exact state; a kernel the gateway culls for idleness comes back, on the same
workspace name, with its state.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from client_support import committed
from client_support import run as run_until
from gateway_support import CHECKOUT, Gateway, execute, kernel_pids
from kernos.client import KernelDied, KernosManager, run_kernel
from kernos.client.gateway_transport import GatewayAPI
from kernos.store.workspace import Workspace

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

DEADLINE = 180.0
Result = TypeVar("Result")


def run(scenario: Coroutine[Any, Any, Result], deadline: float = DEADLINE) -> Result:
    return run_until(scenario, deadline)


def history_on_disk(gateway: Gateway, name: str) -> tuple[int, list[str]]:
    """The workspace's head op and the headline (first line of code) of its ops, oldest
    first, read from disk."""
    from kernos import history

    with Workspace.open(gateway.root / name, writable=False, create=False) as workspace:
        entries = history.log(workspace)
    return entries[0].op, [entry.headline for entry in reversed(entries)]


def test_cells_harness_ops_and_requests_through_the_gateway(gateway: Gateway) -> None:
    name = "basics"

    async def scenario() -> None:
        async with run_kernel(name, gateway=gateway.url, token=gateway.token) as (manager,
                                                                                  client):
            assert manager.workspace == name and manager.pid is None
            hello = await client.hello()
            assert hello["workspace"] == str(gateway.root / name)  # the root, and the name
            # The gateway's kernels run this tree's code (the kernelspec's PYTHONPATH).
            where = await client.op("import kernos\n_where = kernos.__file__")
            assert where.committed
            source = await client.op("_where")
            assert source.value is not None
            assert source.value.json == str(CHECKOUT / "kernel" / "kernos" / "__init__.py")
            # Cells, as a notebook sends them through the gateway.
            api = GatewayAPI(gateway.url, token=gateway.token)
            assert manager.gateway is not None and manager.gateway.kernel_id is not None
            channels = await api.channels(manager.gateway.kernel_id)
            try:
                reply = await execute(channels, "counter = 1\nitems = [1, 2]")
                assert reply["content"]["status"] == "ok"
                assert reply["metadata"]["kernos"]["status"] == "committed"
                reply = await execute(channels, "counter = 99\nitems.append(3)\n1 / 0")
                assert reply["content"]["status"] == "error"
                assert reply["metadata"]["kernos"]["status"] == "rolled back"
            finally:
                channels.close()
            # Harness ops and requests see exactly what the cells left.
            assert (await client.object("counter")).preview.json == 1
            assert (await client.object("items")).preview.json == [1, 2]
            committed(await client.op("counter += 1"))
            failed = await client.op("counter = 1000\nraise ValueError('no')")
            assert not failed.committed
            await client.add_agent("alice")
            await client.grant("alice", "read:counter")
            read = committed(await client.op("seen = read('counter')", principal="alice"))
            assert read.principal == "alice"
            assert [grant["capability"] for grant in await client.grants("alice")] == [
                "read:counter"]
            assert {"counter", "items"} <= {info.name for info in await client.objects()}
            assert (await client.object("counter")).preview.json == 2
            log = await client.log()
            assert log[0]["op"] == read.op
            head = log[0]["op"]
        # Shut down through the gateway: its history is on disk under the root.
        on_disk, codes = history_on_disk(gateway, name)
        assert on_disk == head
        assert codes[1:3] == ["counter = 1 (+1 lines)", "counter += 1"]
        assert not await GatewayAPI(gateway.url, token=gateway.token).kernels()

    run(scenario())


def test_eight_workspaces_at_once_each_with_its_own_state_and_history(gateway: Gateway) -> None:
    names = [f"many-{index}" for index in range(8)]
    ops = 12

    async def drive(name: str, index: int) -> int:
        async with run_kernel(name, gateway=gateway.url, token=gateway.token) as (_, client):
            committed(await client.op(f"owner = {name!r}\ntotal = 0"))
            for step in range(ops):
                committed(await client.op(f"total += {index + 1}", key=f"{name}-{step}"))
            assert (await client.object("total")).preview.json == (index + 1) * ops
            assert (await client.object("owner")).preview.json == name
            return int((await client.log(limit=1))[0]["op"])

    async def scenario() -> list[int]:
        return list(await asyncio.gather(*(drive(name, index)
                                           for index, name in enumerate(names))))

    heads = run(scenario())
    for index, name in enumerate(names):
        head, codes = history_on_disk(gateway, name)
        assert head == heads[index]
        assert codes == [f"owner = {name!r} (+1 lines)"] + [f"total += {index + 1}"] * ops


def test_a_kernel_killed_on_the_gateway_host_raises_kernel_died_and_restarts_exact(
        gateway: Gateway) -> None:
    name = "crash"

    async def scenario() -> None:
        manager = KernosManager(name, gateway=gateway.url, token=gateway.token)
        await manager.start()
        try:
            client = await manager.client()
            committed(await client.op("import numpy\nvalues = {'a': [1, 2], 'n': 7}\n"
                                      "shared = [values, values]"))
            last = committed(await client.op("values['n'] += 1"))
            assert manager.gateway is not None and manager.gateway.kernel_id is not None
            pid = gateway.kernel_pid(manager.gateway.kernel_id)
            waiting = asyncio.ensure_future(client.op("import time\ntime.sleep(30)\n"
                                                      "values['n'] = -1"))
            await asyncio.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(KernelDied) as died:
                await waiting
            assert died.value.action == "op"
            with pytest.raises(KernelDied):  # the client belongs to the dead process
                await client.hello()
            await manager.restart()
            again = await manager.client()
            assert (await again.log(limit=1))[0]["op"] == last.op  # the history head
            assert (await again.object("values")).preview.json == {"a": [1, 2], "n": 8}
            assert (await again.op("assert shared[0] is shared[1] is values")).committed
            assert gateway.kernel_pid(manager.gateway.kernel_id) != pid
        finally:
            await manager.shutdown()

    run(scenario())


def test_a_culled_kernel_comes_back_with_its_state_on_the_same_name(gateway: Gateway) -> None:
    name = f"culled-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        manager = KernosManager(name, gateway=gateway.url, token=gateway.token)
        await manager.start()
        client = await manager.client()
        committed(await client.op("notes = ['before the cull']"))
        head = (await client.log(limit=1))[0]["op"]
        assert manager.gateway is not None and manager.gateway.kernel_id is not None
        kernel_id = manager.gateway.kernel_id
        await client.close()  # idle, and nobody connected: the gateway may cull it
        api = GatewayAPI(gateway.url, token=gateway.token)
        deadline = time.monotonic() + 60
        while await api.kernel(kernel_id) is not None:
            assert time.monotonic() < deadline, "the gateway did not cull the idle kernel"
            await asyncio.sleep(0.5)
        assert not kernel_pids(f"kernel-{kernel_id}.json")
        assert not await manager.is_alive()
        # A new kernel on the same name (here from a new manager) restores it.
        async with run_kernel(name, gateway=gateway.url, token=gateway.token) as (_, resumed):
            assert (await resumed.object("notes")).preview.json == ["before the cull"]
            assert (await resumed.log(limit=1))[0]["op"] == head
            committed(await resumed.op("notes.append('after')"))

    run(scenario())


def test_events_interrupts_and_a_stop_through_the_gateway(gateway: Gateway) -> None:
    """The comm (events), the control channel (interrupt) and ``kill()`` over the websocket."""

    async def scenario() -> None:
        manager = KernosManager("signals", gateway=gateway.url, token=gateway.token)
        await manager.start()
        try:
            client, watcher = await manager.client(), await manager.client()
            live = await watcher.subscribe(topic="orders.*")
            first = committed(await client.op("events.emit('orders.created', {'id': 1})"))
            rolled = await client.op("events.emit('orders.created', {'id': 2})\n1 / 0")
            assert not rolled.committed
            third = committed(await client.op("events.emit('orders.paid', {'id': 3})"))
            received = [await live.get(timeout=30), await live.get(timeout=30)]
            assert [(event["op"], event["payload"]["id"]) for event in received] == [
                (first.op, 1), (third.op, 3)]
            await live.close()

            committed(await client.op("x = 0"))
            slow = asyncio.ensure_future(client.op(
                "x = 1\nimport time\nfor _ in range(600):\n    time.sleep(0.05)", key="slow"))
            for _ in range(600):
                reply = await watcher.interrupt(key="slow")
                if reply["interrupted"]:
                    break
                await asyncio.sleep(0.05)
            result = await asyncio.wait_for(slow, 60)
            assert result.status == "interrupted" and result.op == reply["op"]
            assert (await client.object("x")).preview.json == 0  # rolled back

            await manager.kill()  # through a gateway: stopped now, by the gateway
            for each in (client, watcher):
                with pytest.raises(KernelDied):
                    await each.hello()
            assert not await manager.is_alive()
            assert not await GatewayAPI(gateway.url, token=gateway.token).kernels()
        finally:
            await manager.shutdown()

    run(scenario())
