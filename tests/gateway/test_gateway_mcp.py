"""``kernos mcp --gateway URL``: a real MCP client drives a workspace whose kernel runs under a
real Enterprise Gateway, over stdio.

The server attaches to the gateway kernel already serving the workspace's name (and leaves
it running), or starts one through the gateway for its own life when none does.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from gateway_support import Gateway
from kernos.client import run_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow]


def _server(gateway: Gateway, name: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernos.mcp", "--gateway", gateway.url, "--workspace", name],
        env={**os.environ, "KERNOS_GATEWAY_TOKEN": gateway.token or ""})


async def _op(session: ClientSession, code: str) -> dict[str, Any]:
    result = await session.call_tool("kernos-op", {"code": code})
    assert not result.is_error, result
    content = result.structured_content
    assert content is not None and content["status"] == "committed", content
    return content


def test_mcp_over_a_gateway_kernel_that_runs_and_one_it_starts(gateway: Gateway) -> None:
    async def scenario() -> None:
        async with run_kernel("mcp-running", gateway=gateway.url,
                              token=gateway.token) as (_, owner):
            assert (await owner.op("basket = ['apple']")).committed
            async with stdio_client(_server(gateway, "mcp-running")) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                op = await _op(session, "basket.append('pear')\nlen(basket)")
                assert op["value"]["json"] == 2
            # The server used the owner's kernel and left it running.
            assert (await owner.op("basket")).value.repr == "['apple', 'pear']"

        # No kernel serves this name: the server starts one through the gateway, and
        # what it committed is in that workspace for the next kernel.
        async with stdio_client(_server(gateway, "mcp-started")) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            await _op(session, "found = 'by mcp'")
        async with run_kernel("mcp-started", gateway=gateway.url,
                              token=gateway.token) as (_, later):
            assert (await later.op("found")).value.repr == "'by mcp'"

    asyncio.run(asyncio.wait_for(scenario(), 240))
