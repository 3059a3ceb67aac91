"""Attaching to a gateway kernel that is already running, by its workspace name.

``AsyncKernosClient.connect(name, gateway=URL)`` (and ``KernosClient.connect``) finds
the kernel the gateway runs for that workspace, among others, talks to it, and
leaves it running when it closes; a name no kernel serves gives ``NoKernelRunning``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from gateway_support import Gateway, through
from kernos.client import AsyncKernosClient, KernosClient, NoKernelRunning, run_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow]


def test_connect_finds_the_kernel_of_a_workspace_among_others_and_leaves_it_running(
        gateway: Gateway) -> None:
    async def scenario() -> None:
        async with run_kernel("attach-a", gateway=gateway.url, token=gateway.token) as (
                _, first), run_kernel("attach-b", gateway=gateway.url,
                                      token=gateway.token) as (_, second):
            assert (await first.op("who = 'a'")).committed
            assert (await second.op("who = 'b'")).committed
            for name in ("attach-b", "attach-a"):
                attached = await AsyncKernosClient.connect(name, gateway=gateway.url,
                                                           token=gateway.token)
                try:
                    assert (await attached.op("who")).value.repr == repr(name[-1])
                    assert (await attached.op(f"seen_{name[-1]} = True")).committed
                finally:
                    await attached.close()
            # The owners' kernels still run, and saw what the attached clients did.
            assert (await first.op("seen_a")).value.repr == "True"
            assert (await second.op("seen_b")).value.repr == "True"
            with pytest.raises(NoKernelRunning, match="'attach-none'"):
                await AsyncKernosClient.connect("attach-none", gateway=gateway.url,
                                                token=gateway.token)

    asyncio.run(asyncio.wait_for(scenario(), 180))


def test_the_blocking_client_connects_through_the_gateway(gateway: Gateway) -> None:
    with KernosClient.start("attach-sync", gateway=gateway.url, token=gateway.token) as owner:
        assert owner.op("n = 41").committed
        with KernosClient.connect("attach-sync", gateway=gateway.url,
                                  token=gateway.token) as attached:
            assert attached.op("n += 1").committed
        assert owner.op("n").value.repr == "42"


def test_the_cli_uses_the_gateway_kernel_that_serves_the_workspace(gateway: Gateway) -> None:
    with KernosClient.start("attach-cli", gateway=gateway.url, token=gateway.token) as owner:
        assert owner.op("visits = 1").committed
        done = through(gateway, "run", "-w", "attach-cli", "--json", "visits += 1\nvisits")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["value"]["json"] == 2
        listed = through(gateway, "objects", "-w", "attach-cli", "--no-start", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [item["name"] for item in json.loads(listed.stdout)["objects"]] == ["visits"]
        # The CLI borrowed the owner's kernel and left it running.
        assert owner.op("visits").value.repr == "2"
    # With no kernel on the name, --no-start refuses and starts nothing.
    refused = through(gateway, "grants", "-w", "attach-cli", "--no-start")
    assert refused.returncode == 4
    assert "no kernel is running on attach-cli through the gateway" in refused.stderr
    assert gateway.api("/api/kernels") == []


def test_events_through_the_gateway_from_the_log_and_followed_live(gateway: Gateway) -> None:
    with KernosClient.start("attach-events", gateway=gateway.url,
                            token=gateway.token) as owner:
        assert owner.op("events.emit('orders.created', {'id': 1})").committed
        follower = subprocess.Popen(
            [sys.executable, "-m", "kernos.cli", "events", "-w", "attach-events", "--follow",
             "-n", "3", "--json", "--gateway", gateway.url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "KERNOS_GATEWAY_TOKEN": gateway.token})
        try:
            # The backlog (one event), then two that commit while it follows; the one of a
            # rolled-back op never shows.
            first = follower.stdout.readline() if follower.stdout else ""
            assert json.loads(first)["payload"] == {"id": 1}, follower.stderr
            assert not owner.op("events.emit('orders.created', {'id': 2})\n1 / 0").committed
            assert owner.op("events.emit('orders.paid', {'id': 3})").committed
            assert owner.op("events.emit('orders.paid', {'id': 4})").committed
            out, err = follower.communicate(timeout=60)
        finally:
            follower.kill()
        assert follower.returncode == 0, err
        assert [json.loads(line)["payload"]["id"] for line in out.splitlines()] == [3, 4]
    # From the log with no kernel running: one is started through the gateway for the read.
    logged = through(gateway, "events", "-w", "attach-events", "--json", "--topic", "orders.*")
    assert logged.returncode == 0, logged.stderr
    assert [json.loads(line)["payload"]["id"] for line in logged.stdout.splitlines()] == [
        1, 3, 4]
    followed = through(gateway, "events", "-w", "attach-events", "--follow")
    assert followed.returncode == 4
    assert "no kernel is running on attach-events through the gateway" in followed.stderr
    assert gateway.api("/api/kernels") == []
