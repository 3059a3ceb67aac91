"""What effects and replay cost, in process on the core: medians, and ratios to baselines.

1. *An op that queues one external effect* (the op, the effect run after it
   with its journal records, and the follow-up op that records it) against
   the same op calling an ordinary tool that does the same work inline.
2. *Replaying a session* of N mixed ops (human code, an agent, tool calls,
   effects, failed ops) against recording that same session.
3. *The canonical digest* of a large array against plain SHA-256 of its bytes.

Usage: ``python bench/replay_bench.py [--ops N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernos import Image, Workspace
from kernos.agents import AgentRuntime, Agents
from kernos.harness.service import HarnessService
from kernos.replay import replay
from kernos.replay.digest import digest

TOOLS = '''
def work(amount, idempotency_key=None):
    return {"amount": amount, "key": idempotency_key}
SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer"}},
          "required": ["amount"]}
agents.register_tool("inline", work, schema=SCHEMA, description="inline")
agents.register_tool("outside", work, schema=SCHEMA, description="an effect",
                     effect="external")
agents.add("alice")
agents.grant("alice", "call:inline")
agents.grant("alice", "call:outside")
total = 0
'''


class Session:
    def __init__(self, path: Path) -> None:
        self.workspace = Workspace.open(path, purpose="bench", durable=False)
        module = types.ModuleType("__main__")
        self.image = Image(self.workspace, module.__dict__, module=module,
                           is_persistent=lambda name: name != "agents"
                           and not name.startswith("__"))
        self.image.restore()
        self.runtime = AgentRuntime(self.image)
        module.__dict__["agents"] = Agents(lambda: self.runtime)
        self.service = HarnessService(self.image, self.runtime, max_request_bytes=1 << 20)

    def send(self, **request: Any) -> dict[str, Any]:
        reply: dict[str, Any] = self.service.handle({"v": 1, **request}).reply
        return reply

    def close(self) -> None:
        self.workspace.close()


def median_ms(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def record(session: Session, ops: int) -> None:
    for number in range(ops):
        kind = number % 5
        if kind == 0:
            session.send(action="op", principal="human", code=f"total += {number}")
        elif kind == 1:
            session.send(action="op", principal="alice", tool="inline",
                         arguments={"amount": number})
        elif kind == 2:
            session.send(action="op", principal="alice",
                         code=f"t = call('outside', amount={number})")
        elif kind == 3:
            session.send(action="op", principal="human", code=f"total -= {number}\n1/0")
        else:
            session.send(action="op", principal="alice", code=f"x = {number} * 2")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kernos-replay-bench-"))
    session = Session(root / "effects")
    session.send(action="op", principal="human", code=TOOLS)
    inline = median_ms(lambda: session.send(action="op", principal="alice", tool="inline",
                                            arguments={"amount": 1}), args.repeats * 4)
    queued = median_ms(lambda: session.send(action="op", principal="alice",
                                            code="t = call('outside', amount=1)"),
                       args.repeats * 4)
    session.close()

    recorded, replayed = [], []
    for repeat in range(args.repeats):
        source = Session(root / f"source{repeat}")
        source.send(action="op", principal="human", code=TOOLS)
        started = time.perf_counter()
        record(source, args.ops)
        recorded.append(time.perf_counter() - started)
        source.close()
        started = time.perf_counter()
        report = replay(root / f"source{repeat}", into=root / f"replayed{repeat}")
        replayed.append(time.perf_counter() - started)
        if not report.ok:
            print(f"replay diverged: {report.divergence}", file=sys.stderr)
            return 1

    numpy = __import__("numpy")
    array = numpy.random.default_rng(0).random(25_000_000)  # 200 MB of float64
    plain = median_ms(lambda: hashlib.sha256(array.data).hexdigest(), args.repeats)
    canonical = median_ms(lambda: digest(array), args.repeats)

    rows = [
        ("an op queuing one external effect (with its follow-up op)", queued, inline,
         "the same work as an inline tool call"),
        (f"replaying {args.ops} ops in a fresh workspace", statistics.median(replayed) * 1000,
         statistics.median(recorded) * 1000, "recording them"),
        ("digest() of a 200 MB float64 array", canonical, plain, "sha256 of its bytes"),
    ]
    print(f"kernos replay bench: medians of {args.repeats} runs (KERNOS durability off: "
          "the bench measures the work, not fsync)\n")
    for what, ours, base, against in rows:
        print(f"{what:<58} {ours:10.1f} ms   baseline {base:10.1f} ms ({against})   "
              f"ratio {ours / base:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
