"""The audit log in-process: one record per op, the chain, payloads, recovery, filters."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core_support import CoreEnv
from kernos import Image, Workspace
from kernos.audit import AuditLog, record_hash, verify
from kernos.audit.canonical import canonical
from kernos.audit.log import GENESIS_PREV, INLINE_CODE_BYTES
from kernos.errors import AuditError, OpVetoed
from kernos.personal import Keyring


class Env(CoreEnv):
    """A workspace with an image and a bus on it; ``reopen()`` is a kernel restart."""

    def fail(self, source: str, error: BaseException | tuple[str, str] | None = None, *,
             principal: str = "human", status: str | None = None) -> int:
        """Run ``source`` as an op and abort it; returns its id."""
        op = self.image.begin(source=source, principal=principal)
        exec(compile(source, f"<op {op.id}>", "exec"), self.ns)
        op.abort(error=error, status=status)
        return op.id

    def lines(self) -> list[bytes]:
        return self.chain.read_bytes().splitlines(keepends=True)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    opened = Env(tmp_path / "ws")
    yield opened
    opened.close()


def records(env: Env) -> list[dict[str, Any]]:
    return [json.loads(line) for line in env.lines()]


# -- one record per op ----------------------------------------------------------------------


def test_every_op_gets_a_record_with_its_status(env: Env) -> None:
    committed = env.run("a = 1").op
    failed = env.fail("b = 2", ValueError("boom"))
    interrupted = env.fail("c = 3", KeyboardInterrupt())
    rolled_back = env.fail("d = 4")
    denied = env.fail("e = 5", status="denied")
    from_tuple = env.fail("f = 6", ("TypeError", "bad type"))
    op = env.image.begin(source="g = 7")
    env.ns["g"] = 7
    op.veto("a limit was breached")
    with pytest.raises(OpVetoed, match="a limit was breached"):
        op.commit()
    vetoed = op.id
    with pytest.raises(ZeroDivisionError):
        env.run("h = 1 / 0")
    last = env.image.last_op

    found = {r["op"]: (r["status"], r["error"]) for r in env.image.audit.records(type="op")}
    assert found == {
        committed: ("committed", None),
        failed: ("failed", {"kind": "ValueError", "message": "boom"}),
        interrupted: ("interrupted", {"kind": "KeyboardInterrupt", "message": ""}),
        rolled_back: ("rolled back", None),
        denied: ("denied", None),
        from_tuple: ("failed", {"kind": "TypeError", "message": "bad type"}),
        vetoed: ("vetoed", {"kind": "OpVetoed",
                            "message": found[vetoed][1]["message"]}),  # type: ignore[index]
        last: ("failed", {"kind": "ZeroDivisionError", "message": "division by zero"}),
    }
    assert "a limit was breached" in found[vetoed][1]["message"]  # type: ignore[index]
    assert [r["op"] for r in env.image.audit.records(type="op")] == list(range(1, 9))
    assert [name for name in "abcdefgh" if name in env.ns] == ["a"]


def test_a_committed_record_holds_what_the_op_did(env: Env) -> None:
    env.run("keep = 1\ngone = 2")
    source = "x = [1, 2]\nkeep += 1\ndel gone\nbus.emit('orders.created', {'id': 7})"
    op = env.image.begin(source=source, principal="alice")
    exec(source, env.ns)
    report = op.commit()
    record = env.image.audit.read(report.audit["index"])
    assert report.audit == {"index": 2, "hash": record["hash"]}
    assert env.image.audit.head() == (2, record["hash"])
    assert record["type"] == "op" and record["v"] == 1 and record["index"] == 2
    assert (record["op"], record["principal"], record["kind"]) == (2, "alice", "cell")
    assert record["status"] == "committed" and record["error"] is None
    assert record["commit"] == report.commit
    assert record["code"] == {"sha256": hashlib.sha256(source.encode()).hexdigest(),
                              "size": len(source.encode()), "text": source}
    assert record["changes"] == {"added": ["x"], "changed": ["keep"], "deleted": ["gone"]}
    assert record["events"] == [{"seq": 1, "topic": "orders.created", "principal": "alice",
                                 "depth": 0, "payload": {"id": 7}}]
    assert record["attempted_events"] == 0
    assert record["grants"] == {"used": [], "denied": []}
    assert record["effects"] == []
    assert record["started_at"] <= record["finished_at"] <= record["at"]
    for stamp in (record["started_at"], record["finished_at"], record["at"]):
        assert stamp.endswith("Z") and stamp[:2] == "20"
    assert record["prev"] == env.image.audit.read(1)["hash"]


def test_an_aborted_record_keeps_the_code_but_no_changes_events_or_commit(env: Env) -> None:
    source = "y = 1\nbus.emit('a', 1)\nbus.emit('b', 2)"
    env.fail(source, RuntimeError("x" * 2000))
    record = env.image.audit.records(type="op")[-1]
    assert record["code"]["text"] == source
    assert (record["changes"], record["events"], record["commit"]) == (None, [], None)
    assert record["attempted_events"] == 2
    assert len(record["error"]["message"]) == 500  # bounded


def test_records_are_chained_from_genesis(env: Env) -> None:
    env.run("a = 1")
    env.fail("b = 1")
    env.run("c = 1")
    chain = records(env)
    genesis = chain[0]
    assert (genesis["type"], genesis["index"], genesis["prev"], genesis["adopts"]) == (
        "genesis", 0, GENESIS_PREV, None)
    for index, record in enumerate(chain):
        assert record["index"] == index
        if index:
            assert record["prev"] == chain[index - 1]["hash"]
    assert env.image.audit.head() == (len(chain) - 1, chain[-1]["hash"])
    assert len(env.image.audit) == len(chain) == 4


def test_records_are_canonical_and_hash_to_their_hash(env: Env) -> None:
    env.run("name = 'Zo\u00eb \u2603 \U0001f600'\nnums = [1.5, -0.0, 10**30]")
    env.run("bus.emit('t', {'z': 1, 'a': ['\u00e9', None, True], 'm': {'b': 2, 'a': 1}})")
    env.fail("broken = 1", ValueError("\u00fcber"))
    for line in env.lines():
        assert line.endswith(b"\n") and line.isascii()
        record = json.loads(line)
        assert canonical(record) + b"\n" == line  # re-encodes byte for byte
        body = {key: value for key, value in record.items() if key != "hash"}
        assert record_hash(record) == record["hash"]
        assert record["hash"] == hashlib.sha256(canonical(body)).hexdigest()
    assert records(env)[1]["code"]["text"].startswith("name = 'Zo\u00eb \u2603 \U0001f600'")


def test_canonical_sorts_keys_escapes_non_ascii_and_refuses_nan() -> None:
    assert canonical({"b": 1, "a": ["\u00e9", 1.5, None]}) == (
        b'{"a":["\\u00e9",1.5,null],"b":1}')
    with pytest.raises(ValueError):
        canonical({"x": float("nan")})


def test_record_hash_ignores_only_the_hash_field() -> None:
    record = {"type": "op", "index": 3, "prev": "0" * 64, "hash": "whatever"}
    same = record_hash(record)
    assert record_hash({**record, "hash": "other"}) == same
    assert record_hash({**record, "index": 4}) != same


# -- code -----------------------------------------------------------------------------------


def test_large_code_is_stored_by_reference_and_readable(env: Env) -> None:
    source = "big = 1\n# " + "\u00e9" * 3000 + "\n"  # 6 KB of UTF-8, 3 K characters
    report = env.run(source)
    code = env.image.audit.read(report.audit["index"])["code"]
    data = source.encode()
    assert len(data) > INLINE_CODE_BYTES
    assert "text" not in code
    assert code == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                    "ref": hashlib.sha256(data).hexdigest()}
    assert (env.path / "audit" / "payloads" / code["ref"]).read_bytes() == data
    assert env.image.audit.code(report.op) == source
    assert env.reopen().image.audit.code(report.op) == source
    failed = env.fail(source + "# aborted\n", ValueError("x"))
    assert env.image.audit.code(failed) == source + "# aborted\n"
    assert "ref" in env.image.audit.records(type="op")[-1]["code"]


def test_code_up_to_the_inline_limit_stays_inline(env: Env) -> None:
    source = "x = 1\n#" + "c" * (INLINE_CODE_BYTES - 7)
    assert len(source.encode()) == INLINE_CODE_BYTES
    report = env.run(source)
    code = env.image.audit.read(report.audit["index"])["code"]
    assert code["text"] == source and "ref" not in code
    assert env.image.audit.code(report.op) == source
    assert not (env.path / "audit" / "payloads").exists()
    assert env.image.audit.code(999) is None


def test_an_op_without_code_has_a_null_code_field(env: Env) -> None:
    op = env.image.begin()
    env.ns["v"] = 1
    report = op.commit()
    assert env.image.audit.read(report.audit["index"])["code"] is None
    assert env.image.audit.code(report.op) is None


# -- op ids ---------------------------------------------------------------------------------


def test_op_ids_stay_unique_across_a_reopen_after_aborted_ops(env: Env) -> None:
    env.run("a = 1")
    env.fail("b = 1", ValueError("x"))
    env.fail("c = 1", KeyboardInterrupt())
    assert env.image.last_op == 3
    env.reopen()
    report = env.run("d = 1")
    assert report.op == 4
    env.reopen()
    assert env.run("e = 1").op == 5
    ids = [r["op"] for r in env.image.audit.records(type="op")]
    assert ids == [1, 2, 3, 4, 5]
    assert verify(env.path).ok


# -- recovery -------------------------------------------------------------------------------


def test_a_torn_last_line_is_cut_on_reopen_and_kept_aside(env: Env) -> None:
    env.run("a = 1")
    env.close()
    intact = env.chain.read_bytes()
    garbage = b'{"at":"2026-01-01T00:00:00.000Z","attempted_events":0,"cha'
    with open(env.chain, "ab") as log:
        log.write(garbage)
    assert not verify(env.path).ok  # read-only: reported, not repaired
    env.reopen()
    assert env.chain.read_bytes() == intact
    kept = list((env.path / "audit").glob("torn-*.bin"))
    assert len(kept) == 1 and kept[0].read_bytes() == garbage
    assert "cut short" in (env.restore_report.recovery or "")
    assert env.ns["a"] == 1
    env.run("b = 2")
    assert verify(env.path).ok
    assert [r["index"] for r in records(env)] == [0, 1, 2]


def test_a_record_whose_commit_does_not_exist_is_voided_on_reopen(env: Env) -> None:
    env.run("a = 1")
    env.close()
    log = AuditLog(env.path, keyring=Keyring(env.path / "keys"))
    ghost = log.append({
        "type": "op", "op": 2, "kind": "cell", "principal": "human", "status": "committed",
        "error": None, "code": None, "grants": {"used": [], "denied": []},
        "changes": {"added": ["ghost"], "changed": [], "deleted": []},
        "events": [{"seq": 1, "topic": "ghost.event", "principal": "human", "depth": 0,
                    "payload": 1}],
        "attempted_events": 0, "effects": [], "commit": "ab" * 20,
        "started_at": "2026-01-01T00:00:00.000Z", "finished_at": "2026-01-01T00:00:00.000Z"})
    env.reopen()
    void = records(env)[-1]
    assert (void["type"], void["voids"], void["op"]) == ("void", ghost["index"], 2)
    assert "voided" in (env.restore_report.recovery or "")
    assert "ghost" not in env.ns
    assert env.image.audit.events_since() == []
    assert env.image.audit.records(type="void") == [void]
    report = env.run("bus.emit('real.event', 2)")
    assert report.op == 3  # the voided op's id is not reused
    assert [e["topic"] for e in env.image.audit.events_since()] == ["real.event"]
    length = len(env.image.audit)
    env.reopen()  # voiding happens once
    assert len(env.image.audit) == length
    assert verify(env.path).ok


CHILD = textwrap.dedent("""
    import sys, types
    from kernos import Image, Workspace
    from kernos.events.bus import EventBus
    module = types.ModuleType("__main__")
    ns = module.__dict__
    workspace = Workspace.open(sys.argv[1])
    image = Image(workspace, ns, module=module)
    image.restore()
    bus = EventBus(image)
    source = "doomed = 'value'"
    op = image.begin(source=source, principal="alice")
    exec(source, ns)
    bus.emit("crash.test", {"n": 1})
    op.commit()
    print("survived")
""")

SOURCE_HASH = hashlib.sha256(b"doomed = 'value'").hexdigest()


def crash_at(env: Env, point: str) -> None:
    env.close()
    child = subprocess.run([sys.executable, "-c", CHILD, str(env.path)],
                           env={**os.environ, "KERNOS_CRASH_AT": point},
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "survived" not in child.stdout
    env.reopen()


def test_a_crash_after_the_record_but_before_the_commit_point_voids_the_record(
        env: Env) -> None:
    env.run("a = 1")
    crash_at(env, "sealed")
    chain = records(env)
    doomed, void = chain[-2], chain[-1]
    assert (doomed["op"], doomed["status"], doomed["principal"]) == (2, "committed", "alice")
    assert doomed["events"][0]["topic"] == "crash.test"
    assert (void["type"], void["voids"], void["op"]) == ("void", doomed["index"], 2)
    assert "doomed" not in env.ns and env.ns["a"] == 1
    assert env.image.audit.events_since() == []
    assert env.run("b = 2").op == 3
    assert verify(env.path).ok


@pytest.mark.parametrize("point", ["serialize", "objects"])
def test_an_op_running_when_the_process_died_gets_a_died_record(env: Env, point: str) -> None:
    env.run("a = 1")
    crash_at(env, point)
    died = records(env)[-1]
    assert died["type"] == "died"
    assert (died["op"], died["principal"], died["kind"], died["code"]) == (
        2, "alice", "cell", SOURCE_HASH)
    assert died["started_at"] <= died["at"]
    assert [r["type"] for r in records(env)] == ["genesis", "op", "died"]
    assert "was running when the kernel died" in (env.restore_report.recovery or "")
    assert "doomed" not in env.ns
    assert env.run("b = 2").op == 3
    env.reopen()
    assert [r["type"] for r in records(env)] == ["genesis", "op", "died", "op"]  # once
    assert verify(env.path).ok


def test_a_crash_after_the_commit_point_keeps_the_op_and_its_events(env: Env) -> None:
    env.run("a = 1")
    crash_at(env, "published")
    assert env.ns["doomed"] == "value"
    assert [r["type"] for r in records(env)] == ["genesis", "op", "op"]
    assert [(e["topic"], e["op"]) for e in env.image.audit.events_since()] == [
        ("crash.test", 2)]
    assert env.run("b = 2").op == 3
    assert verify(env.path).ok


@pytest.mark.parametrize("damage", ["garbage", "not an object", "out of order", "edited last"])
def test_a_damaged_log_refuses_to_open_and_is_left_untouched(env: Env, damage: str) -> None:
    for number in range(3):
        env.run(f"v{number} = {number}")
    env.close()
    lines = env.lines()
    if damage == "garbage":
        lines[2] = b'{"this is": not json\n'
        index = 2
    elif damage == "not an object":
        lines[2] = b"[1, 2]\n"
        index = 2
    elif damage == "out of order":
        lines[1], lines[2] = lines[2], lines[1]
        index = 1
    else:
        lines[-1] = lines[-1].replace(b'"principal":"human"', b'"principal":"eve"')
        index = len(lines) - 1
    env.chain.write_bytes(b"".join(lines))
    damaged = env.chain.read_bytes()
    listing = sorted(p.name for p in (env.path / "audit").iterdir())
    workspace = Workspace.open(env.path)
    try:
        with pytest.raises(AuditError) as caught:
            Image(workspace, {})
    finally:
        workspace.close()
    assert caught.value.index == index
    assert f"damaged at record {index}" in str(caught.value)
    assert "Nothing was changed" in str(caught.value)
    assert env.chain.read_bytes() == damaged
    assert sorted(p.name for p in (env.path / "audit").iterdir()) == listing


def test_a_workspace_that_predates_its_audit_log_is_adopted(tmp_path: Path) -> None:
    """History written before the audit existed (no snapshot binds a chain) is adopted."""
    from kernos.store.snapshots import ChunkCache, SnapshotWriter, commit_message

    workspace = Workspace.open(tmp_path / "old")
    with SnapshotWriter(workspace, ChunkCache()) as writer:
        commit = writer.commit(
            groups=[], source="pass", parent=None, author="human <human@kernos.invalid>",
            manifest={"format": 1, "op": 1, "principal": "human", "kind": "cell", "note": "",
                      "committed_at": "2026-01-01T00:00:00.000Z",
                      "changes": {"added": [], "changed": [], "deleted": []}, "names": {}},
            message=commit_message(op=1, principal="human", kind="cell", headline="pass"))
        writer.publish(commit)
    image = Image(workspace, {})
    image.restore()
    genesis = image.audit.read(0)
    assert genesis["type"] == "genesis" and genesis["adopts"] == commit.hex()
    op = image.begin(source="b = 2")
    image.namespace["b"] = 2
    assert op.commit().op == 2
    workspace.close()
    assert verify(tmp_path / "old").ok


def test_a_removed_log_is_not_replaced_over_audited_history(env: Env) -> None:
    env.run("a = 1")
    env.close()
    before = env.chain.read_bytes()
    env.chain.unlink()
    with pytest.raises(AuditError, match="will not start a new log"):
        env.reopen()
    assert not env.chain.exists()
    env.chain.write_bytes(before)
    env.reopen()
    assert env.run("b = 2").op == 2


# -- filters --------------------------------------------------------------------------------


@pytest.fixture
def mixed(env: Env) -> Env:
    env.run("bus.emit('orders.created', {'id': 1})")                     # op 1, index 1
    env.run("bus.emit('ledger.debit', 5)", principal="alice")           # op 2, index 2
    env.fail("bus.emit('orders.created', 2)", ValueError("x"))          # op 3, index 3
    env.fail("x = 1", principal="alice", status="denied")               # op 4, index 4
    env.run("y = 2")                                                    # op 5, index 5
    return env


def picked(found: list[dict[str, Any]]) -> list[int]:
    return [record["index"] for record in found]


@pytest.mark.parametrize("kwargs, expected", [
    ({}, [0, 1, 2, 3, 4, 5]),
    ({"type": "op"}, [1, 2, 3, 4, 5]),
    ({"type": "genesis"}, [0]),
    ({"type": "void"}, []),
    ({"principal": "alice"}, [2, 4]),
    ({"principal": "nobody"}, []),
    ({"status": "committed"}, [1, 2, 5]),
    ({"status": "failed"}, [3]),
    ({"status": "denied"}, [4]),
    ({"topic": "orders.*"}, [1]),  # the aborted op's event is not an event
    ({"topic": "**"}, [1, 2]),
    ({"topic": "ledger.debit"}, [2]),
    ({"since_op": 2}, [3, 4, 5]),
    ({"since_op": 0}, [1, 2, 3, 4, 5]),
    ({"since_op": 5}, []),
    ({"limit": 2}, [4, 5]),  # the newest
    ({"limit": 0}, []),
    ({"limit": 100}, [0, 1, 2, 3, 4, 5]),
    ({"principal": "human", "status": "committed"}, [1, 5]),
    ({"type": "op", "since_op": 1, "limit": 1}, [5]),
])
def test_records_filters(mixed: Env, kwargs: dict[str, Any], expected: list[int]) -> None:
    assert picked(mixed.image.audit.records(**kwargs)) == expected


def test_records_filters_survive_a_restart(mixed: Env) -> None:
    before = mixed.image.audit.records()
    mixed.reopen()
    assert mixed.image.audit.records() == before
    assert picked(mixed.image.audit.records(principal="alice")) == [2, 4]
