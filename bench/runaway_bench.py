"""Runaway agents against the circuit breakers: one command, medians, the same run.

    python bench/runaway_bench.py [--ops N] [--repeats N] [--tokens-per-minute N]

In process, on the core (no kernel), on a fresh workspace in $TMPDIR:

1. *Runaway detection.*  An agent with ``repeats=N`` repeats one failing op
   until the circuit stops it: how many ops ran, against N.  A *burner* with
   ``tokens_per_minute=T`` and an ``llm`` grant of B tokens calls ``llm()``
   (litellm's ``mock_response``, 30 tokens a call) in every op until it is
   stopped: the ops that ran, the tokens it spent, against T and B.
2. *Overhead.*  The median time of a trivial agent op (``n = 1``, its own op,
   committed) for an agent with no policy, against the same op for an agent
   with every figure of a policy set (so each op is admitted, journalled and
   its outcome recorded, and the burn rate reads the ledger), interleaved in
   one run; and the ratio.

Durability is as configured (``KERNOS_DURABILITY=process`` skips fsync).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

CALL = ("a = llm('gpt-4o-mini', [{'role': 'user', 'content': "
        "'Please answer briefly: what colour is the sea on a clear day, %d?'}], "
        "max_tokens=40, mock_response='Blue.')")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300,
                        help="trivial ops per kind for the overhead (default 300)")
    parser.add_argument("--repeats", type=int, default=5, help="the repeats policy (default 5)")
    parser.add_argument("--tokens-per-minute", type=int, default=300,
                        help="the burner's burn-rate policy (default 300)")
    parser.add_argument("--budget", type=int, default=10_000,
                        help="the burner's llm grant, tokens (default 10,000)")
    args = parser.parse_args()

    from kernos import Image, Workspace
    from kernos.agents import AgentRuntime, Agents
    from kernos.errors import CircuitOpen, KernosError

    root = Path(tempfile.mkdtemp(prefix="kernos-runaway-bench-"))
    workspace = Workspace.open(root / "ws")
    try:
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        image.restore()
        runtime = AgentRuntime(image)
        agents = Agents(lambda: runtime)

        def op(agent: str, code: str) -> str:
            """One op of ``agent``: committed, failed or refused."""
            current = image.begin(source=code)
            try:
                runtime.run(agent, code)
            except CircuitOpen as error:
                current.abort(error=error)
                return "refused"
            except (Exception, KernosError) as error:
                current.abort(error=error)
                return "failed"
            try:
                current.commit()
            except KernosError:
                return "failed"
            return "committed"

        def human(code: str) -> None:
            current = image.begin(source=code)
            exec(code, {"agents": agents})
            current.commit()

        human("agents.add('looper'); agents.add('burner'); agents.add('free'); "
              "agents.add('watched')")
        human(f"agents.policy('looper', repeats={args.repeats})\n"
              f"agents.grant('burner', 'llm:gpt-4o-mini', {args.budget})\n"
              f"agents.policy('burner', tokens_per_minute={args.tokens_per_minute})\n"
              "agents.policy('watched', failures=1000, repeats=10**9, iterations=10**9, "
              "wall_seconds=10**9, tokens_per_minute=10**9)")
        print(f"Kernos runaway bench (durability: "
              f"{os.environ.get('KERNOS_DURABILITY', 'default')}, in process)\n")

        ran = 0
        while op("looper", "tries = 1\nraise ValueError('again')") != "refused":
            ran += 1
            if ran > 10 * args.repeats:
                break
        print(f"  one failing op repeated:  {ran} ops ran before the circuit opened "
              f"(policy repeats={args.repeats}): {'PASS' if ran <= args.repeats else 'MISS'}")

        runtime.llm_client()  # litellm imported before the clock matters
        calls = 0
        started = time.perf_counter()
        while op("burner", CALL % calls) == "committed":
            calls += 1
            if calls * 30 > args.budget:
                break
        seconds = time.perf_counter() - started
        spent = int(agents.grants("burner")[0].get("used") or 0)
        trip = agents.circuit("burner")
        print(f"  a burner calling llm():   {calls} ops, {spent} tokens in {seconds:.1f} s "
              f"before the circuit opened (policy tokens_per_minute="
              f"{args.tokens_per_minute}; budget {args.budget}): "
              f"{'PASS' if trip is not None and spent < args.budget else 'MISS'}")

        free: list[float] = []
        watched: list[float] = []
        for number in range(args.ops):
            for agent, samples in (("free", free), ("watched", watched)):
                began = time.perf_counter()
                outcome = op(agent, f"n = {number}")
                samples.append(time.perf_counter() - began)
                assert outcome == "committed", outcome
        none_ms = statistics.median(free) * 1000
        set_ms = statistics.median(watched) * 1000
        print(f"\n  trivial agent op, no policy:       {none_ms:8.3f} ms (median of {args.ops})")
        print(f"  trivial agent op, every figure set: {set_ms:8.3f} ms")
        print(f"  overhead of supervision:            {set_ms - none_ms:+8.3f} ms per op, "
              f"{set_ms / none_ms:.2f}x")
    finally:
        workspace.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
