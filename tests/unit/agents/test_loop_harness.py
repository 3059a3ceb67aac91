"""The harness action ``loop`` (human only, fields allowlisted) and the replay of a loop's
iterations, in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.harness_support import Harness

from kernos.agents import loop
from kernos.replay.driver import replay

STEP = ("if loop_state()['iteration'] == 0:\n    seen = []\n"
        "seen.append(loop_state()['iteration'])\n")


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    opened = Harness(tmp_path / "ws")
    opened.service.max_request_bytes = 100_000
    opened.ok(action="add_agent", agent="alice")
    yield opened
    opened.env.close()  # the workspace lock is the process's until then


def test_start_pause_resume_stop_and_status(harness: Harness) -> None:
    started = harness.ok(action="loop", do="start", agent="alice", step=STEP, every_ms=5,
                         max_iterations=10, plan={"goal": "count"}, pending=[1, 2])
    assert started["loop"]["status"] == "running" and started["op"] is not None
    assert started["loop"]["pending"] == 2 and started["loop"]["plan"] == {"goal": "count"}
    assert loop.run_once(harness.env.runtime, "alice").committed
    assert harness.ok(action="loop", do="pause", agent="alice")["loop"]["status"] == "paused"
    assert harness.ok(action="loop", do="resume", agent="alice")["loop"]["status"] == "running"
    stopped = harness.ok(action="loop", do="stop", agent="alice", reason="done here")
    assert (stopped["loop"]["status"], stopped["loop"]["reason"]) == ("stopped", "done here")
    [described] = harness.ok(action="loop", do="status")["loops"]
    assert (described["agent"], described["iteration"]) == ("alice", 1)
    assert harness.ok(action="loop", do="status", agent="alice")["loops"] == [described]
    assert harness.env.ns_of("alice")["seen"] == [0]


@pytest.mark.parametrize(("fields", "kind", "fragment"), [
    ({"do": "jump", "agent": "alice"}, "malformed", "'do' is one of"),
    ({"do": "pause"}, "malformed", "needs 'agent'"),
    ({"do": "start", "agent": "alice"}, "malformed", "needs 'step'"),
    ({"do": "pause", "agent": "alice", "step": "pass"}, "malformed", "do not go with"),
    ({"do": "start", "agent": "alice", "step": "x", "principal": "alice"}, "malformed",
     "unknown fields"),
    ({"do": "start", "agent": "alice", "step": "x", "every_ms": "5"}, "malformed", "every_ms"),
    ({"do": "start", "agent": "nobody", "step": "pass"}, "unknown_principal", "nobody"),
    ({"do": "start", "agent": "alice", "step": "import os"}, "invalid", "alice"),
    ({"do": "start", "agent": "alice", "step": "pass", "max_iterations": 0}, "invalid",
     "max_iterations"),
    ({"do": "pause", "agent": "alice"}, "invalid", "has no loop to pause"),
])
def test_bad_requests_are_refused_recorded_and_change_nothing(
        harness: Harness, fields: dict[str, object], kind: str, fragment: str) -> None:
    before = len(harness.records())
    head = harness.env.image.head
    error = harness.error(action="loop", **fields)
    assert error["kind"] == kind and fragment in error["message"], error
    assert harness.env.image.head == head
    assert loop.loops(harness.env.image) == []
    assert len(harness.records()) == before + 1  # the refusal has its audit record
    assert harness.records()[-1]["status"] in ("rejected", "rolled back", "failed")


def test_a_replay_runs_the_iterations_again_hash_for_hash(harness: Harness,
                                                          tmp_path: Path) -> None:
    harness.ok(action="loop", do="start", agent="alice",
               step=STEP + "loop_update(notes=len(seen))\n", max_iterations=3)
    assert [loop.run_once(harness.env.runtime, "alice").outcome for _ in range(3)] == [
        "committed"] * 3
    harness.env.close()
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.summary()
    assert [step.kind for step in report.steps].count("loop") == 3
