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
5. *Recall by meaning.* Every episodic entry gets a seeded random vector of
   ``--dims`` (default 256) in the index's ``vectors`` table, as the
   embedding calls of earlier recalls would have left them; then the same
   queries, each as ``ImageMemory`` asks with embeddings on: a catch-up, the
   search for up to 32 entries without a vector (none left), and the hybrid
   recall (bm25 and cosine, fused), with a new op record appended every 10th
   query so that the vector cache follows a moving index.  The query vector
   stands in for the model's answer (no model is called: a recorded
   embedding costs a file read, a fresh one a provider's round trip, both
   outside this figure).  p50, p95, max, and the ratio to the words-only p95
   of step 4, measured in the same run.
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
from kernos.memory.embeddings import EMBED_PER_RECALL
from kernos.memory.index import KINDS, Scope
from kernos.memory.vectors import Meaning, missing, store
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
    parser.add_argument("--dims", type=int, default=256, help="vector size (default 256)")
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
        p50, p95, worst = _quantiles(samples)
        print(f"recall over {args.ops} ops (k=5, {args.queries} queries): "
              f"p50 {p50:.2f} ms, p95 {p95:.2f} ms, max {worst:.2f} ms (target p95 <= 20 ms), "
              f"of which the catch-up with a current chain: median "
              f"{statistics.median(checks) * 1e6:.0f} us")
        meaning_p95 = by_meaning(index, log, args, rng)
        print(f"recall by meaning / by words, p95: {meaning_p95 / p95:.2f}x")
        index.close()
        log.close()
    return 0


def by_meaning(index: MemoryIndex, log: AuditLog, args: argparse.Namespace,
               rng: random.Random) -> float:
    """Step 5 (see the module docstring); returns the p95 in ms."""
    import numpy as np

    model, dims = "bench-embedding", args.dims
    ids = [row[0] for row in index.db.execute("SELECT id FROM entries WHERE kind = 'episodic'")]
    vectors = np.random.default_rng(20).standard_normal((len(ids), dims), dtype=np.float32)
    started = time.perf_counter()
    for at in range(0, len(ids), 10_000):
        store(index, model, dims, list(zip(ids[at:at + 10_000],
                                           vectors[at:at + 10_000].tolist(), strict=True)))
    print(f"vectors: {len(ids)} of {dims} dims stored in {time.perf_counter() - started:.1f} s, "
          f"index {index.path.stat().st_size / 1e6:.1f} MB")
    principal = PRINCIPALS[1]
    query = Meaning(model=model, dims=dims, vector=tuple(vectors[0].tolist()))
    started = time.perf_counter()
    index.recall("invoice", principal=principal, k=5, meaning=query)
    print(f"first recall by meaning (loads the vectors): "
          f"{(time.perf_counter() - started) * 1000:.0f} ms")
    samples, next_op = [], args.ops + 1001
    for number in range(args.queries):
        if number % 10 == 0:
            synthesize(log, 1, next_op, rng)
            next_op += 1
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
        principal = rng.choice(PRINCIPALS)
        query = Meaning(model=model, dims=dims,
                        vector=tuple(vectors[rng.randrange(len(ids))].tolist()))
        started = time.perf_counter()
        index.catch_up(log)
        missing(index, Scope(principal=principal, kinds=KINDS), model, dims, EMBED_PER_RECALL)
        found = index.recall(words, principal=principal, k=5, kinds=["episodic"], meaning=query)
        samples.append(time.perf_counter() - started)
        assert found and all(m.principal == principal for m in found)
    p50, p95, worst = _quantiles(samples)
    print(f"recall by meaning over {len(ids)} vectors (k=5, {args.queries} queries, a new "
          f"record every 10th): p50 {p50:.2f} ms, p95 {p95:.2f} ms, max {worst:.2f} ms "
          f"(target p95 <= 20 ms)")
    return p95


def _quantiles(samples: list[float]) -> tuple[float, float, float]:
    """p50, p95 and max of ``samples`` (seconds), in ms."""
    ordered = sorted(samples)
    return (statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.95) - 1] * 1000,
            ordered[-1] * 1000)


if __name__ == "__main__":
    sys.exit(main())
