"""Run notebooks written for IPython on a real kernel, cell by cell, and record what they did.

The compatibility test (``test_corpus.py``) and the benchmark
(``bench/compat_bench.py``) both use this module: they run the same notebooks
of the vendored corpora (``corpus/<source>/``, each with its licence and a
README saying where it came from, see :data:`CORPORA`) on the stock ``python3``
kernel and on ``kernos``, and compare.

* :func:`run_notebook` runs every code cell in order through jupyter_client and
  records, per cell, the source, the reply's status and ``metadata["kernos"]``,
  the outputs and the client's wall time from ``execute_request`` to
  ``execute_reply``.  Each run works in a scratch copy of the notebook's corpus
  directory (notebooks write files such as ``tmp.txt`` or
  ``examples/mydata.h5``, and read data files beside them), so the repository
  stays clean and two kernels never see each other's files.
* Both kernels get the same environment: matplotlib's inline backend (figures
  come out as ``display_data``), one BLAS thread, ``PYTHONHASHSEED=0`` (sets of
  strings print in one order) and a fresh IPython directory.
* :mod:`compat.compare` says which cells differ and why, and
  :func:`check_restore` kills the Kernos kernel with SIGKILL and compares a
  digest of every name before and after the restore.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client import KernelManager

from kernos.kernel.kernel import NOTICE_MIME

__all__ = [
    "CORPORA",
    "CORPUS_ROOT",
    "NOTEBOOKS",
    "Cell",
    "NotebookKernel",
    "NotebookRun",
    "RestoreCheck",
    "check_restore",
    "code_cells",
    "corpus_directory",
    "run_notebook",
    "scratch_copy",
    "warm_caches",
]

CORPUS_ROOT = Path(__file__).resolve().parent / "corpus"
"""One directory per source: its notebooks, the data files they read, its licence, a README."""
CORPORA: dict[str, tuple[str, ...]] = {
    # "Python for Data Analysis", 3rd edition (MIT): pandas, numpy, statsmodels, I/O.
    "pydata-book": ("ch02", "ch03", "ch05", "ch06", "ch07", "ch08", "ch09", "ch10", "ch11", "ch12"),
    # J.R. Johansson's lectures (CC BY 3.0): matplotlib (%pylab, pylab, figures),
    # scipy (frozen scipy.stats distributions), sympy (numeric evaluation, lambdify).
    "scientific-python-lectures": ("Lecture-3-Scipy", "Lecture-4-Matplotlib", "Lecture-5-Sympy"),
    # Four animations of the Matplotlib gallery (Matplotlib licence), as one notebook.
    "matplotlib-gallery": ("animation-examples",),
    # The examples of CPython's "unittest.mock — getting started" (0BSD), as a notebook.
    "python-docs": ("unittest-mock-examples",),
}
"""Corpus directory name -> the notebooks of it that the test and the bench run, by file stem."""
NOTEBOOKS = tuple(notebook for notebooks in CORPORA.values() for notebook in notebooks)
"""Every notebook the test and the bench run, by file stem (unique across corpora)."""

START_TIMEOUT = 120.0
CELL_TIMEOUT = 180.0
"""Seconds a cell may take; the slowest cell of the corpus takes a few."""
SAME_ENVIRONMENT = {
    # Headless, as under a notebook server: figures are display_data (image/png + text/plain).
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    # One BLAS thread each: two kernels run side by side on small machines, and a
    # threaded reduction may round differently from one run to the next.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    # Sets of strings iterate in hash order: one order for both kernels.
    "PYTHONHASHSEED": "0",
}
NOTICE = "kernos: "
"""Kernos announces a rollback on a stderr line of its own (a value that cannot persist is a
display of its own, ``kernos.kernel.kernel.NOTICE_MIME``)."""


@dataclass
class Cell:
    """One code cell as one kernel ran it."""

    index: int
    """The cell's position in the notebook (markdown cells counted)."""
    source: str
    status: str
    """The execute reply's status (``ok``/``error``), or ``timeout``, ``died``, ``not run``."""
    kernos: dict[str, Any]
    """The reply's ``metadata["kernos"]`` (empty on ``python3``)."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """The IOPub outputs, as nbformat outputs (stream, execute_result, display_data, error)."""
    seconds: float = 0.0
    """Client wall time from sending ``execute_request`` to receiving ``execute_reply``."""

    @property
    def first_line(self) -> str:
        return next((line for line in self.source.splitlines() if line.strip()), "")

    @property
    def rolled_back(self) -> bool:
        return self.kernos.get("status") == "rolled back"

    def notices(self) -> list[str]:
        """Kernos's own announcement lines: in the cell's stderr, and its notices."""
        lines = []
        for output in self.outputs:
            if output["output_type"] == "stream" and output["name"] == "stderr":
                text = output["text"]
            elif output["output_type"] == "display_data" and NOTICE_MIME in output["data"]:
                text = output["data"]["text/plain"]
            else:
                continue
            lines += [line for line in text.splitlines() if line.startswith(NOTICE)]
        return lines

    def error(self) -> tuple[str, str] | None:
        return next(
            ((o["ename"], o["evalue"]) for o in self.outputs if o["output_type"] == "error"), None
        )


@dataclass
class NotebookRun:
    """A notebook run top to bottom on one kernel."""

    notebook: str
    kernel_name: str
    cells: list[Cell]
    start_seconds: float
    """From spawning the kernel to its first ``kernel_info`` reply."""

    @property
    def seconds(self) -> float:
        """The sum of the cells' wall times (start-up not included)."""
        return sum(cell.seconds for cell in self.cells)

    def to_json(self) -> str:
        return json.dumps(
            {
                "notebook": self.notebook,
                "kernel_name": self.kernel_name,
                "start_seconds": self.start_seconds,
                "cells": [vars(cell) for cell in self.cells],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> NotebookRun:
        data = json.loads(text)
        cells = [Cell(**cell) for cell in data.pop("cells")]
        return cls(cells=cells, **data)


def corpus_directory(notebook: str) -> Path:
    """The vendored directory that holds ``notebook`` (a stem of :data:`NOTEBOOKS`)."""
    for name, notebooks in CORPORA.items():
        if notebook in notebooks:
            return CORPUS_ROOT / name
    raise KeyError(f"{notebook!r} is in no corpus of {sorted(CORPORA)}")


def code_cells(notebook: str) -> list[tuple[int, str]]:
    """``(index, source)`` of each code cell of a corpus notebook, in order."""
    document = nbformat.read(corpus_directory(notebook) / f"{notebook}.ipynb", as_version=4)
    return [
        (index, cell.source)
        for index, cell in enumerate(document.cells)
        if cell.cell_type == "code"
    ]


@functools.cache
def warm_caches() -> None:
    """Build matplotlib's font cache before any kernel imports matplotlib.

    On a machine where it was never built, the first kernel to import
    matplotlib prints "Matplotlib is building the font cache" and the other
    does not: build it once, in a child process with the kernels' environment.
    """
    subprocess.run(
        [sys.executable, "-c", "import matplotlib.font_manager"],
        env=dict(os.environ, **SAME_ENVIRONMENT),
        capture_output=True,
        check=False,
        timeout=START_TIMEOUT,
    )


def scratch_copy(directory: Path, notebook: str) -> Path:
    """A private copy of ``notebook``'s corpus in ``directory`` (created), to run it in."""
    copy = directory / "corpus"
    shutil.copytree(corpus_directory(notebook), copy)
    return copy


class NotebookKernel:
    """One kernel process in a working directory, with a blocking client.

    ``workspace`` is given for ``kernos`` (``KERNOS_WORKSPACE``); both kernels
    get :data:`SAME_ENVIRONMENT` and an IPython directory of their own under
    ``scratch``.
    """

    def __init__(
        self, kernel_name: str, *, cwd: Path, scratch: Path, workspace: Path | None = None
    ) -> None:
        warm_caches()
        scratch.mkdir(parents=True, exist_ok=True)
        environment = dict(os.environ, **SAME_ENVIRONMENT, IPYTHONDIR=str(scratch / "ipython"))
        environment.pop("JPY_SESSION_NAME", None)
        if workspace is not None:
            environment["KERNOS_WORKSPACE"] = str(workspace)
        self.kernel_name = kernel_name
        # ipc sockets are files: short paths (a socket path has ~100 bytes at most).
        self._sockets = tempfile.mkdtemp(prefix="kernos-compat-")
        self.manager = KernelManager(
            kernel_name=kernel_name,
            transport="ipc",
            ip=os.path.join(self._sockets, "kernel"),
            connection_file=os.path.join(self._sockets, "kernel.json"),
        )
        launched = time.perf_counter()
        self.manager.start_kernel(env=environment, cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=START_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - launched

    @property
    def pid(self) -> int:
        return int(self.manager.provisioner.process.pid)  # type: ignore[union-attr]

    def execute(self, source: str, timeout: float = CELL_TIMEOUT) -> Cell:
        """Run ``source`` as a cell: its reply, outputs and wall time (``index`` is -1)."""
        client = self.client
        sent = time.perf_counter()
        msg_id = client.execute(source, store_history=True, allow_stdin=False)
        deadline = sent + timeout
        reply = self._reply(msg_id, deadline)
        seconds = time.perf_counter() - sent
        if reply is None:
            status = "timeout" if self.manager.is_alive() else "died"
            return Cell(index=-1, source=source, status=status, kernos={}, seconds=seconds)
        outputs = self._outputs(msg_id, deadline)
        return Cell(
            index=-1,
            source=source,
            status=reply["content"]["status"],
            kernos=dict(reply["metadata"].get("kernos", {})),
            outputs=outputs,
            seconds=seconds,
        )

    def _reply(self, msg_id: str, deadline: float) -> dict[str, Any] | None:
        while time.perf_counter() < deadline:
            try:
                reply: dict[str, Any] = self.client.get_shell_msg(timeout=1.0)
            except queue.Empty:
                if not self.manager.is_alive():
                    return None
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply
        return None

    def _outputs(self, msg_id: str, deadline: float) -> list[dict[str, Any]]:
        """The cell's outputs, up to its ``idle`` status message."""
        outputs: list[dict[str, Any]] = []
        while True:
            try:
                message = self.client.get_iopub_msg(
                    timeout=max(1.0, deadline - time.perf_counter())
                )
            except queue.Empty:
                return outputs
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            if kind in ("stream", "display_data", "execute_result", "error"):
                outputs.append(dict(nbformat.v4.output_from_msg(message)))
            elif kind == "status" and message["content"]["execution_state"] == "idle":
                return outputs

    def kill(self) -> None:
        """SIGKILL the kernel process and wait until it is gone."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.manager.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"kernel {pid} survived SIGKILL")
            time.sleep(0.02)
        self.stop()

    def stop(self) -> None:
        """Shut the kernel down if it still runs; safe to call more than once."""
        self.client.stop_channels()
        if self.manager.has_kernel:
            try:
                self.manager.shutdown_kernel(now=True)
            except Exception:
                self.manager.kill_kernel()
        self.manager.cleanup_resources()
        shutil.rmtree(self._sockets, ignore_errors=True)


@contextmanager
def started(
    kernel_name: str, *, cwd: Path, scratch: Path, workspace: Path | None = None
) -> Iterator[NotebookKernel]:
    kernel = NotebookKernel(kernel_name, cwd=cwd, scratch=scratch, workspace=workspace)
    try:
        yield kernel
    finally:
        kernel.stop()


def run_cells(
    kernel: NotebookKernel, notebook: str, cells: Sequence[tuple[int, str]] | None = None
) -> NotebookRun:
    """Run the notebook's code cells on ``kernel``, stopping at one that times out or kills it."""
    done: list[Cell] = []
    for index, source in cells if cells is not None else code_cells(notebook):
        if done and done[-1].status in ("timeout", "died"):
            done.append(Cell(index=index, source=source, status="not run", kernos={}))
            continue
        cell = kernel.execute(source)
        cell.index = index
        done.append(cell)
    return NotebookRun(
        notebook=notebook,
        kernel_name=kernel.kernel_name,
        cells=done,
        start_seconds=kernel.start_seconds,
    )


def run_notebook(
    notebook: str, kernel_name: str, scratch: Path, prelude: Sequence[str] = ()
) -> NotebookRun:
    """Run a corpus notebook on a new kernel, in a copy of its corpus under ``scratch``.

    ``prelude`` cells run first (``%kernos on-error keep``) and are not
    recorded; each must succeed.  A ``kernos`` kernel works on
    ``scratch / "workspace"``.
    """
    copy = scratch_copy(scratch, notebook)
    workspace = scratch / "workspace" if kernel_name == "kernos" else None
    with started(kernel_name, cwd=copy, scratch=scratch, workspace=workspace) as kernel:
        for source in prelude:
            cell = kernel.execute(source)
            if cell.status != "ok":
                raise RuntimeError(
                    f"prelude cell {source!r} failed on {kernel_name}: "
                    f"{cell.error() or cell.status}"
                )
        return run_cells(kernel, notebook)


# -- the restore check -------------------------------------------------------------------

#: Run by ``exec`` in a dict of its own (``SKIP``: names not to digest), so that the cell
#: binds no name in the namespace.
_DIGESTS = """
import json
from IPython import get_ipython
from kernos.replay.digest import digest

shell = get_ipython()
found = {}
hidden = shell.user_ns_hidden
for name, value in list(shell.user_ns.items()):
    # IPython's own names (%pylab's too) are not the user's, unless the user rebound them
    # (``from sympy import *`` after ``%pylab``): Kernos persists exactly those.
    if name.startswith("_") or name in SKIP or (name in hidden and hidden[name] is value):
        continue
    try:
        found[name] = digest(value)
    except Exception as error:
        found[name] = "digest failed: " + type(error).__name__
print(json.dumps(found, sort_keys=True))
"""


def digest_cell(skip: Iterable[str] = ()) -> str:
    """A cell that prints ``{name: digest}`` of every user name but ``skip``, binding none."""
    return f"exec({_DIGESTS!r}, {{'SKIP': {sorted(set(skip))!r}}})"


DIGEST_CELL = digest_cell()
"""A cell that prints ``{name: digest}`` of every user name and leaves no name behind."""

_NAME_ROOT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STATUS_ENTRY = re.compile(r"^\s{4}(\S.*?): ")


@dataclass
class RestoreCheck:
    """Digests of every user name before a SIGKILL and after the restore that follows it."""

    notebook: str
    before: dict[str, str]
    after: dict[str, str]
    announced: set[str]
    """Root names the run announced as not persistable (``kernos: X cannot be persisted``)."""
    placeholders: set[str]
    """Root names the restored kernel's ``%kernos status`` lists (placeholders, not restored)."""
    status_text: str = ""
    seconds: float = 0.0
    """From the SIGKILL to the digests of the restored kernel."""
    not_digested: set[str] = field(default_factory=set)
    """Announced names left out of both digests: excused whatever comes back, and what cannot
    persist can be costly to digest (a MagicMock that recorded thousands of calls)."""

    @property
    def reported(self) -> set[str]:
        return self.announced | self.placeholders

    def mismatches(self) -> dict[str, str]:
        """``name -> what happened`` for every name that did not come back equal."""
        found: dict[str, str] = {}
        for name in sorted(set(self.before) | set(self.after)):
            if name not in self.after:
                found[name] = "missing after the restore"
            elif name not in self.before:
                found[name] = "appeared after the restore"
            elif self.before[name] != self.after[name]:
                found[name] = "restored to a different value"
        return found

    def silent(self) -> dict[str, str]:
        """Mismatches of names Kernos never reported: silent wrong restores."""
        return {name: why for name, why in self.mismatches().items() if name not in self.reported}


def _digests(kernel: NotebookKernel, skip: Iterable[str] = ()) -> dict[str, str]:
    cell = kernel.execute(digest_cell(skip))
    text = "".join(
        o["text"] for o in cell.outputs if o["output_type"] == "stream" and o["name"] == "stdout"
    )
    if cell.status != "ok" or not text.strip():
        raise RuntimeError(
            f"the digest cell failed on {kernel.kernel_name}: "
            f"{cell.error() or cell.status} {cell.kernos}"
        )
    result: dict[str, str] = json.loads(text.strip().splitlines()[-1])
    return result


def _roots(paths: Sequence[str]) -> set[str]:
    return {match.group(0) for path in paths if (match := _NAME_ROOT.match(path))}


def announced_names(run: NotebookRun) -> set[str]:
    """Root names of the values a Kernos run announced it cannot persist."""
    marker = " cannot be persisted"
    return _roots(
        [
            line[len(NOTICE) :].split(" (", 1)[0]
            for cell in run.cells
            for line in cell.notices()
            if marker in line
        ]
    )


def status_placeholders(status: str) -> set[str]:
    """Root names that ``%kernos status`` lists as transient, placeholders or not restored."""
    names: list[str] = []
    for line in status.splitlines():
        if line.startswith("not restored"):
            names += [name.strip() for name in line.split(":", 1)[1].split(",")]
        elif match := _STATUS_ENTRY.match(line):
            names.append(match.group(1))
    return _roots(names)


def check_restore(
    kernel: NotebookKernel, run: NotebookRun, *, cwd: Path, scratch: Path, workspace: Path
) -> RestoreCheck:
    """Digest every name, SIGKILL ``kernel``, restore on a new kernel and digest again.

    Names the run announced as not persistable are not digested: Kernos reported them.
    """
    announced = announced_names(run)
    before = _digests(kernel, announced)
    started_at = time.perf_counter()
    kernel.kill()
    with started("kernos", cwd=cwd, scratch=scratch / "restored", workspace=workspace) as restored:
        after = _digests(restored, announced)
        seconds = time.perf_counter() - started_at
        status = restored.execute("%kernos status")
    status_text = "".join(o.get("text", "") for o in status.outputs)
    return RestoreCheck(
        notebook=run.notebook,
        before=before,
        after=after,
        announced=announced,
        placeholders=status_placeholders(status_text),
        status_text=status_text,
        seconds=seconds,
        not_digested=announced,
    )


def run_and_restore(notebook: str, scratch: Path) -> tuple[NotebookRun, RestoreCheck]:
    """Run a corpus notebook on ``kernos``, then check what a SIGKILL and restore give back."""
    copy = scratch_copy(scratch, notebook)
    workspace = scratch / "workspace"
    with started("kernos", cwd=copy, scratch=scratch, workspace=workspace) as kernel:
        run = run_cells(kernel, notebook)
        if run.cells and run.cells[-1].status in ("timeout", "died", "not run"):
            stuck = next(c for c in run.cells if c.status in ("timeout", "died"))
            raise RuntimeError(
                f"{notebook} did not finish on kernos: cell {stuck.index} "
                f"{'timed out' if stuck.status == 'timeout' else 'killed it'}"
            )
        check = check_restore(kernel, run, cwd=copy, scratch=scratch, workspace=workspace)
    return run, check
