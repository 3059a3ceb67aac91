"""The audit log's own contract, pinned on an ``AuditLog`` alone (no workspace, no image).

These close gaps mutation testing (``scripts/mutation audit.log``) found: the
tests of this directory drive the log through an image, so what the image
never does was never checked.  Pinned here: the in-memory index a void
record updates (the idempotency keys, the newest commit and the newest prune
it falls back to), the ``effect`` records' keys, which records count as
unchanged or keyed, ``next_seq`` and ``binding``; ``retract``, ``sync`` and the
``unsynced`` flag, which appends fsync the chain (and which never do); the
errors a damaged, read-only or torn log raises, word for word; a full disk
while appending, syncing, storing a payload or noting the running op (what
the user is told, and the chain left as it was); payloads stored, deleted
(zeroed first) and read back; sealed code; the running op's note; closing
and pickling a log that holds open files.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from audit_support import new_log, reseal
from kernos.audit import log as log_module
from kernos.audit.canonical import canonical, digest
from kernos.audit.log import AuditLog, record_hash
from kernos.errors import AuditError, DiskFull

AT = "2026-01-02T03:04:05.000Z"


def op_body(op: int, *, status: str = "committed", commit: str | None = None,
            events: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """An ``op`` record's body, as kernos.audit.record writes it (the fields the log reads)."""
    return {"type": "op", "op": op, "kind": "cell", "principal": "human", "status": status,
            "error": None, "code": None, "commit": commit, "events": events or [],
            "started_at": AT, "finished_at": AT, **extra}


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every fd passed to ``os.fsync`` from now on (the calls still happen)."""
    calls: list[int] = []
    real = os.fsync

    def recording(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return calls


def full_disk_after(half: bool) -> Callable[[int, bytes | memoryview], None]:
    """A ``write_all`` that writes half its data (or nothing), then finds the disk full."""
    def write_all(fd: int, data: bytes | memoryview) -> None:
        if half:
            os.write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write_all


def enospc(*_args: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# -- the in-memory index --------------------------------------------------------------------


def test_a_void_falls_back_to_the_newest_earlier_commit_that_wrote_a_snapshot(
        log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    log.append(op_body(1, commit="a" * 40))                              # 1: the one left
    log.append(op_body(2, commit="c" * 40))                              # 2
    log.append({"type": "void", "voids": 2, "op": 2})                    # 3
    log.append(op_body(3, commit="a" * 40, unchanged=True))              # 4: no snapshot
    log.append(op_body(4, status="rolled back"))                         # 5
    log.append({"type": "died", "op": 5, "principal": "human", "kind": "cell",
                "code": None, "started_at": AT})                         # 6
    log.append({"type": "prune", "from": "a" * 40, "to": "d" * 40})      # 7
    log.append(op_body(6, commit="b" * 40))                              # 8
    assert log.last_commit_index() == 8
    log.append({"type": "void", "voids": 8, "op": 6})
    assert log.last_commit_index() == 1
    assert [entry.voided for entry in log.entries] == [
        False, False, True, False, False, False, False, False, True, False]
    assert log.binding()["from"] == 1
    reopened = new_log(log.root)
    assert reopened.last_commit_index() == 1
    assert reopened.last_prune_index() == 7


def test_voiding_the_only_commit_leaves_none_and_binds_from_the_first_record(
        log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    log.append(op_body(1, status="failed"))
    first = log.append(op_body(2, commit="a" * 40))
    log.append({"type": "void", "voids": first["index"], "op": 2})
    assert log.last_commit_index() is None
    assert log.binding() == {"index": 4, "from": 0,
                             "hashes": [entry.hash for entry in log.entries]}


def test_an_unchanged_commit_does_not_move_the_last_commit(log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    log.append(op_body(1, commit="a" * 40))
    log.append(op_body(2, commit="a" * 40, unchanged=True))
    log.append(op_body(3, commit="a" * 40, unchanged="yes"))  # only ``true`` means unchanged
    assert [entry.unchanged for entry in log.entries] == [False, False, True, False]
    assert log.last_commit_index() == 3
    log.append(op_body(4, commit="a" * 40, unchanged=True))
    assert log.last_commit_index() == 3
    assert new_log(log.root).last_commit_index() == 3


def test_a_voided_prune_falls_back_to_the_newest_earlier_prune_not_voided(
        log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    log.append({"type": "prune", "from": "a", "to": "b"})                # 1, voided below
    log.append({"type": "void", "voids": 1})                             # 2
    log.append({"type": "prune", "from": "a", "to": "c"})                # 3: the one left
    log.append(op_body(1, commit="c" * 40))                              # 4
    log.append({"type": "prune", "from": "c", "to": "e"})                # 5
    assert log.last_prune_index() == 5
    log.append({"type": "void", "voids": 5})
    assert log.last_prune_index() == 3
    assert new_log(log.root).last_prune_index() == 3
    log.append({"type": "void", "voids": 3})
    assert log.last_prune_index() is None


def test_voiding_an_older_record_keeps_the_newest_prune(log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    log.append(op_body(1, commit="a" * 40))
    log.append({"type": "prune", "from": "a" * 40, "to": "b" * 40})
    log.append({"type": "void", "voids": 1, "op": 1})
    assert log.last_prune_index() == 2
    assert log.last_commit_index() is None


def test_a_void_that_names_no_earlier_record_voids_nothing(log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    log.append(op_body(1, commit="a" * 40, key="k"))
    log.append({"type": "void", "voids": 2})    # itself
    log.append({"type": "void", "voids": 99})   # beyond the chain
    last = log.append({"type": "void"})         # no target
    log.close()
    with open(log.path, "ab") as chain:         # not an index (written by hand: append
        chain.write(resealed_line({             # is only ever given ints)
            "v": 1, "at": AT, "type": "void", "voids": "1", "index": 5,
            "prev": last["hash"]}))
    for opened in (log, new_log(log.root)):
        assert not any(entry.voided for entry in opened.entries)
        assert opened.last_commit_index() == 1
        assert opened.committed_with_key("k") == opened.read(1)


def test_idempotency_keys_find_the_committed_record_until_it_is_voided(
        log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    log.append(op_body(1, status="failed", key="k-1"))     # not committed: not found
    first = log.append(op_body(2, commit="a" * 40, key="k-1"))
    log.append(op_body(3, commit="b" * 40, key="k-1"))     # a second one: the first stays
    log.append(op_body(4, commit="c" * 40))                # no key
    log.append(op_body(5, commit="d" * 40, key=7))         # not a string: no key
    assert log.committed_with_key("k-1") == first
    assert log.committed_with_key("k-2") is None
    assert [entry.key for entry in log.entries] == [None, "k-1", "k-1", "k-1", None, None]
    log.append({"type": "void", "voids": 3, "op": 3})      # the later one: the first stays
    assert log.committed_with_key("k-1") == first
    log.append({"type": "void", "voids": 2, "op": 2})
    assert log.committed_with_key("k-1") is None
    assert new_log(log.root).committed_with_key("k-1") is None
    again = log.append(op_body(6, commit="e" * 40, key="k-1"))
    assert log.committed_with_key("k-1") == again


def test_effect_state_is_the_newest_effect_record_of_its_key(log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    assert log.effect_state("mail-1") is None
    log.append(op_body(1, commit="a" * 40, key="mail-1"))  # an op's key is not an effect's
    assert log.effect_state("mail-1") is None
    log.append({"type": "effect", "key": "mail-1", "state": "pending"})
    newest = log.append({"type": "effect", "key": "mail-1", "state": "done"})
    log.append({"type": "effect", "key": "mail-2", "state": "pending"})
    log.append({"type": "effect", "state": "orphan"})
    assert log.effect_state("mail-1") == newest
    assert new_log(log.root).effect_state("mail-1") == newest
    assert log.effect_state("mail-3") is None


def test_next_seq_follows_the_last_record_with_events(log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    assert log.next_seq == 1
    events = [{"seq": seq, "topic": "t", "principal": "human", "depth": 0, "payload": seq}
              for seq in (5, 6, 7)]
    log.append(op_body(1, commit="a" * 40, events=events))
    log.append(op_body(2, status="failed"))
    assert log.next_seq == 8
    assert log.entries[1].first_seq == 5 and log.entries[1].events == 3
    assert new_log(log.root).next_seq == 8


def test_binding_covers_at_most_the_newest_hashes(log: AuditLog,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "MAX_BOUND_HASHES", 3)
    log.append({"type": "genesis", "adopts": None})
    log.append(op_body(1, commit="a" * 40))
    for op in range(2, 7):
        log.append(op_body(op, status="failed"))
    assert log.binding() == {"index": 7, "from": 4,
                             "hashes": [entry.hash for entry in log.entries[4:]]}


# -- opening a log: damage, read-only, torn lines -------------------------------------------


def chain_of(log: AuditLog, count: int) -> list[bytes]:
    log.append({"type": "genesis", "adopts": None})
    for op in range(1, count):
        log.append(op_body(op, status="failed"))
    log.close()
    return log.path.read_bytes().splitlines(keepends=True)


def damage_message(path: Path, index: int, problem: str) -> str:
    return (f"the audit log {path} is damaged at record {index}: {problem}. Nothing was "
            "changed. Run `kernos audit verify` to see the first bad record; to keep working, "
            "move the audit directory aside (it is evidence) and restore it from a backup.")


def resealed_line(record: dict[str, Any]) -> bytes:
    record = {key: value for key, value in record.items() if key != "hash"}
    return canonical(reseal(record)) + b"\n"


@pytest.mark.parametrize("damage, index, problem", [
    ("array", 1, "it cannot be read (not an object)"),
    ("prev", 1, "it cannot be read (out of sequence)"),
    ("index", 2, "it cannot be read (out of sequence)"),
    ("edited", 2, "its hash does not match its content"),
])
def test_a_damaged_chain_is_refused_with_the_record_and_what_is_wrong(
        tmp_path: Path, damage: str, index: int, problem: str) -> None:
    lines = chain_of(new_log(tmp_path), 3)
    records = [json.loads(line) for line in lines]
    if damage == "array":
        lines[1] = b"[1, 2]\n"
    elif damage == "prev":   # a right index after a wrong prev, its own hash resealed
        lines[1] = resealed_line({**records[1], "prev": "f" * 64})
        lines[2] = resealed_line({**records[2], "prev": record_hash(
            {**records[1], "prev": "f" * 64})})
    elif damage == "index":  # a right prev after a wrong index
        lines[2] = resealed_line({**records[2], "index": 5})
    else:
        lines[2] = lines[2].replace(b'"status":"failed"', b'"status":"committed"')
    path = tmp_path / "audit" / "chain.jsonl"
    path.write_bytes(b"".join(lines))
    with pytest.raises(AuditError) as caught:
        new_log(tmp_path)
    assert str(caught.value) == damage_message(path, index, problem)
    assert (caught.value.index, caught.value.path) == (index, str(path))
    assert path.read_bytes() == b"".join(lines)


def test_a_torn_line_in_a_read_only_log_is_reported_not_cut(tmp_path: Path) -> None:
    lines = chain_of(new_log(tmp_path), 2)
    path = tmp_path / "audit" / "chain.jsonl"
    path.write_bytes(b"".join(lines) + b'{"at":"2026')
    with pytest.raises(AuditError) as caught:
        new_log(tmp_path, writable=False)
    assert str(caught.value) == damage_message(
        path, 2, "the last line is incomplete (an append was cut short)")
    assert (caught.value.index, caught.value.path) == (2, str(path))
    assert path.read_bytes() == b"".join(lines) + b'{"at":"2026'
    assert sorted(p.name for p in (tmp_path / "audit").iterdir()) == ["chain.jsonl"]


def test_a_writable_open_cuts_a_torn_line_and_keeps_it_aside(tmp_path: Path) -> None:
    lines = chain_of(new_log(tmp_path), 2)
    path = tmp_path / "audit" / "chain.jsonl"
    path.write_bytes(b"".join(lines) + b'{"at":"2026')
    reopened = new_log(tmp_path)
    assert path.read_bytes() == b"".join(lines)
    kept = [p for p in (tmp_path / "audit").iterdir() if p.name.startswith("torn-")]
    assert [p.read_bytes() for p in kept] == [b'{"at":"2026']
    assert reopened.notes == [f"an audit record cut short by a crash (11 bytes, never "
                              f"acknowledged) was moved to {kept[0].name}"]
    assert reopened.append(op_body(2, status="failed"))["index"] == 2
    reopened.close()


def test_appending_to_a_read_only_log_is_refused(tmp_path: Path) -> None:
    chain_of(new_log(tmp_path), 1)
    reader = new_log(tmp_path, writable=False)
    with pytest.raises(AuditError) as caught:
        reader.append(op_body(1))
    assert str(caught.value) == "this audit log was opened read-only"
    assert caught.value.path == str(tmp_path / "audit" / "chain.jsonl")
    assert len(new_log(tmp_path)) == 1


# -- appending: durability, a full disk ------------------------------------------------------


def test_appends_are_fsynced_by_default_and_unsynced_ones_are_flagged(
        tmp_path: Path, fsyncs: list[int]) -> None:
    log = new_log(tmp_path)  # durable unless told otherwise
    assert log.unsynced is False
    log.sync()  # nothing appended: nothing to sync, nothing created
    assert fsyncs == [] and not (tmp_path / "audit").exists()
    log.append({"type": "genesis", "adopts": None})
    chain = log.sync_target
    assert fsyncs == [chain] and log.unsynced is False
    record = log.append(op_body(1, commit="a" * 40), sync=False)
    assert fsyncs == [chain] and log.unsynced is True
    assert log.last_line == canonical(record) + b"\n"
    log.sync()
    assert fsyncs == [chain, chain] and log.unsynced is False
    log.sync()
    assert fsyncs == [chain, chain]
    log.close()


def test_a_log_that_is_not_durable_never_fsyncs(tmp_path: Path, fsyncs: list[int]) -> None:
    log = new_log(tmp_path, durable=False)
    log.append({"type": "genesis", "adopts": None})
    log.append(op_body(1, commit="a" * 40), sync=False)
    assert log.unsynced is False
    log.sync()
    log.store_payload(b"payload")
    assert fsyncs == []
    log.close()


@pytest.mark.parametrize("half", [True, False])
def test_a_full_disk_while_appending_leaves_the_chain_as_it_was(
        log: AuditLog, monkeypatch: pytest.MonkeyPatch, half: bool) -> None:
    monkeypatch.setattr(log_module, "utc_now", lambda: AT)
    log.append({"type": "genesis", "adopts": None})
    before = log.path.read_bytes()
    with monkeypatch.context() as patched:
        patched.setattr(log_module, "write_all", full_disk_after(half))
        with pytest.raises(DiskFull) as caught:
            log.append(op_body(1, commit="a" * 40))
    assert log.path.read_bytes() == before and len(log) == 1
    record = log.append(op_body(1, commit="a" * 40))  # the same append, once there is room
    line = canonical(record) + b"\n"
    error = caught.value
    assert (error.path, error.what, error.needed, error.then) == (
        str(log.path), "the audit log", len(line), "The record was not appended.")
    assert str(error).startswith(f"the disk is full: writing the audit log ({log.path}) "
                                 "failed with ENOSPC")
    assert f"{len(line):,} needed for this write. The record was not appended. " in str(error)
    assert log.path.read_bytes() == before + line


def test_a_full_disk_at_sync_says_the_record_is_not_durable(
        log: AuditLog, monkeypatch: pytest.MonkeyPatch) -> None:
    log.append({"type": "genesis", "adopts": None}, sync=False)
    monkeypatch.setattr(os, "fsync", enospc)
    with pytest.raises(DiskFull) as caught:
        log.sync()
    assert (caught.value.path, caught.value.what, caught.value.then) == (
        str(log.path), "the audit log (fsync)", "The record is not durable.")
    assert "writing the audit log (fsync)" in str(caught.value)
    assert log.unsynced is True


def test_retract_takes_back_the_last_record_only(log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    kept = log.append(op_body(1, commit="a" * 40, key="k"))
    before = log.path.read_bytes()
    log.append(op_body(2, commit="b" * 40, key="k2"), sync=False)
    log.published = 2
    with pytest.raises(AuditError) as caught:
        log.retract(1)
    assert str(caught.value) == "record 1 cannot be taken back: only the last record can"
    assert (caught.value.index, caught.value.path) == (1, str(log.path))
    log.retract(2)
    assert log.path.read_bytes() == before
    assert (len(log), log.head()) == (2, (1, kept["hash"]))
    assert log.unsynced is False and log.last_line == b""
    assert log.published == 1
    assert log.last_commit_index() == 1 and log.committed_with_key("k2") is None
    log.append(op_body(2, commit="c" * 40), sync=False)
    log.published = 0  # not yet published: taking it back publishes nothing
    log.retract(2)
    assert log.published == 0
    assert log.append(op_body(2, status="failed"))["prev"] == kept["hash"]


# -- payloads and code ------------------------------------------------------------------------


def test_payloads_are_stored_by_their_hash_durably_and_deleted_zeroed(
        tmp_path: Path, fsyncs: list[int]) -> None:
    log = new_log(tmp_path)  # no audit directory yet
    ref = log.store_payload(b"secret bytes")
    path = tmp_path / "audit" / "payloads" / ref
    assert ref == digest(b"secret bytes") and path.read_bytes() == b"secret bytes"
    assert log.payload(ref) == b"secret bytes"
    assert len(fsyncs) == 2  # the file, then its directory
    assert log.store_payload(b"secret bytes") == ref and len(fsyncs) == 2  # there already
    assert sorted(p.name for p in path.parent.iterdir()) == [ref]
    witness = tmp_path / "witness"
    os.link(path, witness)  # the same inode: what deleting leaves in its blocks
    fsyncs.clear()
    assert log.delete_payload(ref) is True
    assert not path.exists() and log.payload(ref) is None
    assert witness.read_bytes() == b"\0" * len(b"secret bytes")
    assert len(fsyncs) == 1
    assert log.delete_payload(ref) is False
    assert log.delete_payload("0" * 64) is False


def test_a_full_disk_while_storing_a_payload_says_the_record_was_not_appended(
        log: AuditLog, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos import _durable as objects

    monkeypatch.setattr(objects, "write_all", full_disk_after(True))
    with pytest.raises(DiskFull) as caught:
        log.store_payload(b"x" * 100)
    ref = digest(b"x" * 100)
    assert (caught.value.path, caught.value.what, caught.value.needed, caught.value.then) == (
        str(log.payload_dir / ref), "an audit payload", 100,
        "The record that refers to it was not appended.")
    assert "writing an audit payload (" in str(caught.value)
    assert list(log.payload_dir.iterdir()) == []  # no payload, no temporary


def sealed_code(log: AuditLog, source: str, subject: str) -> dict[str, Any]:
    """A code field sealed for ``subject``, as kernos.audit.record writes it."""
    sealed = log.keyring.seal([subject], source.encode())
    return {"sealed": [subject], "ref": log.store_payload(sealed), "size": len(source)}


def test_sealed_code_reads_back_until_its_subject_is_erased(log: AuditLog) -> None:
    from kernos.audit.erasure import erase

    first = "name = personal('Zoe', subject='c-1')"
    second = "name = personal('Ann', subject='c-2')"
    log.append({"type": "genesis", "adopts": None})
    log.append(op_body(1, commit="a" * 40, code=sealed_code(log, first, "c-1")))
    plain = {"sha256": digest(b"x = 1"), "size": 5, "ref": log.store_payload(b"x = 1")}
    log.append(op_body(2, commit="b" * 40, code=plain))
    log.append(op_body(3, commit="c" * 40, code=sealed_code(log, second, "c-2")))
    assert [log.code(op) for op in (1, 2, 3)] == [first, "x = 1", second]
    assert log.keyring.destroy("c-1")  # the key gone, the sealed payload still there
    assert [log.code(op) for op in (1, 2, 3)] == [None, "x = 1", second]
    report = erase(log, "c-2")  # in the log's workspace: its key, its code, its recordings
    assert report.payloads == (log.read(3)["code"]["ref"],) and report.key_destroyed
    assert log.read(report.record)["type"] == "erasure"
    assert [log.code(op) for op in (1, 2, 3)] == [None, "x = 1", None]
    assert log.delete_payload(plain["ref"])
    assert log.code(2) is None


# -- the running op's note --------------------------------------------------------------------


def test_the_running_ops_note_is_written_over_in_place_and_read_by_recover(
        log: AuditLog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "utc_now", lambda: AT)
    note = log.directory / "inflight.json"
    log.note_inflight(7, "alice-long-name", "cell", "ab" * 32)
    first = note.read_bytes()
    assert json.loads(first) == {
        "op": 7, "principal": "alice-long-name", "kind": "cell", "code": "ab" * 32,
        "started_at": AT}
    log.note_inflight(8, "bob", "agent", None)
    second = note.read_bytes()
    assert len(second) == len(first) and second.endswith(b" ")  # padded, not truncated
    assert second.startswith(b'{"op": 8, "principal": "bob", "kind": "agent", "code": null')
    notes = log.recover(None, lambda commit: True)
    assert log.read(1) == {**log.read(1), "type": "died", "op": 8, "principal": "bob",
                           "kind": "agent", "code": None, "started_at": AT}
    assert notes == ["op 8 was running when the kernel died; it was rolled back"]


def test_a_full_disk_while_noting_the_running_op_says_it_did_not_start(
        log: AuditLog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "write_all", full_disk_after(False))
    with pytest.raises(DiskFull) as caught:
        log.note_inflight(1, "human", "cell", None)
    assert (caught.value.path, caught.value.what, caught.value.then) == (
        str(log.directory / "inflight.json"), "the running op's note",
        "The op did not start: nothing ran.")
    assert "writing the running op's note (" in str(caught.value)


@pytest.mark.parametrize("content", [b"[1, 2]", b"not json", b'{"op": "7"}'])
def test_a_note_that_names_no_op_records_no_death(log: AuditLog, content: bytes) -> None:
    log.directory.mkdir()
    (log.directory / "inflight.json").write_bytes(content)
    assert log.recover(None, lambda commit: True) == []
    assert [entry.type for entry in log.entries] == ["genesis"]


# -- open files: closing, pickling ----------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_close_releases_the_open_files_and_the_log_reopens_them(log: AuditLog) -> None:
    before = open_fds()
    log.append({"type": "genesis", "adopts": None})
    assert open_fds() == before + 1
    log.close()
    assert open_fds() == before
    log.note_inflight(1, "human", "cell", None)
    log.append(op_body(1, status="failed"))
    assert open_fds() == before + 2
    log.close()
    log.close()
    assert open_fds() == before
    assert [entry.type for entry in new_log(log.root).entries] == ["genesis", "op"]


def test_a_copy_of_the_log_leaves_the_open_files_behind(log: AuditLog) -> None:
    log.append({"type": "genesis", "adopts": None})
    log.note_inflight(1, "human", "cell", None)
    copy = pickle.loads(pickle.dumps(log))
    assert copy.read(0) == log.read(0) and copy.head() == log.head()
    copy.close()  # closes nothing of the original's
    assert log.append(op_body(1, status="failed"))["index"] == 1
    log.note_inflight(2, "human", "cell", None)
    assert json.loads((log.directory / "inflight.json").read_bytes())["op"] == 2
