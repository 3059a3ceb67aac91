"""A supervised loop iteration against the same op without the loop machinery, in one run.

    python bench/loop_bench.py [--iterations N] [--rounds R]

One real Kernos kernel on a fresh workspace in $TMPDIR, one agent ``bench``
with an LLM grant and a circuit-breaker policy (``failures=5``: supervised
in both cases).  Every op runs the same agent code: one ``llm()`` call whose
answer is recorded (litellm's ``mock_response``; each prompt is new, so each
call goes through litellm and is written to the workspace's LLM store), and
one assignment of its answer in the agent's namespace.

* *Loop.*  ``agents.loop("bench", STEP, max_iterations=N, every_ms=0)``: the
  kernel's loop driver runs the N iterations, each one op as the agent (the
  step, the loop's counter, its audit record and its ``kernos.loop.iteration``
  event).  A client subscribed to that event times the iterations: the time
  from the first iteration's event to the last one's, over N - 1.  Events
  that never reach the subscriber are reported (a bug: every committed
  event must), and the timing then uses the first and last that came.
* *Op.*  The same code sent N times, one after another, as harness ``op``
  requests with ``principal="bench"`` (what a harness that runs its own loop
  does, as ``examples/05`` does): the time for the N ops, over N.

Both are wall time per iteration as a client sees it, group commit and
event delivery included.  R rounds alternate the two (loop first in even
rounds); the figures are the medians over rounds, and the ratio is loop /
op (target: <= 1.2x).  The op's own duration as the audit records it
(``started_at`` to ``finished_at``, in milliseconds) is printed too, median
per kind, to show what the loop adds inside the op itself.

Durability is as configured (``KERNOS_DURABILITY=process`` skips fsync).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from kernos.client import KernosClient

AGENT = "bench"
TOPIC = "kernos.loop.iteration"
CALL = """
answer = llm("gpt-4o-mini", [{"role": "user", "content": PROMPT + str(n)}],
             max_tokens=16, mock_response="noted " + str(n))
last = answer["content"]
"""
STEP = "n = loop_state()['iteration']\n" + CALL
OP = "n = count\ncount = count + 1\n" + CALL


def setup(client: KernosClient) -> None:
    done = client.op(
        f"agents.add({AGENT!r})\n"
        f"agents.grant({AGENT!r}, 'llm:gpt-4o-mini', 100_000_000)\n"
        f"agents.policy({AGENT!r}, failures=5)\n"
        f"agents.run({AGENT!r}, 'count = 0')\n")
    if done.status != "committed":
        raise SystemExit(f"setup failed: {done.status} {done.error}")


def run_loop(client: KernosClient, round_: int, iterations: int) -> tuple[float, list[int]]:
    """Seconds per iteration of a loop of ``iterations`` turned by the kernel's driver, and
    the iterations whose event never came (a subscriber must see every committed event)."""
    step = f"PROMPT = 'loop {round_} item '\n" + STEP
    events = client.subscribe(topic=TOPIC)
    seen: dict[int, float] = {}
    try:
        started = client.op(f"agents.loop({AGENT!r}, {step!r}, max_iterations={iterations}, "
                            "every_ms=0)")
        if started.status != "committed":
            raise SystemExit(f"agents.loop failed: {started.status} {started.error}")
        deadline = time.monotonic() + 120
        while len(seen) < iterations:
            try:
                event = events.get(timeout=2)
            except TimeoutError:
                [status] = client.request("loop", do="status", agent=AGENT)["loops"]
                if status["status"] == "finished" and len(seen) >= 2:
                    break  # done, but some events never came: said below
                if time.monotonic() > deadline:
                    raise SystemExit(f"no {TOPIC} event for 120 s after iterations "
                                     f"{sorted(seen)}; the loop: {status}") from None
                continue
            payload = event.get("payload", {})
            if payload.get("agent") == AGENT:
                seen.setdefault(int(payload["iteration"]), time.perf_counter())
    finally:
        events.close()
    first, last = min(seen), max(seen)
    lost = sorted(set(range(iterations)) - set(seen))
    return (seen[last] - seen[first]) / (last - first), lost


def run_ops(client: KernosClient, round_: int, iterations: int) -> float:
    """Seconds per op for ``iterations`` harness ops of the same code, back to back."""
    code = f"PROMPT = 'op {round_} item '\n" + OP
    began = time.perf_counter()
    for _ in range(iterations):
        result = client.op(code, principal=AGENT)
        if result.status != "committed":
            raise SystemExit(f"an op as {AGENT} failed: {result.status} {result.error}")
    return (time.perf_counter() - began) / iterations


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def in_op_ms(records: list[dict[str, Any]]) -> tuple[float, float]:
    """Median duration (ms) of committed loop iterations and of the other ops of the agent."""
    loop: list[float] = []
    plain: list[float] = []
    for record in records:
        if record.get("status") != "committed" or not record.get("started_at"):
            continue
        spent = (_stamp(record["finished_at"]) - _stamp(record["started_at"])) * 1000
        (loop if record.get("loop") else plain).append(spent)
    return statistics.median(loop), statistics.median(plain)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50,
                        help="iterations (and ops) per round (default 50)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    arguments = parser.parse_args()
    if arguments.iterations < 2 or arguments.rounds < 1:
        parser.error("--iterations must be at least 2 and --rounds at least 1")
    durability = os.environ.get("KERNOS_DURABILITY", "full (default)")
    print(f"loop bench: {arguments.rounds} rounds of {arguments.iterations} iterations, "
          f"durability {durability}, load {os.getloadavg()[0]:.2f}")
    loop_s: list[float] = []
    op_s: list[float] = []
    lost_events: list[tuple[int, list[int]]] = []
    with tempfile.TemporaryDirectory(prefix="kernos-loop-bench-") as root, \
            KernosClient.start(Path(root) / "workspace") as client:
        setup(client)
        run_ops(client, -1, 3)  # warm up: litellm's first call, the agent's compiled code
        for round_ in range(arguments.rounds):
            order = (run_loop, run_ops) if round_ % 2 == 0 else (run_ops, run_loop)
            for measure in order:
                if measure is run_loop:
                    seconds, lost = run_loop(client, round_, arguments.iterations)
                    loop_s.append(seconds)
                    if lost:
                        lost_events.append((round_, lost))
                else:
                    op_s.append(run_ops(client, round_, arguments.iterations))
            print(f"  round {round_}: loop {loop_s[-1] * 1000:7.2f} ms/iteration   "
                  f"op {op_s[-1] * 1000:7.2f} ms/op   (load {os.getloadavg()[0]:.2f})")
        records = client.audit(principal=AGENT, limit=None)
    loop_ms = statistics.median(loop_s) * 1000
    op_ms = statistics.median(op_s) * 1000
    ratio = loop_ms / op_ms
    inside_loop, inside_op = in_op_ms(records)
    print()
    print(f"{'':44}{'loop':>10}{'op':>10}{'ratio':>9}")
    print(f"{'wall time per iteration, median (ms)':44}{loop_ms:10.2f}{op_ms:10.2f}"
          f"{ratio:8.2f}x   target <= 1.20x: {'PASS' if ratio <= 1.2 else 'MISS'}")
    print(f"{'inside the op (audit, 1 ms steps), median':44}{inside_loop:10.1f}{inside_op:10.1f}"
          f"{inside_loop / inside_op if inside_op else float('nan'):8.2f}x   (info)")
    for round_, lost in lost_events:
        print(f"WARNING: round {round_}: the subscriber never got {TOPIC} for iterations "
              f"{lost} (they committed: the loop finished); timed from the first to the last "
              f"event seen")
    return 0


if __name__ == "__main__":
    sys.exit(main())
