"""Replay takes the checkpoint and file ops from the original's snapshots (kernos.replay._taken).

Their recorded source holds no bytes, so the replay re-does each as an op of the
same principal, kind and source that applies what the original op changed; the
step's snapshot is still compared with the original's, so a change applied
otherwise (planted here by monkeypatching the application) is a divergence,
named.  A real KernosSaver runs a plain-function LangGraph graph over an
in-process harness service (the requests travel as JSON, as in
tests/unit/integrations/test_langgraph_saver.py); the real-kernel run is in
tests/integration/test_replay_frameworks.py.
"""

from __future__ import annotations

import base64
import operator
import random
from pathlib import Path
from typing import Annotated, Any, TypedDict
from unittest import mock

import pytest

pytest.importorskip("langgraph.graph")

from langgraph.checkpoint.base import id as langgraph_ids
from langgraph.graph import END, START, StateGraph

from harness_support import Harness, LocalClient
from kernos.audit import open_audit
from kernos.client import RequestError
from kernos.harness.checkpoint_requests import page_name
from kernos.integrations.langgraph import KernosSaver
from kernos.replay import _taken
from kernos.replay._taken import TAKEN_ACTIONS, taken_action
from kernos.replay.driver import replay
from kernos.store.workspace import Workspace


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    blob: bytes


def graph(saver: KernosSaver) -> Any:
    """Three plain-function nodes in a line."""
    builder = StateGraph(State)
    for name in ("plan", "act", "check"):
        builder.add_node(name, lambda state, name=name: {
            "steps": [name], "blob": bytes(range(len(state["steps"]) * 40 % 256))})
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "act")
    builder.add_edge("act", "check")
    builder.add_edge("check", END)
    return builder.compile(checkpointer=saver)


def record(tmp_path: Path) -> dict[str, Any]:
    """A session of graph runs, file requests and ordinary ops; the ops of interest.

    LangGraph draws its checkpoint ids from the global ``random`` (uuid6), in the
    thread that saves in the background too.  Here the image is in the same process, so
    a draw while one of its ops is open would make that op store the generators' state
    (``kernos:random``), which no replay can know of: the ids draw from a private
    generator.  (A real kernel runs in a process of its own: tests/integration.)"""
    with mock.patch.object(langgraph_ids, "random", random.Random(37)):
        return _record(tmp_path)


def _record(tmp_path: Path) -> dict[str, Any]:
    harness = Harness(tmp_path / "ws")
    harness.service.max_request_bytes = 4 * 1024 * 1024
    ops: dict[str, Any] = {}
    harness.op("total = 1")
    saver = KernosSaver(LocalClient(harness), principal="graph")
    saver.setup()
    app = graph(saver)
    app.invoke({"steps": ["start"], "blob": b""}, {"configurable": {"thread_id": "t-1"}})
    harness.op("total += 1")
    app.invoke({"steps": ["again"], "blob": b"\x00"}, {"configurable": {"thread_id": "t-2"}})
    saver.copy_thread("t-1", "t-3")
    saver.prune(["t-2"], strategy="keep_latest")
    ops["delete_thread"] = harness.env.image.last_op + 1
    saver.delete_thread("t-1")
    ops["write"] = harness.ok(action="files_write", path="notes/a.txt", data="one\n")
    ops["append"] = harness.ok(action="files_append", path="notes/a.txt", data="two\n")
    ops["binary"] = harness.ok(action="files_write", principal="graph",
                               path="agents/graph/raw.bin", encoding="base64",
                               data=base64.b64encode(bytes(range(256)) * 9).decode())
    ops["read"] = harness.ok(action="files_read", path="notes/a.txt")
    ops["write_b"] = harness.ok(action="files_write", path="notes/b.txt", data="gone soon")
    ops["delete"] = harness.ok(action="files_delete", path="notes/b.txt")
    # Rolled back originally: no such file; an agent writing where no grant lets it.
    ops["missing"] = harness.send(action="files_delete", path="notes/none.txt")
    ops["denied"] = harness.send(action="files_write", principal="graph", path="notes/c.txt",
                                 data="no")
    # An agent whose circuit opens after one op: its second put is refused before it runs.
    harness.ok(action="add_agent", agent="capped")
    harness.ok(action="policy", agent="capped", set={"iterations": 1})
    capped = KernosSaver(LocalClient(harness), principal="capped")
    capped.setup()
    with pytest.raises(RequestError):
        graph(capped).invoke({"steps": [], "blob": b""}, {"configurable": {"thread_id": "c"}})
    harness.op("final = total * 10\nimport kernos.files\n"
               "size = kernos.files.path('notes/a.txt').stat().st_size")
    harness.env.close()
    return ops


def statuses(path: Path) -> dict[int, tuple[str, str]]:
    """op -> (status, action) of the harness ops the replay takes."""
    with Workspace.open(path, writable=False) as opened:
        found = {}
        for entry in open_audit(opened).records(type="op", limit=10_000):
            action = taken_action(str(entry["kind"]), entry["code"]["text"])
            if action is not None:
                found[int(entry["op"])] = (str(entry["status"]), action)
    return found


def test_the_ops_it_takes_reproduce_every_snapshot(tmp_path: Path) -> None:
    ops = record(tmp_path)
    taken = statuses(tmp_path / "ws")
    actions = {action for _, action in taken.values()}
    assert actions >= {"checkpoint_put", "checkpoint_writes", "checkpoint_copy",
                       "checkpoint_prune", "checkpoint_delete", "files_write", "files_append",
                       "files_delete", "files_read"}
    assert {status for status, _ in taken.values()} >= {"committed", "failed", "denied",
                                                        "refused"}
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.summary()
    assert len(report.steps) > 20
    steps = {step.op: step for step in report.steps}
    for op, (status, _action) in taken.items():
        assert steps[op].replayed == status
    compared = [step for step in report.steps if step.original is not None]
    assert all(step.digest == step.original for step in compared)
    assert all(step.files == step.original_files for step in compared)
    assert steps[ops["read"]["op"]].replayed == "committed"
    replayed = tmp_path / "replayed" / "files"
    assert (replayed / "notes" / "a.txt").read_text() == "one\ntwo\n"
    assert (replayed / "agents" / "graph" / "raw.bin").read_bytes() == bytes(range(256)) * 9
    assert not (replayed / "notes" / "b.txt").exists()
    assert not (replayed / "notes" / "c.txt").exists()
    # The same principal and source in the replay's audit log, op for op.
    with Workspace.open(tmp_path / "replayed", writable=False) as opened:
        ours = {int(r["op"]): (r["principal"], r["kind"], r["code"]["text"], r["status"])
                for r in open_audit(opened).records(type="op", limit=10_000)
                if r.get("op") in taken}
    with Workspace.open(tmp_path / "ws", writable=False) as opened:
        theirs = {int(r["op"]): (r["principal"], r["kind"], r["code"]["text"], r["status"])
                  for r in open_audit(opened).records(type="op", limit=10_000)
                  if r.get("op") in taken}
    assert ours == theirs


def test_a_deletion_skipped_in_the_replay_is_a_divergence_naming_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = record(tmp_path)
    monkeypatch.setattr(_taken, "_remove", lambda path: None)
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.divergence is not None and report.divergence.op == ops["delete"]["op"]
    assert "tracked files" in report.divergence.reason
    assert report.divergence.names == {"files/notes/b.txt": "only in the replay"}


def test_a_page_left_bound_in_the_replay_is_a_divergence_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = record(tmp_path)
    taking = _taken.Taker.changes

    def keep_the_pages(self: _taken.Taker, *args: Any) -> _taken.Changes:
        changes = taking(self, *args)
        changes.unbind = []
        return changes

    monkeypatch.setattr(_taken.Taker, "changes", keep_the_pages)
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.divergence is not None
    assert report.divergence.op == ops["delete_thread"]
    assert report.divergence.names == {page_name("graph", "t-1", 0): "only in the replay"}


def test_bytes_applied_otherwise_are_a_divergence_at_that_op(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = record(tmp_path)
    applying = _taken.Taker.apply

    def first_write_only(self: _taken.Taker, changes: _taken.Changes) -> None:
        if "notes/a.txt" in changes.write and len(list((tmp_path / "replayed" / "files")
                                                       .rglob("a.txt"))):
            changes.write.pop("notes/a.txt")  # the append is not applied
        applying(self, changes)

    monkeypatch.setattr(_taken.Taker, "apply", first_write_only)
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.divergence is not None and report.divergence.op == ops["append"]["op"]
    assert "bytes differ" in report.divergence.names["files/notes/a.txt"]


def test_only_the_allowlisted_harness_actions_are_taken() -> None:
    assert taken_action("harness", '{"action": "checkpoint_put", "thread": "t"}') == (
        "checkpoint_put")
    assert taken_action("harness", '{"action": "files_append", "path": "a"}') == "files_append"
    assert taken_action("harness", '{"action": "session_add", "items": []}') is None
    assert taken_action("harness", '{"action": "checkpoint_get"}') is None  # a read: no op
    assert taken_action("cell", '{"action": "files_write"}') is None
    assert taken_action("harness", "files_write = 1") is None
    assert taken_action("harness", '["files_write"]') is None
    assert "checkpoint_list" not in TAKEN_ACTIONS and "op" not in TAKEN_ACTIONS


def test_an_op_whose_snapshot_was_pruned_cannot_be_taken(tmp_path: Path) -> None:
    from kernos.prune import Policy, prune
    from kernos.store.workspace import op_of

    ops = record(tmp_path)
    taken = statuses(tmp_path / "ws")
    with Workspace.open(tmp_path / "ws", writable=False) as opened:
        kept = sum(1 for _, data in opened.history()
                   if (op_of(data) or 0) >= ops["write_b"]["op"])
    prune(tmp_path / "ws", Policy(keep_last=kept))  # from files_write notes/b.txt on
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    divergence = report.divergence
    assert divergence is not None
    assert divergence.op == min(op for op, (status, _) in taken.items() if status == "committed")
    assert "pruned" in divergence.reason and "--from" in divergence.reason
    assert report.steps[-1].replayed == "not replayable"
    # From a snapshot the prune kept, the ops after it are taken as before.
    later = replay(tmp_path / "ws", start=f"@{ops['write_b']['op']}",
                   into=tmp_path / "later")
    assert later.ok, later.summary()
    assert (later.steps[0].op, later.steps[0].replayed) == (ops["delete"]["op"], "committed")
    assert later.steps[0].digest == later.steps[0].original
    assert later.steps[0].files == later.steps[0].original_files
    assert {step.replayed for step in later.steps} >= {"failed", "denied", "refused"}
    assert not (tmp_path / "later" / "files" / "notes" / "b.txt").exists()
