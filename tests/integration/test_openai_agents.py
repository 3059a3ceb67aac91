"""The OpenAI Agents SDK on a real Kernos kernel (``kernos.integrations.openai_agents``).

Offline: the model is the SDK's own test double (``agents.testing.ScriptedModel``),
tracing is off, and no provider is reachable.  A ``Runner`` keeps its conversation
in a ``KernosSession`` (one op per ``add_items``), which survives ``kill -9`` of the
kernel; ``run_python`` runs the model's code as one op of a Kernos agent under its
grants; and a runner process killed with ``kill -9`` in the middle of a run resumes
from the last committed turn without paying twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="needs the openai-agents extra")

from agents import Agent, RunConfig, Runner, set_tracing_disabled
from agents.memory import Session, SessionSettings
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from kernos.client import KernosClient, run_kernel
from kernos.integrations.openai_agents import KernosSession, kernos_python_tool

pytestmark = pytest.mark.kernel

set_tracing_disabled(True)
RUN = RunConfig(tracing_disabled=True)
ENV = {"KERNOS_DURABILITY": "process"}


def _said(call: ModelCall) -> str:
    """Everything the model was given, as text."""
    return json.dumps(call.input, default=str)


def _outputs(items: list[Any]) -> list[dict[str, Any]]:
    """The tool outputs among a session's items, parsed."""
    return [json.loads(item["output"]) for item in items
            if item.get("type") == "function_call_output"]


def _ops_recorded(client: KernosClient, action: str, principal: str) -> list[dict[str, Any]]:
    return [record for record in client.audit(principal=principal)
            if record.get("type") == "op"
            and f'"action": "{action}"' in (record.get("code") or {}).get("text", "")]


class CountingSession(KernosSession):
    """A KernosSession that records how many items each of the SDK's add_items gave."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.adds: list[int] = []

    async def add_items(self, items: list[Any]) -> None:
        self.adds.append(len(items))
        await super().add_items(items)


def test_two_turns_keep_their_history_through_a_kill_9_of_the_kernel(tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=ENV) as kernos:
        kernos.add_agent("ada")
        session = CountingSession("chat-1", kernos, principal="ada")
        assert isinstance(session, Session)  # the SDK's protocol, structurally

        def second(call: ModelCall) -> list[Any]:
            said = _said(call)
            assert "My name is Ada." in said and "Hello, Ada." in said, said
            return [assistant_message("You are Ada.")]

        model = ScriptedModel([[assistant_message("Hello, Ada.")], ModelStep.respond(second)])
        agent = Agent(name="ada", model=model)
        Runner.run_sync(agent, "My name is Ada.", session=session, run_config=RUN)
        result = Runner.run_sync(agent, "Who am I?", session=session, run_config=RUN)
        assert result.final_output == "You are Ada."
        model.assert_complete()
        items = asyncio.run(session.get_items())
        assert [item.get("role") for item in items] == ["user", "assistant"] * 2
        # One op of the session's principal per add_items, each committed.
        recorded = _ops_recorded(kernos, "session_add", "ada")
        assert len(recorded) == len(session.adds) >= 2
        assert {record["status"] for record in recorded} == {"committed"}

        kernos.manager.kill()
        kernos.manager.restart()
        again = KernosSession("chat-1", kernos, principal="ada")
        assert asyncio.run(again.get_items()) == items
        assert asyncio.run(again.get_items(limit=1)) == items[-1:]
        assert asyncio.run(again.pop_item()) == items[-1]
        assert asyncio.run(again.get_items()) == items[:-1]
        asyncio.run(again.clear_session())
        assert asyncio.run(again.get_items()) == []


def test_the_tool_runs_code_as_the_agent_and_a_denial_rolls_its_op_back(
        tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=ENV) as kernos:
        kernos.op("prices = [3, 5, 10]")
        kernos.add_agent("analyst")
        kernos.grant("analyst", "read:prices")
        session = CountingSession("analysis", kernos, principal="analyst")
        tool = kernos_python_tool(kernos, "analyst", session=session)
        calls = [
            ("c1", "total = sum(read('prices'))\nmean = total / len(read('prices'))\nmean"),
            ("c2", "scratch = 1\nwrite('prices', [])"),
            ("c3", "try:\n    write('prices', [])\nexcept CapabilityDenied:\n    pass\n"
                   "scratch = 2"),
        ]

        def last(call: ModelCall) -> list[Any]:
            assert "function_call_output" in _said(call)
            return [assistant_message("The mean is 6.")]

        model = ScriptedModel([
            *[[function_call("run_python", {"code": code}, call_id=call_id)]
              for call_id, code in calls],
            ModelStep.respond(last)])
        agent = Agent(name="analyst", model=model, tools=[tool])
        result = Runner.run_sync(agent, "What is the mean price?", session=session,
                                 run_config=RUN)
        assert result.final_output == "The mean is 6."
        committed, denied, caught = _outputs(asyncio.run(session.get_items()))
        assert committed["status"] == "committed" and committed["result"] == 6.0
        for output in (denied, caught):  # caught or not, a denial vetoes the op
            assert output["status"] == "denied", output
            assert "write:prices" in output["error"]["message"]
            assert "nothing this code did was kept" in output["error"]["message"]
        assert kernos.op("mean", principal="analyst").value.json == 6.0  # type: ignore[union-attr]
        missing = kernos.op("scratch", principal="analyst")
        assert missing.status == "failed" and "NameError" in missing.error.message  # type: ignore[union-attr]
        assert kernos.object("prices").preview.json == [3, 5, 10]  # type: ignore[union-attr]
        records = [record for record in kernos.audit(principal="analyst")
                   if (record.get("code") or {}).get("text") in (calls[1][1], calls[2][1])]
        assert [record["status"] for record in records] == ["denied", "denied"]
        # A turn of a tool call and its output is one op, both items or neither.
        recorded = _ops_recorded(kernos, "session_add", "analyst")
        assert len(recorded) == len(session.adds) and max(session.adds) >= 2


def test_with_the_async_client_on_the_runners_own_loop(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws", env=ENV) as (_, client):
            await client.add_agent("calc")
            session = KernosSession("sums", client, principal="calc")
            model = ScriptedModel([
                [function_call("run_python", {"code": "kept = 2 + 3\nprint(kept)\nkept"},
                               call_id="s1")],
                [assistant_message("5")]])
            agent = Agent(name="calc", model=model,
                          tools=[kernos_python_tool(client, "calc", session=session)])
            result = await Runner.run(agent, "2 + 3?", session=session, run_config=RUN)
            assert result.final_output == "5"
            [output] = _outputs(await session.get_items())
            assert (output["status"], output["stdout"], output["result"]) == (
                "committed", "5\n", 5)
            assert (await client.op("kept", principal="calc")).value.json == 5  # type: ignore[union-attr]
            everything = await session.get_items()
            assert await session.get_items(limit=-1) == everything  # as SQLiteSession does
            assert await session.get_items(limit=0) == []
            limited = KernosSession("sums", client, principal="calc",
                                    session_settings=SessionSettings(limit=2))
            assert await limited.get_items() == everything[-2:]
            assert await limited.get_items(limit=3) == everything[-3:]
            assert await session.pop_item() == everything[-1]
            assert len(await client.session_items("sums", principal="calc")) == 3
            await session.clear_session()
            assert await client.sessions(principal="calc") == []

    asyncio.run(asyncio.wait_for(scenario(), 180))


SETUP = '''
import json, os
LEDGER = {ledger!r}
def pay(amount, to, idempotency_key):
    with open(LEDGER, "a") as f:
        f.write(json.dumps({{"key": idempotency_key, "amount": amount, "to": to}}) + "\\n")
        f.flush()
        os.fsync(f.fileno())
    return {{"receipt": idempotency_key[-8:]}}
agents.register_tool("pay", pay, description="pays", effect="external",
                     schema={{"type": "object", "properties": {{"amount": {{"type": "integer"}},
                              "to": {{"type": "string"}}}}, "required": ["amount", "to"]}})
'''

RUNNER = '''
import asyncio, json, sys, time
from agents import Agent, RunConfig, Runner, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from kernos.client import KernosClient, run_kernel
from kernos.errors import UsageError
from kernos.integrations.openai_agents import KernosSession, kernos_python_tool

workspace, mode, mark = sys.argv[1:4]
set_tracing_disabled(True)
PAY = "ticket = call('pay', amount=5, to='bob')\\nticket['status']"


def signal_and_hang(where):
    with open(mark, "w") as f:
        f.write(where)
    time.sleep(3600)  # the test kills this process here


class Session(KernosSession):
    async def add_items(self, items):
        if mode == "die-before-saving-the-tool-turn" and any(
                item.get("type") == "function_call_output" for item in items):
            signal_and_hang("the tool ran; its turn is not saved")
        await super().add_items(items)


def respond(call):
    said = json.dumps(call.input, default=str)
    if "function_call_output" not in said:
        return [function_call("run_python", {"code": PAY}, call_id="call-pay-1")]
    if mode == "die-in-the-next-model-call":
        signal_and_hang("the tool turn is saved; the model is thinking")
    return [assistant_message("Paid bob 5.")]


async def main():
    kernos = KernosClient.connect(workspace)
    try:
        session = Session("order-7", kernos, principal="payer")
        agent = Agent(name="payer", model=ScriptedModel([ModelStep.respond(respond)] * 3),
                      tools=[kernos_python_tool(kernos, "payer", session=session)])
        given = "Pay bob 5." if mode != "resume" else []
        result = await Runner.run(agent, given, session=session,
                                  run_config=RunConfig(tracing_disabled=True))
        print(json.dumps({"final": result.final_output}))
    finally:
        kernos.close()


asyncio.run(main())
'''


def _kill_runner_at(script: Path, workspace: Path, mode: str, mark: Path) -> str:
    runner = subprocess.Popen([sys.executable, str(script), str(workspace), mode, str(mark)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not mark.exists():
        if runner.poll() is not None:
            raise AssertionError(f"the runner ended before its kill point: "
                                 f"{runner.communicate()}")
        assert time.monotonic() < deadline, "the runner never reached its kill point"
        time.sleep(0.05)
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait(timeout=30)
    assert runner.returncode == -signal.SIGKILL
    return mark.read_text()


def _resume(script: Path, workspace: Path, mark: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(script), str(workspace), "resume", str(mark)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["die-in-the-next-model-call",
                                  "die-before-saving-the-tool-turn"])
def test_a_runner_killed_mid_run_resumes_from_the_last_turn_and_pays_once(
        tmp_path: Path, mode: str) -> None:
    workspace, ledger = tmp_path / "ws", tmp_path / "ledger.jsonl"
    script, mark = tmp_path / "runner.py", tmp_path / "mark"
    script.write_text(RUNNER)
    with KernosClient.start(workspace, env=ENV) as kernos:
        assert kernos.op(SETUP.format(ledger=str(ledger))).committed
        kernos.add_agent("payer")
        kernos.grant("payer", "call:pay")
        where = _kill_runner_at(script, workspace, mode, mark)
        session = KernosSession("order-7", kernos, principal="payer")
        before = asyncio.run(session.get_items())
        saved = [item.get("role") or item.get("type") for item in before]
        if mode == "die-in-the-next-model-call":
            assert saved == ["user", "function_call", "function_call_output"], where
        else:
            assert saved == ["user"], where  # the tool's turn was never saved
        assert len(ledger.read_text().splitlines()) == 1  # the tool's op paid, once

        mark.unlink()
        assert _resume(script, workspace, mark) == {"final": "Paid bob 5."}
        items = asyncio.run(session.get_items())
        kinds = [item.get("role") or item.get("type") for item in items]
        assert kinds == ["user", "function_call", "function_call_output", "assistant"]
        [output] = _outputs(items)
        assert output["status"] == "committed"
        assert output.get("duplicate", False) is (mode == "die-before-saving-the-tool-turn")
        payments = [json.loads(line) for line in ledger.read_text().splitlines()]
        assert len(payments) == 1 and payments[0]["to"] == "bob"  # no effect ran twice
