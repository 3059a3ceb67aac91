"""A LangGraph graph on KernosSaver, killed with ``kill -9`` in the middle of a run, resumes.

The graph (five plain-function nodes in a line, no LLM) runs in a process of its
own against a real kernel.  Each node counts its runs in a file outside Kernos,
then makes its external effect once: an append to ``agents/graph/effects.log`` in
the files root, an op keyed by ``task_key(config)``.  The process is killed with
SIGKILL inside step 3, after step 3's effect committed and before LangGraph saved
its writes.  Run again on the same thread, the graph continues from the last
committed checkpoint (after step 2): steps 1 and 2 do not run again, step 3 runs
again but its effect is answered as a duplicate, and every effect is in the log
exactly once.  And a checkpoint acknowledged as stored survives ``kill -9`` of
the kernel itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("langgraph.graph")

from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)

from kernos.client import KernosClient
from kernos.integrations.langgraph import KernosSaver

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}
STEPS = ["step1", "step2", "step3", "step4", "step5"]

GRAPH = '''
import operator, os, sys, time
from pathlib import Path
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from kernos.client import KernosClient
from kernos.integrations.langgraph import KernosSaver, task_key

workspace, outside, thread = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
pause_in = os.environ.get("PAUSE_IN")


class State(TypedDict):
    steps: Annotated[list[str], operator.add]


def node(name):
    def run(state, config):
        with open(outside / "calls.log", "a") as calls:   # outside Kernos: counts runs
            calls.write(name + "\\n")
        client.append_file("agents/graph/effects.log", name + "\\n", principal="graph",
                           key=task_key(config))      # the effect: once per task
        if name == pause_in:
            (outside / "paused").write_text(name)
            time.sleep(600)                            # killed here
        return {"steps": [name]}
    return run


with KernosClient.connect(workspace) as client:
    saver = KernosSaver(client, principal="graph")
    saver.setup()
    builder = StateGraph(State)
    names = STEPS
    for name in names:
        builder.add_node(name, node(name))
    builder.add_edge(START, names[0])
    for first, second in zip(names, names[1:]):
        builder.add_edge(first, second)
    builder.add_edge(names[-1], END)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread}}
    pending = graph.get_state(config)
    final = graph.invoke(None if pending.next else {"steps": []}, config)
    (outside / "final").write_text(",".join(final["steps"]))
'''.replace("STEPS", repr(STEPS))


def _graph(tmp_path: Path, workspace: Path, outside: Path, pause_in: str | None
           ) -> subprocess.Popen[bytes]:
    script = tmp_path / "graph.py"
    script.write_text(GRAPH)
    env = dict(os.environ)
    env.pop("PAUSE_IN", None)
    if pause_in:
        env["PAUSE_IN"] = pause_in
    return subprocess.Popen([sys.executable, str(script), str(workspace), str(outside),
                             "thread-1"], env=env)


def test_a_graph_killed_mid_run_resumes_from_the_last_step_without_repeating_effects(
        tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    outside.mkdir()
    with KernosClient.start(workspace, env=ENV) as client:
        running = _graph(tmp_path, workspace, outside, pause_in="step3")
        deadline = time.monotonic() + 120
        while not (outside / "paused").exists():
            assert running.poll() is None, "the graph process ended before step 3"
            assert time.monotonic() < deadline, "step 3 never started"
            time.sleep(0.05)
        os.kill(running.pid, signal.SIGKILL)
        assert running.wait(timeout=30) == -signal.SIGKILL

        saver = KernosSaver(client, principal="graph")
        committed = saver.get_tuple(generate_config("thread-1"))
        assert committed is not None
        assert committed.checkpoint["channel_values"]["steps"] == ["step1", "step2"]
        assert (outside / "calls.log").read_text().split() == ["step1", "step2", "step3"]

        resumed = _graph(tmp_path, workspace, outside, pause_in=None)
        assert resumed.wait(timeout=180) == 0
        assert (outside / "final").read_text() == ",".join(STEPS)
        # Steps 1 and 2 ran once; step 3 ran again (it was killed), its effect did not.
        assert (outside / "calls.log").read_text().split() == [
            "step1", "step2", "step3", "step3", "step4", "step5"]
        effects = client.read_file("agents/graph/effects.log", principal="graph")
        assert effects.split() == STEPS
        history = [entry for entry in client.log(limit=200) if entry["principal"] == "graph"]
        assert len(history) >= 2 * len(STEPS)
        finished = saver.get_tuple(generate_config("thread-1"))
        assert finished is not None and finished.checkpoint["channel_values"]["steps"] == STEPS


def test_a_committed_checkpoint_survives_kill_9_of_the_kernel(tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=ENV) as client:
        saver = KernosSaver(client, principal="graph")
        saver.setup()
        config = generate_config("t-1")
        checkpoint = generate_checkpoint(channel_values={"steps": ["one"]})
        checkpoint["channel_versions"] = {"steps": saver.get_next_version(None, None)}
        stored = saver.put(config, checkpoint, generate_metadata(step=0),
                           checkpoint["channel_versions"])
        saver.put_writes(stored, [("steps", "two")], "task-1")
        client.manager.kill()
        client.manager.restart()
        found = saver.get_tuple(generate_config("t-1"))
        assert found is not None and found.checkpoint["id"] == checkpoint["id"]
        assert found.checkpoint["channel_values"] == {"steps": ["one"]}
        assert found.pending_writes == [("task-1", "steps", "two")]
