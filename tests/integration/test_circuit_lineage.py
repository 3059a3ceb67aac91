"""Circuits flow down, in a real kernel: while ``alice``'s circuit is open, her sub-agent
``alice/helper`` and its own sub-agent ``alice/helper/intern`` are refused on every path
(``%%agent`` cells, the harness ``op`` with code and with a tool, a tool helper wrote
called by the human, MCP as helper), helper's subscriber is skipped, and intern's
running loop is parked by the kernel's driver (no op tried while it waits).  Each
refusal names the sub-agent, alice, why she tripped and the reset to ask for; the
human's ``kernos agent reset alice`` lets all of them run again, and the loop goes on."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from tests.agents_support import committed, names_of
from tests.integration.test_circuit import ENV, TIMEOUT, _kernos, _records
from tests.integration.test_loop import STEP, loop_of, loop_records, wait_for

from kernos.client import KernosClient

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

HELPER, INTERN = "alice/helper", "alice/helper/intern"
REASON = "2 op(s) of 'alice' in a row did not commit"
RESET = "`agents.reset('alice')` in a cell or `kernos agent reset alice` in a shell"
QUIET = 1.0
"""Seconds the parked loop is watched for not moving (it could only fail by moving)."""
SHOUT = "def shout(text):\n    return text.upper()\n"
SETUP = """
agents.add('alice')
agents.grant('alice', 'agents:spawn')
agents.register_tool('echo', lambda text: text, description='Echo',
                     schema={'type': 'object', 'properties': {'text': {'type': 'string'}}})
"""
HELPER_GRANTS = """
agents.grant('alice/helper', 'agents:spawn')
agents.grant('alice/helper', 'call:echo')
agents.grant('alice/helper', 'subscribe:orders.*')
"""
HELPER_SETUP = """%%agent alice/helper
spawn('intern')
define_tool('shout', SHOUT, {'type': 'object', 'properties': {'text': {'type': 'string'}}},
            'Shout')
seen = []
def on(event):
    seen.append(event['payload'])
subscribe('orders.*', on)
n = 1
""".replace("SHOUT", repr(SHOUT))


def _refused(workspace: Path, agent: str, via: str = "op") -> dict[str, Any]:
    record = _records(workspace)[-1]
    assert record["status"] == "refused", record
    assert record["circuit"]["agent"] == "alice"
    assert record["circuit"]["sub_agent"] == agent
    assert record["circuit"]["via"] == via
    assert record["circuit"]["figures"]["in_a_row"] == 2
    return record


def _helper_state(kernel: Kernel) -> Any:
    return kernel.value(f"(dict(agents.namespace({HELPER!r})).get('n'), "
                        f"list(agents.namespace({HELPER!r})['seen']))")


def _names(message: str, agent: str) -> None:
    """The refusal names the sub-agent, the tripped ancestor, why, and the reset."""
    assert f"{agent!r} is " in message and "whose circuit is open" in message, message
    assert REASON in message and "policy failures=2" in message, message
    assert RESET in message, message


async def _mcp_as(workspace: Path, principal: str) -> str:
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernos.mcp", "--workspace", str(workspace), "--principal", principal],
        env={**os.environ, **ENV})
    async with stdio_client(parameters) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("kernos-op", {"code": "n = 2"})
        assert result.is_error
        assert result.structured_content["status"] == "refused"
        return "\n".join(block.text for block in result.content if block.type == "text")


def test_a_tripped_agents_sub_agents_are_refused_everywhere_until_it_is_reset(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace, ENV)
    committed(kernel, SETUP)
    committed(kernel, "%%agent alice\nspawn('helper')")
    committed(kernel, HELPER_GRANTS)
    committed(kernel, HELPER_SETUP)
    committed(kernel, f"agents.loop({INTERN!r}, {STEP!r}, every_ms=10)")
    wait_for(kernel, INTERN, lambda state: state["iteration"] >= 2)
    committed(kernel, "agents.policy('alice', failures=2)")
    for _ in range(2):
        failed = kernel.run("%%agent alice\n1/0")
        assert failed.rolled_back, failed.kernos

    # intern's loop is parked by the driver: it neither advances nor tries op after op
    def refused_turns() -> int:
        return sum(record["status"] == "refused" and record["loop"]["agent"] == INTERN
                   for record in loop_records(workspace))

    parked = loop_of(kernel, INTERN)
    time.sleep(QUIET)
    assert loop_of(kernel, INTERN)["iteration"] == parked["iteration"]
    assert parked["status"] == "running"
    assert refused_turns() <= 1       # at most the one turn that found the circuit open
    seen_by_intern = list(names_of(kernel, INTERN)["seen"])
    assert len(seen_by_intern) == parked["iteration"]

    # %%agent cells of the child and the grandchild
    for agent in (HELPER, INTERN):
        cell = kernel.run(f"%%agent {agent}\nn = 2")
        assert cell.status == "error" and cell.errors[0]["ename"] == "CircuitOpen"
        _names(cell.errors[0]["evalue"], agent)
        _refused(workspace, agent)
    assert "a sub-agent of 'alice/helper', a sub-agent of 'alice'" in \
        kernel.run(f"%%agent {INTERN}\nn = 2").errors[0]["evalue"]
    with KernosClient.connect(workspace) as client:
        # the harness: an op with code, a tool call, and a tool helper wrote
        result = client.op("n = 3", principal=HELPER)
        assert result.status == "refused" and result.error is not None
        _names(result.error.message, HELPER)
        _refused(workspace, HELPER)
        result = client.op(principal=HELPER, tool="echo", arguments={"text": "hi"})
        assert result.status == "refused" and result.error is not None
        _refused(workspace, HELPER)
        result = client.op(principal="human", tool="shout", arguments={"text": "hi"})
        assert result.status == "refused" and result.error is not None
        assert "'alice/helper''s tool shout was refused" in result.error.message
        _refused(workspace, HELPER, via="tool shout")
        # what the human sees of the circuits: helper's is alice's trip
        circuits = client.request("circuit", agent=HELPER)["circuits"]
        assert circuits[HELPER]["policy"] == "failures"
        assert REASON in circuits[HELPER]["message"]
    # MCP, as helper
    text = asyncio.run(asyncio.wait_for(_mcp_as(workspace, HELPER), TIMEOUT))
    _names(text, HELPER)
    _refused(workspace, HELPER)
    # helper's subscriber: skipped, and the human's op commits
    emitted = committed(kernel, "events.emit('orders.new', {'n': 1})")
    assert emitted.committed
    skipped = _records(workspace)[-1]["circuit_skipped"]
    assert [(item["agent"], item["topic"]) for item in skipped] == [(HELPER, "orders.new")]
    assert _helper_state(kernel) == (1, [])
    assert loop_of(kernel, INTERN)["iteration"] == parked["iteration"]
    assert refused_turns() <= 1

    # the human resets alice: the sub-agents run again, and the loop goes on by itself
    reset = _kernos(workspace, "agent", "reset", "alice", "--json")
    assert reset.returncode == 0, reset.stderr
    assert json.loads(reset.stdout)["was_open"] == "failures"
    wait_for(kernel, INTERN, lambda state: state["iteration"] > parked["iteration"])
    committed(kernel, f"%%agent {HELPER}\nn = 5")
    committed(kernel, "events.emit('orders.new', {'n': 2})")
    assert _helper_state(kernel) == (5, [{"n": 2}])
    committed(kernel, f"agents.stop({INTERN!r})")
