"""What a framework's step costs on Kernos, against the framework's own store in the same run.

    python bench/frameworks_bench.py [--runs N]

Each figure is a median of N (default 50) and each is printed with its ratio
to a baseline measured in the same run, on the same machine:

1. *LangGraph.*  ``invoke`` of a graph of five plain-function nodes on a new
   thread, checkpointed by :class:`KernosSaver` (a real kernel: every
   checkpoint and every task's writes one durable op), against LangGraph's own
   ``SqliteSaver`` (a file, sqlite's default durability) and ``InMemorySaver``
   (no durability at all).
2. *OpenAI Agents SDK.*  One turn of a session (``add_items`` of two items,
   then ``get_items``): :class:`KernosSession` against the SDK's own
   ``SQLiteSession`` on a file.
3. *A code step.*  The same agent code (``n = n + 1``) as one op of a Kernos
   agent through ``client.op`` (the baseline), through the E2B-style
   ``Sandbox.run_code`` and through smolagents' ``KernosExecutor``: what each
   integration's own layer adds.

The kernel runs with the workspace's default durability (an fsync'd commit)
unless ``KERNOS_DURABILITY=process`` is set.  Needs the extras
``kernos[frameworks]`` and ``langgraph-checkpoint-sqlite`` (``kernos[bench]``).
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(runs: int, step: Callable[[int], Any]) -> list[float]:
    step(-1)  # warm
    samples = []
    for run in range(runs):
        started = time.perf_counter()
        step(run)
        samples.append(time.perf_counter() - started)
    return samples


def show(label: str, samples: list[float], baseline: list[float] | None = None,
         against: str = "") -> None:
    ratio = "" if baseline is None else f"  ({median_ms(samples) / median_ms(baseline):.2f}x " \
                                        f"{against})"
    print(f"  {label:<44} {median_ms(samples):8.2f} ms{ratio}", flush=True)


class Steps(TypedDict):
    steps: Annotated[list[str], operator.add]


def graph(checkpointer: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(Steps)
    names = [f"n{index}" for index in range(5)]
    for name in names:
        builder.add_node(name, lambda state, name=name: {"steps": [name]})
    for before, after in zip([START, *names], [*names, END], strict=True):
        builder.add_edge(before, after)
    return builder.compile(checkpointer=checkpointer)


def langgraph(kernos: Any, scratch: Path, runs: int) -> None:
    import sqlite3

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    from kernos.integrations.langgraph import KernosSaver

    print("LangGraph: invoke of a five-node graph on a new thread", flush=True)

    def run_on(saver: Any, prefix: str) -> list[float]:
        compiled = graph(saver)
        return timed(runs, lambda run: compiled.invoke(
            {"steps": []}, {"configurable": {"thread_id": f"{prefix}-{run}"}}))

    memory = run_on(InMemorySaver(), "memory")
    connection = sqlite3.connect(scratch / "langgraph.sqlite", check_same_thread=False)
    sqlite = run_on(SqliteSaver(connection), "sqlite")
    saver = KernosSaver(kernos, principal="graph")
    saver.setup()
    ours = run_on(saver, "kernos")
    show("InMemorySaver (no durability)", memory)
    show("SqliteSaver (a file)", sqlite, memory, "InMemorySaver")
    show("KernosSaver (a real kernel, durable ops)", ours, sqlite, "SqliteSaver")


def agents_session(kernos: Any, scratch: Path, runs: int) -> None:
    from agents.memory import SQLiteSession

    from kernos.integrations.openai_agents import KernosSession

    print("OpenAI Agents SDK: one session turn (add_items of 2 items, get_items)", flush=True)
    turn = [{"role": "user", "content": "What is the mean price?"},
            {"role": "assistant", "content": "It is 3.0."}]

    def turns(session: Any) -> list[float]:
        async def one() -> None:
            await session.add_items(turn)
            await session.get_items(limit=20)

        return timed(runs, lambda run: asyncio.run(one()))

    sqlite = turns(SQLiteSession("chat", scratch / "agents.sqlite"))
    ours = turns(KernosSession("chat", kernos, principal="analyst"))
    show("SQLiteSession (a file)", sqlite)
    show("KernosSession (a real kernel, one op a turn)", ours, sqlite, "SQLiteSession")


def code_step(kernos: Any, workspace: Path, runs: int) -> None:
    from kernos.integrations.smolagents import KernosExecutor
    from kernos.sandbox import Sandbox

    print("A code step: `n = n + 1` as one op of a Kernos agent", flush=True)
    kernos.op("n = 0", principal="analyst")
    direct = timed(runs, lambda run: kernos.op("n = n + 1", principal="analyst"))
    executor = KernosExecutor(kernos, "analyst")
    smol = timed(runs, lambda run: executor("n = n + 1"))
    with Sandbox.create(workspace=workspace, principal="analyst") as sandbox:
        sandbox.run_code("n = 0")
        sandboxed = timed(runs, lambda run: sandbox.run_code("n = n + 1"))
    show("client.op as the agent", direct)
    show("smolagents KernosExecutor", smol, direct, "client.op")
    show("Sandbox.run_code", sandboxed, direct, "client.op")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="samples per figure (50)")
    args = parser.parse_args()
    from agents import set_tracing_disabled

    from kernos.client import KernosClient

    set_tracing_disabled(True)
    with tempfile.TemporaryDirectory(prefix="kernos-frameworks-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        workspace = scratch / "workspace"
        with KernosClient.start(workspace) as kernos:
            kernos.add_agent("analyst")
            langgraph(kernos, scratch, args.runs)
            agents_session(kernos, scratch, args.runs)
            code_step(kernos, workspace, args.runs)


if __name__ == "__main__":
    main()
