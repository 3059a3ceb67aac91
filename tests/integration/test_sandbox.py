"""``kernos.sandbox``: the E2B-shaped code interpreter, on real Kernos kernels.

Each sandbox starts (or joins) a kernel process through ``kernos.client``.
Checked: results and logs, the callbacks, rich displays from the human
principal, a failing cell as ``execution.error`` with its op rolled back, a
refused import and a denied capability as errors, the files API under the
principal's grants, the op in the principal's log, kill and reopen keeping
state, ``kill -9`` of the kernel giving ``SandboxDied``, a timeout
interrupting the op, and bad input refused with a clear error.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from kernos.client import KernosClient
from kernos.sandbox import (
    AsyncSandbox,
    ExecutionError,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    OutputMessage,
    PermissionDeniedException,
    Result,
    Sandbox,
    SandboxDied,
    TimeoutException,
)

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def test_results_logs_and_callbacks_of_an_agent_cell() -> None:
    seen: list[tuple[str, Any]] = []
    with Sandbox.create(envs=ENV) as sandbox:
        assert sandbox.principal == sandbox.sandbox_id
        assert sandbox.sandbox_id.startswith("sbx_")
        execution = sandbox.run_code(
            "x = 40\nprint('hi')\nprint('there')\nx + 2",
            on_stdout=lambda message: seen.append(("stdout", message)),
            on_result=lambda result: seen.append(("result", result)),
            on_error=lambda error: seen.append(("error", error)))
        assert execution.error is None and execution.committed
        assert execution.text == "42"
        assert execution.logs.stdout == ["hi\n", "there\n"]
        assert execution.logs.stderr == []
        assert [result.is_main_result for result in execution.results] == [True]
        assert isinstance(execution.execution_count, int)
        assert [kind for kind, _ in seen] == ["stdout", "stdout", "result"]
        assert isinstance(seen[0][1], OutputMessage) and str(seen[0][1]) == "hi\n"
        assert isinstance(seen[2][1], Result) and seen[2][1].text == "42"
        again = sandbox.run_code("x + 1")          # the namespace persists across cells
        assert again.text == "41"
        assert again.execution_count is not None
        assert again.execution_count > execution.execution_count
        assert sandbox.run_code("y = 1").results == []   # no final expression, no result
        last = sandbox.run_code("z = x")
        log = sandbox.log(5)
        assert log[0]["principal"] == sandbox.principal
        assert log[0]["op"] == last.execution_count and log[0]["commit"] == last.commit


def test_a_failing_cell_is_an_error_and_rolls_back() -> None:
    errors: list[ExecutionError] = []
    with Sandbox.create(envs=ENV) as sandbox:
        sandbox.run_code("total = 1")
        execution = sandbox.run_code("total = 99\n1 / 0",
                                     on_error=errors.append)
        assert execution.error is not None
        assert execution.error.name == "ZeroDivisionError"
        assert execution.error.value == "division by zero"
        assert execution.error.traceback.startswith("ZeroDivisionError: division by zero")
        assert "rolled back" in execution.error.traceback
        assert errors == [execution.error]
        assert not execution.committed and execution.commit is None
        assert sandbox.run_code("total").text == "1"       # the op rolled back

        refused = sandbox.run_code("import os")             # the restricted dialect
        assert refused.error is not None and refused.error.name == "AgentCodeRejected"
        assert "imports are not available to agents" in refused.error.value


def test_grants_apply_and_a_denied_capability_is_an_error(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with Sandbox.create(workspace=workspace, principal="human", envs=ENV) as human:
        assert human.run_code("ledger = {'left': 500}").committed
        with Sandbox.create(workspace=workspace, principal="alice",
                            grants=["read:ledger"]) as alice:   # joins the running kernel
            assert alice.kernel_pid is None
            assert alice.run_code("read('ledger')['left']").text == "500"
            denied = alice.run_code("seen = 1\nwrite('ledger', {'left': 0})")
            assert denied.error is not None
            assert denied.error.name == "CapabilityDenied"
            assert "write:ledger" in denied.error.value
            assert denied.status == "denied"
            gone = alice.run_code("seen").error                          # rolled back
            assert gone is not None and gone.name == "NameError"
            with KernosClient.connect(workspace) as client:           # in the audit chain
                records = client.audit(principal="alice")
            assert any(record.get("op") == denied.op and record.get("status") == "denied"
                       for record in records), records[-3:]
        # alice's sandbox left the kernel it joined running
        assert human.is_running()
        assert human.run_code("ledger['left']").text == "500"
        # creating the same sandbox again does not grant twice
        with Sandbox.create(workspace=workspace, principal="alice",
                            grants=["read:ledger"]) as again:
            assert again.run_code("len(grants())").text == "1"


def test_the_human_principal_displays_rich_formats() -> None:
    code = ("from IPython.display import display, HTML, Image, Markdown\n"
            "display(HTML('<b>bold</b>'))\n"
            f"display(Image(data={PNG!r}, format='png'))\n"
            "display(Markdown('# title'))\n"
            "import sys\nprint('to stderr', file=sys.stderr)\n"
            "{'rows': [1, 2]}")
    with Sandbox.create(principal="human", envs=ENV) as sandbox:
        results: list[Result] = []
        execution = sandbox.run_code(code, on_result=results.append)
        assert execution.error is None
        html, png, markdown, main = execution.results
        assert html.html == "<b>bold</b>" and "html" in html.formats()
        assert not html.is_main_result
        assert png.png is not None and base64.b64decode(png.png) == PNG
        assert png.formats() == ["text", "png"]
        assert markdown.markdown == "# title"
        assert main.is_main_result and main.json == {"rows": [1, 2]}
        assert execution.text == "{'rows': [1, 2]}"
        assert results == execution.results
        assert execution.logs.stdout == ["to stderr\n"]   # the kernel merges the streams


def test_files_are_the_principals_under_its_grants() -> None:
    with Sandbox.create(envs=ENV, grants=["file:read:shared/*"]) as sandbox:
        files = sandbox.files
        assert files.cwd == f"agents/{sandbox.principal}"
        written = files.write("data/notes.md", "# notes\n")
        assert written.path == f"/agents/{sandbox.principal}/data/notes.md"
        assert written.name == "notes.md" and written.type is FileType.FILE
        files.write("raw.bin", b"\x00\x01\xff")
        assert files.read("data/notes.md") == "# notes\n"
        assert files.read("raw.bin", format="bytes") == b"\x00\x01\xff"
        assert files.read(written.path) == "# notes\n"           # a /-rooted path
        entries = {(entry.name, entry.type) for entry in files.list("")}
        assert entries == {("data", FileType.DIR), ("raw.bin", FileType.FILE)}
        assert [entry.name for entry in files.list("", depth=None)] == [
            "data", "notes.md", "raw.bin"]
        assert files.exists("data") and files.exists("data/notes.md")
        assert not files.exists("nothing.txt")
        # agent code reads the same file, from the files root
        seen = sandbox.run_code(f"files.read('agents/{sandbox.principal}/data/notes.md')")
        assert seen.text == "'# notes\\n'"
        files.remove("data/notes.md")
        assert not files.exists("data/notes.md")
        with pytest.raises(NotFoundException, match=r"notes\.md"):
            files.read("data/notes.md")
        with pytest.raises(PermissionDeniedException, match="file:write"):
            files.write("/shared/out.txt", "no grant to write here")
        with pytest.raises(InvalidArgumentException):
            files.read("../escape")


def test_kill_then_a_new_sandbox_finds_the_state(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    first = Sandbox.create(workspace=workspace, principal="analyst", envs=ENV)
    assert first.run_code("found = [1, 2, 3]").committed
    first.files.write("result.txt", "kept")
    assert first.kill() is True
    assert not first.is_running()
    assert first.kill() is False
    with pytest.raises(SandboxDied, match="killed"):
        first.run_code("found")
    assert workspace.is_dir()                                # a given workspace is kept
    with Sandbox(workspace=workspace, principal="analyst", envs=ENV) as second:
        assert second.run_code("sum(found)").text == "6"
        assert second.files.read("result.txt") == "kept"

    temporary = Sandbox.create(envs=ENV)
    made = temporary.workspace
    assert made.is_dir()
    temporary.kill()
    assert not made.exists()                                 # a temporary one is deleted
    kept = Sandbox.create(envs=ENV, keep=True)
    kept.run_code("z = 1")
    kept.kill()
    assert kept.workspace.is_dir()
    with Sandbox.create(workspace=kept.workspace, principal=kept.principal, envs=ENV) as back:
        assert back.run_code("z").text == "1"


def test_kill_9_of_the_kernel_gives_sandbox_died(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    sandbox = Sandbox.create(workspace=workspace, principal="worker", envs=ENV)
    try:
        assert sandbox.run_code("done = 'committed'").committed
        pid = sandbox.kernel_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while sandbox.is_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(SandboxDied) as died:
            sandbox.run_code("done")
        assert str(workspace) in str(died.value) and "'worker'" in str(died.value)
        with pytest.raises(SandboxDied):
            sandbox.files.read("anything.txt")
    finally:
        sandbox.kill()
    with Sandbox.create(workspace=workspace, principal="worker", envs=ENV) as back:
        assert back.run_code("done").text == "'committed'"


def test_a_timeout_interrupts_the_op() -> None:
    with Sandbox.create(principal="human", envs=ENV) as sandbox:
        started = time.monotonic()
        with pytest.raises(TimeoutException, match="rolled back"):
            sandbox.run_code("partial = 1\nimport time\ntime.sleep(60)", timeout=1)
        assert time.monotonic() - started < 30
        after = sandbox.run_code("'partial' in globals()")
        assert after.text == "False"


def test_bad_input_is_refused_clearly() -> None:
    with pytest.raises(TypeError, match="unexpected options \\['worksapce'\\]"):
        Sandbox.create(worksapce="x")
    with pytest.raises(InvalidArgumentException, match="drop grants"):
        Sandbox.create(principal="human", grants=["read:x"])
    with Sandbox.create(envs=ENV, template="base", api_key="ignored") as sandbox:
        with pytest.raises(InvalidArgumentException, match="Python only"):
            sandbox.run_code("1", language="javascript")
        with pytest.raises(InvalidArgumentException, match="envs"):
            sandbox.run_code("1", envs={"A": "1"})
        with pytest.raises(InvalidArgumentException, match="contexts"):
            sandbox.run_code("1", context=object())
        assert sandbox.run_code("1 + 1", language="python").text == "2"


def test_the_async_sandbox() -> None:
    async def main() -> None:
        seen: list[str] = []

        async def on_stdout(message: OutputMessage) -> None:
            seen.append(message.line)

        async with await AsyncSandbox.create(envs=ENV) as sandbox:
            execution = await sandbox.run_code("print('a')\n6 * 7", on_stdout=on_stdout)
            assert execution.text == "42" and seen == ["a\n"]
            await sandbox.files.write("x.txt", "y")
            assert await sandbox.files.read("x.txt") == "y"
            assert await sandbox.is_running()
        assert not await sandbox.is_running()

    asyncio.run(main())
