"""``on_error: keep``: human code that raises commits what it did, as an op marked failed
(the harness side of ``%kernos on-error keep``), and a replay reproduces it."""

from __future__ import annotations

from pathlib import Path

from tests.harness_support import Harness

from kernos.replay.driver import replay


def test_a_kept_op_commits_what_it_did_and_says_it_failed(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "ws")
    result = harness.op("a = 'text'\nb = [1]\na[0] = 'x'", on_error="keep")
    assert result["status"] == "committed"
    assert result["failed"] == {"kind": "TypeError",
                                "message": "'str' object does not support item assignment"}
    assert sorted(result["added"]) == ["a", "b"]
    record = harness.records()[-1]
    assert record["status"] == "committed" and record["error"]["kind"] == "TypeError"
    rolled = harness.op("c = 1\n1/0")  # the default still rolls back
    assert rolled["status"] == "failed" and rolled["undone"]["added"] == ["c"]
    harness.ok(action="add_agent", agent="bob")
    agent = harness.op("x = 1\nraise ValueError('no')", principal="bob", on_error="keep")
    assert agent["status"] == "failed"  # agents' ops always roll back
    assert harness.error(action="op", principal="human", code="1",
                         on_error="sometimes")["kind"] == "malformed"
    harness.env.close()
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.divergence
    assert [step.replayed for step in report.steps][:1] == ["committed"]
