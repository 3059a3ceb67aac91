"""The pure parts of ``kernos.integrations.pydantic_ai``: no kernel.

A stand-in for the kernel records the requests the toolset and the history send:
what the model is offered (the code tool, the Kernos tools as listed), where each
call goes and with what idempotency key, what the model reads back, how messages
are stored and loaded (Pydantic AI's own adapter), the checks on what is given,
and the missing-extra message.  Pydantic AI's ``FunctionModel`` plays the model.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="needs the pydantic-ai extra")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kernos.client import KernosClient, RequestError
from kernos.errors import UsageError
from kernos.harness.results import ErrorInfo, OpResult, Value
from kernos.integrations import pydantic_ai as integration
from kernos.integrations.pydantic_ai import KernosHistory, KernosToolset

DOUBLE = {"name": "double", "version": 1, "description": "doubles x", "effect": "pure",
          "capability": "call:double", "author": "human",
          "schema": {"type": "object", "properties": {"x": {"type": "integer"}},
                     "required": ["x"]}}


def _unstarted_client() -> KernosClient:
    """A client object that is never used (a stand-in kernel answers instead)."""
    return object.__new__(KernosClient)


class StandIn:
    """Answers the requests a toolset or a history sends, and records them."""

    def __init__(self, tools: list[dict[str, Any]] | None = None,
                 items: list[Any] | None = None) -> None:
        self.tools = tools or []
        self.items = items or []
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.op_result = OpResult(status="committed", principal="analyst", op=7,
                                  value=Value(repr="8", json=8, has_json=True))
        self.refusal: RequestError | None = None

    async def arequest(self, action: str, **fields: Any) -> dict[str, Any]:
        return self.request(action, **fields)

    def request(self, action: str, **fields: Any) -> dict[str, Any]:
        self.sent.append((action, fields))
        if self.refusal is not None:
            raise self.refusal
        if action == "tools":
            return {"tools": self.tools}
        if action == "session_items":
            return {"items": self.items}
        if action == "session_add":
            return {"op": 9, "added": len(fields["items"])}
        if action == "op":
            return self.op_result.to_json()
        raise AssertionError(f"unexpected {action}")

    async def aop(self, code: str, *, principal: str, key: str | None = None) -> OpResult:
        self.sent.append(("code", {"code": code, "principal": principal, "key": key}))
        return self.op_result


def _toolset(stand_in: StandIn, **options: Any) -> KernosToolset:
    toolset = KernosToolset(_unstarted_client(), "analyst", **options)
    toolset._kernel = stand_in  # type: ignore[assignment]
    return toolset


def _history(stand_in: StandIn, session: str = "chat") -> KernosHistory:
    history = KernosHistory(session, _unstarted_client(), principal="analyst")
    history._kernel = stand_in  # type: ignore[assignment]
    return history


def _scripted(*steps: list[Any]) -> tuple[FunctionModel, list[list[ModelMessage]],
                                          list[list[str]]]:
    """A model that answers with ``steps`` in turn, then "done"; what it was given."""
    seen: list[list[ModelMessage]] = []
    offered: list[list[str]] = []
    queue = list(steps)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        offered.append([tool.name for tool in info.function_tools])
        return ModelResponse(parts=queue.pop(0) if queue else [TextPart("done")])

    return FunctionModel(respond), seen, offered


def _returns(messages: list[ModelMessage]) -> list[Any]:
    return [part for message in messages for part in message.parts
            if isinstance(part, (ToolReturnPart, RetryPromptPart))]


def test_the_model_is_offered_the_code_tool_and_the_listed_kernos_tools() -> None:
    stand_in = StandIn(tools=[DOUBLE])
    tools = asyncio.run(_toolset(stand_in).get_tools(None))  # type: ignore[arg-type]
    assert list(tools) == ["run_python", "double"]
    code, double = tools["run_python"].tool_def, tools["double"].tool_def
    assert code.parameters_json_schema["required"] == ["code"]
    assert "'analyst'" in (code.description or "")
    assert double.parameters_json_schema == DOUBLE["schema"]
    assert double.description == "doubles x"
    assert double.metadata is not None and double.metadata["capability"] == "call:double"
    assert stand_in.sent == [("tools", {"principal": "analyst"})]  # the agent's list
    only_code = StandIn(tools=[DOUBLE])
    assert list(asyncio.run(_toolset(only_code, kernos_tools=False).get_tools(
        None))) == ["run_python"]  # type: ignore[arg-type]
    assert only_code.sent == []
    assert list(asyncio.run(_toolset(StandIn(tools=[DOUBLE]), python_tool=None).get_tools(
        None))) == ["double"]  # type: ignore[arg-type]


def test_a_kernos_tool_named_like_the_code_tool_is_an_error_naming_both() -> None:
    clash = StandIn(tools=[{**DOUBLE, "name": "run_python"}])
    with pytest.raises(UsageError, match=r"'run_python'.*python_tool="):
        asyncio.run(_toolset(clash).get_tools(None))  # type: ignore[arg-type]
    renamed = asyncio.run(_toolset(StandIn(tools=[{**DOUBLE, "name": "run_python"}]),
                                   python_tool="python").get_tools(None))  # type: ignore[arg-type]
    assert list(renamed) == ["python", "run_python"]


def test_each_call_goes_to_its_op_with_a_key_of_agent_scope_tool_and_call() -> None:
    stand_in = StandIn(tools=[DOUBLE])
    model, seen, offered = _scripted(
        [ToolCallPart("run_python", {"code": "1 + 1"}, tool_call_id="c1"),
         ToolCallPart("double", {"x": 4}, tool_call_id="c2")])
    toolset = _toolset(stand_in, history=_history(StandIn()))
    result = Agent(model, toolsets=[toolset]).run_sync("go")
    assert result.output == "done" and offered[0] == ["run_python", "double"]
    code = [fields for action, fields in stand_in.sent if action == "code"]
    called = [fields for action, fields in stand_in.sent if action == "op"]
    assert code == [{"code": "1 + 1", "principal": "analyst",
                     "key": "pydantic-ai:analyst:analyst/chat/run_python:c1"}]
    assert called == [{"principal": "analyst", "tool": "double", "arguments": {"x": 4},
                       "key": "pydantic-ai:analyst:analyst/chat/double:c2"}]
    answers = [part.content for part in _returns(seen[-1])]
    assert answers == [{"status": "committed", "op": 7, "stdout": "", "result": 8,
                        "error": None}] * 2
    # No key without idempotence; a scope keeps two conversations' ids apart.
    assert _toolset(StandIn(), idempotent=False)._key("run_python", "c1") is None
    assert _toolset(StandIn())._key("run_python", None) is None
    assert (_toolset(StandIn(), scope="a")._key("run_python", "c1")
            != _toolset(StandIn(), scope="b")._key("run_python", "c1"))


def test_a_rolled_back_call_and_a_refusal_are_answered_and_other_refusals_raise() -> None:
    stand_in = StandIn(tools=[DOUBLE])
    stand_in.op_result = OpResult(status="denied", principal="analyst", op=8, error=ErrorInfo(
        kind="denied", message="'analyst' does not hold 'call:double'."))
    model, seen, _ = _scripted([ToolCallPart("double", {"x": 4}, tool_call_id="c1")])
    Agent(model, toolsets=[_toolset(stand_in)]).run_sync("go")
    [answer] = [part.content for part in _returns(seen[-1])]
    assert answer["status"] == "denied" and answer["op"] == 8
    assert "nothing this code did was kept" in answer["error"]["message"]
    toolset = _toolset(stand_in)
    tools = asyncio.run(toolset.get_tools(None))  # type: ignore[arg-type]
    stand_in.refusal = RequestError("denied", "the circuit of 'analyst' is open")
    refused = asyncio.run(integration.call_kernos_tool(toolset._kernel, "double", {"x": 1},
                                                       agent="analyst"))
    assert refused["status"] == "refused" and "Nothing ran" in refused["error"]["message"]
    stand_in.refusal = RequestError("unknown_principal", "no agent 'analyst'")
    with pytest.raises(RequestError, match="no agent"):
        asyncio.run(toolset.call_tool("double", {"x": 1}, _context(), tools["double"]))


def _context() -> Any:
    class Context:
        tool_call_id = "c9"
    return Context()


def test_code_arguments_are_checked_by_pydantic_ai_and_nothing_runs() -> None:
    stand_in = StandIn()
    model, seen, _ = _scripted([ToolCallPart("run_python", {"code": 3}, tool_call_id="c1")],
                               [ToolCallPart("run_python", {"src": "1"}, tool_call_id="c2")])
    Agent(model, toolsets=[_toolset(stand_in, kernos_tools=False, max_retries=2)]).run_sync("go")
    retries = [part for part in _returns(seen[-1]) if getattr(part, "outcome", "") == "retried"
               or isinstance(part, RetryPromptPart)]
    assert len(retries) == 2 and all("'code'" in str(part.content) for part in retries)
    assert [action for action, _ in stand_in.sent if action == "code"] == []


def test_messages_are_stored_as_pydantic_ais_json_and_load_back_equal() -> None:
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("Mean price?")]),
        ModelResponse(parts=[ToolCallPart("run_python", {"code": "1"}, tool_call_id="c1")]),
        ModelRequest(parts=[ToolReturnPart("run_python", {"status": "committed"},
                                           tool_call_id="c1")]),
        ModelResponse(parts=[TextPart("It is 6.")])]
    stand_in = StandIn()
    history = _history(stand_in)
    assert asyncio.run(history.save(messages)) == 9
    [(action, fields)] = stand_in.sent
    assert action == "session_add" and fields["key"] is None
    assert [item["kind"] for item in fields["items"]] == ["request", "response"] * 2
    stored = StandIn(items=fields["items"])
    assert _history(stored).load_sync() == messages
    assert asyncio.run(_history(stored).load(limit=2)) == messages
    assert stored.sent[-1] == ("session_items", {"session": "chat", "principal": "analyst",
                                                 "limit": 2})


def test_a_run_is_saved_with_a_key_naming_it_so_saving_it_twice_adds_it_once() -> None:
    model, _, _ = _scripted()
    result = Agent(model).run_sync("hello")
    stand_in = StandIn()
    history = _history(stand_in)
    history.save_sync(result)
    asyncio.run(history.save(result))
    keys = [fields["key"] for _, fields in stand_in.sent]
    assert keys[0] == keys[1] and result.run_id in keys[0]
    assert keys[0].startswith("pydantic-ai-history:analyst:chat:")
    assert stand_in.sent[0][1]["items"] == integration.dump_messages(result.new_messages())
    assert _history(StandIn()).save_sync([]) is None  # nothing to add: no request


def test_misuse_is_refused_with_what_to_do() -> None:
    client = _unstarted_client()
    with pytest.raises(UsageError, match=r"cannot run as 'human'.*add_agent"):
        KernosToolset(client, "human")
    with pytest.raises(UsageError, match="names the Kernos agent"):
        KernosToolset(client, "")
    with pytest.raises(TypeError, match="AsyncKernosClient or a KernosClient"):
        KernosToolset("ws", "analyst")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not both"):
        KernosToolset(client, "a", history=KernosHistory("c", client), scope="s")
    with pytest.raises(UsageError, match="python_tool names"):
        KernosToolset(client, "a", python_tool="")
    for bad in ("", "x" * 201):
        with pytest.raises(UsageError, match="1 to 200 characters"):
            KernosHistory(bad, client)
    history = _history(StandIn())
    with pytest.raises(UsageError, match="message 1 is a dict"):
        history.save_sync([ModelRequest(parts=[UserPromptPart("hi")]), {"kind": "x"}])  # type: ignore[list-item]
    with pytest.raises(UsageError, match="not str"):
        history.save_sync("hello")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="an int >= 0"):
        history.load_sync(limit=-1)
    with pytest.raises(UsageError, match="idempotency key"):
        history.save_sync([ModelRequest(parts=[UserPromptPart("hi")])], key="k" * 201)
    foreign = _history(StandIn(items=[{"role": "user", "content": "hi"}]))
    with pytest.raises(UsageError, match="not Pydantic AI messages"):
        foreign.load_sync()
    toolset = KernosToolset(client, "analyst")
    assert toolset.history("chat").principal == "analyst"


def test_without_pydantic_ai_the_import_names_the_extra() -> None:
    code = ("import sys; sys.modules['pydantic_ai'] = None\n"
            "import kernos.integrations.pydantic_ai")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "pip install 'kernos[pydantic-ai]'" in done.stderr
