"""Pydantic AI on a real Kernos kernel (``kernos.integrations.pydantic_ai``).

Offline: the model is Pydantic AI's own ``FunctionModel``, scripted to make the
tool calls under test, and no provider is reachable.  ``KernosToolset`` runs the
model's code as ops of a Kernos agent (committed, or rolled back with the error
for the model to read) and calls the Kernos tools that agent was granted (an
ungranted one is not offered, and one whose grant is revoked mid-run is denied
and its op rolled back); ``KernosHistory`` keeps the messages in the image, one
op per run, through a ``kill -9`` of the kernel; every op is in the audit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="needs the pydantic-ai extra")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kernos.client import KernosClient, run_kernel
from kernos.integrations.pydantic_ai import KernosHistory, KernosToolset

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}
TOOLS = '''
agents.register_tool("double", lambda x: x * 2, description="doubles x",
                     schema={"type": "object", "properties": {"x": {"type": "integer"}},
                             "required": ["x"]})
agents.register_tool("secret", lambda: 42, description="the secret",
                     schema={"type": "object", "properties": {}})
'''

Step = Callable[[list[ModelMessage], AgentInfo], list[Any]] | list[Any]


class Script:
    """A ``FunctionModel`` that answers with ``steps`` in turn (a step may be a function
    of what the model was given), then "done"; it keeps what it was given and offered."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.seen: list[list[ModelMessage]] = []
        self.offered: list[list[str]] = []
        self.model = FunctionModel(self.respond)

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        self.offered.append([tool.name for tool in info.function_tools])
        step = self.steps.pop(0) if self.steps else [TextPart("done")]
        return ModelResponse(parts=step(messages, info) if callable(step) else step)

    def answers(self) -> dict[str, Any]:
        """What the model read back for each tool call, by call id."""
        return {part.tool_call_id: part.content for message in self.seen[-1]
                for part in message.parts if isinstance(part, (ToolReturnPart, RetryPromptPart))}


def call(tool: str, call_id: str, **arguments: Any) -> ToolCallPart:
    return ToolCallPart(tool, arguments, tool_call_id=call_id)


def audit_of(client: KernosClient, agent: str) -> list[tuple[str, str]]:
    """(status, code) of the agent's ops, oldest first."""
    return [(record["status"], (record.get("code") or {}).get("text", ""))
            for record in client.audit(principal=agent) if record.get("type") == "op"]


def test_code_commits_keeps_its_variables_and_an_error_or_a_denial_rolls_back(
        tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=ENV) as kernos:
        kernos.op("prices = [3, 5, 10]")
        kernos.add_agent("analyst")
        kernos.grant("analyst", "read:prices")
        codes = {"c1": "total = sum(read('prices'))\ntotal",
                 "c2": "mean = total / len(read('prices'))\nprint(mean)\nmean",
                 "c3": "scratch = 1\nboom = 1 / 0",
                 "c4": "scratch = 2\nwrite('prices', [])"}

        def read_the_errors(messages: list[ModelMessage], info: AgentInfo) -> list[Any]:
            said = str([message.parts for message in messages])
            assert "ZeroDivisionError" in said and "write:prices" in said, said
            return [TextPart("The mean is 6.")]

        script = Script(*[[call("run_python", call_id, code=code)]
                          for call_id, code in codes.items()], read_the_errors)
        agent = Agent(script.model, toolsets=[KernosToolset(kernos, "analyst")])
        assert agent.run_sync("Mean price?").output == "The mean is 6."
        answers = script.answers()
        assert (answers["c1"]["status"], answers["c1"]["result"]) == ("committed", 18)
        assert (answers["c2"]["status"], answers["c2"]["stdout"], answers["c2"]["result"]) == (
            "committed", "6.0\n", 6.0)  # c1's variable was there for c2
        assert answers["c3"]["status"] == "failed"
        assert answers["c4"]["status"] == "denied"
        for answer in (answers["c3"], answers["c4"]):
            assert "nothing this code did was kept" in answer["error"]["message"]
        # What committed stays in the agent's namespace; what rolled back left nothing.
        assert kernos.op("mean", principal="analyst").value.json == 6.0  # type: ignore[union-attr]
        assert kernos.op("scratch", principal="analyst").status == "failed"
        assert kernos.object("prices").preview.json == [3, 5, 10]  # type: ignore[union-attr]
        ops = [entry for entry in audit_of(kernos, "analyst") if entry[1] in codes.values()]
        assert [status for status, _ in ops] == ["committed", "committed", "failed", "denied"]
        logged = {entry["op"] for entry in kernos.log(principal="analyst")}
        assert answers["c1"]["op"] in logged and answers["c3"]["op"] not in logged


def test_a_granted_tool_is_called_an_ungranted_one_is_not_offered_and_a_revoked_one_denied(
        tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=ENV) as kernos:
        kernos.op(TOOLS)
        kernos.add_agent("analyst")
        kernos.grant("analyst", "call:double")

        def revoke_then_call(messages: list[ModelMessage], info: AgentInfo) -> list[Any]:
            kernos.revoke("analyst", "call:double")  # after this step's list was made
            return [call("double", "t3", x=5)]

        script = Script([call("double", "t1", x=4), call("double", "t0", x=1)],
                        [call("secret", "t2")], revoke_then_call,
                        [TextPart("done")])
        toolset = KernosToolset(kernos, "analyst", python_tool=None)
        Agent(script.model, toolsets=[toolset]).run_sync("Double 4.")
        assert script.offered[0] == ["double"]  # secret is not the agent's to call
        assert script.offered[-1] == []  # the revocation took effect at the next step
        answers = script.answers()
        assert (answers["t1"]["status"], answers["t1"]["result"]) == ("committed", 8)
        assert "Unknown tool name: 'secret'" in str(answers["t2"])  # Pydantic AI's answer
        assert answers["t3"]["status"] == "denied"
        assert "call:double" in answers["t3"]["error"]["message"]
        ops = audit_of(kernos, "analyst")
        calls = [(status, code) for status, code in ops if '"tool"' in code]
        assert answers["t0"]["result"] == 2  # called in parallel with t1
        assert [status for status, _ in calls] == ["committed"] * 2 + ["denied"]  # none: secret
        assert all('"double"' in code for _, code in calls)
        logged = {entry["op"] for entry in kernos.log()}
        assert answers["t1"]["op"] in logged and answers["t3"]["op"] not in logged


def test_the_history_survives_a_kill_9_and_a_second_run_continues_from_it(
        tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=ENV) as kernos:
        kernos.add_agent("ada")
        toolset = KernosToolset(kernos, "ada", history=KernosHistory("chat", kernos,
                                                                      principal="ada"))
        history = toolset.history("chat")
        first = Script([call("run_python", "r1", code="name = 'Ada'\nname")],
                       [TextPart("Hello, Ada.")])
        agent = Agent(first.model, toolsets=[toolset])
        result = agent.run_sync("My name is Ada.", message_history=history.load_sync())
        saved = history.save_sync(result)
        assert saved is not None and history.save_sync(result) is None  # once per run
        stored = history.load_sync()
        assert len(stored) == len(result.new_messages()) == 4

        kernos.manager.kill()
        kernos.manager.restart()

        def remembers(messages: list[ModelMessage], info: AgentInfo) -> list[Any]:
            prompts = [part.content for message in messages for part in message.parts
                       if isinstance(part, UserPromptPart)]
            assert prompts == ["My name is Ada.", "Who am I?"], prompts
            return [call("run_python", "r2", code="name")]

        second = Script(remembers, [TextPart("You are Ada.")])
        again = KernosHistory("chat", kernos, principal="ada")
        assert again.load_sync() == stored
        result = Agent(second.model, toolsets=[toolset]).run_sync(
            "Who am I?", message_history=again.load_sync())
        assert second.answers()["r2"]["result"] == "Ada"  # the namespace survived too
        again.save_sync(result)
        everything = again.load_sync()
        assert everything[:4] == stored and len(everything) == 8
        assert again.load_sync(limit=2) == everything[-2:]
        saves = [status for status, code in audit_of(kernos, "ada")
                 if '"action": "session_add"' in code]
        assert saves == ["committed", "committed"]  # one op per run, and no more
        # A recorded model that repeats a call id (a resumed run that was not saved)
        # is answered as a duplicate and does not run again.
        replayed = Script([call("run_python", "r1", code="name = 'Eve'\nname")])
        Agent(replayed.model, toolsets=[toolset]).run_sync("My name is Ada.")
        assert replayed.answers()["r1"]["duplicate"] is True
        assert kernos.op("name", principal="ada").value.json == "Ada"  # type: ignore[union-attr]
        assert again.clear_sync() == 8 and again.load_sync() == []


def test_with_the_async_client_on_the_agents_own_loop(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws", env=ENV) as (_, client):
            await client.add_agent("calc")
            toolset = KernosToolset(client, "calc")
            history = toolset.history("sums")
            script = Script([call("run_python", "a1", code="kept = 2 + 3\nprint(kept)\nkept"),
                             call("run_python", "a2", code="other = 1")],  # in parallel
                            [call("run_python", "a3", code="kept + other")], [TextPart("5")])
            result = await Agent(script.model, toolsets=[toolset]).run(
                "2 + 3?", message_history=await history.load())
            assert result.output == "5"
            answers = script.answers()
            assert answers["a1"]["stdout"] == "5\n" and answers["a3"]["result"] == 6
            assert await history.save(result) is not None
            assert await history.load() == result.new_messages()
            assert (await client.op("kept", principal="calc")).value.json == 5  # type: ignore[union-attr]
            with pytest.raises(Exception, match="own event loop"):
                history.load_sync()  # a sync call on the client's own loop would wait forever

    asyncio.run(asyncio.wait_for(scenario(), 180))
