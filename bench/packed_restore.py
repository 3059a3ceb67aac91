"""A packed history restores at least as fast as a loose one (issue 17's read side).

    python bench/packed_restore.py [--mb 200] [--repeats 3]

Builds one image twice, in two workspaces (a float array of ``--mb`` MB, a
100,000-entry dict of small dicts, a 50,000-record list, then 20 ops that
each edit one entry of the dict and one element of the array), as Kernos
writes it: a pack per commit, merged by the background repack.  One copy is
then turned into the layout earlier versions wrote, one loose file per
object (``git unpack-objects``).  Each is restored ``--repeats`` times,
alternating, in this process (``Image.restore``: what a starting kernel does
before its first cell), and the medians and their ratio are printed.  The
target: packed <= 1.0x loose.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))

from kernos import Image, Workspace
from kernos.store.maintenance import loosen


def build(path: Path, megabytes: int) -> None:
    with Workspace.open(path, purpose="bench") as workspace:
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        image.restore()
        namespace = module.__dict__
        op = image.begin(source="setup")
        namespace["big"] = np.random.default_rng(0).random(megabytes * 125_000)
        namespace["table"] = {key: {"v": key, "name": f"entry {key}"} for key in range(100_000)}
        namespace["memory"] = [{"op": n, "text": f"record {n}"} for n in range(50_000)]
        op.commit()
        for number in range(20):
            op = image.begin(source=f"edit {number}")
            namespace["table"][number]["v"] += 1
            namespace["big"][number] = number
            op.commit()
        workspace.objects.wait_for_maintenance()


def restore(path: Path) -> float:
    with Workspace.open(path, purpose="bench") as workspace:
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        started = time.perf_counter()
        report = image.restore()
        elapsed = time.perf_counter() - started
        if report.failed:
            raise SystemExit(f"the restore of {path} failed: {report.failed}")
        return elapsed


def files(path: Path) -> int:
    return sum(len(names) for _root, _dirs, names in os.walk(path / "history.git" / "objects"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="size of the array (200)")
    parser.add_argument("--repeats", type=int, default=3, help="restores of each (3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kernos-restore-") as scratch:
        root = Path(scratch)
        packed, loose = root / "packed", root / "loose"
        for path in (packed, loose):
            build(path, args.mb)
        loosen(loose / "history.git")
        times: dict[str, list[float]] = {"packed": [], "loose": []}
        for _ in range(args.repeats):
            for name, path in (("packed", packed), ("loose", loose)):
                times[name].append(restore(path))
        medians = {name: statistics.median(samples) for name, samples in times.items()}
        print(f"Kernos restore, packed against loose: a {args.mb} MB array, a 100,000-entry "
              f"dict, a 50,000-record list, 21 ops; median of {args.repeats}")
        for name, path in (("packed", packed), ("loose", loose)):
            print(f"  {name:7} {medians[name] * 1000:8.0f} ms   {files(path):6,} files")
        ratio = medians["packed"] / medians["loose"]
        verdict = "PASS" if ratio <= 1.0 else "MISS"
        print(f"  packed / loose {ratio:.2f}x   target <= 1.0x   {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
