"""Kernos on real notebooks: the compatibility corpus timed on python3 and kernos in one run.

Run it with one command (``python bench/compat_bench.py``; ``--help`` for options).

The notebooks are those of the compatibility test (``tests/compat/corpus``):
by default the ten chapters of "Python for Data Analysis" (``pydata-book``),
which the 1.15x target was set on; ``--notebooks`` picks any notebook of the
other corpora too.  They run top to bottom through jupyter_client by the
test's own runner (``tests/compat/corpus.py``), each in a scratch copy of its
corpus, on the stock ``python3`` kernel and on
``kernos`` (a fresh workspace per run).  The kernels run one after the other,
never side by side, and the order alternates from one repeat to the next, so
that neither kernel always gets the warm file cache.

What is printed:

* per notebook, the median over the repeats of the sum of the cells' client
  wall times (``execute_request`` to ``execute_reply``; kernel start-up is
  shown apart), on each kernel, and the ratio;
* the total over the corpus without ``%timeit`` cells (their loop count, and so
  their wall time, varies by seconds from run to run), and its ratio against
  the target (<= 1.15x); the total with every cell, for information;
* the per-cell overhead (the kernos median minus the python3 median of the
  same cell): median, p90, p99 and max, and the 15 cells with the largest
  overhead, with the kernel's own ``metadata["kernos"]["timings_ms"]``;
* the comparison of the first repeat's outputs, as the test counts it.

It exits 0 whenever it could measure, 1 if a kernel failed and 2 if the
environment is missing something.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from run import kernos_source  # noqa: E402
from summary import Row, fmt_ms, summary_table  # noqa: E402

if TYPE_CHECKING:
    from compat.corpus import NotebookRun

TARGET = 1.15
"""The issue's target: the whole corpus on kernos within 1.15x of python3."""
SELF_TIMING = ("%timeit", "%%timeit")
"""Cells that time themselves, with a loop count they choose: not comparable across runs."""
SLOWEST = 15
KERNELS = ("python3", "kernos")
VERSIONED = ("kernos", "ipykernel", "jupyter_client", "numpy", "pandas", "matplotlib")


@dataclass
class NotebookTimes:
    """Every repeat's run of one notebook on each kernel."""

    notebook: str
    runs: dict[str, list[NotebookRun]] = field(default_factory=lambda: {k: [] for k in KERNELS})

    def seconds(self, kernel: str) -> float:
        return statistics.median(run.seconds for run in self.runs[kernel])

    def start(self, kernel: str) -> float:
        return statistics.median(run.start_seconds for run in self.runs[kernel])


@dataclass(frozen=True)
class CellOverhead:
    notebook: str
    index: int
    first_line: str
    python3_ms: float
    kernos_ms: float
    timings_ms: dict[str, float]
    status: str

    @property
    def overhead_ms(self) -> float:
        return self.kernos_ms - self.python3_ms

    @property
    def outside_op_ms(self) -> float | None:
        """Round trip minus the op's own ``total``: request handling, reach, replies."""
        total = self.timings_ms.get("total")
        return None if not isinstance(total, int | float) else self.kernos_ms - total


def log(message: str = "") -> None:
    print(message, flush=True)


def phase(title: str) -> None:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    log(f"\n== {title} [{time.strftime('%H:%M:%S')}, load average {load}]")


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def cell_overheads(times: list[NotebookTimes]) -> list[CellOverhead]:
    """Per cell: the median wall time on each kernel over the repeats, and their difference."""
    found = []
    for notebook in times:
        python3_runs, kernos_runs = notebook.runs["python3"], notebook.runs["kernos"]
        for position, cell in enumerate(python3_runs[0].cells):
            ours = [run.cells[position].seconds for run in python3_runs]
            theirs = [run.cells[position] for run in kernos_runs]
            kernos_ms = statistics.median(c.seconds for c in theirs) * 1000
            # The kernel's breakdown from the repeat closest to the median.
            typical = min(theirs, key=lambda c: abs(c.seconds * 1000 - kernos_ms))
            found.append(
                CellOverhead(
                    notebook=notebook.notebook,
                    index=cell.index,
                    first_line=cell.first_line,
                    python3_ms=statistics.median(ours) * 1000,
                    kernos_ms=kernos_ms,
                    timings_ms=dict(typical.kernos.get("timings_ms", {})),
                    status=str(typical.kernos.get("status", typical.status)),
                )
            )
    return found


def _grid(rows: list[list[str]], left: set[int]) -> str:
    """Columns padded to their widest cell; the columns in ``left`` align left."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for number, row in enumerate(rows):
        cells = [
            cell.ljust(width) if index in left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def notebook_table(times: list[NotebookTimes]) -> str:
    rows = [["notebook", "cells", "python3", "kernos", "ratio", "start python3", "start kernos"]]
    for notebook in times:
        ours, theirs = notebook.seconds("python3"), notebook.seconds("kernos")
        rows.append(
            [
                notebook.notebook,
                str(len(notebook.runs["python3"][0].cells)),
                f"{ours:.2f} s",
                f"{theirs:.2f} s",
                f"{theirs / ours:.2f}x",
                f"{notebook.start('python3'):.2f} s",
                f"{notebook.start('kernos'):.2f} s",
            ]
        )
    total_ours = sum(n.seconds("python3") for n in times)
    total_theirs = sum(n.seconds("kernos") for n in times)
    rows.append(
        [
            "total",
            str(sum(len(n.runs["python3"][0].cells) for n in times)),
            f"{total_ours:.2f} s",
            f"{total_theirs:.2f} s",
            f"{total_theirs / total_ours:.2f}x",
            f"{sum(n.start('python3') for n in times):.2f} s",
            f"{sum(n.start('kernos') for n in times):.2f} s",
        ]
    )
    return _grid(rows, left={0})


def slowest_table(cells: list[CellOverhead]) -> str:
    rows = [
        [
            "notebook",
            "cell",
            "status",
            "python3",
            "kernos",
            "overhead",
            "outside op",
            "timings_ms",
            "source",
        ]
    ]
    for cell in sorted(cells, key=lambda c: c.overhead_ms, reverse=True)[:SLOWEST]:
        timings = " ".join(
            f"{key} {value:.0f}"
            for key, value in cell.timings_ms.items()
            if isinstance(value, int | float)
        )
        rows.append(
            [
                cell.notebook,
                str(cell.index),
                cell.status,
                fmt_ms(cell.python3_ms),
                fmt_ms(cell.kernos_ms),
                fmt_ms(cell.overhead_ms),
                fmt_ms(cell.outside_op_ms),
                timings or "-",
                cell.first_line[:50],
            ]
        )
    return _grid(rows, left={0, 2, 8})


def comparison_lines(times: list[NotebookTimes]) -> list[str]:
    """The test's comparison of the first repeat's outputs (no EXPECTED table: raw causes)."""
    from compat.compare import compare

    lines, causes = [], Counter[str]()
    for notebook in times:
        comparison = compare(notebook.runs["python3"][0], notebook.runs["kernos"][0], {})
        causes.update(comparison.counts())
        lines.append("  " + comparison.summary())
    total = ", ".join(f"{count} {cause}" for cause, count in causes.most_common())
    return [*lines, f"  all: {sum(causes.values())} cells: {total}"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from compat.corpus import CORPORA, NOTEBOOKS

    chapters = CORPORA["pydata-book"]

    parser = argparse.ArgumentParser(
        prog="python bench/compat_bench.py",
        description="Time the compatibility corpus (real notebooks written for IPython) on "
        "python3 and on kernos, one kernel after the other, in one run; print per-notebook "
        "and total ratios (target <= 1.15x) and the per-cell overhead.",
    )
    parser.add_argument(
        "--notebooks",
        nargs="+",
        default=list(chapters),
        choices=NOTEBOOKS,
        metavar="NAME",
        help=f"notebooks to run (default: the pydata-book chapters {' '.join(chapters)}; "
        f"any of {' '.join(NOTEBOOKS)})",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each notebook on each kernel, medians taken (default 3)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch directory and print where it is"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def _check_environment() -> str | None:
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

        import compat.corpus  # noqa: F401
    except ImportError as error:
        return (
            f"{error}. Run the benchmark with the Python that has Kernos and its test "
            "extras installed (e.g. .venv/bin/python bench/compat_bench.py)."
        )
    for name in KERNELS:
        try:
            KernelSpecManager().get_kernel_spec(name)
        except NoSuchKernel:
            return f"no {name!r} kernelspec is installed for {sys.executable}"
    return None


def header(args: argparse.Namespace) -> str:
    versions = []
    for name in VERSIONED:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return "\n".join(
        [
            f"machine    {os.cpu_count()} CPUs, {platform.platform()}",
            f"python     {platform.python_version()} ({sys.executable})",
            f"versions   {', '.join(versions)}",
            f"kernos     {kernos_source()}",
            f"durability KERNOS_DURABILITY={os.environ.get('KERNOS_DURABILITY', '(unset: full)')}",
            f"corpus     {' '.join(args.notebooks)}; {args.repeats} repeat(s), kernels one "
            "after the other, order alternating per repeat",
            "note       this machine may be shared and noisy: read medians and ratios",
        ]
    )


def measure(args: argparse.Namespace, scratch: Path) -> list[NotebookTimes]:
    from compat.corpus import run_notebook

    times = [NotebookTimes(notebook) for notebook in args.notebooks]
    for repeat in range(args.repeats):
        order = KERNELS if repeat % 2 == 0 else KERNELS[::-1]
        phase(f"repeat {repeat + 1}/{args.repeats}: {order[0]} first")
        for notebook in times:
            line = [f"  {notebook.notebook}"]
            for kernel in order:
                run = run_notebook(
                    notebook.notebook, kernel, scratch / f"{notebook.notebook}-{kernel}-{repeat}"
                )
                stuck = [cell for cell in run.cells if cell.status in ("timeout", "died")]
                if stuck:
                    raise RuntimeError(
                        f"{notebook.notebook} cell {stuck[0].index} {stuck[0].status} on {kernel}"
                    )
                notebook.runs[kernel].append(run)
                line.append(f"{kernel} {run.seconds:6.2f} s")
            log("  ".join(line))
    return times


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = _check_environment()
    if problem:
        print(f"bench: {problem}", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="kernos-compat-bench-"))
    log(f"Kernos on real notebooks ({time.strftime('%Y-%m-%d %H:%M:%S')})")
    log(header(args))
    started = time.perf_counter()
    try:
        times = measure(args, scratch)
    except RuntimeError as error:
        print(f"\nbench: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nbench: interrupted", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            log(f"\nkept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    phase("per notebook (median over repeats of the sum of cell wall times; start-up apart)")
    log(notebook_table(times))
    cells = cell_overheads(times)
    overheads = [cell.overhead_ms for cell in cells]
    phase(f"per-cell overhead: kernos minus python3, same cell, medians ({len(cells)} cells)")
    log(
        f"median {fmt_ms(statistics.median(overheads))}, p90 {fmt_ms(percentile(overheads, 0.9))}"
        f", p99 {fmt_ms(percentile(overheads, 0.99))}, max {fmt_ms(max(overheads))}; "
        f"sum {sum(overheads) / 1000:.2f} s"
    )
    log(f"\nThe {SLOWEST} cells with the largest overhead (timings_ms from the kernos reply):\n")
    log(slowest_table(cells))
    phase("outputs of the first repeat, compared as the test does (before EXPECTED)")
    log("\n".join(comparison_lines(times)))
    phase("summary")
    ours = sum(n.seconds("python3") for n in times)
    theirs = sum(n.seconds("kernos") for n in times)
    # %timeit picks its own loop count from how fast the first loops ran, so its
    # wall time swings by seconds between runs of the same kernel (ch07's cell
    # took 8 s and 24 s on python3 in one run): the target is judged without it.
    timed = [cell for cell in cells if not cell.first_line.lstrip().startswith(SELF_TIMING)]
    timed_ours = sum(cell.python3_ms for cell in timed) / 1000
    timed_theirs = sum(cell.kernos_ms for cell in timed) / 1000
    log(
        summary_table(
            [
                Row(
                    f"corpus on kernos, cells' wall time, without {len(cells) - len(timed)} "
                    "%timeit cells",
                    f"{timed_theirs:.2f} s",
                    f"python3 {timed_ours:.2f} s",
                    timed_theirs / timed_ours,
                    f"<= {TARGET}x python3",
                    timed_theirs / timed_ours <= TARGET,
                ),
                Row(
                    "corpus on kernos, cells' wall time, every cell",
                    f"{theirs:.2f} s",
                    f"python3 {ours:.2f} s",
                    theirs / ours,
                    "-",
                    None,
                ),
                Row(
                    "per-cell overhead, median",
                    fmt_ms(statistics.median(overheads)),
                    "-",
                    None,
                    "-",
                    None,
                ),
            ]
        )
    )
    log(f"\nWall time of the whole run {time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
