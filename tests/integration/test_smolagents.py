"""smolagents' CodeAgent on a real Kernos kernel (``kernos.integrations.smolagents``).

Offline: the model is a scripted ``Model`` that returns fixed ``ChatMessage``s and
keeps what it was given.  Each code action runs as one op of a Kernos agent
(``KernosExecutor``): a variable of one step is there in the next (and after
``kill -9`` of the kernel), ``final_answer`` brings the answer back, a step that
raises or is denied a capability is rolled back and the next step reads why, and
every step is in the audit chain and the log, and a recorded run replays without the
model (``kernos.replay``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("smolagents", reason="needs the smolagents extra")

from smolagents import CodeAgent
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.tools import Tool

from kernos.client import KernosClient, RequestError, run_kernel
from kernos.errors import UsageError
from kernos.integrations.smolagents import KernosExecutor, kernos_tools
from kernos.replay import replay

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}


class ScriptedModel(Model):
    """A model that answers each call with the next of ``replies`` and keeps its inputs."""

    def __init__(self, *replies: str) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.inputs: list[str] = []

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None,
                 tools_to_call_from: list[Tool] | None = None, **kwargs: Any) -> ChatMessage:
        self.inputs.append("\n".join(_text(message.content) for message in messages))
        assert self.replies, "the agent asked the model more often than scripted"
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content)
    return str(content or "")


def step(code: str) -> str:
    """A model reply that is one code action."""
    return f"Thought: next.\n<code>\n{code}\n</code>"


def _agent(executor: KernosExecutor, model: ScriptedModel) -> CodeAgent:
    return CodeAgent(tools=[], model=model, executor=executor, verbosity_level=0,
                     instructions=executor.instructions(), max_steps=6)


def _records(client: KernosClient, principal: str) -> dict[str, dict[str, Any]]:
    """The agent's audit records, by the code each op ran."""
    return {(record.get("code") or {}).get("text", ""): record
            for record in client.audit(principal=principal) if record.get("type") == "op"}


def _value(client: KernosClient, agent: str, name: str) -> Any:
    result = client.op(name, principal=agent)
    assert result.committed and result.value is not None, result
    return result.value.json


def test_variables_carry_across_steps_and_the_final_answer_comes_back(
        tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=ENV) as kernos:
        kernos.op("prices = [3, 5, 10]")
        kernos.add_agent("analyst")
        kernos.grant("analyst", "read:prices")
        kernos.add_agent("smith")
        define = ("define_tool('double', 'def double(x):\\n    return x * 2\\n', "
                  "{'type': 'object', 'properties': {'x': {'type': 'integer'}}}, "
                  "'doubles x')")
        assert kernos.op(define, principal="smith").committed
        kernos.grant("analyst", "call:double")
        executor = KernosExecutor(kernos, "analyst")
        tools = kernos_tools(kernos, "analyst")
        codes = ["total = sum(read('prices'))\nprint('total', total)",
                 "mean = total / len(read('prices'))\n"
                 "final_answer({'mean': mean, 'big': double(x=threshold), "
                 "'same': call('double', x=2)})"]
        model = ScriptedModel(*(step(code) for code in codes))
        agent = CodeAgent(tools=tools, model=model, executor=executor, verbosity_level=0,
                          instructions=executor.instructions())
        answer = agent.run("What is the mean price?", additional_args={"threshold": 4})

        assert answer == {"mean": 6.0, "big": 8, "same": 4}
        prompt = model.inputs[0]
        assert "def double(x: integer) -> any" in prompt  # CodeAgent lists the Kernos tool
        assert "call('NAME', **arguments)" in prompt and "- double: doubles x" in prompt
        assert "total 18" in model.inputs[1]  # step 1's print is step 2's observation
        assert _value(kernos, "analyst", "total") == 18
        assert _value(kernos, "analyst", "mean") == 6.0
        assert _value(kernos, "analyst", "threshold") == 4

        records = _records(kernos, "analyst")
        sent = ["threshold = 4",
                "def double(**arguments):\n    return call('double', **arguments)\n",
                codes[0],
                "mean = total / len(read('prices'))\n"
                "({'mean': mean, 'big': double(x=threshold), 'same': call('double', x=2)})\n"]
        assert [records[code]["status"] for code in sent] == ["committed"] * 4
        assert [records[code]["op"] for code in sent] == sorted(
            records[code]["op"] for code in sent)
        logged = {entry["op"] for entry in kernos.log(20, principal="analyst")}
        assert {records[code]["op"] for code in sent} <= logged

        # Without the grant, the tool's function is denied like call(): rolled back.
        kernos.revoke("analyst", "call:double")
        model = ScriptedModel(step("kept = double(x=1)"), step("final_answer(total)"))
        agent = CodeAgent(tools=tools, model=model, executor=executor, verbosity_level=0)
        assert agent.run("Double one.") == 18
        assert "[denied, op" in model.inputs[1] and "call:double" in model.inputs[1]

        # The agent's variables are its Kernos namespace: a new run after kill -9 sees them.
        kernos.manager.kill()
        kernos.manager.restart()
        model = ScriptedModel(step("final_answer(total + mean)"))
        assert _agent(KernosExecutor(kernos, "analyst"), model).run("Again?") == 24.0


def test_a_failed_step_is_rolled_back_and_the_next_step_reads_why(tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=ENV) as kernos:
        kernos.op("prices = [3, 5, 10]")
        kernos.add_agent("analyst")
        kernos.grant("analyst", "read:prices")
        executor = KernosExecutor(kernos, "analyst")
        raising = "x = 2\nprint('halfway')\n1 / 0"
        denied = "x = 3\nwrite('prices', [])"
        caught = "try:\n    write('prices', [])\nexcept CapabilityDenied:\n    pass\nx = 4"
        misplaced = "if x > 0:\n    final_answer(x)"
        codes = ["x = 1", raising, denied, caught, misplaced, "final_answer(x)"]
        model = ScriptedModel(*(step(code) for code in codes))
        answer = _agent(executor, model).run("What is x?")

        assert answer == 1  # no failed step's assignment was kept
        after_raise, after_deny, after_catch, after_misplaced = model.inputs[2:6]
        assert "ZeroDivisionError" in after_raise and "rolled back" in after_raise
        assert "Printed before the error:\nhalfway" in after_raise
        for seen in (after_deny, after_catch):  # caught or not, a denial vetoes the op
            assert "[denied, op" in seen and "write:prices" in seen
        assert "nothing this code did was kept" in after_deny
        assert "final_answer(...) ends a code action" in after_misplaced
        assert kernos.object("prices").preview.json == [3, 5, 10]  # type: ignore[union-attr]

        records = _records(kernos, "analyst")
        assert records[raising]["status"] == "failed"
        assert records[denied]["status"] == records[caught]["status"] == "denied"
        assert misplaced not in records  # refused before it was sent: no op
        assert {records[code]["status"] for code in ("x = 1", "(x)\n")} == {"committed"}
        steps = [records[code]["op"] for code in ("x = 1", raising, denied, caught, "(x)\n")]

    # The recorded run replays without the model: the same ops, outcomes and states.
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.summary()
    replayed = {step.op: (step.status, step.replayed) for step in report.steps}
    assert [replayed[op] for op in steps] == [
        ("committed", "committed"), ("failed", "failed"), ("denied", "denied"),
        ("denied", "denied"), ("committed", "committed")]


def test_host_tools_and_unknown_agents_stop_the_run_before_the_model_is_asked(
        tmp_path: Path) -> None:
    class Search(Tool):
        name = "search"
        description = "Searches the web."
        inputs = {"query": {"type": "string", "description": "what to search"}}  # noqa: RUF012 (smolagents declares tools so)
        output_type = "string"

        def forward(self, query: str) -> str:
            return query

    with KernosClient.start(tmp_path / "ws", env=ENV) as kernos:
        kernos.add_agent("analyst")
        model = ScriptedModel(step("final_answer(1)"))
        agent = CodeAgent(tools=[Search()], model=model, verbosity_level=0,
                          executor=KernosExecutor(kernos, "analyst"))
        with pytest.raises(UsageError, match=r"smolagents tools cannot be sent.*search"):
            agent.run("Search.")
        ghost = CodeAgent(tools=[], model=model, verbosity_level=0,
                          executor=KernosExecutor(kernos, "ghost"))
        with pytest.raises(RequestError, match="no principal 'ghost'"):
            ghost.run("Anything.")
        assert model.inputs == []
        with pytest.raises(UsageError, match="'bad' cannot be sent"):
            CodeAgent(tools=[], model=model, verbosity_level=0,
                      executor=KernosExecutor(kernos, "analyst")).run(
                "Anything.", additional_args={"bad": object()})
        assert _records(kernos, "analyst") == {}


def test_budgets_and_limits_hold_and_a_breach_rolls_the_step_back(tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=ENV) as kernos:
        kernos.add_agent("buyer", limits={"seconds": 1, "hard_seconds": 10})
        kernos.grant("buyer", "spend:USD", 10)
        overspend = "spent = 12\nspend(6, 'USD')"
        endless = "spent = 99\nwhile True:\n    pass"
        codes = ["spend(6, 'USD')\nspent = 6", overspend, endless, "final_answer(spent)"]
        model = ScriptedModel(*(step(code) for code in codes))
        answer = _agent(KernosExecutor(kernos, "buyer"), model).run("Buy twice.")

        assert answer == 6
        after_overspend, after_endless = model.inputs[2:4]
        assert "[denied, op" in after_overspend and "spend:USD" in after_overspend
        assert "[vetoed, op" in after_endless and "deadline" in after_endless
        (budget,) = kernos.grants("buyer")
        assert budget["remaining"] in (4, "4")  # the denied spend was not counted
        records = _records(kernos, "buyer")
        assert records[overspend]["status"] == "denied"
        assert records[endless]["status"] not in ("committed", None)


def test_with_an_async_client_the_agent_runs_in_a_worker_thread(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws", env=ENV) as (_, kernos):
            await kernos.add_agent("analyst")
            executor = KernosExecutor(kernos, "analyst")
            model = ScriptedModel(step("x = 20"), step("final_answer(x + 1)"))
            agent = CodeAgent(tools=[], model=model, executor=executor, verbosity_level=0)
            # On the client's own loop a sync executor would wait for itself: refused.
            with pytest.raises(UsageError, match="from its own event loop"):
                agent.run("Count.")
            assert model.inputs == []
            assert await asyncio.to_thread(agent.run, "Count.") == 21

    asyncio.run(asyncio.wait_for(scenario(), 180))
