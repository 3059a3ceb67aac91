"""The memory index: recall latency over many episodic entries, and rebuild time and size.

    python bench/memory_bench.py [--ops N] [--queries Q]

In-process, on the core (no kernel), in a fresh workspace in $TMPDIR:

1. *History.* N op records (default 100,000) are appended to a real audit
   chain through ``AuditLog.append`` (no fsync), alternating principals
   (``human`` and three agents), each with a short code text drawn from a
   small vocabulary, some with an error and an event.
2. *Rebuild.* ``MemoryIndex.open`` on the workspace with no index: the time
   to build it from the whole chain, and the file's size.
3. *Catch-up.* 1,000 more records, then an open of the existing index.
4. *Recall.* Q queries (default 500) of 1-3 vocabulary words by a random
   principal, k=5, each after a catch-up with the chain (as the runtime's
   ``ImageMemory`` does before every recall): p50, p95 and max latency
   (target p95 <= 20 ms).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kernos.audit.log import AuditLog
from kernos.memory import MemoryIndex
from kernos.personal import Keyring

WORDS = ("invoice", "refund", "customer", "shipping", "carrier", "delay", "ledger", "budget",
         "forecast", "supplier", "order", "payment", "quarter", "revenue", "report", "audit",
         "queue", "ticket", "summary", "anomaly", "retry", "timeout", "model", "prompt")
PRINCIPALS = ("human", "agent-a", "agent-b", "agent-c")


def synthesize(log: AuditLog, count: int, first_op: int, rng: random.Random) -> None:
    for number in range(first_op, first_op + count):
        words = " ".join(rng.choice(WORDS) for _ in range(6))
        failed = number % 7 == 0
        body = {"type": "op", "op": number, "kind": "cell",
                "principal": PRINCIPALS[number % len(PRINCIPALS)],
                "status": "failed" if failed else "committed",
                "error": f"ValueError: {rng.choice(WORDS)} out of range" if failed else None,
                "code": {"sha256": "0" * 64, "size": 40, "text": f"x_{number} = '{words}'"},
                "grants": {"used": [], "denied": []}, "changes": [f"x_{number}"],
                "events": [], "effects": [], "commit": None,
                "started_at": "2026-01-01T00:00:00.000Z", "finished_at": "2026-01-01T00:00:00.001Z"}
        if number % 10 == 0:
            body["events"] = [{"seq": number, "topic": f"work.{rng.choice(WORDS)}",
                               "principal": body["principal"], "depth": 0,
                               "payload": {"note": rng.choice(WORDS)}}]
        log.append(body, sync=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="op records (default 100000)")
    parser.add_argument("--queries", type=int, default=500, help="recall queries (default 500)")
    args = parser.parse_args()
    rng = random.Random(20)
    with tempfile.TemporaryDirectory(prefix="kernos-memory-bench-") as scratch:
        root = Path(scratch) / "ws"
        root.mkdir()
        log = AuditLog(root, keyring=Keyring(root / "keys", durable=False), durable=False)
        log.append({"type": "genesis", "adopts": None}, sync=False)
        started = time.perf_counter()
        synthesize(log, args.ops, 1, rng)
        print(f"history: {args.ops} op records, chain {log.path.stat().st_size / 1e6:.1f} MB "
              f"(written in {time.perf_counter() - started:.1f} s)")
        started = time.perf_counter()
        index = MemoryIndex.open(root, log)
        took = time.perf_counter() - started
        size = index.path.stat().st_size
        print(f"rebuild: {took:.2f} s, {sum(index.count().values())} entries, "
              f"index {size / 1e6:.1f} MB")
        index.close()
        synthesize(log, 1000, args.ops + 1, rng)
        started = time.perf_counter()
        index = MemoryIndex.open(root, log)
        print(f"catch-up of 1000 records: {(time.perf_counter() - started) * 1000:.0f} ms "
              f"(rebuilt: {index.rebuilt})")
        samples, checks = [], []
        for _ in range(args.queries):
            query = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
            principal = rng.choice(PRINCIPALS)
            started = time.perf_counter()
            index.catch_up(log)  # as ImageMemory does before every recall
            checked = time.perf_counter()
            found = index.recall(query, principal=principal, k=5, kinds=["episodic"])
            samples.append(time.perf_counter() - started)
            checks.append(checked - started)
            assert found and all(m.principal == principal for m in found)
        samples.sort()
        p95 = samples[int(len(samples) * 0.95) - 1]
        print(f"recall over {args.ops} ops (k=5, {args.queries} queries): "
              f"p50 {statistics.median(samples) * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms, "
              f"max {samples[-1] * 1000:.2f} ms (target p95 <= 20 ms), of which the "
              f"catch-up with a current chain: median {statistics.median(checks) * 1e6:.0f} us")
        index.close()
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
