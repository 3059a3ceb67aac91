"""The audit log's events, its recovery and ``restore_records``, pinned on an ``AuditLog`` alone.

These close gaps mutation testing (``scripts/mutation audit.log``) found:
which events ``events_since`` returns for each filter and at each boundary
(``seq``, ``op``, topic patterns, principal, ``limit``), the exact shape of an
event as subscribers see it (payloads inline, by reference, sealed, erased),
that nothing is published before recovery or beyond ``published``; which
records ``recover`` voids (and which it must leave to verify), with the words
it records and reports; and ``restore_records``, which puts back the records
a crash took from the chain (from a missing, empty, torn or whole chain; only
the next records, in order; synced only when it wrote; past a last record
longer than the 1 MiB it reads first, which made a workspace fail to open).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from audit_support import new_log
from kernos.audit.log import AuditLog, restore_records

AT = "2026-01-02T03:04:05.000Z"


def event(seq: int, topic: str, principal: str, **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "topic": topic, "principal": principal, "depth": seq % 2,
            **(fields or {"payload": {"n": seq}})}


def op_body(op: int, *, status: str = "committed", commit: str | None = None,
            events: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "op", "op": op, "kind": "cell", "principal": "human", "status": status,
            "error": None, "code": None, "commit": commit, "events": events or [],
            "started_at": AT, "finished_at": f"2026-01-02T03:04:{op:02}.000Z", **extra}


@pytest.fixture
def published(log: AuditLog) -> AuditLog:
    """Five ops, four committed, five events, all published by ``recover``."""
    log.ensure_genesis(None)
    log.append(op_body(1, commit="c1", events=[event(1, "a.x", "alice"),
                                               event(2, "b.y", "bob")]))
    log.append(op_body(2, status="failed"))
    log.append(op_body(3, commit="c3", events=[event(3, "a.z", "alice"),
                                               event(4, "a.x", "bob")]))
    log.append(op_body(4, commit="c4"))
    log.append(op_body(5, commit="c5", events=[event(5, "c", "alice")]))
    assert log.recover("c5", lambda commit: True) == []
    return log


@pytest.mark.parametrize("kwargs, seqs", [
    ({}, [1, 2, 3, 4, 5]),
    ({"seq": 0}, [1, 2, 3, 4, 5]),
    ({"seq": 1}, [2, 3, 4, 5]),       # inside op 1's events
    ({"seq": 2}, [3, 4, 5]),          # op 1's last event
    ({"seq": 3}, [4, 5]),
    ({"seq": 5}, []),
    ({"op": 0}, [1, 2, 3, 4, 5]),
    ({"op": 1}, [3, 4, 5]),
    ({"op": 3}, [5]),
    ({"op": 5}, []),
    ({"topic": "a.x"}, [1, 4]),       # op 3 holds a.z too
    ({"topic": "a.*"}, [1, 3, 4]),
    ({"topic": "c"}, [5]),            # after two ops with other topics
    ({"topic": "**"}, [1, 2, 3, 4, 5]),
    ({"topic": "d"}, []),
    ({"principal": "bob"}, [2, 4]),   # the second event of each op
    ({"principal": "alice"}, [1, 3, 5]),
    ({"limit": 0}, []),
    ({"limit": -1}, []),
    ({"limit": 1}, [1]),
    ({"limit": 2}, [1, 2]),
    ({"limit": 3}, [1, 2, 3]),
    ({"limit": 9}, [1, 2, 3, 4, 5]),
    ({"seq": 1, "topic": "a.*", "principal": "bob", "limit": 5}, [4]),
    ({"op": 1, "principal": "alice"}, [3, 5]),
])
def test_events_since_filters(published: AuditLog, kwargs: dict[str, Any],
                              seqs: list[int]) -> None:
    assert [found["seq"] for found in published.events_since(**kwargs)] == seqs


def test_an_event_as_subscribers_see_it(published: AuditLog) -> None:
    assert published.events_since(seq=3) == [
        {"seq": 4, "topic": "a.x", "principal": "bob", "op": 3, "depth": 0, "commit": "c3",
         "at": "2026-01-02T03:04:03.000Z", "payload": {"n": 4}},
        {"seq": 5, "topic": "c", "principal": "alice", "op": 5, "depth": 1, "commit": "c5",
         "at": "2026-01-02T03:04:05.000Z", "payload": {"n": 5}},
    ]


def test_payloads_by_reference_are_read_opened_or_shown_erased(log: AuditLog) -> None:
    sealed = log.keyring.seal(["c-1"], json.dumps("Zoe").encode())
    marker = {"$personal": {"subject": "c-1", "sealed": base64.b64encode(sealed).decode()}}
    ref = log.store_payload(json.dumps({"name": marker, "n": [1, marker]}).encode())
    plain = log.store_payload(b'{"big": "payload"}')
    log.ensure_genesis(None)
    log.append(op_body(1, commit="c1", events=[
        event(1, "p", "alice", ref=ref, subjects=["c-1"]),
        event(2, "p", "alice", ref=plain),
        event(3, "p", "alice", ref="0" * 64, subjects=["c-2"]),
        event(4, "p", "alice", ref="1" * 64),
    ]))
    log.recover("c1", lambda commit: True)
    opened = {"$personal": {"subject": "c-1", "value": "Zoe"}}
    assert [found["payload"] for found in log.events_since()] == [
        {"name": opened, "n": [1, opened]},
        {"big": "payload"},
        {"$erased": {"subjects": ["c-2"]}},
        {"$erased": {"subjects": []}},
    ]
    assert log.keyring.destroy("c-1")
    gone = {"$personal": {"subject": "c-1", "erased": True}}
    assert log.events_since(limit=1)[0]["payload"] == {"name": gone, "n": [1, gone]}


def test_nothing_is_published_before_recovery_or_beyond_published(tmp_path: Path) -> None:
    writer = new_log(tmp_path)
    writer.ensure_genesis(None)
    assert writer.published == 0
    writer.append(op_body(1, commit="c1", events=[event(1, "t", "human")]))
    assert writer.events_since() == []  # its commit is not visible yet
    writer.published = 1
    assert [found["seq"] for found in writer.events_since()] == [1]
    writer.append(op_body(2, commit="c2", events=[event(2, "t", "human")]))
    writer.append(op_body(3, commit="c3", events=[event(3, "t", "human")]))
    assert [found["seq"] for found in writer.events_since()] == [1]
    writer.close()
    reader = new_log(tmp_path)
    assert reader.published == -1
    assert reader.events_since() == []
    reader.recover("c3", lambda commit: True)
    assert reader.published == 3
    assert [found["seq"] for found in reader.events_since()] == [1, 2, 3]


# -- recover --------------------------------------------------------------------------------


def test_recover_starts_the_chain_with_a_genesis_that_adopts_the_head(log: AuditLog) -> None:
    assert log.recover("h" * 40, lambda commit: True) == []
    assert [(entry.type, log.read(0)["adopts"]) for entry in log.entries] == [
        ("genesis", "h" * 40)]
    assert log.published == 0


def test_recover_voids_an_op_whose_commit_was_never_published(log: AuditLog) -> None:
    log.ensure_genesis(None)
    log.append(op_body(1, commit="c1"))
    log.append(op_body(2, commit="c2"))
    assert log.recover("c1", lambda commit: commit == "c1") == [
        "op 2 was voided: its commit was never published"]
    void = log.read(3)
    assert {key: void[key] for key in ("type", "voids", "op", "reason")} == {
        "type": "void", "voids": 2, "op": 2,
        "reason": "the process died before this op's commit was published; the op did not "
                  "happen"}
    assert log.last_commit_index() == 1 and log.published == 3


@pytest.mark.parametrize("head, exists", [("c2", False), ("c1", True)])
def test_recover_leaves_a_commit_that_is_the_head_or_exists(
        log: AuditLog, head: str, exists: bool) -> None:
    """A commit that exists but is not the head is verify's to judge (a rewritten history)."""
    log.ensure_genesis(None)
    log.append(op_body(1, commit="c1"))
    log.append(op_body(2, commit="c2"))
    assert log.recover(head, lambda commit: exists) == []
    assert len(log) == 3 and log.last_commit_index() == 2


def test_recover_voids_a_prune_whose_history_was_never_published(log: AuditLog) -> None:
    log.ensure_genesis(None)
    log.append(op_body(1, commit="c1"))
    log.append({"type": "prune", "from": "c1", "to": "p1"})
    assert log.recover("c1", lambda commit: commit == "c1") == [
        "an interrupted prune was voided: nothing was pruned"]
    void = log.read(3)
    assert {key: void[key] for key in ("type", "voids", "reason")} == {
        "type": "void", "voids": 2,
        "reason": "the process died before the pruned history was published; nothing was "
                  "pruned"}
    assert "op" not in void
    assert log.last_prune_index() is None and log.last_commit_index() == 1


@pytest.mark.parametrize("to, head, known", [
    ("p1", "p1", set()),          # the head: published
    ("p1", "c1", {"p1"}),         # exists: verify's to judge
    (None, "c1", set()),          # no target to judge
    (7, "c1", set()),
])
def test_recover_leaves_a_prune_it_cannot_judge_void(
        log: AuditLog, to: Any, head: str, known: set[str]) -> None:
    log.ensure_genesis(None)
    log.append({"type": "prune", "from": "c0", "to": to})
    assert log.recover(head, lambda commit: commit in known) == []
    assert len(log) == 2 and log.last_prune_index() == 1


def test_recover_judges_the_newest_of_a_commit_and_a_prune(log: AuditLog) -> None:
    log.ensure_genesis(None)
    log.append({"type": "prune", "from": "c0", "to": "p1"})
    log.append(op_body(1, commit="c1"))
    assert log.recover("p1", lambda commit: commit == "p1") == [
        "op 1 was voided: its commit was never published"]
    assert [entry.type for entry in log.entries] == ["genesis", "prune", "op", "void"]


# -- restore_records ------------------------------------------------------------------------


@pytest.fixture
def lines(tmp_path: Path) -> list[bytes]:
    """Five records' lines: genesis and four failed ops."""
    source = new_log(tmp_path, durable=False)
    source.ensure_genesis(None)
    for op in range(1, 5):
        source.append(op_body(op, status="failed"))
    source.close()
    return source.path.read_bytes().splitlines(keepends=True)


@pytest.fixture
def chain(tmp_path: Path) -> Path:
    return tmp_path / "chain.jsonl"


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def recording(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return calls


def test_restore_into_a_missing_chain_writes_from_genesis_and_syncs(
        chain: Path, lines: list[bytes], fsyncs: list[int]) -> None:
    assert restore_records(chain, lines[:3]) == 3
    assert chain.read_bytes() == b"".join(lines[:3])
    assert len(fsyncs) == 1


@pytest.mark.parametrize("held", [b"", b'{"at":"20'])
def test_restore_into_an_empty_or_torn_first_record(
        chain: Path, lines: list[bytes], held: bytes) -> None:
    chain.write_bytes(held)
    assert restore_records(chain, lines[:2], durable=False) == 2
    assert chain.read_bytes() == b"".join(lines[:2])
    assert [path.read_bytes() for path in chain.parent.glob("torn-*.bin")] == \
        ([held] if held else [])


def test_restore_appends_only_the_next_records_after_the_last_whole_line(
        chain: Path, lines: list[bytes], fsyncs: list[int]) -> None:
    chain.write_bytes(lines[0])  # one record: the window starts at the file's first byte
    assert restore_records(chain, [lines[0], lines[2], lines[1], lines[2], lines[3]],
                           durable=False) == 3
    assert chain.read_bytes() == b"".join(lines[:4])
    assert fsyncs == []


def test_restore_cuts_a_torn_last_line_first(chain: Path, lines: list[bytes]) -> None:
    chain.write_bytes(b"".join(lines[:2]) + lines[2][:30])
    assert restore_records(chain, lines[2:], durable=False) == 3
    assert chain.read_bytes() == b"".join(lines)
    kept = list(chain.parent.glob("torn-*.bin"))  # evidence, as AuditLog keeps it
    assert [path.read_bytes() for path in kept] == [lines[2][:30]]


def test_restore_stops_at_a_record_that_does_not_chain(
        chain: Path, lines: list[bytes], fsyncs: list[int]) -> None:
    chain.write_bytes(b"".join(lines[:2]))
    forged = {**json.loads(lines[3]), "prev": "f" * 64}  # the next index, the wrong prev
    assert restore_records(chain, [lines[2], json.dumps(forged).encode() + b"\n",
                                   lines[3]]) == 1
    assert chain.read_bytes() == b"".join(lines[:3])
    assert len(fsyncs) == 1


def test_restore_writes_and_syncs_nothing_when_the_chain_holds_every_record(
        chain: Path, lines: list[bytes], fsyncs: list[int]) -> None:
    chain.write_bytes(b"".join(lines))
    assert restore_records(chain, lines[1:]) == 0
    assert restore_records(chain, [b"[1, 2]\n"]) == 0
    assert chain.read_bytes() == b"".join(lines)
    assert fsyncs == []


def long_chain(tmp_path: Path, size: int) -> list[bytes]:
    """Genesis, a failed op whose record is about ``size`` bytes long, two more after it."""
    source = new_log(tmp_path / "long", durable=False)
    source.ensure_genesis(None)
    source.append(op_body(1, status="failed", output="x" * size))
    source.append(op_body(2, status="failed"))
    source.append(op_body(3, status="failed"))
    source.close()
    return source.path.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("held", [2, 3])
@pytest.mark.parametrize("size", [1 << 10, (1 << 20) - 900, 3 << 19, 5 << 20])
def test_restore_finds_the_last_record_however_long_it_is(
        tmp_path: Path, chain: Path, size: int, held: int) -> None:
    """An op's record can pass 1 MiB (10,000 events of up to 1 KB each are allowed).

    With ``held=2`` the long record is the last one the chain holds; with ``held=3`` a
    short one follows it, and the first 1 MiB read back starts inside the long one.
    """
    (tmp_path / "long").mkdir()
    lines = long_chain(tmp_path, size)
    assert len(lines[1]) > size
    chain.write_bytes(b"".join(lines[:held]))
    assert restore_records(chain, lines[1:], durable=False) == 4 - held
    assert chain.read_bytes() == b"".join(lines)


@pytest.mark.parametrize("size", [3 << 19, 5 << 20])
def test_restore_cuts_a_torn_line_longer_than_the_window(
        tmp_path: Path, chain: Path, size: int) -> None:
    (tmp_path / "long").mkdir()
    lines = long_chain(tmp_path, size)
    chain.write_bytes(b"".join(lines[:2]) + lines[2][:-1] + b"y" * size)
    assert restore_records(chain, lines[2:], durable=False) == 2
    assert chain.read_bytes() == b"".join(lines)


def test_a_workspace_opens_after_a_crash_that_follows_an_op_with_a_long_record(
        tmp_path: Path) -> None:
    """The crash leaves the op in the commit tail; the next open restores from it."""
    import shutil

    from core_support import CoreEnv

    env = CoreEnv(tmp_path / "ws")
    try:
        env.run("for i in range(1400): bus.emit('big.event', 'x' * 800)")
        assert env.workspace is not None and env.workspace.tail.frames  # not folded yet
        assert len(env.chain.read_bytes()) > 1 << 20
        shutil.copytree(tmp_path / "ws", tmp_path / "crashed")  # what a kill -9 leaves
    finally:
        env.close()
    crashed = CoreEnv(tmp_path / "crashed")
    try:
        assert "folded 1 commit(s)" in (crashed.restore_report.recovery or "")
        assert len(crashed.image.audit.events_since()) == 1400
    finally:
        crashed.close()
