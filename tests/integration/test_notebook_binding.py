"""A notebook bound to a workspace (``metadata.kernos.workspace``), through a real kernel.

jupyter_server starts a notebook's kernel with ``$JPY_SESSION_NAME`` set to the
notebook's path and the notebook's directory as its working directory; the
kernel reads the notebook's metadata and opens the workspace it names (a fork,
opened from JupyterLab), even over ``$KERNOS_WORKSPACE``.  A binding that does
not name a Kernos workspace is refused in every cell, and nothing is opened,
created or changed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client import KernelManager

from audit_support import cli

pytestmark = pytest.mark.kernel

START_TIMEOUT = 120


def write_notebook(path: Path, metadata: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "cells": [], "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "kernos", "display_name": "Kernos",
                                    "language": "python"}, **metadata}}))
    return path


class NotebookKernel:
    """A kernos kernel started as jupyter_server starts a notebook's: its session name
    and its directory."""

    def __init__(self, session_name: str, cwd: Path, env: dict[str, str]) -> None:
        environment = {**os.environ, **env, "JPY_SESSION_NAME": session_name}
        self._sockets = tempfile.mkdtemp(prefix="kernos-ipc-")
        self.manager = KernelManager(kernel_name="kernos", transport="ipc",
                                     ip=os.path.join(self._sockets, "kernel"))
        self.manager.start_kernel(env=environment, cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=START_TIMEOUT)
        self.stopped = False

    def run(self, code: str) -> tuple[dict[str, Any], str]:
        """The reply and what the cell printed."""
        printed: list[str] = []

        def collect(message: dict[str, Any]) -> None:
            if message["msg_type"] == "stream":
                printed.append(message["content"]["text"])

        reply = self.client.execute_interactive(code, timeout=120, output_hook=collect)
        return reply, "".join(printed)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        shutil.rmtree(self._sockets, ignore_errors=True)


@pytest.fixture
def notebook_kernel() -> Iterator[Callable[..., NotebookKernel]]:
    started: list[NotebookKernel] = []

    def start(session_name: str, cwd: Path, env: dict[str, str]) -> NotebookKernel:
        kernel = NotebookKernel(session_name, cwd, env)
        started.append(kernel)
        return kernel

    yield start
    for kernel in started:
        kernel.stop()


def head_op(workspace: Path) -> int:
    shown = cli("show", "-w", str(workspace), "--json")
    assert shown.returncode == 0, shown.stderr
    return int(json.loads(shown.stdout)["op"])


def test_a_notebook_bound_to_a_fork_runs_on_the_fork(
        kernel_factory: Callable[..., Any], notebook_kernel: Callable[..., NotebookKernel],
        tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    kernel = kernel_factory(origin)
    assert kernel.run("plan = 'A'").committed
    assert kernel.run("plan = 'B'").committed
    kernel.stop()
    fork = tmp_path / "trial"
    made = cli("fork", f"{origin}@HEAD~1", str(fork))
    assert made.returncode == 0, made.stderr
    origin_head = head_op(origin)

    folder = tmp_path / "notebooks"
    write_notebook(folder / "on trial.ipynb", {"kernos": {"workspace": str(fork)}})
    elsewhere = tmp_path / "server-wide"  # $KERNOS_WORKSPACE: the binding wins over it
    # jupyter_server's form: the notebook's absolute path, the kernel in its directory.
    bound = notebook_kernel(str(folder / "on trial.ipynb"), folder,
                            {"KERNOS_WORKSPACE": str(elsewhere)})
    reply, printed = bound.run("print(plan)")
    assert reply["content"]["status"] == "ok" and printed == "A\n"
    reply, _ = bound.run("plan = 'tried on the fork'")
    assert reply["metadata"]["kernos"]["status"] == "committed"
    bound.stop()

    assert not elsewhere.exists()
    assert head_op(origin) == origin_head  # the fork's op never touched its origin
    assert head_op(fork) == reply["metadata"]["kernos"]["op"]

    # An API path (no session name): the notebook is found in the kernel's directory.
    again = notebook_kernel("notebooks/on trial.ipynb", folder,
                            {"KERNOS_WORKSPACE": str(elsewhere)})
    _, printed = again.run("print(plan)")
    assert printed == "tried on the fork\n"


def test_a_binding_to_something_else_is_refused_and_nothing_is_touched(
        notebook_kernel: Callable[..., NotebookKernel], tmp_path: Path) -> None:
    empty = tmp_path / "not-a-workspace"
    empty.mkdir()
    folder = tmp_path / "notebooks"
    notebook = write_notebook(folder / "bad.ipynb", {"kernos": {"workspace": str(empty)}})
    elsewhere = tmp_path / "server-wide"
    kernel = notebook_kernel(str(notebook), folder, {"KERNOS_WORKSPACE": str(elsewhere)})
    for _ in range(2):  # every cell says why, and what to do
        reply, _ = kernel.run("x = 1")
        content = reply["content"]
        assert content["status"] == "error" and content["ename"] == "WorkspaceError"
        assert f"{notebook} binds its kernel to a workspace" in content["evalue"]
        assert "is not a Kernos workspace" in content["evalue"]
        assert "No workspace was opened or changed" in content["evalue"]
        assert "metadata.kernos.workspace" in content["evalue"]
        assert reply["metadata"]["kernos"]["status"] == "rejected"
    kernel.stop()
    assert list(empty.iterdir()) == []
    assert not elsewhere.exists()
    assert sorted(path.name for path in folder.iterdir()) == ["bad.ipynb"]
