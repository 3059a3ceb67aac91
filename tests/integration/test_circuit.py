"""Circuit breakers in a real kernel: an open circuit refuses every path of the agent.

One workspace, one agent ``alice`` with ``failures=2``: two failing ``%%agent``
cells trip it, the event ``kernos.circuit.open`` reaches a subscriber before
any other op, and then each path is refused with the policy and its figures
named, an audit record, and the image unchanged: ``%%agent`` cells, the
harness ``op`` (code and tool), MCP (a server running as alice), a tool alice
wrote (called by the human), and alice's event subscriber (skipped).  alice
cannot reset or loosen its policy; the circuit survives ``kill -9``; the
human's ``kernos agent reset`` closes it.  Then the runaway policies:
``repeats`` stops one failing op repeated, and a burn rate stops an agent
calling ``llm()`` (litellm's ``mock_response``) before its budget is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from kernos.client import AsyncKernosClient
from kernos.client.errors import RequestError

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}
TIMEOUT = 120
FIGURES = "2 op(s) of 'alice' in a row did not commit"
SHOUT = "def shout(text):\n    return text.upper()\n"
SETUP = """
agents.add('alice')
agents.grant('alice', 'call:echo')
agents.grant('alice', 'subscribe:orders.*')
agents.register_tool('echo', lambda text: text, description='Echo',
                     schema={'type': 'object', 'properties': {'text': {'type': 'string'}}})
"""
ALICE_SETUP = """%%agent alice
define_tool('shout', SHOUT, {'type': 'object', 'properties': {'text': {'type': 'string'}}},
            'Shout')
seen = []
def on(event):
    seen.append(event['payload'])
subscribe('orders.*', on)
n = 1
""".replace("SHOUT", repr(SHOUT))


def _records(workspace: Path) -> list[dict[str, Any]]:
    lines = (workspace / "audit" / "chain.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["type"] == "op"]


def _refused_record(workspace: Path) -> dict[str, Any]:
    record = _records(workspace)[-1]
    assert record["status"] == "refused", record
    assert record["circuit"]["agent"] == "alice"
    assert record["circuit"]["policy"] == "failures"
    assert record["circuit"]["figures"]["in_a_row"] == 2
    return record


def _kernos(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernos.cli", *args, "-w", str(workspace)],
                          capture_output=True, text=True, timeout=TIMEOUT, check=False,
                          env={**os.environ, **ENV})


def _alice_state(kernel: Kernel) -> Any:
    return kernel.value("(dict(agents.namespace('alice')).get('n'), "
                        "list(agents.namespace('alice')['seen']))")


async def _mcp_as_alice(workspace: Path) -> str:
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernos.mcp", "--workspace", str(workspace), "--principal", "alice"],
        env={**os.environ, **ENV})
    async with stdio_client(parameters) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("kernos-op", {"code": "n = 2"})
        assert result.is_error
        text = "\n".join(block.text for block in result.content if block.type == "text")
        assert result.structured_content["status"] == "refused"
        return text


def test_an_open_circuit_refuses_every_path_until_the_human_resets_it(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace, ENV)
    here = kernel.run("import kernos; print(kernos.__file__)")
    assert here.stdout.strip() == str(Path(__file__).parents[2] / "kernel/kernos/__init__.py")
    assert kernel.run(SETUP).committed
    assert kernel.run(ALICE_SETUP).committed

    async def scenario() -> None:
        client = await AsyncKernosClient.connect(workspace)
        try:
            policy = await client.request("policy", agent="alice", set={"failures": 2})
            assert policy["policy"] == {"failures": 2}
            # an agent may not loosen its own policy, nor close its circuit
            for action, fields in (("policy", {"set": {"failures": 100}}), ("reset", {})):
                with pytest.raises(RequestError) as denied:
                    await client.request(action, agent="alice", principal="alice", **fields)
                assert denied.value.kind == "denied"
                assert _records(workspace)[-1]["status"] == "rejected"
            events = await client.subscribe(topic="kernos.circuit.*")
            for _ in range(2):
                failed = kernel.run("%%agent alice\nn = 99\n1/0")
                assert failed.rolled_back or failed.kernos["status"] == "failed"
            tripped = (await client.request("circuit", agent="alice"))["circuits"]["alice"]
            assert tripped is not None and tripped["policy"] == "failures"
            # announced at once: by an op of the supervisor's, before any other op
            # (``circuit`` is a read: it runs no op, so it announces nothing)
            event = await events.get(timeout=TIMEOUT)
            assert event["topic"] == "kernos.circuit.open"
            assert event["payload"]["agent"] == "alice"
            assert event["payload"]["policy"] == "failures"
            assert FIGURES in event["payload"]["message"]
            announcing = _records(workspace)[-1]
            assert (announcing["kind"], announcing["status"]) == ("supervisor", "committed")
            circuits = await client.request("circuit", agent="alice")
            assert circuits["circuits"]["alice"]["announced"] is True
            before = _alice_state(kernel)
            assert before == (1, [])

            # %%agent cell
            cell = kernel.run("%%agent alice\nn = 2")
            assert cell.status == "error" and cell.errors[0]["ename"] == "CircuitOpen"
            assert FIGURES in cell.errors[0]["evalue"]
            assert "policy failures=2" in cell.errors[0]["evalue"]
            _refused_record(workspace)
            # harness op: code, then a tool
            result = await client.op("n = 3", principal="alice")
            assert result.status == "refused" and FIGURES in result.error.message
            _refused_record(workspace)
            result = await client.op(principal="alice", tool="echo",
                                     arguments={"text": "hi"})
            assert result.status == "refused" and "policy failures=2" in result.error.message
            _refused_record(workspace)
            # a tool alice wrote, called by the human
            result = await client.op(principal="human", tool="shout",
                                     arguments={"text": "hi"})
            assert result.status == "refused" and FIGURES in result.error.message
            assert _refused_record(workspace)["circuit"]["via"] == "tool shout"
            # MCP, as alice
            text = await _mcp_as_alice(workspace)
            assert FIGURES in text and "policy failures=2" in text
            _refused_record(workspace)
            # alice's subscriber: skipped, and the human's op commits
            emitted = kernel.run("events.emit('orders.new', {'n': 1})")
            assert emitted.committed, emitted.errors
            skipped = _records(workspace)[-1]["circuit_skipped"]
            assert [(item["agent"], item["topic"]) for item in skipped] == [
                ("alice", "orders.new")]
            assert _alice_state(kernel) == before
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT * 3))

    # kill -9: the circuit is still open in the next kernel
    kernel.kill9()
    kernel = kernel_factory(workspace, ENV)
    again = kernel.run("%%agent alice\nn = 4")
    assert again.status == "error" and again.errors[0]["ename"] == "CircuitOpen"
    assert FIGURES in again.errors[0]["evalue"]
    shown = _kernos(workspace, "agent", "circuit", "alice", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["circuits"]["alice"]["policy"] == "failures"
    # the human resets it (the CLI, through the running kernel)
    reset = _kernos(workspace, "agent", "reset", "alice", "--json")
    assert reset.returncode == 0, reset.stderr
    assert json.loads(reset.stdout)["was_open"] == "failures"
    closed = _kernos(workspace, "agent", "circuit", "alice")
    assert closed.stdout.strip() == "alice: closed; no safe checkpoint"
    assert kernel.run("%%agent alice\nn = 5").committed
    assert kernel.run("events.emit('orders.new', {'n': 2})").committed
    assert _alice_state(kernel) == (5, [{"n": 2}])


def test_the_same_failing_op_repeated_is_stopped_within_n(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace, ENV)
    assert kernel.run("agents.add('loop')").committed
    policy = _kernos(workspace, "agent", "policy", "loop", "--repeats", "3", "--json")
    assert policy.returncode == 0, policy.stderr
    assert json.loads(policy.stdout)["policy"] == {"repeats": 3}
    runs = 0
    for _ in range(10):
        result = kernel.run("%%agent loop\ntries = 1\nraise ValueError('again')")
        if result.errors and result.errors[0]["ename"] == "CircuitOpen":
            assert "4 times in a row; policy repeats<=3" in result.errors[0]["evalue"]
            break
        runs += 1
    assert runs == 3
    assert kernel.value("dict(agents.namespace('loop'))") == {}


BUDGET = 1000
CALL = ("a = llm('gpt-4o-mini', [{'role': 'user', 'content': "
        "'Please answer briefly: what colour is the sea on a clear day, {}?'}], "
        "max_tokens=40, mock_response='Blue.')\nanswers = answers + [a['content']]")


def test_a_burn_rate_stops_an_agent_before_its_budget_is_gone(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace, ENV)
    setup = kernel.run("agents.add('burner')\n"
                       f"agents.grant('burner', 'llm:gpt-4o-mini', {BUDGET})\n"
                       "agents.policy('burner', tokens_per_minute=100)")
    assert setup.committed, setup.errors
    assert kernel.run("%%agent burner\nanswers = []").committed
    calls = 0
    for number in range(BUDGET // 30 + 1):
        result = kernel.run("%%agent burner\n" + CALL.replace("{}", str(number)))
        if result.errors and result.errors[0]["ename"] == "CircuitOpen":
            assert "LLM tokens in the last 60 s; policy tokens_per_minute<100" in \
                result.errors[0]["evalue"]
            break
        assert result.committed, result.errors
        calls += 1
    # each mock call is 30 tokens: 4 calls reach 120 >= 100, and the 5th op is refused
    assert calls == 4
    assert kernel.value("len(agents.namespace('burner')['answers'])") == 4
    used = int(kernel.value("agents.grants('burner')[0]['used']"))
    assert used == 120 < BUDGET
