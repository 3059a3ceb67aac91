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
    ({"do": "status", "since_op": 3}, "malformed", "since_op needs 'agent'"),
    ({"do": "pause", "agent": "alice", "since_op": 3}, "malformed", "do not go with"),
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


def test_status_shows_what_the_last_committed_iterations_printed_bounded(
        harness: Harness) -> None:
    step = ("n = loop_state()['iteration']\nprint('item', n)\n"
            "if n == 2:\n    print('y' * 2500)\nif n == 3:\n    1 / 0\n")
    started = harness.ok(action="loop", do="start", agent="alice", step=step)
    [fresh] = harness.ok(action="loop", do="status")["loops"]
    assert fresh["output"] is None   # nothing printed yet
    turns = [loop.run_once(harness.env.runtime, "alice") for _ in range(4)]
    assert [turn.outcome for turn in turns] == ["committed"] * 3 + ["failed"]
    [described] = harness.ok(action="loop", do="status")["loops"]
    last = described["output"]   # the failed iteration printed too, but did not commit
    assert (last["op"], last["iteration"], last["cut"]) == (turns[2].op, 2, 508)
    assert last["text"] == "item 2\n" + "y" * (loop.MAX_OUTPUT_CHARS - 7)
    assert "outputs" not in described
    [since] = harness.ok(action="loop", do="status", agent="alice",
                         since_op=turns[0].op)["loops"]
    assert [(entry["op"], entry["text"][:6]) for entry in since["outputs"]] == [
        (turns[1].op, "item 1"), (turns[2].op, "item 2")]
    everything = harness.ok(action="loop", do="status", agent="alice",
                            since_op=started["op"])["loops"][0]["outputs"]
    assert [entry["text"] for entry in everything][:2] == ["item 0\n", "item 1\n"]
    # Never in the image, nor in the event's payload (printed text may hold personal data).
    assert "item 1" not in repr(loop.state_of(harness.env.image, "alice").__dict__)
    payloads = [event["payload"] for event in harness.ok(action="events")["events"]
                if event["topic"] == loop.ITERATION_TOPIC]
    assert len(payloads) == 3 and all("output" not in payload for payload in payloads)


def test_only_the_last_iterations_outputs_are_held() -> None:
    outputs = loop.LoopOutputs()
    for number in range(loop.HELD_OUTPUTS + 5):
        outputs.record(loop.IterationResult(agent="a", iteration=number, op=100 + number,
                                            status="running", reason=None, output=f"{number}"))
    held = outputs.since("a", 0)
    assert len(held) == loop.HELD_OUTPUTS and held[0]["iteration"] == 5
    assert outputs.last("a") == {"op": 120, "iteration": 20, "text": "20", "cut": 0}
    assert outputs.last("b") is None and outputs.since("b", 0) == []


def test_the_circuit_listing_names_the_safe_checkpoint(harness: Harness) -> None:
    harness.ok(action="add_agent", agent="bob")
    listed = harness.ok(action="circuit")
    assert listed["safe"] == {"alice": None, "bob": None}, listed
    refused = harness.error(action="reset", agent="alice", restore=True)
    assert "no checkpoint tagged safe" in refused["message"], refused
    op = harness.env.image.begin(source="tag alice's namespace safe", principal="human")
    harness.env.runtime.breakers.checkpoint("alice")
    op.commit()
    assert harness.ok(action="circuit", agent="alice")["safe"] == {"alice": op.id}
    assert harness.ok(action="circuit")["safe"]["bob"] is None
    assert harness.ok(action="reset", agent="alice", restore=True)["restored_from"] == op.id


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
