"""Attaching to a gateway kernel that is already running, by its workspace name.

``AsyncKernosClient.connect(name, gateway=URL)`` (and ``KernosClient.connect``) finds
the kernel the gateway runs for that workspace, among others, talks to it, and
leaves it running when it closes; a name no kernel serves gives ``NoKernelRunning``.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway_support import Gateway
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
