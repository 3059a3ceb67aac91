"""The first cell after a restart of a big image, while the big values still load.

    python bench/first_cell.py [--gb 1.0] [--repeats 3]

A Kernos kernel builds an image holding one big array (``--gb`` GB of random
float64) and a few small values, then is killed with SIGKILL.  Each repeat
starts a new kernel on the workspace and measures, from its launch:

* ``kernel_info``: when the kernel answers (its start-up, before any restore);
* the first cell, ``x = small + [3]`` (it names no big value): its reply;
* the whole restore, as the kernel reports it (``%kernos status``).

The first cell's time after ``kernel_info`` is the target (<= 100 ms).  The
baseline is a stock ipykernel's launch to the reply of the same kind of cell,
measured in the same run.  Medians are printed.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from driver import KernelProcess

STATUS = re.compile(r"restore\s+(\d+) names in ([0-9.]+) s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the big array (1.0)")
    parser.add_argument("--repeats", type=int, default=3, help="restarts to take the median of")
    args = parser.parse_args()
    elements = int(args.gb * 1e9 / 8)
    with tempfile.TemporaryDirectory(prefix="kernos-first-cell-") as tmp:
        root = Path(tmp)
        workspace = root / "ws"
        kernel = KernelProcess("kernos", run_dir=root, tag="build", workspace=workspace)
        kernel.run(f"import numpy as np\nbig = np.random.default_rng(0).random({elements})\n"
                   "small = [1, 2]")
        kernel.kill()
        first, info, restore = [], [], []
        for attempt in range(args.repeats):
            kernel = KernelProcess("kernos", run_dir=root, tag=f"restart{attempt}",
                                   workspace=workspace)
            try:
                reply = kernel.run("x = small + [3]")
                replied = time.perf_counter()
                info.append((kernel.ready_at - kernel.launched_at) * 1000)
                first.append((replied - kernel.ready_at) * 1000)
                status = kernel.run("%kernos status").output  # waits for the whole restore
                match = STATUS.search(status)
                restore.append(float(match.group(2)) if match else float("nan"))
                assert reply.round_trip_ms > 0
            finally:
                kernel.kill()
        stock = []
        for attempt in range(args.repeats):
            baseline = KernelProcess("python3", run_dir=root, tag=f"stock{attempt}")
            try:
                baseline.run("small = [1, 2]\nx = small + [3]")
                stock.append((time.perf_counter() - baseline.launched_at) * 1000)
            finally:
                baseline.stop(now=True)
    print(f"image: one {args.gb:g} GB array and two small values; {args.repeats} restarts\n")
    median = statistics.median
    rows = [
        ("launch to kernel_info", f"{median(info):7.0f} ms", ""),
        ("kernel_info to the first cell's reply", f"{median(first):7.0f} ms",
         "target <= 100 ms " + ("PASS" if median(first) <= 100 else "MISS")),
        ("launch to the first cell's reply", f"{median(info) + median(first):7.0f} ms",
         f"stock ipykernel launch to first reply {median(stock):.0f} ms"),
        ("whole restore (kernel-reported)", f"{median(restore):7.2f} s", ""),
    ]
    width = max(len(row[0]) for row in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value}  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
