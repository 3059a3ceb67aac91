"""``kernos-recall`` and ``kernos-remember`` through ``kernos mcp``, driven by a real MCP client.

The server runs as one principal for its whole life (``--principal``), so a
client can never recall another principal's memory: alice's server finds her
facts and the human's names her grants cover, never bob's, and a server run as
an agent without ``memory:read`` is refused (``denied``) with nothing run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from mcp import ClientSession, stdio_client

from kernos.client import run_kernel
from mcp_support import ENV, server, text

pytestmark = pytest.mark.kernel

TIMEOUT = 120


def test_recall_and_remember_over_mcp_as_the_servers_principal(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"

    async def scenario() -> None:
        async with run_kernel(workspace, env=ENV) as (_, kernel):
            assert (await kernel.op("secret_plan = 'echidna secret'\n"
                                    "open_plan = 'echidna open'")).committed
            for agent in ("alice", "bob", "carol"):
                await kernel.add_agent(agent)
            for capability in ("memory:read", "memory:write", "read:open_plan"):
                await kernel.grant("alice", capability)
            await kernel.grant("bob", "memory:write")
            await kernel.grant("bob", "memory:read")
            await kernel.remember("echidna fact of bob", principal="bob")

            async with stdio_client(server(workspace, "alice")) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                tools = {tool.name: tool for tool in (await session.list_tools()).tools}
                assert {"kernos-recall", "kernos-remember"} <= set(tools)
                assert all("principal" not in tool.input_schema.get("properties", {})
                           for tool in tools.values())
                stored = await session.call_tool("kernos-remember",
                                                 {"fact": "echidna lays eggs", "tags": ["zoo"]})
                assert not stored.is_error, text(stored)
                assert stored.structured_content["fact"]["text"] == "echidna lays eggs"
                found = await session.call_tool("kernos-recall", {"query": "echidna", "k": 50})
                assert not found.is_error, text(found)
                memories = found.structured_content["memories"]
                seen = {(m["kind"], m["principal"], m.get("name")) for m in memories}
                assert ("semantic", "alice", "1") in seen
                assert ("working", "human", "open_plan") in seen
                assert {principal for _, principal, _ in seen} == {"alice", "human"}, seen
                assert "secret" not in str(memories) and "bob" not in str(memories)
                bad = await session.call_tool("kernos-recall", {"query": "x", "k": 10**6})
                assert bad.is_error and "k" in text(bad)

            async with stdio_client(server(workspace, "carol")) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                head = (await kernel.log(limit=1))[0]["op"]
                refused = await session.call_tool("kernos-recall", {"query": "echidna"})
                assert refused.is_error and "memory:read" in text(refused), text(refused)
                refused = await session.call_tool("kernos-remember", {"fact": "carol was here"})
                assert refused.is_error and "memory:write" in text(refused), text(refused)
                assert (await kernel.log(limit=1))[0]["op"] == head  # nothing committed
            # The human's own recall does not see alice's facts either (they are hers).
            assert not [m for m in await kernel.recall("echidna lays eggs", k=50)
                        if m["kind"] == "semantic"]

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT))
