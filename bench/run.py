"""Kernos benchmark: the standard research workload in a real kernel, against dill.

Run it with one command (``python bench/run.py``; ``--help`` for options).

What is measured, and why
-------------------------
The targets of docs/performance.md promise that persisting every cell costs next to
nothing however big the image is, that small edits to big values add little
to the history, and that a restart brings the image back about as fast as
dill loads a session file.  This script checks those promises end to end,
the way a user meets them: through a real ``kernos`` kernel process driven
by jupyter_client, with the workspace on disk as the only other witness.

1. *Stock ipykernel* (``python3`` kernelspec): time from launch to the first
   reply, and the round trip of trivial cells (``pass``).  Every Kernos
   latency is also read against this floor.
2. *The workload* in a fresh ``kernos`` kernel on a temporary workspace:
   setup cells (200 MB array, dict of 100k small dicts, 1M-row DataFrame,
   ``counter = 0``), ten ``counter += 1`` cells, then an 8-byte array edit,
   a one-field dict edit and a one-cell frame edit.  For every cell: the
   kernel's own timings (``metadata["kernos"]["timings_ms"]``: analyze,
   serialize, write, publish and the op's total), the client's round trip,
   the kernel-reported ``bytes_written`` and the growth of
   ``<workspace>/history.git`` on disk.
3. *Restore*, repeated: ``kill -9`` the kernel, start a new one on the same
   workspace, time launch-to-first-reply of a trivial cell and read the
   kernel's own restore time from ``%kernos status``.  The first restore
   also checks the restored values (a silent wrong restore is the worst
   outcome) and the last one measures trivial-cell round trips on the full
   image.
4. *Baseline*, in child processes: build the same namespace as a module's
   globals and time ``dill.dump_module`` (time, file size), then time
   ``dill.load_module`` in fresh interpreters.

Numbers are medians (with min/max) because the machines are shared and
noisy; the final table compares each median with its baseline from this
same run and with the target.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from driver import CellResult, KernelError, KernelProcess, directory_bytes
from summary import (
    Row,
    cell_table,
    fmt_bytes,
    fmt_ms,
    fmt_samples,
    median,
    summary_table,
)
from workload import ARRAY_EDIT, DICT_EDIT, FRAME_EDIT, Workload

TRIVIAL = "pass"
STATUS_LINE = re.compile(r"restore\s+(\d+) names in ([0-9.]+) s at start")
VERSIONED = ("kernos", "ipykernel", "jupyter_client", "numpy", "pandas", "dill")


@dataclass
class Restore:
    """One kill -9 and restart on the same workspace."""

    first_reply_ms: float
    """From spawning the kernel process to the execute_reply of the first trivial cell."""
    ready_ms: float
    """From spawning the kernel process to its first kernel_info reply."""
    kernel_restore_s: float
    """The restore time the kernel reports in ``%kernos status``."""
    names: int


@dataclass
class Results:
    """Everything one run measured; the summary is computed from it."""

    workload: Workload
    stock_first_reply_ms: float = 0.0
    stock_trivial_ms: list[float] = field(default_factory=list)
    cells: list[CellResult] = field(default_factory=list)
    history_bytes: int = 0
    workload_peak_rss: int | None = None
    restores: list[Restore] = field(default_factory=list)
    check: CellResult | None = None
    restored_peak_rss: int | None = None
    kernos_trivial_ms: list[float] = field(default_factory=list)
    dump_s: float = 0.0
    dump_bytes: int = 0
    namespace_rss: int = 0
    load_s: list[float] = field(default_factory=list)
    imports_s: float = 0.0


def log(message: str = "") -> None:
    print(message, flush=True)


def phase(title: str) -> None:
    log(f"\n== {title} [{time.strftime('%H:%M:%S')}, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}]")


def kernos_source() -> str:
    """Which Kernos is measured: the checkout's commit, and whether kernel/ has local edits."""
    checkout = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "kernel"],
                               capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "(not a git checkout)"
    return f"checkout {commit}" + (f" + {len(dirty)} uncommitted file(s) in kernel/"
                                   if dirty else ", kernel/ clean")


def machine_facts(args: argparse.Namespace, workload: Workload) -> str:
    versions = []
    for name in VERSIONED:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    memory = "?"
    try:
        with open("/proc/meminfo") as meminfo:
            memory = f"{int(meminfo.readline().split()[1]) / 1e6:.1f} GB"
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return "\n".join([
        f"machine    {os.cpu_count()} CPUs ({usable} usable), {memory} RAM, "
        f"{platform.platform()}",
        f"python     {platform.python_version()} ({sys.executable})",
        f"versions   {', '.join(versions)}",
        f"kernos     {kernos_source()}",
        f"durability KERNOS_DURABILITY={os.environ.get('KERNOS_DURABILITY', '(unset: full)')}",
        f"workload   scale {args.scale:g}: {workload.describe()}",
        f"repeats    {args.repeats} restores and dill loads, {args.trivial} trivial cells "
        "per kernel",
        "note       this machine may be shared and noisy (load average shown per phase): "
        "read medians and ratios, not single samples",
    ])


def measure_stock(results: Results, run_dir: Path, trivial: int) -> None:
    phase("1. stock ipykernel (python3 kernelspec)")
    kernel = KernelProcess("python3", run_dir=run_dir, tag="stock")
    try:
        first = kernel.run(TRIVIAL)
        results.stock_first_reply_ms = (time.perf_counter() - kernel.launched_at) * 1000
        log(f"launch to first reply  {fmt_ms(results.stock_first_reply_ms)} "
            f"(kernel_info after {fmt_ms((kernel.ready_at - kernel.launched_at) * 1000)}, "
            f"first cell {fmt_ms(first.round_trip_ms)})")
        results.stock_trivial_ms = [kernel.run(TRIVIAL).round_trip_ms for _ in range(trivial)]
        log(f"trivial cell ({TRIVIAL!r}) round trip  {fmt_samples(results.stock_trivial_ms)}")
        log(f"peak RSS of the empty kernel  {fmt_bytes(kernel.peak_rss())}")
    finally:
        kernel.stop()


def measure_workload(results: Results, run_dir: Path, workspace: Path) -> KernelProcess:
    phase(f"2. the workload in a kernos kernel (workspace {workspace})")
    kernel = KernelProcess("kernos", run_dir=run_dir, tag="workload", workspace=workspace)
    try:
        cells = results.workload.cells()
        for number, cell in enumerate(cells, 1):
            result = kernel.run(cell.code, label=cell.label)
            results.cells.append(result)
            log(f"  [{number:2d}/{len(cells)}] {cell.label:<22} {fmt_ms(result.round_trip_ms):>8}")
        results.history_bytes = directory_bytes(workspace / "history.git")
        results.workload_peak_rss = kernel.peak_rss()
    except BaseException:
        kernel.stop()
        raise
    log("\nPer cell (kernel-reported timings_ms; commit = analyze+serialize+write+publish; "
        "total = the whole op, cell included;\nround trip = client execute_request to "
        "execute_reply; written = kernel-reported bytes_written; history + = growth of "
        "history.git on disk):\n")
    log(cell_table(results.cells))
    log(f"\nhistory.git after the workload: {fmt_bytes(results.history_bytes)}; kernel peak "
        f"RSS {fmt_bytes(results.workload_peak_rss)}")
    return kernel


def measure_restores(results: Results, kernel: KernelProcess, run_dir: Path, workspace: Path,
                     repeats: int, trivial: int) -> None:
    phase(f"3. restore: kill -9, then a new kernel on the same workspace ({repeats}x)")
    for attempt in range(1, repeats + 1):
        try:
            kernel.kill()
        except BaseException:
            kernel.stop()
            raise
        kernel = KernelProcess("kernos", run_dir=run_dir, tag=f"restore{attempt}",
                               workspace=workspace)
        try:
            kernel.run(TRIVIAL)
            first_reply_ms = (time.perf_counter() - kernel.launched_at) * 1000
            status = kernel.run("%kernos status")
            match = STATUS_LINE.search(status.output)
            if match is None:
                raise KernelError(f"no restore line in %kernos status:\n{status.output}")
            restore = Restore(first_reply_ms=first_reply_ms,
                              ready_ms=(kernel.ready_at - kernel.launched_at) * 1000,
                              kernel_restore_s=float(match.group(2)), names=int(match.group(1)))
            results.restores.append(restore)
            log(f"  restore {attempt}: kernel restored {restore.names} names in "
                f"{restore.kernel_restore_s:.2f} s; launch to kernel_info "
                f"{fmt_ms(restore.ready_ms)}, to first reply {fmt_ms(restore.first_reply_ms)}")
            if attempt == 1:
                results.check = kernel.run(results.workload.check_code(),
                                           label="check (read-only)")
                results.restored_peak_rss = kernel.peak_rss()
                verdict = "OK" if results.check.output.strip() == "True" else "WRONG"
                log(f"  restored values checked: {verdict} "
                    f"({results.check.output.strip() or 'no output'})")
                log("  the check cell only reads arr, d, df and counter; its op cost:\n")
                log("    " + cell_table([results.check]).replace("\n", "\n    ") + "\n")
            if attempt == repeats:
                results.kernos_trivial_ms = [kernel.run(TRIVIAL).round_trip_ms
                                             for _ in range(trivial)]
                log(f"  trivial cell ({TRIVIAL!r}) round trip on the restored image  "
                    f"{fmt_samples(results.kernos_trivial_ms)}")
        except BaseException:
            kernel.stop()
            raise
    kernel.stop()


def measure_dill(results: Results, run_dir: Path, repeats: int) -> None:
    from dill_baseline import measure_dump, measure_imports, measure_load

    phase("4. baseline: dill.dump_module / dill.load_module of the same namespace")
    file = run_dir / "session.dill"
    dump = measure_dump(results.workload.scale, file)
    results.dump_s, results.dump_bytes = dump.seconds, dump.file_bytes
    results.namespace_rss = dump.namespace_rss
    log(f"  dump_module  {dump.seconds:.2f} s, {fmt_bytes(dump.file_bytes)} "
        f"(child RSS with the namespace {fmt_bytes(dump.namespace_rss)}, peak "
        f"{fmt_bytes(dump.peak_rss)})")
    for attempt in range(1, repeats + 1):
        results.load_s.append(measure_load(file, results.workload.scale))
        log(f"  load_module  {results.load_s[-1]:.2f} s (fresh interpreter, #{attempt}, "
            "values checked)")
    results.imports_s = measure_imports()
    log(f"  (import numpy, pandas alone: {results.imports_s:.2f} s; both restores include it)")


def _cell(results: Results, label: str) -> CellResult:
    return next(cell for cell in results.cells if cell.label == label)


def _ratio(measured: float | None, baseline: float | None) -> float | None:
    if measured is None or not baseline:
        return None
    return measured / baseline


def summary_rows(results: Results) -> list[Row]:
    """The final table: each target of docs/performance.md that this workload exercises."""
    dump_ms = results.dump_s * 1000
    dump_text = f"dump_module {results.dump_s:.2f} s"
    counters = [result.commit_ms for cell, result in zip(results.workload.cells(), results.cells,
                                                         strict=True) if cell.kind == "counter"]
    counter = median([value for value in counters if value is not None])
    arr, dct, frame = (_cell(results, label) for label in (ARRAY_EDIT, DICT_EDIT, FRAME_EDIT))
    restore_s = median([r.kernel_restore_s for r in results.restores])
    load_s = median(results.load_s)
    first_reply = median([r.first_reply_ms for r in results.restores])
    trivial, stock = median(results.kernos_trivial_ms), median(results.stock_trivial_ms)
    rows = [
        Row("counter cell: commit (issue)", fmt_ms(counter), dump_text,
            _ratio(counter, dump_ms), "<= 20 ms", counter <= 20),
        Row("counter cell: commit (stretch)", fmt_ms(counter), dump_text,
            _ratio(counter, dump_ms), "<= 5 ms", counter <= 5),
    ]
    for label, cell, limit in (("array 8-byte edit: commit", arr, 50.0),
                               ("dict field edit: commit", dct, 250.0),
                               ("frame cell edit: commit", frame, None)):
        value = cell.commit_ms
        rows.append(Row(label, fmt_ms(value), dump_text, _ratio(value, dump_ms),
                        "-" if limit is None else f"<= {limit:.0f} ms",
                        None if limit is None or value is None else value <= limit))
    for label, cell, byte_limit in (("array 8-byte edit: history +", arr, 2e6),
                                    ("frame cell edit: history +", frame, None)):
        added = cell.history_added
        rows.append(Row(label, fmt_bytes(added), f"dump file {fmt_bytes(results.dump_bytes)}",
                        _ratio(added, results.dump_bytes),
                        "-" if byte_limit is None else f"<= {fmt_bytes(byte_limit)}",
                        None if byte_limit is None or added is None else added <= byte_limit))
    check = results.check.commit_ms if results.check is not None else None
    rows.append(Row("read-only cell naming arr, d, df", fmt_ms(check), dump_text,
                    _ratio(check, dump_ms), "<= 20 ms (blocking)",
                    None if check is None else check <= 20))
    small = [value for value in [*counters, arr.commit_ms, dct.commit_ms, frame.commit_ms, check]
             if value is not None]
    worst = max(small)
    rows.append(Row("worst checkpoint after setup (max)", fmt_ms(worst), dump_text,
                    _ratio(worst, dump_ms), "<= 20 ms (blocking)", worst <= 20))
    history_ratio = _ratio(results.history_bytes, results.dump_bytes)
    restore_ratio = _ratio(restore_s, load_s)
    rows += [
        Row("history.git after the script", fmt_bytes(results.history_bytes),
            f"dump file {fmt_bytes(results.dump_bytes)}", history_ratio, "<= 1.1x dump",
            history_ratio is not None and history_ratio <= 1.1),
        Row("restore (kernel-reported)", f"{restore_s:.2f} s", f"load_module {load_s:.2f} s",
            restore_ratio, "<= 1.5x load (issue)",
            restore_ratio is not None and restore_ratio <= 1.5),
        Row("restore (kernel-reported)", f"{restore_s:.2f} s", f"load_module {load_s:.2f} s",
            restore_ratio, "<= 1.0x load (product)",
            restore_ratio is not None and restore_ratio <= 1.0),
        Row("restart: launch to first reply",
            f"{fmt_ms(first_reply)} ({first_reply - results.stock_first_reply_ms:+.0f} ms)",
            f"stock start {fmt_ms(results.stock_first_reply_ms)}",
            _ratio(first_reply, results.stock_first_reply_ms), "<= stock +100 ms (stretch)",
            first_reply - results.stock_first_reply_ms <= 100),
        Row("trivial cell round trip", fmt_ms(trivial), f"ipykernel {fmt_ms(stock)}",
            _ratio(trivial, stock), "<= 1.3x ipykernel", trivial <= 1.3 * stock),
    ]
    for label, rss in (("peak RSS, workload kernel", results.workload_peak_rss),
                       ("peak RSS, restored kernel", results.restored_peak_rss)):
        ratio = _ratio(rss, results.namespace_rss)
        rows.append(Row(label, fmt_bytes(rss), f"namespace {fmt_bytes(results.namespace_rss)}",
                        ratio, "<= 1.3x namespace", None if ratio is None else ratio <= 1.3))
    check_ok = results.check is not None and results.check.output.strip() == "True"
    rows.append(Row("restored values equal the workload's", "yes" if check_ok else "NO", "-",
                    None, "silent wrong restores: 0", check_ok))
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/run.py",
        description="Benchmark Kernos on the standard research workload of docs/performance.md "
                    "(200 MB array, 100k-dict, 1M-row DataFrame, counter) in a real kernel, "
                    "against dill.dump_module/load_module and stock ipykernel measured in the "
                    "same run. Not a test: it prints measurements and PASS/MISS per target, "
                    "and exits 0 unless something broke.",
    )
    parser.add_argument("--scale", type=float, default=1.0,
                        help="size of the workload relative to docs/performance.md's (default 1.0; "
                             "0.05 for a quick run; targets are defined at 1.0)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="restores and dill loads to take the median of (default 3)")
    parser.add_argument("--trivial", type=int, default=20,
                        help="trivial cells per kernel for the round-trip median (default 20)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (workspace, dill file) and print it")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.trivial < 1:
        parser.error("--repeats and --trivial must be at least 1")
    return args


def _check_environment() -> str | None:
    try:
        import dill  # noqa: F401
        import jupyter_client  # noqa: F401
        import numpy  # noqa: F401
        import pandas  # noqa: F401
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError as error:
        return (f"{error}. Run the benchmark with the Python that has Kernos and its bench "
                "extras installed (e.g. the checkout's .venv/bin/python bench/run.py, "
                "after bash scripts/test).")
    for name in ("kernos", "python3"):
        try:
            KernelSpecManager().get_kernel_spec(name)
        except NoSuchKernel:
            return (f"no {name!r} kernelspec is installed for {sys.executable} (`jupyter "
                    "kernelspec list`); install Kernos with pip into this environment.")
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = _check_environment()
    if problem:
        print(f"bench: {problem}", file=sys.stderr)
        return 2
    workload = Workload.at_scale(args.scale)
    results = Results(workload=workload)
    run_dir = Path(tempfile.mkdtemp(prefix="kernos-bench-"))
    log(f"Kernos benchmark ({time.strftime('%Y-%m-%d %H:%M:%S')})")
    log(machine_facts(args, workload))
    started = time.perf_counter()
    try:
        measure_stock(results, run_dir, args.trivial)
        kernel = measure_workload(results, run_dir, run_dir / "workspace")
        measure_restores(results, kernel, run_dir, run_dir / "workspace", args.repeats,
                         args.trivial)
        measure_dill(results, run_dir, args.repeats)
    except KernelError as error:
        print(f"\nbench: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nbench: interrupted; kernels stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            log(f"\nkept {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    phase("summary")
    if args.scale != 1.0:
        log(f"scale {args.scale:g}: the targets are defined at scale 1; PASS/MISS here is "
            "only indicative.")
    log(summary_table(summary_rows(results)))
    log(f"\nratio = measured / baseline. Wall time of the whole run "
        f"{time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
