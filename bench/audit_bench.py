"""What events and the audit cost: one command, medians, baselines from the same run.

    python bench/audit_bench.py [--ops N] [--repeats R]

In-process, on the core (no kernel), on a fresh workspace in $TMPDIR:

1. *Commit cost.* The median time of a trivial op (``counter += 1``) with no
   events, against the same op emitting one event to one in-image subscriber,
   and one emitting ten.  The ratio is the price of events inside the
   transaction.
2. *Verify.* ``kernos.audit.verify`` of the whole workspace (chain, snapshots,
   history, every object re-hashed) against ``git fsck --full`` of the same
   repository, which also re-hashes every object: the baseline.
3. *Catch-up.* Reading every committed event back from the durable log
   (``events_since(0)``), per event.

Durability is as configured (``KERNOS_DURABILITY=process`` skips fsync).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:8.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300, help="ops per kind (default 300)")
    parser.add_argument("--repeats", type=int, default=5, help="verify repeats (default 5)")
    args = parser.parse_args()

    from kernos import Image, Workspace
    from kernos.audit import verify
    from kernos.events import EventBus

    root = Path(tempfile.mkdtemp(prefix="kernos-audit-bench-"))
    try:
        workspace = Workspace.open(root / "ws")
        ns: dict[str, object] = {}
        image = Image(workspace, ns)
        image.restore()
        bus = EventBus(image)

        def op(source: str, emit: int = 0) -> float:
            started = time.perf_counter()
            running = image.begin(source=source)
            exec(source, ns)
            for number in range(emit):
                bus.emit("bench.tick", {"n": number})
            running.commit()
            return time.perf_counter() - started

        op("counter = 0\nlast = {}\ndef on_tick(event):\n    last['n'] = event.payload['n']")
        setup = image.begin(source="subscribe")
        bus.subscribe("bench.*", ns["on_tick"])
        setup.commit()
        plain, one, ten = [], [], []
        for _ in range(args.ops):  # interleaved, so drift hits all three alike
            plain.append(op("counter += 1"))
            one.append(op("counter += 1", emit=1))
            ten.append(op("counter += 1", emit=10))
        workspace.close()

        verifies, fscks = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            report = verify(root / "ws")
            verifies.append(time.perf_counter() - started)
            assert report.ok, report.summary()
            started = time.perf_counter()
            subprocess.run(["git", "--git-dir", str(root / "ws" / "history.git"), "fsck",
                            "--full", "--no-dangling"], check=True, capture_output=True)
            fscks.append(time.perf_counter() - started)

        workspace = Workspace.open(root / "ws", writable=False)
        from kernos.audit import open_audit

        log = open_audit(workspace)
        started = time.perf_counter()
        events = log.events_since(0)
        catch_up = time.perf_counter() - started
        workspace.close()

        durability = os.environ.get("KERNOS_DURABILITY", "full")
        print(f"Kernos events and audit, {args.ops} ops of each kind, durability={durability}")
        print(f"  records {report.records}, snapshots {report.commits}, objects {report.objects}")
        print(f"  op commit, no event        {median_ms(plain)}")
        print(f"  op commit, 1 event  + sub  {median_ms(one)}   "
              f"{statistics.median(one) / statistics.median(plain):.2f}x the plain op")
        print(f"  op commit, 10 events + sub {median_ms(ten)}   "
              f"{statistics.median(ten) / statistics.median(plain):.2f}x the plain op")
        print(f"  verify (whole workspace)   {median_ms(verifies)}   "
              f"{statistics.median(verifies) / statistics.median(fscks):.2f}x git fsck --full "
              f"({median_ms(fscks).strip()})")
        print(f"  catch-up, {len(events)} events   {catch_up * 1000:8.2f} ms   "
              f"{catch_up / max(len(events), 1) * 1e6:.1f} us per event")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
