"""The pure parts of ``kernos.integrations.smolagents``: no kernel.

How a code action's ``final_answer`` is sent (and where it is refused), the
literals ``send_variables`` writes, which tools ``send_tools`` takes, what an op's
result becomes for CodeAgent, and the missing-extra message.  The kernel is a
stand-in that returns fixed ``OpResult``s; tests/integration/test_smolagents.py
runs the same against a real kernel.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("smolagents", reason="needs the smolagents extra")

from smolagents.default_tools import FinalAnswerTool
from smolagents.local_python_executor import CodeOutput, PythonExecutor
from smolagents.tools import Tool

from kernos.client import KernosClient, RequestError
from kernos.errors import UsageError
from kernos.harness.results import ErrorInfo, OpResult, Value
from kernos.integrations import smolagents as smolagents_integration
from kernos.integrations.smolagents import (
    CodeActionFailed,
    KernosExecutor,
    KernosTool,
    prepare,
    tools_code,
    variables_code,
)


def _unstarted_client() -> KernosClient:
    """A client object that is never used (the kernel is stubbed)."""
    return object.__new__(KernosClient)


class StubKernel:
    """Answers each op with the next of ``results`` (an OpResult or an error to raise)."""

    def __init__(self, *results: OpResult | Exception) -> None:
        self.results = list(results)
        self.ops: list[tuple[str, str]] = []
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def op(self, code: str, *, principal: str, key: str | None = None) -> OpResult:
        self.ops.append((code, principal))
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    def request(self, action: str, **fields: Any) -> dict[str, Any]:
        self.requests.append((action, fields))
        return {"grants": [], "tools": []}


def _executor(*results: OpResult | Exception) -> tuple[KernosExecutor, StubKernel]:
    executor = KernosExecutor(_unstarted_client(), "analyst")
    stub = StubKernel(*results)
    executor._kernel = stub  # type: ignore[assignment]
    return executor, stub


def _refused(kind: str, message: str) -> RequestError:
    return RequestError.from_reply({"status": "error", "action": "op",
                                    "error": {"kind": kind, "message": message}})


# -- final_answer -------------------------------------------------------------------------


def test_code_without_final_answer_is_sent_as_it_is() -> None:
    code = "total = sum(read('prices'))\nprint(total)\n"
    assert prepare(code).code == code and not prepare(code).final


@pytest.mark.parametrize(("code", "sent"), [
    ("x = 2\nfinal_answer(x * 3)", "x = 2\n(x * 3)\n"),
    ("x = 2\nfinal_answer(answer=x)\n# done\n", "x = 2\n(x)\n"),
    ("a = 1; final_answer(a)", "a = 1; (a)\n"),
    ("s = 'é'; final_answer(s + 'x')", "s = 'é'; (s + 'x')\n"),  # columns are UTF-8 bytes
    ("final_answer({'mean': 6,\n              'n': 3})", "({'mean': 6,\n              'n': 3})\n"),
])
def test_a_final_final_answer_is_sent_as_the_ops_final_expression(code: str, sent: str) -> None:
    action = prepare(code)
    assert (action.code, action.final) == (sent, True)
    ast.parse(action.code)


@pytest.mark.parametrize("code", [
    "if ok:\n    final_answer(1)\nelse:\n    final_answer(2)",
    "final_answer(1)\nx = 2",
    "final_answer(1)\nfinal_answer(2)",
    "for p in prices:\n    final_answer(p)",
    "f = final_answer\nf(1)",
    "def g():\n    return final_answer(1)\ng()",
    "final_answer(1, 2)",
    "final_answer()",
    "final_answer(*xs)",
    "final_answer(value=1)",
])
def test_final_answer_anywhere_else_is_refused_before_anything_runs(code: str) -> None:
    with pytest.raises(CodeActionFailed) as refused:
        prepare(code)
    assert refused.value.answer["status"] == "refused"
    assert refused.value.answer["op"] is None
    assert "final_answer" in str(refused.value) and "Nothing ran" in str(refused.value)


def test_code_that_does_not_parse_goes_to_the_kernel_unchanged() -> None:
    assert prepare("final_answer(").code == "final_answer("
    assert not prepare("final_answer(").final


# -- variables ----------------------------------------------------------------------------


def test_variables_become_literals_of_their_values() -> None:
    variables = {"n": 3, "ok": True, "none": None, "x": 1.5, "s": "a'b\"\n", "b": b"\x00",
                 "items": [1, (2,), {"k": [3]}], "tags": {"a"}, "empty": set(),
                 "frozen": frozenset({1}), "pair": (1, 2)}
    code = variables_code(variables)
    scope: dict[str, Any] = {}
    exec(code, {"set": set, "frozenset": frozenset}, scope)
    assert scope == variables
    assert variables_code({}) == ""


@pytest.mark.parametrize(("variables", "named"), [
    ({"_hidden": 1}, "'_hidden'"),
    ({"final_answer": 1}, "'final_answer'"),
    ({"class": 1}, "'class'"),
    ({"a b": 1}, "'a b'"),
    ({"x": float("nan")}, "'x'"),
    ({"x": object()}, "'x'"),
    ({"x": {1: "a"}}, "'x'"),
    ({"x": [1, [2, {"y": {3j}}]]}, "'x'"),
])
def test_variables_agent_code_cannot_hold_are_refused_by_name(
        variables: dict[str, Any], named: str) -> None:
    with pytest.raises(UsageError, match="Nothing was sent") as refused:
        variables_code(variables)
    assert named in str(refused.value)


def test_send_variables_is_one_op_of_the_agent_and_none_for_no_variables() -> None:
    executor, stub = _executor(OpResult(status="committed", principal="analyst", op=3))
    executor.send_variables({})
    assert stub.ops == []
    executor.send_variables({"threshold": 4, "name": "x"})
    assert stub.ops == [("threshold = 4\nname = 'x'", "analyst")]


def test_send_variables_says_when_the_op_did_not_commit() -> None:
    executor, _ = _executor(OpResult(status="failed", principal="analyst", op=3, error=ErrorInfo(
        kind="failed", message="'len' is a builtin of agent code and cannot be rebound")))
    with pytest.raises(UsageError, match="cannot be rebound"):
        executor.send_variables({"len": 1})


# -- tools --------------------------------------------------------------------------------


class Search(Tool):
    name = "search"
    description = "Searches."
    inputs = {"query": {"type": "string", "description": "what"}}  # noqa: RUF012 (as smolagents declares tools)
    output_type = "string"

    def forward(self, query: str) -> str:
        return query


def test_send_tools_takes_final_answer_and_checks_the_agent() -> None:
    executor, stub = _executor()
    executor.send_tools({"final_answer": FinalAnswerTool()})
    assert stub.requests == [("grants", {"agent": "analyst"})]


def test_send_tools_refuses_host_tools_by_name() -> None:
    executor, stub = _executor()
    with pytest.raises(UsageError, match="search") as refused:
        executor.send_tools({"final_answer": FinalAnswerTool(), "search": Search()})
    assert "call('NAME', **args)" in str(refused.value)
    assert stub.requests == []


DOUBLE = {"name": "double", "description": "doubles x", "version": 1,
          "schema": {"type": "object", "required": ["x"],
                     "properties": {"x": {"type": "integer", "description": "a number"},
                                    "note": {"type": ["string", "null"]}}}}


def test_a_kernos_tool_is_listed_as_a_function_and_never_runs_here() -> None:
    tool = KernosTool(DOUBLE)
    assert (tool.name, tool.description) == ("double", "doubles x")
    assert tool.inputs == {"x": {"type": "integer", "description": "a number"},
                           "note": {"type": "any", "description": "note", "nullable": True}}
    assert "def double(x: integer, note: any) -> any:" in tool.to_code_prompt()
    with pytest.raises(UsageError, match="runs inside a Kernos agent's code"):
        tool(x=1)
    assert KernosTool({"name": "ping"}).inputs == {}


@pytest.mark.parametrize("name", ["_secret", "final_answer", "two words", "class", "read",
                                  "len", None])
def test_a_kernos_tool_whose_name_agent_code_cannot_use_is_refused(name: Any) -> None:
    with pytest.raises(UsageError, match=r"call it with call\(NAME"):
        KernosTool({"name": name})


def test_send_tools_defines_each_kernos_tool_in_one_op() -> None:
    executor, stub = _executor(OpResult(status="committed", principal="analyst", op=2))
    tools = [KernosTool(DOUBLE), KernosTool({"name": "ping"})]
    executor.send_tools({"final_answer": FinalAnswerTool(), **{t.name: t for t in tools}})
    assert stub.ops == [(tools_code(tools), "analyst")] and stub.requests == []
    scope: dict[str, Any] = {}
    exec(tools_code(tools), {"call": lambda name, **arguments: (name, arguments)}, scope)
    assert scope["double"](x=2) == ("double", {"x": 2}) and scope["ping"]() == ("ping", {})


def test_kernos_tools_leaves_out_what_cannot_be_a_function(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class ToolsKernel(StubKernel):
        def __init__(self, client: object, **_: object) -> None:
            super().__init__()

        def request(self, action: str, **fields: Any) -> dict[str, Any]:
            assert (action, fields) == ("tools", {"principal": "analyst"})
            return {"tools": [DOUBLE, {"name": "len"}, {"name": "class"}, {"name": "ping"}]}

    monkeypatch.setattr(smolagents_integration, "Kernel", ToolsKernel)
    tools = smolagents_integration.kernos_tools(_unstarted_client(), "analyst")
    assert [tool.name for tool in tools] == ["double", "ping"]


def test_send_tools_says_when_the_tools_could_not_be_defined() -> None:
    executor, _ = _executor(OpResult(status="vetoed", principal="analyst", op=2, error=ErrorInfo(
        kind="vetoed", message="op 2 (analyst) ran over its 1 s deadline.")))
    with pytest.raises(UsageError, match=r"could not be defined.*deadline"):
        executor.send_tools({"ping": KernosTool({"name": "ping"})})


# -- what CodeAgent gets back ---------------------------------------------------------------


def test_a_committed_op_is_a_code_output() -> None:
    executor, stub = _executor(
        OpResult(status="committed", principal="analyst", op=4, output="18\n",
                 value=Value(repr="6", json=6, has_json=True)),
        OpResult(status="committed", principal="analyst", op=5,
                 value=Value(repr="Decimal('1.5')", has_json=False)))
    assert isinstance(executor, PythonExecutor)
    assert executor("print(18)\nfinal_answer(6)") == CodeOutput(output=6, logs="18\n",
                                                             is_final_answer=True)
    assert stub.ops[0] == ("print(18)\n(6)\n", "analyst")
    assert executor("q") == CodeOutput(output="Decimal('1.5')", logs="", is_final_answer=False)


def test_an_op_that_did_not_commit_raises_what_the_model_reads() -> None:
    executor, _ = _executor(OpResult(
        status="denied", principal="analyst", op=6, output="before\n",
        error=ErrorInfo(kind="denied", message="'analyst' lacks write:prices.")))
    with pytest.raises(CodeActionFailed) as failed:
        executor("scratch = 1\nwrite('prices', [])")
    message = str(failed.value)
    assert message.startswith("[denied, op 6] 'analyst' lacks write:prices.")
    assert "nothing this code did was kept" in message
    assert message.endswith("Printed before the error:\nbefore\n")
    assert failed.value.answer["status"] == "denied"


def test_a_refusal_the_model_can_act_on_is_its_error_any_other_raises() -> None:
    executor, _ = _executor(_refused("invalid", "the circuit of 'analyst' is open."),
                            _refused("unknown_principal", "there is no principal 'analyst'"))
    with pytest.raises(CodeActionFailed, match="circuit of 'analyst' is open"):
        executor("x = 1")
    with pytest.raises(RequestError) as other:
        executor("x = 1")
    assert not isinstance(other.value, CodeActionFailed)


def test_bad_arguments_are_refused_clearly() -> None:
    with pytest.raises(UsageError, match="cannot run as 'human'"):
        KernosExecutor(_unstarted_client(), "human")
    with pytest.raises(TypeError, match="KernosClient"):
        KernosExecutor(object(), "analyst")  # type: ignore[arg-type]
    executor, _ = _executor()
    with pytest.raises(UsageError, match="a code action is a str"):
        executor(b"x = 1")  # type: ignore[arg-type]


def test_without_smolagents_the_import_names_the_extra() -> None:
    code = ("import sys; sys.modules['smolagents'] = None\n"
            "import kernos.integrations.smolagents")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "pip install 'kernos[smolagents]'" in done.stderr
