"""LangGraph's own conformance suite against KernosSaver on a real kernel process.

``langgraph-checkpoint-conformance`` (the LangGraph project's suite) detects
which capabilities the saver implements and runs each one's tests; KernosSaver
must implement all of them (put, put_writes, get_tuple, list, delete_thread,
delete_for_runs, copy_thread, prune) and pass every test: level FULL.  Every
change it makes is an op of the saver's principal, in the kernel's history.  On
the same kernel, a StateGraph of async functions runs with ``ainvoke`` (its state
and history read back), and the sync methods work from another thread but refuse,
saying what to do, on the client's own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from pathlib import Path
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.graph import END, START, StateGraph

from kernos.client import run_kernel
from kernos.errors import UsageError
from kernos.integrations.langgraph import KernosSaver

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}


class Counted(TypedDict):
    count: int


async def _an_async_graph_runs_on_the_saver(saver: KernosSaver) -> None:
    """A StateGraph of plain async functions, run with ainvoke twice on one thread."""
    async def add_one(state: Counted) -> Counted:
        return {"count": state["count"] + 1}

    async def double(state: Counted) -> Counted:
        return {"count": state["count"] * 2}

    builder = StateGraph(Counted)
    builder.add_node("add_one", add_one)
    builder.add_node("double", double)
    builder.add_edge(START, "add_one")
    builder.add_edge("add_one", "double")
    builder.add_edge("double", END)
    graph = builder.compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "async-graph"}}
    assert (await graph.ainvoke({"count": 1}, config))["count"] == 4
    state = await graph.aget_state(config)
    assert state.values == {"count": 4} and not state.next
    history = [snapshot async for snapshot in graph.aget_state_history(config)]
    assert [snapshot.metadata["step"] for snapshot in history if snapshot.metadata] == [
        2, 1, 0, -1]


def test_kernos_saver_passes_the_conformance_suite_at_level_full(
        tmp_path: Path, record_property: Any) -> None:
    async def main() -> tuple[Any, list[dict[str, Any]]]:
        async with run_kernel(tmp_path / "ws", env=ENV) as (_, client):
            saver = KernosSaver(client, principal="graph")
            await saver.asetup()

            @checkpointer_test(name="KernosSaver")
            async def factory() -> Any:
                yield saver

            report = await validate(factory)
            # The sync methods (graph.invoke) work from another thread, and say what to do
            # from the client's own loop, where they would wait for themselves.
            config = {"configurable": {"thread_id": "sync"}}
            assert await asyncio.to_thread(saver.get_tuple, config) is None
            with pytest.raises(UsageError, match=r"graph\.ainvoke"):
                saver.get_tuple(config)
            await _an_async_graph_runs_on_the_saver(saver)
            return report, await client.log(limit=5)

    report, log = asyncio.run(main())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        report.print_report()
    record_property("summary:langgraph-checkpoint-conformance", printed.getvalue().strip())
    failures = {name: result.failures for name, result in report.results.items()
                if result.failures}
    assert report.conformance_level() == "FULL", failures
    assert {name for name, result in report.results.items() if result.detected} == {
        capability.value for capability in ALL_CAPABILITIES}
    assert all(result.tests_passed > 0 for result in report.results.values())
    assert {entry["principal"] for entry in log} == {"graph"}
