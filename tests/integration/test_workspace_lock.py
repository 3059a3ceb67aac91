"""One owner per workspace, through real kernels and the real ``kernos`` command.

A second kernel on a workspace that another kernel holds must refuse every
cell with an error that says which workspace, who holds it and what to do,
and must run nothing: no code, no commit.  Once the owner dies (even by
kill -9, which leaves no chance to clean up) the second kernel's next cell
attaches, restores the owner's last commit and works.  ``kernos checkout``
writes to the workspace, so it is refused too, while ``kernos log`` only
reads and works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support import history_length

pytestmark = pytest.mark.kernel

KERNOS = str(Path(sys.executable).with_name("kernos"))


def kernos(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KERNOS, *args], capture_output=True, text=True, timeout=120)


def committed(kernel: Any, code: str) -> None:
    result = kernel.run(code)
    assert result.committed, (result.errors, result.kernos)


def assert_refused(result: Any, workspace: Path, owner_pid: int) -> None:
    assert result.status == "error"
    assert result.kernos["status"] == "rejected", result.kernos
    message = result.reply["content"]["evalue"]
    assert str(workspace.resolve()) in message, message
    assert f"pid {owner_pid}" in message, message
    assert "Stop that kernel" in message and "KERNOS_WORKSPACE" in message, message
    assert result.errors and result.errors[0]["evalue"] == message  # shown in the output too


def test_second_kernel_is_refused_and_takes_over_after_the_owner_dies(
    kernel_factory: Any,
) -> None:
    owner = kernel_factory()
    committed(owner, "x = [1]\nshared = {'x': x}")
    second = kernel_factory(owner.workspace)
    length = history_length(owner.workspace)

    for code in ("x = 'from the second kernel'", "print('RAN')\nx.append(99)", "y = 1"):
        result = second.run(code)
        assert_refused(result, owner.workspace, owner.pid)
        assert "RAN" not in result.stdout
    assert history_length(owner.workspace) == length

    # The owner is unaffected and keeps committing; nothing of the second kernel is shared.
    assert owner.value("(x, shared['x'] is x, 'y' in dir())") == ([1], True, False)
    committed(owner, "x.append(2)")
    acknowledged = owner.value("(x, shared['x'] is x)")
    assert acknowledged == ([1, 2], True)
    length = history_length(owner.workspace)

    owner.kill9()
    # The second kernel retries attaching at its next cell: it restores the
    # owner's last acknowledged commit and works.
    assert second.value("(x, shared['x'] is x)") == acknowledged
    # The probe committed, and changed nothing: no new snapshot.
    assert history_length(owner.workspace) == length
    committed(second, "x.append(3)\ny = 'second'")
    assert second.value("(x, y)") == ([1, 2, 3], "second")

    # ...and now the second kernel is the owner that a third one meets.
    third = kernel_factory(owner.workspace)
    assert_refused(third.run("print('RAN')"), owner.workspace, second.pid)
    second.kill9()
    assert third.value("(x, y, shared['x'] is x)") == ([1, 2, 3], "second", True)


def test_cli_offline_writes_are_refused_while_a_kernel_holds_the_workspace(
        kernel_factory: Any) -> None:
    kernel = kernel_factory()
    committed(kernel, "v = 'first'")
    committed(kernel, "v = 'second'")
    workspace = str(kernel.workspace)
    length = history_length(kernel.workspace)

    log = kernos("log", "-w", workspace)
    assert log.returncode == 0, log.stderr
    assert "v = 'first'" in log.stdout and "v = 'second'" in log.stdout

    # An offline write (erase) is refused while the kernel holds the workspace
    # (a checkout would go through that kernel instead: see test_cli_harness).
    refused = kernos("erase", "-w", workspace, "someone")
    assert refused.returncode == 2
    assert refused.stderr.startswith("kernos erase: ")
    assert str(kernel.workspace.resolve()) in refused.stderr
    assert f"pid {kernel.pid}" in refused.stderr and "Stop that kernel" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert history_length(kernel.workspace) == length
    assert kernel.value("v") == "second"  # the kernel never noticed
    length = history_length(kernel.workspace)  # the probe committed (no snapshot: a read)

    kernel.kill9()
    done = kernos("checkout", "-w", workspace, "@1")
    assert done.returncode == 0, done.stderr
    assert history_length(kernel.workspace) == length + 1  # a new snapshot, history kept
    assert kernel_factory(kernel.workspace).value("v") == "first"


def test_a_process_forked_by_the_kernel_does_not_keep_the_workspace(kernel_factory: Any) -> None:
    owner = kernel_factory()
    committed(owner, "import os, time\nx = [1]\nchild = os.fork()\nif child == 0:\n"
                     "    time.sleep(300)\n    os._exit(0)")
    child = owner.value("child")
    try:
        assert Path(f"/proc/{child}").exists()
        owner.kill9()
        # The forked copy of the kernel holds the lock file open, yet the lock died with
        # the kernel: the next kernel attaches at once.
        successor = kernel_factory(owner.workspace)
        committed(successor, "x.append(2)")
        assert successor.value("x") == [1, 2]
    finally:
        os.kill(child, signal.SIGKILL)
