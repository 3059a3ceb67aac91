"""The output mapping of ``kernos.sandbox``: an op's result → E2B's ``Execution``,
Jupyter MIME bundles → ``Result``, paths → the files root, callbacks in order,
and options refused before any kernel starts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kernos.harness.results import ErrorInfo, OpResult, Value
from kernos.sandbox import (
    AsyncFilesystem,
    AsyncSandbox,
    Execution,
    ExecutionError,
    InvalidArgumentException,
    Logs,
    Result,
    execution_from_op,
    result_from_bundle,
)
from kernos.sandbox.sandbox import _callbacks


def op(**fields: Any) -> OpResult:
    return OpResult(**{"status": "committed", "principal": "alice", "op": 7,
                       "commit": "abc", **fields})


def test_output_is_stdout_one_entry_per_line() -> None:
    execution = execution_from_op(op(output="a\nb\n\nc"))
    assert execution.logs.stdout == ["a\n", "b\n", "\n", "c"]
    assert execution.logs.stderr == []
    assert execution_from_op(op()).logs.stdout == []


def test_the_value_is_the_main_result() -> None:
    execution = execution_from_op(op(value=Value(repr="{'a': 1}", json={"a": 1},
                                                 has_json=True)))
    (main,) = execution.results
    assert main.is_main_result and main.text == "{'a': 1}" and main.json == {"a": 1}
    assert execution.text == "{'a': 1}"
    assert (execution.execution_count, execution.op, execution.commit) == (7, 7, "abc")
    assert execution.principal == "alice" and execution.committed and execution.error is None
    scalar = execution_from_op(op(value=Value(repr="42", json=42, has_json=True)))
    assert scalar.results[0].json is None and scalar.text == "42"
    opaque = execution_from_op(op(value=Value(repr="<Thing>")))
    assert opaque.results[0].text == "<Thing>" and opaque.results[0].json is None


def test_a_none_value_gives_no_result() -> None:
    assert execution_from_op(op(value=Value(repr="None", json=None, has_json=True))
                             ).results == []
    assert execution_from_op(op(value=None)).text is None


def test_an_op_that_did_not_commit_is_an_error() -> None:
    failed = op(status="failed", commit=None, error=ErrorInfo(
        kind="failed", message="ZeroDivisionError: division by zero",
        data={"type": "ZeroDivisionError"}))
    execution = execution_from_op(failed)
    assert execution.error == ExecutionError(
        name="ZeroDivisionError", value="division by zero",
        traceback="ZeroDivisionError: division by zero\n"
                  "(op 7: failed; rolled back, nothing it did was kept)")
    assert not execution.committed and execution.status == "failed"


def test_a_kernos_refusal_is_named_by_its_class() -> None:
    denied = op(status="denied", commit=None, error=ErrorInfo(
        kind="denied", message="'alice' does not hold the capability 'read:x'.",
        data={"type": "CapabilityDenied", "capability": "read:x"}))
    error = execution_from_op(denied).error
    assert error is not None and error.name == "CapabilityDenied"
    assert error.value == "'alice' does not hold the capability 'read:x'."
    untyped = op(status="vetoed", op=None, commit=None,
                 error=ErrorInfo(kind="vetoed", message="no"))
    error = execution_from_op(untyped).error
    assert error is not None and error.name == "Vetoed"
    assert "(the op: vetoed;" in error.traceback


def test_a_committed_op_has_no_error_even_with_error_info() -> None:
    assert execution_from_op(op(error=ErrorInfo(kind="x", message="y"))).error is None


def test_outputs_map_to_results_and_logs_in_order() -> None:
    outputs: list[tuple[str, dict[str, Any]]] = [
        ("display_data", {"data": {"text/plain": "<HTML>", "text/html": "<b>x</b>"}}),
        ("stream", {"name": "stderr", "text": "warn\n"}),
        ("stream", {"name": "stdout", "text": "out\n"}),
        ("display_data", {"data": {"image/png": "iVBO", "text/plain": "<Image>"}}),
        ("error", {"ename": "X"}),
    ]
    execution = execution_from_op(op(output="printed\n", value=Value(repr="1", json=1,
                                                                      has_json=True)),
                                  outputs)
    assert [result.formats() for result in execution.results] == [
        ["text", "html"], ["text", "png"], ["text"]]
    assert [result.is_main_result for result in execution.results] == [False, False, True]
    assert execution.logs.stderr == ["warn\n"]
    assert execution.logs.stdout == ["out\n", "printed\n"]


def test_an_execute_result_is_the_main_result() -> None:
    execution = execution_from_op(
        op(value=Value(repr="<HTML object>")),
        [("execute_result", {"data": {"text/plain": "<HTML object>",
                                      "text/html": "<i>y</i>"}, "execution_count": 3})])
    (main,) = execution.results
    assert main.is_main_result and main.html == "<i>y</i>"


def test_bundles_fill_e2b_fields_and_extra() -> None:
    bundle = {"text/plain": "t", "text/html": "h", "text/markdown": "m",
              "image/svg+xml": "s", "image/png": "p", "image/jpeg": "j",
              "application/pdf": "d", "text/latex": "l", "application/json": {"k": 1},
              "application/javascript": "js", "application/vnd.custom+json": {"c": 2}}
    result = result_from_bundle(bundle)
    assert (result.text, result.html, result.markdown, result.svg, result.png, result.jpeg,
            result.pdf, result.latex, result.json, result.javascript) == (
        "t", "h", "m", "s", "p", "j", "d", "l", {"k": 1}, "js")
    assert result.extra == {"application/vnd.custom+json": {"c": 2}}
    assert result.formats() == ["text", "html", "markdown", "svg", "png", "jpeg", "pdf",
                                "latex", "json", "javascript", "application/vnd.custom+json"]
    assert result["png"] == "p" and result._repr_html_() == "h"
    assert not result.is_main_result
    assert result_from_bundle({"application/json": '{"a": [1]}'}).json == {"a": [1]}
    assert result_from_bundle({"application/json": "not json"}).extra == {
        "application/json": "not json"}
    assert result_from_bundle({"text/plain": ["a\n", "b"]}).text == "a\nb"
    assert repr(result_from_bundle({"image/png": "p"})) == "Result(Formats: png)"


def test_execution_json_and_repr() -> None:
    execution = Execution(results=[Result(text="1", html="<b>1</b>", is_main_result=True)],
                          logs=Logs(stdout=["x\n"]),
                          error=ExecutionError(name="E", value="v", traceback="t"))
    data = json.loads(execution.to_json())
    assert data["results"] == [{"text": "1", "html": "<b>1</b>"}]
    assert json.loads(data["logs"]) == {"stdout": ["x\n"], "stderr": []}
    assert json.loads(data["error"]) == {"name": "E", "value": "v", "traceback": "t"}
    assert "Result(1)" in repr(execution)


def test_callbacks_run_in_e2b_order() -> None:
    execution = Execution(results=[Result(text="r")], logs=Logs(stdout=["o\n"],
                                                                stderr=["e\n"]),
                          error=ExecutionError(name="E", value="v", traceback="t"))
    calls: list[str] = []
    for call in _callbacks(execution, lambda m: calls.append("out:" + m.line),
                           lambda m: calls.append(f"err:{m.line}:{m.error}"),
                           lambda r: calls.append("result:" + r.text),
                           lambda e: calls.append("error:" + e.name)):
        call()
    assert calls == ["out:o\n", "err:e\n:True", "result:r", "error:E"]
    assert _callbacks(execution, None, None, None, None) == []


@pytest.mark.parametrize(("cwd", "path", "resolved"), [
    ("agents/alice", "data.csv", "agents/alice/data.csv"),
    ("agents/alice", "./a//b/./c.txt", "agents/alice/a/b/c.txt"),
    ("agents/alice", "/shared/x.txt", "shared/x.txt"),
    ("agents/alice", "", "agents/alice"),
    ("", "x/y", "x/y"),
    ("", "/", ""),
])
def test_paths_resolve_from_the_working_directory(cwd: str, path: str, resolved: str) -> None:
    files = AsyncFilesystem(lambda: None, "alice", cwd)  # type: ignore[arg-type,return-value]
    assert files.resolve(path) == resolved


def test_a_path_must_be_text() -> None:
    files = AsyncFilesystem(lambda: None, "alice", "")  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidArgumentException, match="not bytes"):
        files.resolve(b"x")  # type: ignore[arg-type]


def test_options_are_checked_before_a_kernel_starts() -> None:
    with pytest.raises(TypeError, match="unexpected options \\['image'\\]"):
        asyncio.run(AsyncSandbox.create(image="x"))
    with pytest.raises(InvalidArgumentException, match="capability string"):
        asyncio.run(AsyncSandbox.create(grants=[42]))  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentException, match="human"):
        asyncio.run(AsyncSandbox.create(principal="human", limits={"seconds": 1}))
