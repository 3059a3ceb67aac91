"""``kernos replay`` of a framework's run through a real kernel: every snapshot again.

A plain-function LangGraph graph checkpoints through a real ``KernosSaver`` (one
op per put and per task's writes, whose recorded source holds no bytes), its
nodes append to a file through ``client.append_file`` keyed by
``task_key(config)``, the client writes, appends and deletes files, and ordinary
ops around them read what those stored (so a later op depends on each).  The
CLI's ``kernos replay`` in a fresh process re-does the checkpoint and file ops
from the original's snapshots (``kernos.replay._taken``), re-runs the others,
and every snapshot comes out equal, the tracked files hash for hash.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph")

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from kernos.client import KernosClient, RequestError
from kernos.integrations.langgraph import KernosSaver, task_key

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}


class State(TypedDict):
    steps: Annotated[list[str], operator.add]


def build(client: KernosClient, saver: KernosSaver) -> Any:
    def node(name: str) -> Any:
        def run(state: State, config: RunnableConfig) -> dict[str, list[str]]:
            client.append_file("agents/graph/effects.log", f"{name} {len(state['steps'])}\n",
                               principal="graph", key=task_key(config))
            return {"steps": [name]}
        return run

    builder = StateGraph(State)
    for name in ("plan", "act", "check"):
        builder.add_node(name, node(name))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "act")
    builder.add_edge("act", "check")
    builder.add_edge("check", END)
    return builder.compile(checkpointer=saver)


def test_a_replay_of_a_graph_and_file_requests_reproduces_every_snapshot(
        tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace, env=ENV) as client:
        client.op("runs = []")
        saver = KernosSaver(client, principal="graph")
        saver.setup()
        graph = build(client, saver)
        graph.invoke({"steps": ["start"]}, {"configurable": {"thread_id": "t-1"}})
        client.op("import kernos.files\n"
                  "runs.append(kernos.files.path('agents/graph/effects.log').read_text())")
        asyncio.run(graph.ainvoke({"steps": ["again"]}, {"configurable": {"thread_id": "t-2"}}))
        client.write_file("notes/a.txt", "one\n")
        client.append_file("notes/a.txt", b"\x00\xff two\n")
        client.write_file("notes/b.txt", "to delete")
        client.delete_file("notes/b.txt")
        with pytest.raises(RequestError):
            client.delete_file("notes/none.txt")  # rolled back: no such file
        saver.delete_thread("t-1")
        client.op("import kernos.files\n"
                  "seen = sorted(p.name for p in (kernos.files.root() / 'notes').iterdir())\n"
                  "a = kernos.files.path('notes/a.txt').read_bytes()")
        history = client.log(limit=500)
    kinds = {entry["principal"] for entry in history}
    assert kinds >= {"graph", "human"}

    completed = subprocess.run(
        [sys.executable, "-m", "kernos.cli", "replay", "--workspace", str(workspace),
         "--into", str(tmp_path / "replayed"), "--json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "99"},
        timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr + completed.stdout[-3000:]
    report = json.loads(completed.stdout)
    assert report["ok"], report
    steps = report["steps"]
    taken = [step for step in steps if step["principal"] == "graph"]
    assert len(taken) >= 12  # the puts and writes of two runs, and the appends
    compared = [step for step in steps if step.get("original")]
    assert len(compared) >= 15
    assert all(step["digest"] == step["original"] for step in compared)
    assert all(step["files"] == step["original_files"] for step in compared)
    assert [step["replayed"] for step in steps] == [step["status"] for step in steps]
    assert "failed" in {step["status"] for step in steps}
    replayed = tmp_path / "replayed" / "files"
    assert (replayed / "notes" / "a.txt").read_bytes() == b"one\n\x00\xff two\n"
    assert not (replayed / "notes" / "b.txt").exists()
    assert (replayed / "agents" / "graph" / "effects.log").read_text().split()[::2] == [
        "plan", "act", "check", "plan", "act", "check"]
