"""Run an example notebook top to bottom on a real Kernos kernel, as a reader would.

Each code cell is sent to the kernel in order with jupyter_client; its outputs
are collected as nbformat outputs.  Four cell tags change what happens:

* ``raises-exception`` (nbval's and nbclient's tag): the cell must end in an
  error, and that error is not a failure;
* ``kernos-restart-before``: the kernel is restarted (a real restart of the
  process, on the same workspace) before the cell runs, where the notebook
  asks its reader to restart;
* ``kernos-kill-before``: the kernel process is killed with ``SIGKILL``
  (``kill -9``: no shutdown, no flush, whatever it was doing) before the cell
  runs, where the notebook asks its reader to kill it, and a new kernel is
  started on the same workspace, as JupyterLab does when a kernel dies;
* ``kernos-wait-loops``: before the cell runs, wait until no agent's loop is
  turning (each is paused, stopped, finished, or parked by its open circuit),
  asking the kernel between its ops (the harness ``loop`` and ``circuit``
  actions), where the notebook asks its reader to let the loop run.

The kernel runs on the workspace given (``KERNOS_WORKSPACE``), with the
notebook's directory as its working directory.

This file is also a script, so that another environment (the simulated
Binder venv) runs notebooks with its own interpreter and kernelspec::

    python notebook_run.py NOTEBOOK WORKSPACE REPORT.json [--executed OUT.ipynb]

It writes the report (every cell's source, tags, status and outputs) and
exits 0 however the cells ended: the caller judges the report.  With
``--executed`` it also writes the notebook with the run's outputs, which is
what ``scripts/docs`` renders on the site.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client import KernelManager

RAISES = "raises-exception"
RESTART = "kernos-restart-before"
KILL = "kernos-kill-before"
WAIT_LOOPS = "kernos-wait-loops"
START_TIMEOUT = 120
CELL_TIMEOUT = 120
"""Seconds a cell may run (the examples' cells take a few)."""
LOOPS_TIMEOUT = 120
"""Seconds the loops may take to come to rest before a ``kernos-wait-loops`` cell."""


@dataclass
class CellRun:
    index: int
    """The cell's position in the notebook (markdown cells counted)."""
    id: str
    """The cell's nbformat id."""
    source: str
    tags: list[str]
    status: str
    """The execute reply's status: ``ok`` or ``error``."""
    kernos: str
    """The reply's ``metadata["kernos"]["status"]``: committed, rolled back, ..."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    restarted: bool = False
    """Whether the kernel was restarted (or killed and started again) just before this cell."""
    killed: int | None = None
    """The pid of the kernel killed with SIGKILL just before this cell, if one was."""
    loops_at_kill: list[dict[str, Any]] | None = None
    """The loops as the kernel described them just before that kill."""
    waited: list[dict[str, Any]] | None = None
    """For a ``kernos-wait-loops`` cell: the loops as they were once at rest."""

    @property
    def text(self) -> str:
        """Everything the cell printed or displayed as plain text, and its error."""
        parts = []
        for output in self.outputs:
            kind = output["output_type"]
            if kind == "stream":
                parts.append(output["text"])
            elif kind in ("execute_result", "display_data"):
                parts.append(output.get("data", {}).get("text/plain", "") + "\n")
            elif kind == "error":
                parts.append(f"{output['ename']}: {output['evalue']}\n")
        return "".join(parts)

    @property
    def error(self) -> dict[str, Any] | None:
        return next((o for o in self.outputs if o["output_type"] == "error"), None)


@dataclass
class NotebookRun:
    notebook: str
    cells: list[CellRun]

    def cell(self, cell_id: str) -> CellRun:
        for cell in self.cells:
            if cell.id == cell_id:
                return cell
        raise KeyError(f"{self.notebook} has no code cell with id {cell_id!r}")

    def problems(self) -> list[str]:
        """Cells that raised without the tag, or carry the tag and did not raise."""
        found = []
        for cell in self.cells:
            error = cell.error
            if RAISES in cell.tags:
                if error is None or cell.status != "error":
                    found.append(f"cell {cell.index} ({cell.id}) is tagged {RAISES} but did "
                                 f"not raise:\n{cell.source}\n--- output:\n{cell.text}")
            elif error is not None or cell.status != "ok":
                trace = "\n".join((error or {}).get("traceback", []))
                found.append(f"cell {cell.index} ({cell.id}) failed:\n{cell.source}\n"
                             f"--- error:\n{_plain(trace) or cell.text}")
        return found

    def to_json(self) -> str:
        return json.dumps({"notebook": self.notebook,
                           "cells": [asdict(cell) for cell in self.cells]})

    def executed(self, notebook: Path) -> nbformat.NotebookNode:
        """``notebook`` with this run's outputs and execution counts in its code cells
        (what the documentation site renders)."""
        document = nbformat.read(notebook, as_version=4)
        runs = {cell.index: cell for cell in self.cells}
        count = 0
        for index, cell in enumerate(document.cells):
            if cell.cell_type != "code":
                continue
            run = runs.get(index)
            if run is None:  # a cell after one that timed out never ran
                cell.outputs, cell.execution_count = [], None
                continue
            count += 1
            cell.execution_count = count
            cell.outputs = [nbformat.from_dict(output) for output in run.outputs]
        nbformat.validate(document)
        return document

    @classmethod
    def from_json(cls, text: str) -> NotebookRun:
        data = json.loads(text)
        return cls(data["notebook"], [CellRun(**cell) for cell in data["cells"]])


def _result(content: dict[str, Any], action: str) -> Any:
    if content.get("status") != "ok":
        raise RuntimeError(f"the harness action {action!r} failed: {content.get('error')}")
    return content["result"]


def _plain(text: str) -> str:
    """Drop the ANSI colours of IPython tracebacks."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


class _Kernel:
    def __init__(self, workspace: Path, cwd: Path, kernel_name: str) -> None:
        environment = dict(os.environ, KERNOS_WORKSPACE=str(workspace))
        # Jupyter's notebook name chooses the workspace only when none is given; drop it anyway.
        environment.pop("JPY_SESSION_NAME", None)
        self._sockets = tempfile.mkdtemp(prefix="kernos-ipc-")
        self.manager = KernelManager(kernel_name=kernel_name, transport="ipc",
                                     ip=os.path.join(self._sockets, "kernel"))
        self.manager.start_kernel(env=environment, cwd=str(cwd))
        self._connect()

    def _connect(self) -> None:
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=START_TIMEOUT)

    def restart(self) -> None:
        self.client.stop_channels()
        self.manager.restart_kernel(now=False)
        self._connect()

    def kill9(self) -> int:
        """SIGKILL the kernel process, then start a new kernel on the same workspace."""
        pid = int(self.manager.provisioner.process.pid)  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.manager.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"kernel {pid} survived SIGKILL for 30 s")
            time.sleep(0.02)
        self.client.stop_channels()
        self.manager.restart_kernel(now=True)  # the dead one is gone: this starts a new one
        self._connect()
        return pid

    def request(self, content: dict[str, Any]) -> dict[str, Any]:
        """Send a harness ``kernos_request`` and return its ``kernos_reply`` content."""
        message = self.client.session.msg("kernos_request", {"v": 1, **content})
        self.client.shell_channel.send(message)
        deadline = time.monotonic() + CELL_TIMEOUT
        while True:
            try:
                reply = self.client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no kernos_reply to {content} within {CELL_TIMEOUT} s") \
                    from None
            if reply["parent_header"].get("msg_id") == message["header"]["msg_id"]:
                return dict(reply["content"])

    def loops(self) -> list[dict[str, Any]]:
        """Every loop, as the harness ``loop`` action's ``status`` describes it."""
        return list(_result(self.request({"action": "loop", "do": "status"}), "loop")["loops"])

    def open_circuits(self) -> set[str]:
        """The agents whose circuit is open (the harness ``circuit`` action)."""
        circuits = _result(self.request({"action": "circuit"}), "circuit")["circuits"]
        return {agent for agent, trip in circuits.items() if trip is not None}

    def wait_for_loops(self) -> list[dict[str, Any]]:
        """Return the loops once none is turning: paused, stopped, finished or tripped."""
        deadline = time.monotonic() + LOOPS_TIMEOUT
        while True:
            loops = self.loops()
            turning = [loop for loop in loops if loop.get("status") == "running"]
            if turning:
                tripped = self.open_circuits()
                turning = [loop for loop in turning if loop["agent"] not in tripped]
            if not turning:
                return loops
            if time.monotonic() > deadline:
                raise TimeoutError(f"loops still turning after {LOOPS_TIMEOUT} s: {turning}")
            time.sleep(0.1)

    def execute(self, source: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        outputs: list[dict[str, Any]] = []

        def collect(message: dict[str, Any]) -> None:
            if message["msg_type"] in ("stream", "display_data", "execute_result", "error"):
                outputs.append(dict(nbformat.v4.output_from_msg(message)))

        reply = self.client.execute_interactive(source, timeout=CELL_TIMEOUT,
                                                output_hook=collect, allow_stdin=False)
        return reply, outputs

    def stop(self) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=False)
        shutil.rmtree(self._sockets, ignore_errors=True)


def run_notebook(notebook: Path, workspace: Path, kernel_name: str = "kernos") -> NotebookRun:
    """Run every code cell of ``notebook`` on a new kernel on ``workspace``."""
    document = nbformat.read(notebook, as_version=4)
    kernel = _Kernel(workspace, notebook.parent, kernel_name)
    cells: list[CellRun] = []
    try:
        for index, cell in enumerate(document.cells):
            if cell.cell_type != "code":
                continue
            tags = list(cell.get("metadata", {}).get("tags", []))
            restarted = RESTART in tags or KILL in tags
            killed = waited = loops_at_kill = None
            try:
                if KILL in tags:
                    loops_at_kill = kernel.loops()
                    killed = kernel.kill9()
                elif RESTART in tags:
                    kernel.restart()
                if WAIT_LOOPS in tags:
                    waited = kernel.wait_for_loops()
                reply, outputs = kernel.execute(cell.source)
            except TimeoutError as error:
                timeout = {"output_type": "error", "ename": "TimeoutError", "traceback": [],
                           "evalue": str(error) or f"no reply within {CELL_TIMEOUT} s"}
                cells.append(CellRun(index=index, id=str(cell.get("id", "")),
                                     source=cell.source, tags=tags, status="timeout", kernos="",
                                     outputs=[timeout], restarted=restarted, killed=killed,
                                     loops_at_kill=loops_at_kill, waited=waited))
                break  # the kernel is still busy with it: later cells would only queue
            cells.append(CellRun(
                index=index, id=str(cell.get("id", "")), source=cell.source, tags=tags,
                status=reply["content"]["status"],
                kernos=str(reply["metadata"].get("kernos", {}).get("status", "")),
                outputs=outputs, restarted=restarted, killed=killed,
                loops_at_kill=loops_at_kill, waited=waited))
    finally:
        kernel.stop()
    return NotebookRun(notebook.name, cells)


def main(argv: list[str]) -> int:
    executed = None
    if len(argv) == 5 and argv[3] == "--executed":
        executed = Path(argv.pop())
        argv.pop()
    notebook, workspace, report = (Path(arg) for arg in argv)
    run = run_notebook(notebook.resolve(), workspace.resolve())
    report.write_text(run.to_json())
    if executed is not None:
        nbformat.write(run.executed(notebook), executed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
