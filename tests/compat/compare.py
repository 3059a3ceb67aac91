"""Which cells gave different outputs on ``python3`` and ``kernos``, and why.

A cell's outputs are reduced to a :class:`Signature`: its stdout, its stderr
without Kernos's own ``kernos: ...`` announcement lines, the ``text/plain`` of
each result and display (figures' PNG bytes differ from run to run, their
``<Figure size 640x480 with 1 Axes>`` does not) and its error's name and
message (tracebacks are left out).  Memory addresses (also the decimal
``id='...'`` of unittest.mock's reprs), ANSI colours, the ipykernel file names
of cells, ``%timeit`` / ``%time`` figures and process ids are normalised
first.

A difference is allowed for three reasons only, checked in this order:

1. the cell is listed in ``expected`` with a reason (unseeded randomness, ...);
   a listed cell that does not differ is a stale excuse, and fails;
2. the cell raised on both kernels with the same error (Kernos rolled it back);
3. the cell reads a name that an earlier rolled-back cell undid, and no
   committed cell has re-assigned it since (from the rollback's
   ``metadata["kernos"]["undone"]``; a cell that reads such a name passes the
   taint on to the names it assigns, also when it failed on Kernos alone and
   so never assigned them there).

``keep=True`` (a kernel told ``%kernos on-error keep``) allows the first reason
only: nothing is rolled back, so every other cell must match.

Kernos's announcement lines are counted by kind (:func:`notice_kind`) for the
report.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from compat.corpus import NOTICE, NOTICE_MIME, Cell, NotebookRun

__all__ = [
    "Comparison",
    "Signature",
    "Verdict",
    "compare",
    "normalise",
    "notice_kind",
    "signature",
]

SAME = "same"
EXPECTED = "listed in EXPECTED"
BOTH_RAISED = "raised on both, rolled back"
UNDONE = "reads a name a rollback undid"
DIFFERENT = "UNEXPLAINED DIFFERENCE"
STALE = "STALE EXCUSE (listed in EXPECTED, no difference)"
CAUSES = (SAME, BOTH_RAISED, UNDONE, EXPECTED, DIFFERENT, STALE)
FAILING = (DIFFERENT, STALE)

RANDOM = "<the global random generators>"
"""A rollback that moved the random generators back taints every later cell that draws."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")
# unittest.mock's reprs show the mock's id(), its memory address in decimal.
_MOCK_ID = re.compile(r"\bid='\d+'")
_CELL_FILE = re.compile(r"[^\s'\"]*ipykernel_\d+/\d+\.py")
_TIMEIT = re.compile(r"^.*? ± .* per loop \(mean ± std\. dev\. of .*\)$", re.MULTILINE)
_SLOWEST = re.compile(r"^The slowest run took .*(?:\n|$)", re.MULTILINE)
_CPU_TIMES = re.compile(r"^CPU times: .*$", re.MULTILINE)
_WALL_TIME = re.compile(r"^Wall time: .*$", re.MULTILINE)
_PID = re.compile(r"\b(pid|PID|process) \d+")
# statsmodels' summary tables print the date and the time of day they were made.
_SUMMARY_CLOCK = re.compile(
    r"^(Date|Time):( +)(?:\w{3}, \d\d \w{3} \d{4}|\d\d:\d\d:\d\d)", re.MULTILINE
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DRAWS = re.compile(r"random|\.sample\(|default_rng")
_MAGIC_CALLS = frozenset({"run_line_magic", "run_cell_magic", "system", "getoutput"})


def normalise(text: str) -> str:
    """What of an output is comparable between two kernels and two runs."""
    text = _ANSI.sub("", text)
    text = _ADDRESS.sub("0x…", text)
    text = _MOCK_ID.sub("id='…'", text)
    text = _CELL_FILE.sub("<cell>", text)
    text = _SLOWEST.sub("", text)
    text = _TIMEIT.sub("<timeit line>", text)
    text = _CPU_TIMES.sub("CPU times: …", text)
    text = _WALL_TIME.sub("Wall time: …", text)
    text = _SUMMARY_CLOCK.sub(r"\1:\2…", text)
    return _PID.sub(r"\1 <pid>", text)


def notice_kind(line: str) -> str:
    """The category of a ``kernos: ...`` announcement line."""
    if "rolled back" in line:
        return "rollback"
    if "cannot be persisted" in line:
        return "cannot persist"
    if "marked failed" in line:
        return "kept failed"
    return "other"


@dataclass(frozen=True)
class Signature:
    """What of a cell's outputs two kernels must agree on."""

    stdout: str
    stderr: str
    results: tuple[str, ...]
    error: tuple[str, str] | None

    def render(self) -> list[str]:
        lines = [f"stdout| {line}" for line in self.stdout.splitlines()]
        lines += [f"stderr| {line}" for line in self.stderr.splitlines()]
        for result in self.results:
            lines += [f"result| {line}" for line in result.splitlines() or [""]]
        if self.error is not None:
            lines.append(f"error | {self.error[0]}: {self.error[1]}")
        return lines


def _plain(output: dict[str, Any]) -> str:
    data = output.get("data", {})
    if "text/plain" in data:
        return normalise(str(data["text/plain"]))
    return "<" + ", ".join(sorted(data)) + ">"


def signature(cell: Cell) -> Signature:
    stdout, stderr, results = [], [], []
    error = None
    for output in cell.outputs:
        kind = output["output_type"]
        if kind == "stream":
            (stdout if output["name"] == "stdout" else stderr).append(output["text"])
        elif kind == "display_data" and NOTICE_MIME in output.get("data", {}):
            continue  # Kernos's notice (a value that cannot persist): not the cell's output
        elif kind in ("execute_result", "display_data"):
            results.append(_plain(output))
        elif kind == "error":
            error = (output["ename"], normalise(output["evalue"]))
    kept = [
        line for line in "".join(stderr).splitlines(keepends=True) if not line.startswith(NOTICE)
    ]
    if cell.status in ("timeout", "died", "not run"):
        error = (cell.status, "")
    return Signature(
        stdout=normalise("".join(stdout)),
        stderr=normalise("".join(kept)),
        results=tuple(results),
        error=error,
    )


# -- what a cell reads and binds -------------------------------------------------------------


def _tree(source: str) -> ast.Module | None:
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except (SyntaxError, ValueError):
        return None


def _module_level(tree: ast.AST) -> Iterable[ast.AST]:
    """The nodes that run in the notebook's global scope (not inside def, class, lambda)."""
    scopes = (
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.Lambda,
        ast.ListComp,
        ast.SetComp,
        ast.DictComp,
        ast.GeneratorExp,
    )
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, scopes):
            stack.extend(ast.iter_child_nodes(node))


def reads(source: str) -> set[str]:
    """Names the cell reads anywhere (magic lines' arguments included), or every word."""
    tree = _tree(source)
    if tree is None:
        return set(_IDENTIFIER.findall(source))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            found.add(node.id)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MAGIC_CALLS
        ):
            for argument in node.args:
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    found.update(_IDENTIFIER.findall(argument.value))
    return found


def binds(source: str) -> set[str]:
    """Global names the cell assigns, defines, imports or deletes."""
    tree = _tree(source)
    if tree is None:
        return set()
    found = set()
    for node in _module_level(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            found.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return found


def undone_names(cell: Cell) -> set[str]:
    """The names a rolled-back cell's rollback undid, as the kernel reports them.

    Until the kernel reports ``undone``, every name the cell assigns, and the
    names it reports ``reloaded`` (changed in place), stand in for it.
    """
    undone = cell.kernos.get("undone")
    if isinstance(undone, dict):
        names = {name for names in undone.values() if isinstance(names, list) for name in names}
        if undone.get("random"):
            names.add(RANDOM)
        return names
    names = binds(cell.source) | set(cell.kernos.get("reloaded", []))
    if _DRAWS.search(cell.source):
        names.add(RANDOM)
    return names


# -- the comparison --------------------------------------------------------------------------


@dataclass
class Verdict:
    notebook: str
    index: int
    cause: str
    reference: Cell
    kernos: Cell
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.cause in FAILING

    def describe(self) -> str:
        head = (
            f"{self.notebook} cell {self.index} ({self.cause}"
            + (f": {self.detail}" if self.detail else "")
            + ")"
        )
        source = "\n".join(f"    {line}" for line in self.reference.source.splitlines()[:8])
        diff = list(
            difflib.unified_diff(
                signature(self.reference).render(),
                signature(self.kernos).render(),
                "python3",
                "kernos",
                lineterm="",
                n=1,
            )
        )
        shown = diff[:30] + ([f"... {len(diff) - 30} more diff lines"] if len(diff) > 30 else [])
        return "\n".join([head, source, *(f"    {line}" for line in shown)])


@dataclass
class Comparison:
    """Every cell of one notebook, python3 against kernos, with the cause of each difference."""

    notebook: str
    verdicts: list[Verdict] = field(default_factory=list)
    notices: Counter[str] = field(default_factory=Counter)
    """Kernos announcement lines, by :func:`notice_kind`."""
    rollbacks: int = 0
    python3_errors: int = 0

    def counts(self) -> Counter[str]:
        return Counter(verdict.cause for verdict in self.verdicts)

    def failures(self) -> list[Verdict]:
        return [verdict for verdict in self.verdicts if verdict.failed]

    def summary(self) -> str:
        counts = self.counts()
        causes = ", ".join(f"{counts[cause]} {cause}" for cause in CAUSES if counts[cause])
        notices = ", ".join(f"{count} {kind}" for kind, count in sorted(self.notices.items()))
        return (
            f"{self.notebook}: {len(self.verdicts)} cells compared: {causes}; "
            f"{self.rollbacks} rolled back on kernos, {self.python3_errors} raised on "
            f"python3; notices: {notices or 'none'}"
        )


def compare(
    reference: NotebookRun,
    kernos: NotebookRun,
    expected: Mapping[tuple[str, int], str],
    *,
    keep: bool = False,
) -> Comparison:
    """Compare two runs of one notebook cell by cell (see the module docstring)."""
    notebook = reference.notebook
    comparison = Comparison(notebook)
    theirs = {cell.index: cell for cell in kernos.cells}
    undone: dict[str, int] = {}
    """Name -> the rolled-back cell that left it different from python3's."""
    for ours in reference.cells:
        cell = theirs.get(ours.index) or Cell(
            index=ours.index, source=ours.source, status="not run", kernos={}
        )
        for line in cell.notices():
            comparison.notices[notice_kind(line)] += 1
        comparison.rollbacks += cell.rolled_back
        comparison.python3_errors += ours.status == "error"
        seeds = "seed(" in cell.source
        read = reads(cell.source) | (
            {RANDOM} if _DRAWS.search(cell.source) and not seeds else set()
        )
        tainted = sorted(name for name in read if name in undone)
        differs = signature(ours) != signature(cell)
        detail = ""
        if (notebook, ours.index) in expected:
            cause = EXPECTED if differs else STALE
            detail = expected[notebook, ours.index]
        elif not differs:
            cause = SAME
        elif (
            not keep
            and cell.status == "error"
            and ours.status == "error"
            and signature(cell).error == signature(ours).error
        ):
            cause = BOTH_RAISED
        elif tainted and not keep:
            cause = UNDONE
            detail = ", ".join(f"{name} (cell {undone[name]})" for name in tainted)
        else:
            cause = DIFFERENT
        comparison.verdicts.append(Verdict(notebook, ours.index, cause, ours, cell, detail))
        if cell.rolled_back:
            for name in undone_names(cell):
                undone[name] = ours.index
            if tainted and ours.status == "ok":
                # It failed on Kernos for a name a rollback undid, so what python3 bound
                # here is missing on Kernos too: the taint passes on to those names.
                origin = min(undone[name] for name in tainted)
                for name in binds(cell.source):
                    undone.setdefault(name, origin)
        elif cell.status == "ok":
            origin = min((undone[name] for name in tainted), default=None)
            for name in binds(cell.source) | ({RANDOM} if seeds else set()):
                if origin is None or name == RANDOM:
                    undone.pop(name, None)
                else:
                    undone[name] = origin
    return comparison
