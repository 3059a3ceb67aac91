"""An op that changes nothing writes its audit record and no snapshot.

Its record says ``unchanged`` and names the last snapshot, which is still the
image; verify, replay, ``@N`` and a restart all read the history that way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core_support import CoreEnv
from kernos.audit.canonical import canonical
from kernos.audit.log import record_hash
from kernos.audit.verify import verify
from kernos.errors import UnknownRef
from kernos.replay import replay


def packs(env: CoreEnv) -> set[str]:
    return {path.name for path in (env.path / "history.git" / "objects" / "pack").glob("*.pack")}


def test_a_read_only_op_writes_no_snapshot_and_says_so(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run("table = {k: {'v': k} for k in range(10_000)}\nx = 1")
    assert env.workspace is not None
    head, before = env.workspace.head(), packs(env)
    report = env.run("print(len(table), table[5], x)")
    assert report.unchanged and report.bytes_written == 0
    assert report.commit == head.hex() and env.workspace.head() == head  # type: ignore[union-attr]
    assert packs(env) == before
    record = env.image.audit.read(report.audit["index"])
    assert record["status"] == "committed" and record["unchanged"] is True
    assert record["commit"] == head.hex()  # type: ignore[union-attr]
    changed = env.run("x += 1")
    assert not changed.unchanged and env.workspace.head() != head
    assert env.workspace.read_commit(bytes.fromhex(changed.commit)).parents == (head,)
    assert verify(env.path).ok


def test_an_op_that_changes_anything_still_writes_a_snapshot(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run("memory = [0] * 5000\nnote = 'a'")
    for code in ("memory[3] = 1", "note = 'b'", "memory.append(1)", "del note",
                 "other = memory"):
        assert not env.run(code).unchanged, code
    env.reopen()
    assert env.ns["memory"][3] == 1 and env.ns["memory"][-1] == 1 and "note" not in env.ns
    assert env.ns["other"] is env.ns["memory"]


def test_an_op_without_a_snapshot_is_replayed_from_the_image_it_left(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    first = env.run("x = 1")
    quiet = env.run("x")
    env.run("x = 2")
    assert env.workspace is not None
    with pytest.raises(UnknownRef):  # op N's own snapshot: it has none
        env.workspace.resolve(f"@{quiet.op}")
    assert env.workspace.snapshot_of_op(quiet.op, exact=False).hex() == first.commit
    env.close()
    report = replay(tmp_path / "ws", start=f"@{quiet.op}", into=tmp_path / "replayed")
    assert report.ok and [step.op for step in report.steps] == [quiet.op + 1], report.summary()


def test_a_restart_and_a_replay_agree_with_an_unchanged_op(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run("x = [1, 2]")
    quiet = env.run("y = len(x)\ndel y")
    assert quiet.unchanged
    env.run("x.append(3)")
    env.reopen()
    assert env.ns["x"] == [1, 2, 3] and env.image.last_op == quiet.op + 1
    assert env.run("x").op == quiet.op + 2  # op numbers go on past the unchanged op
    env.close()
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.summary()


def test_verify_rejects_an_unchanged_record_that_names_another_snapshot(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    first = env.run("x = 1")
    env.run("x = 2")
    quiet = env.run("x")
    env.close()
    chain = tmp_path / "ws" / "audit" / "chain.jsonl"
    lines = chain.read_text().splitlines()
    record = json.loads(lines[quiet.audit["index"]])
    assert record["unchanged"] is True
    record["commit"] = first.commit  # an old snapshot: the op would have undone x = 2
    record["hash"] = record_hash(record)  # the last record: the chain still holds
    lines[quiet.audit["index"]] = canonical(record).decode()
    chain.write_text("\n".join(lines) + "\n")
    problems = [problem.what for problem in verify(tmp_path / "ws").problems]
    assert any("changed nothing" in problem for problem in problems), problems
