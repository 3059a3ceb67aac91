"""What tracked files cost: one command, medians, the baseline from the same run.

    python bench/files_bench.py [--ops N] [--files 1000,10000] [--size 1G]

In-process, on the core (no kernel), on fresh workspaces in $TMPDIR:

1. *An op that touches no file.*  The median time of a trivial op
   (``counter += 1``) on a workspace whose files root holds 1,000, then
   10,000 small files in 100 directories, taking turns op by op with the
   same op on a workspace that holds none (the baseline).  The difference is
   what tracking adds to an op that writes nothing (targets: <= 1 ms for
   1,000 files, <= 10 ms for 10,000).
2. *A 1-byte edit in a big file.*  A file of ``--size`` random bytes is
   committed, one byte in its middle is changed, and the bytes the next
   commit adds to the store are printed, with their ratio to the file's size
   (target: <= 1.1 MB for a 1 GB file; the default size is 256 MB, so the
   run stays short: the cost is one chunk whatever the size).

The ops skip fsync (``KERNOS_DURABILITY=process``, unless set otherwise): a
sync's latency (milliseconds, in steps) would drown the difference measured.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))
os.environ.setdefault("KERNOS_DURABILITY", "process")


def size_of(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def store_bytes(workspace: Path) -> int:
    return sum(path.stat().st_size for path in (workspace / "history.git").rglob("*")
               if path.is_file())


class Tracked:
    """A workspace whose files root holds ``files`` small files in 100 directories, its
    image restored and those files committed (and read once more, as racily clean)."""

    def __init__(self, root: Path, files: int) -> None:
        from kernos import Image, Workspace
        from kernos.files import scan

        self.workspace = Workspace.open(root / f"ws-{files}-{time.monotonic_ns()}")
        self.namespace: dict[str, object] = {"counter": 0}
        self.image = Image(self.workspace, self.namespace)
        self.image.restore()
        tracked = self.image.files.root()
        for number in range(files):
            directory = tracked / f"d{number % 100:02d}"
            directory.mkdir(exist_ok=True)
            (directory / f"f{number}.txt").write_text(f"file {number}\n")
        for _ in range(2):
            time.sleep(scan.RACY_NS / 1e9 + 0.05)
            self.op(touching=True)

    def op(self, *, touching: bool = False) -> float:
        """One ``counter += 1`` op; its seconds."""
        started = time.perf_counter()
        running = self.image.begin(source="counter += 1")
        exec("counter += 1", self.namespace)
        report = running.commit()
        elapsed = time.perf_counter() - started
        assert touching or not report.files, sorted(report.files)
        return elapsed


def trivial_ops(root: Path, files: int, ops: int) -> tuple[float, float]:
    """Median seconds of ``counter += 1`` without tracked files and with ``files`` of them,
    the two workspaces taking turns (the machine's drift hits both alike)."""
    baseline = Tracked(root, 0)
    tracked = Tracked(root, files)  # made last: one image at a time keeps its watchers
    try:
        plain, with_files = [], []
        for _ in range(ops):
            plain.append(baseline.op())
            with_files.append(tracked.op())
        return statistics.median(plain), statistics.median(with_files)
    finally:
        baseline.workspace.close()
        tracked.workspace.close()


def one_byte_edit(root: Path, size: int) -> tuple[int, int]:
    """Bytes the store grew by when the file was committed, and for a 1-byte edit."""
    from kernos import Image, Workspace

    path = root / "ws-big"
    workspace = Workspace.open(path)
    try:
        image = Image(workspace, {})
        image.restore()
        big = image.files.root() / "big.bin"
        with open(big, "wb") as file:
            for _ in range(0, size, 1 << 24):
                file.write(os.urandom(min(1 << 24, size - file.tell())))
        before = store_bytes(path)
        image.begin(source="# the big file").commit()
        committed = store_bytes(path) - before
        with open(big, "r+b") as file:
            file.seek(size // 2 + 4321)
            byte = file.read(1)
            file.seek(-1, os.SEEK_CUR)
            file.write(bytes([byte[0] ^ 0xFF]))
        before = store_bytes(path)
        report = image.begin(source="# one byte").commit()
        assert report.files == {"changed": ["big.bin"]}, report.files
        return committed, store_bytes(path) - before
    finally:
        workspace.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200, help="ops per size (default 200)")
    parser.add_argument("--files", default="1000,10000", help="file counts (default 1000,10000)")
    parser.add_argument("--size", default="256M", help="the big file's size (default 256M)")
    args = parser.parse_args()
    counts = [int(count) for count in args.files.split(",") if count]
    size = size_of(args.size)

    root = Path(tempfile.mkdtemp(prefix="kernos-files-bench-"))
    try:
        print("1. an op that touches no file (counter += 1), median of", args.ops,
              "taking turns with a workspace that tracks no file")
        for count in counts:
            target = count / 1000  # 1 ms per 1,000 files: the targets at 1,000 and 10,000
            baseline, median = trivial_ops(root, count, args.ops)
            added = (median - baseline) * 1000
            print(f"   {count:>6} tracked files {median * 1000:8.3f} ms (no file "
                  f"{baseline * 1000:.3f} ms)   added {added:7.3f} ms   (target <= "
                  f"{target:g} ms: {'ok' if added <= target else 'OVER'})")
        print(f"2. a 1-byte edit in a {size / (1 << 20):.0f} MiB file")
        committed, edit = one_byte_edit(root, size)
        print(f"   committing the file   {committed / 1e6:10.2f} MB "
              f"({committed / size:.3f}x the file)")
        print(f"   the 1-byte edit       {edit / 1e6:10.3f} MB "
              f"({edit / size:.5f}x the file; target <= 1.1 MB for 1 GB: "
              f"{'ok' if edit <= 1.1e6 else 'OVER'}; one chunk whatever the size)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
