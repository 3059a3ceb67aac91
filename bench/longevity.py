"""A workspace's cost over a long life: latency, bytes and files per op as it ages.

    python bench/longevity.py [--ops N] [--windows W] [--workspace DIR]

The life of an agent's memory, through the core API (``HarnessService``, as
a harness drives it; durable commits unless ``KERNOS_DURABILITY=process``):
every op appends one record to a growing ``memory`` list, and every 10th op
also edits one entry of a 10,000-entry dict of small dicts (``table``).

The run is cut into W windows of N/W ops.  For each window it prints the
median op latency, the bytes the workspace grew per op and the files it
holds at the window's end.  The baseline is the first window of the same
run; the targets (issue 17) are:

* the last window's median latency <= 1.2x the first's;
* bytes added per op flat: the last window's <= 4 KB + what the op changed
  (a record of about 60 bytes), and not growing with the window number;
* at most 5,000 files in the workspace at the end.

A short run (``--ops 2000``) shows the trend in a minute; the issue's
measure is ``--ops 100000``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from summary import Row, fmt_bytes, summary_table

SETUP = ("memory = []\n"
         "table = {key: {'v': 0, 'name': f'entry {key}'} for key in range(10_000)}")
APPEND = "memory.append({{'op': {n}, 'text': 'record number {n} of the agent memory'}})"
EDIT = "\ntable[{key}]['v'] += 1"
LATENCY_TARGET = 1.2
BYTES_TARGET = 4096 + 64
FILES_TARGET = 5000


@dataclass(frozen=True)
class Window:
    first_op: int
    ops: int
    median_ms: float
    bytes_per_op: float
    files: int


def footprint(root: Path) -> tuple[int, int]:
    """Bytes and files under ``root``."""
    size = files = 0
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                size += os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:  # removed while we walked
                continue
            files += 1
    return size, files


def run(root: Path, ops: int, windows: int) -> list[Window]:
    from kernos import Image, Workspace
    from kernos.agents import AgentRuntime
    from kernos.harness.service import HarnessService

    per_window = max(1, ops // windows)
    found: list[Window] = []
    with Workspace.open(root) as workspace:
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        image.restore()
        service = HarnessService(image, AgentRuntime(image))
        request = {"v": 1, "action": "op", "principal": "human"}
        reply = service.handle({**request, "code": SETUP}).reply
        assert reply["result"]["status"] == "committed", reply
        size, _ = footprint(root)
        number = 0
        for window in range(windows):
            samples = []
            first = number
            for _ in range(per_window):
                code = APPEND.format(n=number)
                if number % 10 == 0:
                    code += EDIT.format(key=(number * 7919) % 10_000)
                began = time.perf_counter()
                reply = service.handle({**request, "code": code}).reply
                samples.append(time.perf_counter() - began)
                assert reply["result"]["status"] == "committed", reply
                number += 1
            grown, files = footprint(root)
            found.append(Window(first_op=first, ops=per_window,
                                median_ms=statistics.median(samples) * 1000,
                                bytes_per_op=(grown - size) / per_window, files=files))
            size = grown
            print(f"  ops {first:>7}-{number - 1:<7} median {found[-1].median_ms:7.2f} ms  "
                  f"{fmt_bytes(int(found[-1].bytes_per_op)):>9}/op  {files:>8} files  "
                  f"[window {window + 1}/{windows}]", flush=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--workspace", type=Path, default=None,
                        help="where to build the workspace (default: a temporary directory)")
    args = parser.parse_args()
    if args.ops < args.windows or args.windows < 2:
        parser.error("give --windows >= 2 and --ops >= --windows")
    durability = os.environ.get("KERNOS_DURABILITY", "(unset: full)")
    print(f"Kernos longevity: {args.ops:,} ops in {args.windows} windows "
          f"(KERNOS_DURABILITY={durability}, {time.strftime('%Y-%m-%d %H:%M:%S')})",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="kernos-longevity-") as scratch:
        root = args.workspace or Path(scratch) / "ws"
        started = time.perf_counter()
        found = run(root, args.ops, args.windows)
        elapsed = time.perf_counter() - started
    first, last = found[0], found[-1]
    latency = last.median_ms / first.median_ms
    print()
    print(summary_table([
        Row("op latency, last window (median)", f"{last.median_ms:.2f} ms",
            f"first window {first.median_ms:.2f} ms", latency,
            f"<= {LATENCY_TARGET}x first", latency <= LATENCY_TARGET),
        Row("bytes added per op, last window", fmt_bytes(int(last.bytes_per_op)),
            f"first window {fmt_bytes(int(first.bytes_per_op))}",
            last.bytes_per_op / first.bytes_per_op if first.bytes_per_op > 0 else None,
            f"<= {fmt_bytes(BYTES_TARGET)}", last.bytes_per_op <= BYTES_TARGET),
        Row("files in the workspace at the end", f"{last.files:,}", "-", None,
            f"<= {FILES_TARGET:,}", last.files <= FILES_TARGET),
    ]))
    print(f"\nWall time {elapsed:.0f} s ({args.ops / elapsed:.0f} ops/s overall).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
