"""Run an example notebook top to bottom on a real Kernos kernel, as a reader would.

Each code cell is sent to the kernel in order with jupyter_client; its outputs
are collected as nbformat outputs.  Two cell tags change what happens:

* ``raises-exception`` (nbval's and nbclient's tag): the cell must end in an
  error, and that error is not a failure;
* ``kernos-restart-before``: the kernel is restarted (a real restart of the
  process, on the same workspace) before the cell runs, where the notebook
  asks its reader to restart.

The kernel runs on the workspace given (``KERNOS_WORKSPACE``), with the
notebook's directory as its working directory.

This file is also a script, so that another environment (the simulated
Binder venv) runs notebooks with its own interpreter and kernelspec::

    python notebook_run.py NOTEBOOK WORKSPACE REPORT.json

It writes the report (every cell's source, tags, status and outputs) and
exits 0 however the cells ended: the caller judges the report.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client import KernelManager

RAISES = "raises-exception"
RESTART = "kernos-restart-before"
START_TIMEOUT = 120
CELL_TIMEOUT = 120
"""Seconds a cell may run (the examples' cells take a few)."""


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
    """Whether the kernel was restarted just before this cell."""

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

    @classmethod
    def from_json(cls, text: str) -> NotebookRun:
        data = json.loads(text)
        return cls(data["notebook"], [CellRun(**cell) for cell in data["cells"]])


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
            restarted = RESTART in tags
            if restarted:
                kernel.restart()
            try:
                reply, outputs = kernel.execute(cell.source)
            except TimeoutError:
                timeout = {"output_type": "error", "ename": "TimeoutError", "traceback": [],
                           "evalue": f"no reply within {CELL_TIMEOUT} s"}
                cells.append(CellRun(index=index, id=str(cell.get("id", "")),
                                     source=cell.source, tags=tags, status="timeout", kernos="",
                                     outputs=[timeout], restarted=restarted))
                break  # the kernel is still busy with it: later cells would only queue
            cells.append(CellRun(
                index=index, id=str(cell.get("id", "")), source=cell.source, tags=tags,
                status=reply["content"]["status"],
                kernos=str(reply["metadata"].get("kernos", {}).get("status", "")),
                outputs=outputs, restarted=restarted))
    finally:
        kernel.stop()
    return NotebookRun(notebook.name, cells)


def main(argv: list[str]) -> int:
    notebook, workspace, report = (Path(arg) for arg in argv)
    run = run_notebook(notebook.resolve(), workspace.resolve())
    report.write_text(run.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
