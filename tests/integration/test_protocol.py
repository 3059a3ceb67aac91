"""The Jupyter protocol around ops: what Kernos offers, refuses and serializes.

* No kernel subshells and no debugger: both would run code beside a cell.
* Oversized and malformed requests are refused without running anything, and
  the kernel keeps serving.
* Comm messages that arrive while a cell runs wait until its op has finished.
"""

from __future__ import annotations

import queue
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from support import git_view_current

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

TIMEOUT = 60


def commit_count(workspace: Path) -> int:
    git_view_current(workspace)
    result = subprocess.run(["git", "-C", str(workspace / "history.git"), "rev-list",
                             "--count", "main"], capture_output=True, text=True, timeout=60)
    return int(result.stdout) if result.returncode == 0 else 0


def replies_until(kernel: Kernel, msg_id: str) -> list[dict[str, Any]]:
    """Shell replies up to and including the reply to ``msg_id`` (replies come in order)."""
    replies = []
    while True:
        reply = kernel.client.get_shell_msg(timeout=TIMEOUT)
        replies.append(reply)
        if reply["parent_header"].get("msg_id") == msg_id:
            return replies


def control_request(kernel: Kernel, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    client = kernel.client
    message = client.session.msg(msg_type, content)
    client.control_channel.send(message)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        reply = client.control_channel.get_msg(timeout=TIMEOUT)
        if reply["parent_header"].get("msg_id") == message["header"]["msg_id"]:
            return reply
    raise AssertionError(f"no reply to {msg_type}")


def test_no_subshells_and_no_debugger(kernel: Kernel) -> None:
    info = replies_until(kernel, kernel.client.kernel_info())[-1]["content"]
    assert info["implementation"] == "kernos"
    assert info["language_info"]["name"] == "python"
    features = info.get("supported_features", [])
    assert "kernel subshells" not in features and "debugger" not in features
    assert info.get("debugger", False) is False

    reply = control_request(kernel, "create_subshell_request", {})
    assert reply["msg_type"] == "create_subshell_reply"
    assert reply["content"]["status"] == "error"
    assert "subshell" in reply["content"]["evalue"]
    assert "subshell_id" not in reply["content"]

    listed = control_request(kernel, "list_subshell_request", {})
    assert listed["content"].get("subshell_id", []) == []

    debug = control_request(kernel, "debug_request", {
        "seq": 1, "type": "request", "command": "initialize", "arguments": {}})
    assert debug["content"]["success"] is False
    assert "debugger" in debug["content"]["message"]

    # A request addressed to a subshell is refused and does not run.
    client = kernel.client
    message = client.session.msg("execute_request", {
        "code": "sneaky = 1", "silent": False, "store_history": True,
        "user_expressions": {}, "allow_stdin": False})
    message["header"]["subshell_id"] = "not-a-subshell"
    client.shell_channel.send(message)
    reply = replies_until(kernel, message["header"]["msg_id"])[-1]
    assert reply["content"]["status"] == "error"
    assert kernel.value("'sneaky' in globals()") is False


def test_an_oversized_cell_is_rejected_before_anything_runs(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    kernel = kernel_factory(env={"KERNOS_MAX_SOURCE_BYTES": "2000"})
    assert kernel.run("x = 1").committed
    marker = tmp_path / "ran"
    commits = commit_count(kernel.workspace)
    code = (f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nx = 2\n"
            f"# {'a' * 2000}")
    result = kernel.run(code)
    assert result.status == "error"
    assert result.kernos["status"] == "rejected", result.kernos
    assert "KERNOS_MAX_SOURCE_BYTES" in result.kernos["reason"]
    error = result.errors[0]
    assert error["ename"] == "RequestRejected"
    assert "2,000" in error["evalue"] and "Nothing ran" in error["evalue"]
    assert result.reply["content"]["evalue"] == error["evalue"]
    assert not marker.exists(), "the oversized cell ran"
    assert commit_count(kernel.workspace) == commits, "a rejected cell changed the history"
    assert kernel.value("x") == 1

    # The limit counts bytes (UTF-8), not characters.
    wide = kernel.run("y = '" + "\u20ac" * 700 + "'")       # 700 characters, 2,100 bytes
    assert wide.kernos["status"] == "rejected"
    fits = kernel.run("y = '" + "a" * 1900 + "'")
    assert fits.committed and kernel.value("len(y)") == 1900


MALFORMED: dict[str, Callable[[dict[str, Any]], None]] = {
    "missing code": lambda message: message["content"].pop("code"),
    "code is not a string": lambda message: message["content"].update(code=42),
    "code is a list": lambda message: message["content"].update(code=["x = 3"]),
    "content is a list": lambda message: message.update(content=b'["x = 3"]'),
}


def send_malformed(kernel: Kernel, breaks: Callable[[dict[str, Any]], None]) -> str:
    client = kernel.client
    message = client.session.msg("execute_request", {
        "code": "x = 3", "silent": False, "store_history": True,
        "user_expressions": {}, "allow_stdin": False})
    breaks(message)
    client.shell_channel.send(message)
    return str(message["header"]["msg_id"])


def test_malformed_execute_requests_get_an_error_and_the_kernel_keeps_serving(
        kernel: Kernel) -> None:
    assert kernel.run("x = 1").committed
    commits = commit_count(kernel.workspace)
    sent = {send_malformed(kernel, breaks): case for case, breaks in MALFORMED.items()}
    probe = kernel.client.execute("x = x + 1")
    replies = {reply["parent_header"].get("msg_id"): reply
               for reply in replies_until(kernel, probe)}
    for msg_id, case in sent.items():
        assert msg_id in replies, f"no reply to an execute_request whose {case}"
        reply = replies[msg_id]
        assert reply["msg_type"] == "execute_reply"
        assert reply["content"]["status"] == "error", (case, reply["content"])
        assert "malformed" in reply["content"]["evalue"], reply["content"]
        assert "Nothing ran" in reply["content"]["evalue"]
        assert reply["metadata"]["kernos"]["status"] == "rejected", case
    assert replies[probe]["content"]["status"] == "ok"
    assert replies[probe]["metadata"]["kernos"]["status"] == "committed"
    assert kernel.manager.is_alive()
    assert kernel.value("x") == 2, "a malformed request ran code"
    # The probe only: value() reads, and an op that changes nothing writes no commit.
    assert commit_count(kernel.workspace) == commits + 1


def test_user_expressions_are_part_of_the_op(kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    assert kernel.run("items = []").committed
    client = kernel.client
    msg_id = client.execute("pass", user_expressions={"n": "items.append(1) or len(items)"})
    reply = replies_until(kernel, msg_id)[-1]
    assert reply["content"]["user_expressions"]["n"]["data"]["text/plain"] == "1"
    assert reply["metadata"]["kernos"]["status"] == "committed"
    kernel.kill9()
    restored = kernel_factory(kernel.workspace)
    assert restored.value("items") == [1]


COMM_SETUP = """
import asyncio, time
state = "initial"
def on_open(comm, message):
    comm.send({"event": "open", "state": state, "t": time.time()})
    comm.on_msg(lambda msg: comm.send({"event": "msg", "state": state, "t": time.time()}))
get_ipython().kernel.comm_manager.register_target("probe", on_open)
"""

LONG_CELL = "state = 'running'\nawait asyncio.sleep(2)\nstate = 'done'"


def comm_message(kernel: Kernel, msg_type: str, **content: Any) -> dict[str, Any]:
    message = kernel.client.session.msg(msg_type, {"data": {}, **content})
    kernel.client.shell_channel.send(message)
    return message


def iopub_until(kernel: Kernel, done: Callable[[list[dict[str, Any]]], bool]
                ) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + TIMEOUT
    while not done(seen):
        assert time.monotonic() < deadline, [m["msg_type"] for m in seen]
        try:
            seen.append(kernel.client.get_iopub_msg(timeout=1))
        except queue.Empty:
            continue
    return seen


def test_comm_messages_wait_for_the_running_op(kernel: Kernel) -> None:
    result = kernel.run(COMM_SETUP)
    assert result.committed, result.errors
    comm_message(kernel, "comm_open", comm_id="early", target_name="probe")
    iopub_until(kernel, lambda seen: any(m["msg_type"] == "comm_msg" for m in seen))

    cell = kernel.client.execute(LONG_CELL)
    iopub_until(kernel, lambda seen: any(
        m["msg_type"] == "execute_input" and m["parent_header"]["msg_id"] == cell
        for m in seen))
    sent_at = time.monotonic()
    time.sleep(0.3)
    comm_message(kernel, "comm_open", comm_id="late", target_name="probe")
    comm_message(kernel, "comm_msg", comm_id="early")
    comm_message(kernel, "comm_open", comm_id="nobody", target_name="no-such-target")
    assert time.monotonic() - sent_at < 1.5, "too slow: the cell may have finished already"

    reply = replies_until(kernel, cell)[-1]
    assert reply["content"]["status"] == "ok"
    report = reply["metadata"]["kernos"]
    assert report["status"] == "committed"
    committed_at = datetime.fromisoformat(report["committed_at"].replace("Z", "+00:00"))

    def finished(seen: list[dict[str, Any]]) -> bool:
        kinds = {(m["msg_type"], m["content"].get("comm_id")) for m in seen}
        return {("comm_msg", "late"), ("comm_msg", "early"), ("comm_close", "nobody")} <= kinds

    seen = iopub_until(kernel, finished)
    handled = [m["content"]["data"] for m in seen if m["msg_type"] == "comm_msg"]
    assert {data["event"] for data in handled} == {"open", "msg"}
    for data in handled:
        # The handler saw the image as the op left it, and ran after it committed.
        assert data["state"] == "done", data
        assert data["t"] >= committed_at.timestamp() - 0.002, (data, report["committed_at"])
    closed = next(m for m in seen if m["msg_type"] == "comm_close")
    assert closed["header"]["date"] >= committed_at
    assert kernel.value("state") == "done"
