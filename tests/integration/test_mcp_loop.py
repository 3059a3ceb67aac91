"""``kernos-loop``: agents' loops through ``kernos mcp``, driven by a real MCP client.

One running kernel; a server as ``human`` starts, reads, pauses, resumes and
stops a loop, and sees what its iterations printed; a server as the agent
``bob`` reads only its own loop and changes none (only the human changes a
loop, as the harness ``loop`` action allows).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, stdio_client

from kernos.client import run_kernel
from mcp_support import ENV, server, text

pytestmark = pytest.mark.kernel

TIMEOUT = 120
STEP = "print('bob says', loop_state()['iteration'])"


async def _call(session: ClientSession, arguments: dict[str, Any], *,
                error: bool = False) -> Any:
    result = await session.call_tool("kernos-loop", arguments)
    assert result.is_error is error, text(result)
    return result


async def _as_human(session: ClientSession, kernel: Any) -> None:
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    schema = tools["kernos-loop"].input_schema
    assert schema["required"] == ["do"] and schema["additionalProperties"] is False
    assert schema["properties"]["do"]["enum"] == ["status", "pause", "resume", "stop", "start"]

    started = await _call(session, {"do": "start", "agent": "bob", "step": STEP,
                                    "max_iterations": 2})
    assert started.structured_content["loop"]["status"] == "running"
    assert "bob: running at iteration 0" in text(started)
    while True:   # the kernel's driver turns it; the test's TIMEOUT bounds the wait
        status = await _call(session, {"do": "status", "agent": "bob"})
        [bob] = status.structured_content["loops"]
        if bob["status"] == "finished":
            break
        await asyncio.sleep(0.05)
    assert bob["output"]["text"] == "bob says 1\n" and bob["output"]["op"] == bob["last_op"]
    assert "last output (op" in text(status) and "    bob says 1" in text(status)

    # Bad calls are refused before anything is sent, and say why.
    for arguments, fragment in (({"do": "pause"}, "needs 'agent'"),
                                ({"do": "start", "agent": "bob"}, "needs 'step'"),
                                ({"do": "pause", "agent": "bob", "step": "x = 1"},
                                 "do not go with"),
                                ({"do": "jump", "agent": "bob"}, "'do'")):
        refused = await _call(session, arguments, error=True)
        assert fragment in text(refused), text(refused)

    again = await _call(session, {"do": "start", "agent": "bob", "step": STEP,
                                  "every_ms": 3_600_000})
    assert again.structured_content["loop"]["status"] == "running"
    paused = await _call(session, {"do": "pause", "agent": "bob"})
    assert paused.structured_content["loop"]["status"] == "paused"
    assert (await kernel.request("loop", do="status", agent="bob"))["loops"][0][
        "status"] == "paused"   # in the image
    resumed = await _call(session, {"do": "resume", "agent": "bob"})
    assert resumed.structured_content["loop"]["status"] == "running"
    await _call(session, {"do": "pause", "agent": "bob"})


async def _as_bob(session: ClientSession, kernel: Any) -> None:
    mine = await _call(session, {"do": "status"})
    assert [entry["agent"] for entry in mine.structured_content["loops"]] == ["bob"]
    head = (await kernel.log(limit=1))[0]["op"]
    for arguments, fragment in (
            ({"do": "status", "agent": "carol"}, "its own loop only"),
            ({"do": "resume", "agent": "bob"}, "only the human may resume a loop"),
            ({"do": "stop", "agent": "bob"}, "only the human may stop a loop"),
            ({"do": "start", "agent": "bob", "step": "x = 1"},
             "only the human may start a loop")):
        refused = await _call(session, arguments, error=True)
        assert fragment in text(refused), text(refused)
        assert refused.structured_content["error"]["kind"] == "denied"
    assert (await kernel.log(limit=1))[0]["op"] == head   # nothing committed
    assert (await kernel.request("loop", do="status", agent="bob"))["loops"][0][
        "status"] == "paused"


def test_loops_through_mcp_as_the_human_and_as_an_agent(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"

    async def scenario() -> None:
        async with run_kernel(workspace, env=ENV) as (_, kernel):
            assert await kernel.add_agent("bob") == "bob"
            assert await kernel.add_agent("carol") == "carol"
            carol = await kernel.request("loop", do="start", agent="carol", step="x = 1",
                                         every_ms=3_600_000)
            assert carol["loop"]["status"] == "running"
            await kernel.request("loop", do="pause", agent="carol")
            async with stdio_client(server(workspace, "human")) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                await _as_human(session, kernel)
            async with stdio_client(server(workspace, "bob")) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                await _as_bob(session, kernel)

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT))
