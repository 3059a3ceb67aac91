"""Issue 38's table: what Kernos costs against stock ipykernel and dill, both in one run.

Run it with one command (``python bench/cost_bench.py``; ``--help`` for options).

Every row of the issue's table is measured with the stock side and the Kernos
side in the same run, through real kernels driven by the same client code
(``bench/driver.py``), and printed as the stock median, the Kernos median, the
difference or ratio the issue's target is phrased in, the target and a verdict.

1. *The workload* (``bench/workload.py``, as ``bench/run.py`` builds it: a
   200 MB float64 array ``arr``, a dict of 100k small dicts ``d``, a 1M-row
   frame ``df``, ``counter`` and its edits) on a stock ``python3`` kernel and
   a ``kernos`` kernel, cell by cell, alternating which kernel goes first.
   Then the whole Kernos workspace on disk (each top-level entry listed)
   against one ``dill.dump_module`` file of the same namespace (a child
   process of ``bench/dill_baseline.py``).
2. *Cells*, ``--runs`` times each, alternating which kernel goes first from
   one run to the next: the 8-byte edit ``arr[i] = -1.0`` (a different ``i``
   each run), ``x = arr[:10].copy()``, ``arr.sum()``, ``df.iat[0, 1] = v`` (a
   different ``v`` each run), ``counter += 1`` and creating a second 200 MB
   array (deleted by an untimed cell after each run).  The measure is the
   client's round trip (``execute_request`` to ``execute_reply``); the
   Kernos side also shows the medians of the kernel's ``timings_ms`` and
   ``bytes_written``.
3. *Restore after kill -9*: the workload's ``kernos`` kernel is killed by
   SIGKILL and a new one started on the same workspace, timed from the launch
   to the reply of a cell that reads every value; against a fresh stock
   kernel that runs ``dill.load_module`` of the dump file, then the same cell.
   (The image then also holds phase 2's small edits and ``x``; the values read
   after each restore must equal those of the killed kernel.)
4. *Figure cells* on a second pair of fresh kernels: a 1,000-point line plot
   under ``%matplotlib inline``, and one cell of J.R. Johansson's matplotlib
   lecture (CC BY 3.0), read at run time from ``tests/compat/corpus``.

The public-notebook row is ``bench/compat_bench.py``'s: its command is printed,
and ``--notebooks NAME ...`` runs it on those notebooks (one repeat).
It exits 0 whenever it could measure, 1 if a kernel failed, 2 if the
environment is missing something.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from dill_baseline import measure_dump  # noqa: E402
from driver import (  # noqa: E402
    TIMING_KEYS,
    CellResult,
    KernelError,
    KernelProcess,
    directory_bytes,
)
from run import _check_environment, log, machine_facts, phase  # noqa: E402
from summary import fmt_bytes, fmt_ms  # noqa: E402
from workload import Workload  # noqa: E402

LECTURE = HERE.parent / "tests/compat/corpus/scientific-python-lectures/Lecture-4-Matplotlib.ipynb"
LECTURE_SETUP = range(0, 6)
"""The lecture's code cells before its first figures: ``%matplotlib inline``, pylab, x and y."""
LECTURE_FIGURE = 22
"""Its code cell drawing two curves with a legend, labels and a title on ``plt.subplots()``."""
LINE_PLOT_SETUP = "%matplotlib inline\nimport matplotlib.pyplot as plt\nimport numpy as np"
READ_CELL = ("print(arr.shape, float(arr[-1]), float(arr.sum()), len(d), d['k500']['v'], "
             "df.shape, float(df['b'].sum()), counter)")
"""The cell a restored kernel answers first: it reads every value of the workload."""


@dataclass
class Samples:
    """One row's round trips on each kernel, and what the Kernos kernel reported."""

    stock: list[float] = field(default_factory=list)
    kernos: list[float] = field(default_factory=list)
    reports: list[CellResult] = field(default_factory=list)

    def add(self, kernel: KernelProcess, result: CellResult) -> None:
        if kernel.kernel_name == "kernos":
            self.kernos.append(result.round_trip_ms)
            self.reports.append(result)
        else:
            self.stock.append(result.round_trip_ms)

    def written(self) -> float | None:
        values = [r.bytes_written for r in self.reports if r.bytes_written is not None]
        return statistics.median(values) if values else None

    def timings(self) -> str:
        """The medians of every ``timings_ms`` key the Kernos kernel reported for this row."""
        def rank(key: str) -> tuple[int, str]:  # the commit's steps in order, the op's total last
            return (TIMING_KEYS.index(key) if key in TIMING_KEYS
                    else len(TIMING_KEYS) + (key == "total"), key)

        keys = sorted({key for result in self.reports for key in result.timings}, key=rank)
        parts = []
        for key in keys:
            values = [result.timings[key] for result in self.reports if key in result.timings]
            parts.append(f"{key} {fmt_ms(statistics.median(values))}")
        return ", ".join(parts) or "(no timings_ms)"


@dataclass(frozen=True)
class Line:
    """One printed row: stock and Kernos medians, how they compare, the target."""

    what: str
    stock: str
    kernos: str
    compared: str
    target: str
    passed: bool | None

    @property
    def verdict(self) -> str:
        return "INFO" if self.passed is None else ("PASS" if self.passed else "MISS")


def grid(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                     for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
           for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def alternate(runs: int, kernels: tuple[KernelProcess, KernelProcess],
              cell: Callable[[int], str], samples: Samples,
              after: str | None = None) -> None:
    """Run ``cell(run)`` on both kernels ``runs`` times, the first kernel alternating."""
    for run in range(runs):
        order = kernels if run % 2 == 0 else kernels[::-1]
        for kernel in order:
            samples.add(kernel, kernel.run(cell(run)))
            if after is not None:
                kernel.run(after)


def entry_sizes(workspace: Path) -> list[tuple[str, int]]:
    """Each top-level entry of the workspace with its size on disk (``lstat`` sums)."""
    sizes = []
    for entry in sorted(workspace.iterdir()):
        size = directory_bytes(entry) if entry.is_dir() else entry.lstat().st_size
        sizes.append((entry.name + ("/" if entry.is_dir() else ""), size))
    return sizes


@dataclass
class Bench:
    """One run of the bench: its options, scratch directory and every row measured."""

    runs: int
    workload: Workload
    run_dir: Path
    lines: list[Line] = field(default_factory=list)
    dump_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dump_file = self.run_dir / "session.dill"

    def diff_line(self, what: str, samples: Samples, limit_ms: float) -> None:
        stock, kernos = statistics.median(samples.stock), statistics.median(samples.kernos)
        self.lines.append(Line(what, fmt_ms(stock), fmt_ms(kernos), f"{kernos - stock:+.1f} ms",
                               f"<= +{limit_ms:g} ms", kernos - stock <= limit_ms))
        log(f"  {what}: stock {fmt_ms(stock)}, kernos {fmt_ms(kernos)} "
            f"(n={len(samples.kernos)} each)\n    kernos timings_ms medians: {samples.timings()}")

    def ratio_line(self, what: str, stock: float, kernos: float, limit: float,
                   show: Callable[[float], str] = fmt_ms) -> None:
        ratio = kernos / stock
        self.lines.append(Line(what, show(stock), show(kernos), f"{ratio:.2f}x",
                               f"<= {limit:g}x", ratio <= limit))

    def bytes_line(self, what: str, samples: Samples, limit: float | None) -> None:
        written = samples.written()
        self.lines.append(Line(what, "-", fmt_bytes(written), "-",
                               "-" if limit is None else f"<= {fmt_bytes(limit)}",
                               None if limit is None or written is None else written <= limit))

    # -- 1. the workload and the history on disk ----------------------------------

    def build(self, kernels: tuple[KernelProcess, KernelProcess], workspace: Path) -> None:
        phase("1. the workload on both kernels, cell by cell, alternating which goes first")
        for number, cell in enumerate(self.workload.cells()):
            order = kernels if number % 2 == 0 else kernels[::-1]
            times = {kernel.kernel_name: kernel.run(cell.code).round_trip_ms for kernel in order}
            log(f"  {cell.label:<24} python3 {fmt_ms(times['python3']):>8}   "
                f"kernos {fmt_ms(times['kernos']):>8}")
        sizes = entry_sizes(workspace)
        total = sum(size for _name, size in sizes)
        log("  Kernos workspace on disk: " + ", ".join(f"{name} {fmt_bytes(size)}"
                                                      for name, size in sizes))
        dump = measure_dump(self.workload.scale, self.dump_file)
        log(f"  dill.dump_module of the same namespace: {fmt_bytes(dump.file_bytes)} "
            f"in {dump.seconds:.2f} s (child process)")
        self.ratio_line("history on disk after the workload (whole workspace)",
                        dump.file_bytes, total, 1.05, fmt_bytes)

    # -- 2. cells on the workload ---------------------------------------------------

    def cells(self, kernels: tuple[KernelProcess, KernelProcess]) -> None:
        phase(f"2. cells on the workload, {self.runs} runs each, alternating which goes first")
        elements, runs = self.workload.array_elements, self.runs
        edit, copy, total, frame, counter, create = (Samples() for _ in range(6))
        alternate(runs, kernels, lambda run: f"arr[{(run + 1) * elements // (runs + 2)}] = -1.0",
                  edit)
        self.diff_line("8-byte edit of the array (arr[i] = -1.0)", edit, 10)
        self.bytes_line("  its bytes written (kernel-reported)", edit, 1.1e6)
        alternate(runs, kernels, lambda _run: "x = arr[:10].copy()", copy)
        self.diff_line("x = arr[:10].copy() (reads arr)", copy, 5)
        alternate(runs, kernels, lambda _run: "arr.sum()", total)
        self.diff_line("arr.sum()", total, 5)
        alternate(runs, kernels, lambda run: f"df.iat[0, 1] = {-1.0 - run}", frame)
        self.diff_line("df.iat[0, 1] = v on the 1M-row frame", frame, 10)
        self.bytes_line("  its bytes written (kernel-reported)", frame, None)
        alternate(runs, kernels,
                  lambda run: f"made = np.random.default_rng({run + 10}).random({elements})",
                  create, after="del made")
        log(f"  creating the {self.workload.array_mb:.0f} MB array: stock "
            f"{fmt_ms(statistics.median(create.stock))}, kernos "
            f"{fmt_ms(statistics.median(create.kernos))}\n"
            f"    kernos timings_ms medians: {create.timings()}; written "
            f"{fmt_bytes(create.written())}")
        self.ratio_line(f"creating the {self.workload.array_mb:.0f} MB array",
                        statistics.median(create.stock), statistics.median(create.kernos), 1.3)
        alternate(runs, kernels, lambda _run: "counter += 1", counter)
        self.diff_line("counter += 1", counter, 1)

    # -- 3. figure cells ----------------------------------------------------------------

    def figures(self, workspace: Path) -> None:
        phase("4. figure cells (matplotlib inline) on a fresh pair of kernels")
        stock, kernos = kernel_pair(self.run_dir, "fig-", workspace)
        kernels = (stock, kernos)
        try:
            line = Samples()
            for kernel in kernels:
                kernel.run(LINE_PLOT_SETUP)
            alternate(self.runs, kernels, lambda run: (
                "fig, ax = plt.subplots()\n"
                f"ax.plot(np.random.default_rng({run}).random(1000));"), line)
            log(f"  1,000-point line plot: stock {fmt_ms(statistics.median(line.stock))}, "
                f"kernos {fmt_ms(statistics.median(line.kernos))}\n"
                f"    kernos timings_ms medians: {line.timings()}")
            self.ratio_line("figure cell: 1,000-point line plot", statistics.median(line.stock),
                            statistics.median(line.kernos), 1.2)
            code = [cell for cell in json.loads(LECTURE.read_text())["cells"]
                    if cell["cell_type"] == "code"]
            lecture = Samples()
            for kernel in kernels:
                for index in LECTURE_SETUP:
                    kernel.run("".join(code[index]["source"]), expect_ok=False)
            source = "".join(code[LECTURE_FIGURE]["source"])
            alternate(self.runs, kernels, lambda _run: source, lecture)
            log(f"  lecture cell (J.R. Johansson, Lecture 4, CC BY 3.0; code cell "
                f"{LECTURE_FIGURE} of {LECTURE.relative_to(HERE.parent)}, after its code "
                f"cells {LECTURE_SETUP.start}-{LECTURE_SETUP.stop - 1}):\n    "
                + source.replace("\n", "\n    ")
                + f"\n  stock {fmt_ms(statistics.median(lecture.stock))}, kernos "
                f"{fmt_ms(statistics.median(lecture.kernos))}\n"
                f"    kernos timings_ms medians: {lecture.timings()}")
            self.ratio_line("figure cell: lecture 4's legend plot",
                            statistics.median(lecture.stock), statistics.median(lecture.kernos),
                            1.2)
        finally:
            stock.stop()
            kernos.stop()

    # -- 4. restore after kill -9 ------------------------------------------------------

    def restores(self, kernel: KernelProcess, workspace: Path) -> None:
        phase(f"3. restore after kill -9 against a fresh kernel + dill.load_module "
              f"({self.runs}x, alternating)")
        expected = kernel.run(READ_CELL).output.strip()
        load = ("import dill\n"
                f"globals().update({{name: value for name, value in vars(dill.load_module("
                f"{str(self.dump_file)!r})).items() if not name.startswith('__')}})")
        kernos_ms: list[float] = []
        stock_ms: list[float] = []
        current = [kernel]  # the live kernos kernel, replaced at each restore
        try:
            self._restore_runs(current, workspace, load, expected, kernos_ms, stock_ms)
        finally:
            current[0].stop(now=True)
        log(f"  (values read after each restore equal the killed kernel's: {expected})")
        self.ratio_line("restore after kill -9: launch to the first reading reply",
                        statistics.median(stock_ms), statistics.median(kernos_ms), 0.7)

    def _restore_runs(self, current: list[KernelProcess], workspace: Path, load: str,
                      expected: str, kernos_ms: list[float], stock_ms: list[float]) -> None:
        for run in range(self.runs):
            for side in ("kernos", "stock") if run % 2 == 0 else ("stock", "kernos"):
                if side == "kernos":
                    current[0].kill()
                    kernel = KernelProcess("kernos", run_dir=self.run_dir,
                                           tag=f"restore{run}", workspace=workspace)
                    current[0] = kernel
                    read = kernel.run(READ_CELL)
                    kernos_ms.append((time.perf_counter() - kernel.launched_at) * 1000)
                    if read.output.strip() != expected:
                        raise KernelError(f"restored values differ: {read.output.strip()} "
                                          f"instead of {expected}")
                else:
                    fresh = KernelProcess("python3", run_dir=self.run_dir, tag=f"dill{run}")
                    try:
                        fresh.run(load)
                        fresh.run(READ_CELL)
                        stock_ms.append((time.perf_counter() - fresh.launched_at) * 1000)
                    finally:
                        fresh.stop()
            log(f"  run {run + 1}: kernos {fmt_ms(kernos_ms[-1])}, "
                f"stock + dill.load_module {fmt_ms(stock_ms[-1])}")

    def table(self) -> str:
        rows = [["row", "stock / dill", "kernos", "difference/ratio", "target", "result"]]
        rows += [[line.what, line.stock, line.kernos, line.compared, line.target, line.verdict]
                 for line in self.lines]
        return grid(rows)


def notebooks_command() -> str:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from compat.corpus import NOTEBOOKS

    return f"python bench/compat_bench.py --notebooks {' '.join(NOTEBOOKS)}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/cost_bench.py",
        description="Issue 38's cost table: stock ipykernel / dill against Kernos, both "
                    "measured in the same run through real kernels, medians of --runs.")
    parser.add_argument("--runs", type=int, default=5,
                        help="runs of each cell and restore per kernel (default 5)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="size of the workload (default 1.0, the issue's; 0.05 is quick)")
    parser.add_argument("--notebooks", nargs="+", metavar="NAME", default=[],
                        help="also run bench/compat_bench.py on these notebooks, one repeat "
                             "(off by default; the names are compat_bench.py's)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory and print where it is")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def kernel_pair(run_dir: Path, prefix: str, workspace: Path
                ) -> tuple[KernelProcess, KernelProcess]:
    """A stock ``python3`` kernel and a ``kernos`` kernel on ``workspace``; the first is
    stopped if the second does not start."""
    stock = KernelProcess("python3", run_dir=run_dir, tag=f"{prefix}stock")
    try:
        return stock, KernelProcess("kernos", run_dir=run_dir, tag=f"{prefix}kernos",
                                    workspace=workspace)
    except BaseException:
        stock.stop()
        raise


def measure(bench: Bench) -> None:
    workspace = bench.run_dir / "workspace"
    stock, kernos = kernel_pair(bench.run_dir, "", workspace)
    try:
        bench.build((stock, kernos), workspace)
        bench.cells((stock, kernos))
        stock.stop()
        bench.restores(kernos, workspace)
    except BaseException:
        stock.stop()
        kernos.stop(now=True)
        raise
    bench.figures(bench.run_dir / "workspace-figures")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = _check_environment()
    if problem:
        print(f"bench: {problem}", file=sys.stderr)
        return 2
    workload = Workload.at_scale(args.scale)
    facts = machine_facts(argparse.Namespace(scale=args.scale, repeats=0, trivial=0), workload)
    log(f"Kernos cost bench, issue 38 ({time.strftime('%Y-%m-%d %H:%M:%S')})")
    log("\n".join(line for line in facts.splitlines() if not line.startswith("repeats")))
    log(f"runs       {args.runs} per row and kernel; load average at start "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    bench = Bench(args.runs, workload, Path(tempfile.mkdtemp(prefix="kernos-cost-")))
    started = time.perf_counter()
    try:
        measure(bench)
        if args.notebooks:
            phase("5. public notebooks: bench/compat_bench.py, one repeat")
            subprocess.run([sys.executable, str(HERE / "compat_bench.py"), "--notebooks",
                            *args.notebooks, "--repeats", "1"], check=True)
    except (KernelError, subprocess.CalledProcessError) as error:
        print(f"\nbench: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nbench: interrupted; kernels stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            log(f"\nkept {bench.run_dir}")
        else:
            shutil.rmtree(bench.run_dir, ignore_errors=True)
    where = "compat_bench.py above" if args.notebooks else "command below"
    bench.lines.append(Line("public notebooks, wall time", "-", "-", where, "<= 1.1x", None))
    phase("summary")
    if args.scale != 1.0:
        log(f"scale {args.scale:g}: the targets are defined at scale 1; PASS/MISS here is "
            "only indicative.")
    log(bench.table())
    log("\nstock / kernos: medians of client round trips (execute_request to execute_reply) "
        "on the two kernels; the disk row compares the whole workspace with one dill file.")
    log("public notebooks, wall time (target <= 1.1x; compat_bench.py's own verdict uses "
        f"1.15x), every notebook of the corpus:\n  {notebooks_command()}")
    log(f"\nWall time {time.perf_counter() - started:.0f} s; load average at end "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
