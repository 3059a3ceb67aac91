"""What ``kernos audit verify --since`` saves on a long log: a suffix against the whole.

    python bench/audit_since.py [--records N] [--back K] [--no-full] [--keep]

Builds, in process and without a kernel, a workspace of N op records (default
100,000) after the genesis record:

* ops before the last ``--tail`` (default 2,000) commit a real snapshot every
  ``--commit-every`` ops (default 10), through the core ``Image``; the others
  are failed ops, whose records the log's own writer (``AuditLog.append``)
  appends as the op's transaction would, with no snapshot (an op that fails
  writes none);
* the last ``--tail`` ops all commit a snapshot, so the range ``--since``
  verifies holds one snapshot per record, the costly case.

Then it times, medians of 3, ``kernos.audit.verify`` of the whole workspace
(``--no-full`` skips it: at 100,000 records it takes about a minute) and
``verify(since=ANCHOR)`` where ANCHOR is the record K back from the head
(default 1,000; the head digest an earlier verify would have printed), and
prints the ratio.  Both re-hash every git object the snapshots they check
reach.  Last, one ``kernos audit verify --since`` in a fresh process, which
adds the interpreter's start.  Target: the suffix within 1 s at 100,000
records.  Building takes about 40 s at the defaults (3 ms per committed op,
30 us per appended record); durability is off while building.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

REPEATS = 3
TARGET_SECONDS = 1.0


def build(path: Path, records: int, tail: int, commit_every: int) -> None:
    """A workspace whose log holds ``records`` op records after its genesis."""
    from kernos import Image, Workspace
    from kernos._time import utc_now
    from kernos.audit.record import code_field

    with Workspace.open(path, durable=False) as workspace:
        module = types.ModuleType("__main__")
        namespace = module.__dict__
        image = Image(workspace, namespace, module=module)
        image.restore()
        log = image.audit
        failing = "memory.append(counter)\nraise ValueError('the tool said no')"
        code = code_field(log, failing, frozenset())
        started = time.perf_counter()
        for number in range(records):
            if number >= records - tail or number % commit_every == 0:
                op = image.begin(source="counter += 1")
                namespace["counter"] = namespace.get("counter", 0) + 1
                op.commit()
            else:
                image.last_op += 1  # the op id the image would have given it
                now = utc_now()
                log.append({
                    "type": "op", "op": image.last_op, "kind": "cell", "principal": "human",
                    "status": "failed",
                    "error": {"kind": "ValueError", "message": "the tool said no"},
                    "code": code, "grants": {"used": [], "denied": []}, "changes": None,
                    "events": [], "attempted_events": 0, "effects": [], "commit": None,
                    "started_at": now, "finished_at": now})
            if (number + 1) % 10_000 == 0:
                print(f"  built {number + 1:,} records in {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)


def anchor_back(path: Path, back: int) -> str:
    """``INDEX:HASH`` of the record ``back`` records before the newest (read from the end)."""
    lines = (path / "audit" / "chain.jsonl").read_bytes().splitlines()
    record = json.loads(lines[-1 - back])
    return f"{record['index']}:{record['hash']}"


def timed(run: Callable[[], object]) -> tuple[float, object]:
    """The median of REPEATS runs, in seconds, and the last result."""
    samples = []
    result: object = None
    for _ in range(REPEATS):
        started = time.perf_counter()
        result = run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000,
                        help="op records after the genesis (default 100,000)")
    parser.add_argument("--back", type=int, default=1_000,
                        help="how many records before the head the anchor is (default 1,000)")
    parser.add_argument("--tail", type=int, default=2_000,
                        help="the newest ops, all committed (default 2,000)")
    parser.add_argument("--commit-every", type=int, default=10,
                        help="before the tail, one op in N commits (default 10)")
    parser.add_argument("--no-full", action="store_true", help="skip the full verify")
    parser.add_argument("--keep", action="store_true", help="keep the workspace; print where")
    args = parser.parse_args()
    if not 0 < args.back < args.records:
        parser.error("--back must be between 1 and --records - 1")

    from kernos.audit import VerifyReport, verify

    root = Path(tempfile.mkdtemp(prefix="kernos-audit-since-"))
    path = root / "ws"
    try:
        print(f"building {args.records:,} records (the newest {args.tail:,} committed, one in "
              f"{args.commit_every} before them) in {path}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        build(path, args.records, min(args.tail, args.records), max(args.commit_every, 1))
        built = time.perf_counter() - started
        anchor = anchor_back(path, args.back)

        def since() -> VerifyReport:
            return verify(path, since=anchor)

        since_s, since_report = timed(since)
        assert isinstance(since_report, VerifyReport)
        assert since_report.ok, since_report.summary()
        full_s: float | None = None
        if not args.no_full:
            full_s, full_report = timed(lambda: verify(path))
            assert isinstance(full_report, VerifyReport)
            assert full_report.ok and full_report.head == since_report.head, \
                full_report.summary()
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kernos.cli", "audit", "verify", "-w",
                               str(path), "--since", anchor], capture_output=True, text=True)
        cli_s = time.perf_counter() - started
        assert done.returncode == 0, done.stdout + done.stderr

        size = (path / "audit" / "chain.jsonl").stat().st_size
        print(f"Kernos audit verify --since, {args.records:,} records "
              f"({size / 1e6:.0f} MB of log), built in {built:.0f} s")
        print(f"  --since {anchor.split(':')[0]} ({since_report.range()}; "
              f"{since_report.commits} snapshots, {since_report.objects} objects)")
        verdict = "PASS" if since_s <= TARGET_SECONDS else "MISS"
        print(f"  verify --since          {since_s * 1000:9.1f} ms   median of {REPEATS}   "
              f"target <= {TARGET_SECONDS * 1000:.0f} ms: {verdict}")
        if full_s is not None:
            print(f"  verify (whole log)      {full_s * 1000:9.1f} ms   median of {REPEATS}   "
                  f"{full_s / since_s:.0f}x the --since verify")
        print(f"  kernos audit verify --since, one fresh process: {cli_s * 1000:.0f} ms")
        if args.keep:
            print(f"  kept: {path}  (anchor {anchor})")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
