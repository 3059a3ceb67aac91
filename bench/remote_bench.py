"""Remotes: push-after-commit lag, and clone against ``git clone``; one command.

    python bench/remote_bench.py [--ops N] [--rate OPS_PER_S] [--interval MS] [--mb MB]

In-process, on the core (no kernel), fresh workspaces and a bare remote in $TMPDIR:

1. *Lag.* A steady stream of ``counter += 1`` ops (``--rate`` per second) while an
   ``AutoPusher`` (``--interval``) pushes; each op's lag is from its commit to the end of
   the push that carried it to the remote.  Median and p99.
2. *Clone.* A workspace holding ``--mb`` MB of random float64 data (one array per op, 8
   ops), pushed; then ``kernos.remote.transfer.clone`` of it against ``git clone --bare
   --no-local`` of the same remote (the same bytes moved, without the audit and LLM
   refs or the workspace's own checks).  Then the restore of the clone against the
   original's (a fresh image each time, median of 3).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))

from kernos import Image, Workspace
from kernos.remote.autopush import AutoPusher
from kernos.remote.transfer import RemoteConfig, clone, push
from kernos.store.identity import load_identity


def open_image(path: Path) -> tuple[Workspace, Image, dict[str, object]]:
    workspace = Workspace.open(path)
    module = types.ModuleType("__main__")
    image = Image(workspace, module.__dict__, module=module)
    image.restore()
    return workspace, image, module.__dict__


def run(image: Image, namespace: dict[str, object], source: str) -> None:
    op = image.begin(source=source)
    exec(compile(source, "<op>", "exec"), namespace)
    op.commit()


def lag(root: Path, ops: int, rate: float, interval: float) -> list[float]:
    workspace, image, namespace = open_image(root / "lag")
    RemoteConfig.load(root / "lag").add("origin", str(root / "lag.git"))
    run(image, namespace, "counter = 0")
    arrivals: list[tuple[float, str]] = []
    lock = threading.Lock()

    class Timed(AutoPusher):
        def push_now(self):  # type: ignore[no-untyped-def]
            result = super().push_now()
            if result is not None and result.head:
                with lock:
                    arrivals.append((time.monotonic(), result.head))
            return result

    pusher = Timed(root / "lag", "origin", interval=interval)
    pusher.start()
    commits: list[tuple[float, str]] = []
    for _ in range(ops):
        started = time.monotonic()
        run(image, namespace, "counter += 1")
        head = workspace.head()
        assert head is not None
        commits.append((time.monotonic(), head.hex()))
        pusher.notify()
        time.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))
    pusher.close()
    workspace.close()
    order = {sha: index for index, (_, sha) in enumerate(commits)}
    lags = []
    for index, (committed_at, _) in enumerate(commits):
        arrived = min(at for at, sha in arrivals if order.get(sha, -1) >= index)
        lags.append(arrived - committed_at)
    return lags


def clone_times(root: Path, megabytes: int) -> tuple[float, float]:
    workspace, image, namespace = open_image(root / "big")
    run(image, namespace, "import numpy as np")
    per = megabytes * (1 << 20) // 8 // 8
    for index in range(8):
        run(image, namespace, f"a{index} = np.random.default_rng({index}).random({per})")
    workspace.close()
    RemoteConfig.load(root / "big").add("origin", str(root / "big.git"))
    push(root / "big")
    started = time.monotonic()
    clone(str(root / "big.git"), root / "clone", trust=[load_identity(root / "big").key_id])
    ours = time.monotonic() - started
    started = time.monotonic()
    subprocess.run(["git", "clone", "--quiet", "--bare", "--no-local", str(root / "big.git"),
                    str(root / "git-clone.git")], check=True)
    return ours, time.monotonic() - started


def restore_seconds(path: Path) -> float:
    started = time.monotonic()
    workspace, _image, namespace = open_image(path)
    # Read every byte of every big value: loaded, not just mapped or deferred.
    total = sum(float(namespace[f"a{index}"].sum()) for index in range(8))  # type: ignore[attr-defined]
    assert total > 0
    seconds = time.monotonic() - started
    workspace.close()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0, help="ops per second (default 20)")
    parser.add_argument("--interval", type=float, default=200, help="pusher interval, ms")
    parser.add_argument("--mb", type=int, default=256, help="clone workload size (default 256)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kernos-remote-bench-") as directory:
        root = Path(directory)
        lags = sorted(lag(root, args.ops, args.rate, args.interval / 1000))
        p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
        print(f"push lag, {args.ops} ops at {args.rate:g}/s, interval {args.interval:g} ms: "
              f"median {statistics.median(lags) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
        ours, theirs = clone_times(root, args.mb)
        print(f"clone of a {args.mb} MB workspace: kernos clone {ours:.2f} s, "
              f"git clone --bare --no-local {theirs:.2f} s ({ours / theirs:.2f}x)")
        original = statistics.median(restore_seconds(root / "big") for _ in range(3))
        cloned = statistics.median(restore_seconds(root / "clone") for _ in range(3))
        print(f"restore: original {original:.2f} s, clone {cloned:.2f} s "
              f"({cloned / original:.2f}x; median of 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
