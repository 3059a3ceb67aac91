"""The pure parts of ``kernos.integrations.openai_agents``: no kernel.

What the model reads back from ``run_python``, the idempotency key of a tool call,
the checks on what a session is given, the missing-extra message, and that nothing
else in Kernos imports the SDK's top-level ``agents`` package.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="needs the openai-agents extra")

from agents import FunctionTool
from agents.tool_context import ToolContext

from kernos.client import KernosClient
from kernos.errors import UsageError
from kernos.harness.results import ErrorInfo, OpResult, Value
from kernos.integrations import openai_agents
from kernos.integrations._kernel import to_the_end
from kernos.integrations.openai_agents import KernosSession, kernos_python_tool

KERNOS = Path(openai_agents.__file__).resolve().parents[1]


def _unstarted_client() -> KernosClient:
    """A client object that is never used (the checks under test come first)."""
    return object.__new__(KernosClient)


def test_the_model_reads_what_the_op_did() -> None:
    committed = OpResult(status="committed", principal="a", op=4, output="hi\n",
                         value=Value(repr="6.0", json=6.0, has_json=True))
    assert json.loads(openai_agents._tool_output(committed)) == {
        "status": "committed", "op": 4, "stdout": "hi\n", "result": 6.0, "error": None}
    opaque = OpResult(status="committed", principal="a", op=5,
                      value=Value(repr="<Thing>", has_json=False))
    assert json.loads(openai_agents._tool_output(opaque))["result"] == "<Thing>"
    denied = OpResult(status="denied", principal="a", op=6, output="before\n", error=ErrorInfo(
        kind="denied", message="'a' lacks write:prices"))
    answer = json.loads(openai_agents._tool_output(denied))
    assert (answer["status"], answer["stdout"], answer["result"]) == ("denied", "before\n", None)
    assert answer["error"]["kind"] == "denied"
    assert answer["error"]["message"].startswith("'a' lacks write:prices The op was rolled "
                                                 "back: nothing this code did was kept.")
    duplicate = OpResult(status="committed", principal="a", op=3, duplicate=True)
    answer = json.loads(openai_agents._tool_output(duplicate))
    assert answer["duplicate"] is True and "not run again" in answer["note"]


def test_a_call_key_names_agent_scope_and_call_and_stays_within_the_limit() -> None:
    assert openai_agents._call_key("a", "a/chat", "call_1") == "openai-agents:a:a/chat:call_1"
    assert openai_agents._call_key("a", "", "c") != openai_agents._call_key("b", "", "c")
    long = openai_agents._call_key("a", "s" * 300, "c")
    assert len(long) <= 200 and long == openai_agents._call_key("a", "s" * 300, "c")
    assert long != openai_agents._call_key("a", "s" * 300, "d")


def test_bad_tool_arguments_come_back_to_the_model_and_nothing_runs() -> None:
    tool = kernos_python_tool(_unstarted_client(), "analyst")
    assert isinstance(tool, FunctionTool) and tool.name == "run_python"
    assert tool.params_json_schema["required"] == ["code"]
    for arguments, said in (("{not json", "not JSON"), ('{"code": ""}', "non-empty"),
                            ('{"code": 3}', "non-empty"), ("[]", "non-empty")):
        context: ToolContext[Any] = ToolContext(context=None, tool_name="run_python",
                                                tool_call_id="c1", tool_arguments=arguments)
        answer = json.loads(asyncio.run(tool.on_invoke_tool(context, arguments)))
        assert answer["status"] == "refused" and said in answer["error"]["message"]


def test_misuse_is_refused_with_what_to_do() -> None:
    with pytest.raises(UsageError, match=r"cannot run as 'human'.*add_agent"):
        kernos_python_tool(_unstarted_client(), "human")
    with pytest.raises(UsageError, match="names the Kernos agent"):
        kernos_python_tool(_unstarted_client(), "")
    with pytest.raises(TypeError, match="AsyncKernosClient or a KernosClient"):
        kernos_python_tool("ws", "analyst")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="1 to 200 characters"):
        KernosSession("", _unstarted_client())
    with pytest.raises(UsageError, match="1 to 200 characters"):
        KernosSession("x" * 201, _unstarted_client())


def test_items_must_be_json_objects_and_nothing_is_sent_otherwise() -> None:
    session = KernosSession("chat", _unstarted_client())
    with pytest.raises(UsageError, match="item 1 is not JSON data"):
        asyncio.run(session.add_items([{"role": "user"}, {"bad": {1, 2}}]))  # type: ignore[list-item]
    with pytest.raises(UsageError, match="item 0 is a str"):
        asyncio.run(session.add_items(["hello"]))  # type: ignore[list-item]
    asyncio.run(session.add_items([]))  # nothing to add: no request
    assert asyncio.run(session.get_items(limit=0)) == []


def test_a_mutation_runs_to_its_end_when_its_caller_is_cancelled() -> None:
    finished: list[str] = []

    async def mutation() -> str:
        await asyncio.sleep(0.05)
        finished.append("done")
        return "done"

    async def scenario() -> None:
        task = asyncio.ensure_future(to_the_end(mutation()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert finished == ["done"]


def test_without_the_sdk_the_import_names_the_extra() -> None:
    code = ("import sys; sys.modules['agents'] = None\n"
            "import kernos.integrations.openai_agents")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "pip install 'kernos[openai-agents]'" in done.stderr


def test_nothing_else_in_kernos_imports_the_sdks_top_level_agents() -> None:
    pattern = re.compile(r"^\s*(import agents\b|from agents\b)", re.MULTILINE)
    importers = sorted(str(path.relative_to(KERNOS)) for path in KERNOS.rglob("*.py")
                       if pattern.search(path.read_text(encoding="utf-8")))
    assert importers == ["integrations/openai_agents.py"]
