"""The pack writer of ``kernos.store.objects`` (:class:`ObjectStore`), pinned.

These close gaps mutation testing (``scripts/mutation store.objects``) found:
the journal's lines and when it is emptied, what ``sync`` makes durable (and
only once), when a sealed batch is kept for the commit tail and what
``append_frame``, ``unframe`` and ``pack_tail`` then write, the spill and frame
size boundaries, which background repack ``maintain`` starts and when, the
exact recovery notes and what recovery deletes, reads from the tail, packs
and loose files (a reader that sees a writer's new frame or pack), the
refusals outside a batch, and the ``DiskFull`` each writer reports.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disk_support import Syncs
from kernos.errors import DiskFull
from kernos.store import object_store as objects_module
from kernos.store import repack as repack_module
from kernos.store.object_store import ObjectStore
from kernos.store.objects import object_id
from kernos.store.packs import Pack, PackBuilder
from kernos.store.space import NOT_FOLDED, NOTHING_COMMITTED
from kernos.store.tail import Frame, Tail
from support import git


@pytest.fixture
def made(repo: Path, tmp_path: Path) -> Iterator[list[ObjectStore]]:
    """Stores made by a test, closed after it."""
    stores: list[ObjectStore] = []
    yield stores
    for store in stores:
        store.close()


@pytest.fixture
def new(repo: Path, tmp_path: Path, made: list[ObjectStore]) -> Any:
    def make(*, durable: bool = True, tail: Tail | None = None) -> ObjectStore:
        store = ObjectStore(repo, journal=tmp_path / "pending", scratch=tmp_path / "scratch",
                            durable=durable, tail=tail)
        made.append(store)
        return store
    return make


def tail_of(tmp_path: Path, *, writable: bool = True, durable: bool = False) -> Tail:
    return Tail(tmp_path / "tail", ref=lambda: None, writable=writable, durable=durable)


def packs(store: ObjectStore) -> list[Path]:
    return sorted(store.pack_dir.glob("*.pack")) if store.pack_dir.exists() else []


def count(pack: Path) -> int:
    opened = Pack(pack)
    try:
        return opened.count
    finally:
        opened.close()


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Syncs:
    return Syncs(monkeypatch)


def blob(store: ObjectStore, data: bytes) -> bytes:
    sha = object_id(b"blob", data)
    store.write(b"blob", data, sha)
    return sha


COMMIT = bytes.fromhex("c0ffee" * 6 + "0123")


# -- the batch and its journal --------------------------------------------------------


def test_writes_and_seals_outside_a_batch_are_refused(new: Any) -> None:
    store = new()
    sha = object_id(b"blob", b"a")
    outside = r"called outside begin\(\)/finish\(\)$"
    with pytest.raises(RuntimeError, match=r"^ObjectStore\.write " + outside):
        store.write(b"blob", b"a", sha)
    with pytest.raises(RuntimeError, match=r"^ObjectStore\.seal " + outside):
        store.seal(COMMIT)
    store.begin()
    store.write(b"blob", b"a", sha)
    store.seal(COMMIT)
    store.finish()
    with pytest.raises(RuntimeError, match=r"^ObjectStore\.write " + outside):
        store.write(b"blob", b"b", object_id(b"blob", b"b"))
    with pytest.raises(RuntimeError, match=r"^ObjectStore\.seal " + outside):
        store.seal(COMMIT)
    assert len(packs(store)) == 1


def test_the_journal_names_the_pack_then_the_commit_and_is_emptied_not_deleted(
        new: Any, tmp_path: Path) -> None:
    (tmp_path / "pending").write_text("what a crashed process left\n")
    store = new()
    store.begin()
    assert (tmp_path / "pending").read_bytes() == b""  # a batch starts an empty journal
    written = [store.write(b"blob", data, object_id(b"blob", data)) for data in (b"1", b"22")]
    assert store.write(b"blob", b"1", object_id(b"blob", b"1")) == 0  # once per batch
    assert packs(store) == []  # nothing is written before the seal
    store.seal(COMMIT)
    [pack] = packs(store)
    assert (tmp_path / "pending").read_text() == f"pack {pack.name}\ncommit {COMMIT.hex()}\n"
    assert count(pack) == 2 and pack.stat().st_size == 12 + sum(written) + 20
    assert store.read(object_id(b"blob", b"22")) == (b"blob", b"22")
    store.finish()
    assert (tmp_path / "pending").read_bytes() == b""
    fd = store._journal_fd
    store.begin()  # the same journal, kept open between batches
    assert store._journal_fd == fd
    blob(store, b"333")
    store.seal(COMMIT)
    second = next(path for path in packs(store) if path != pack)
    assert (tmp_path / "pending").read_text() == f"pack {second.name}\ncommit {COMMIT.hex()}\n"
    store.begin()  # a batch begun again without finishing starts over
    assert (tmp_path / "pending").read_bytes() == b""
    store.seal(COMMIT)
    assert (tmp_path / "pending").read_text() == f"commit {COMMIT.hex()}\n"
    store.finish()


def test_the_journal_is_a_plain_file_readable_by_all(new: Any, tmp_path: Path) -> None:
    old = os.umask(0o022)
    (tmp_path / "scratch").mkdir()  # left by an earlier process
    try:
        new().begin()
    finally:
        os.umask(old)
    assert (tmp_path / "pending").stat().st_mode & 0o777 == 0o644


def test_a_batch_spills_a_pack_when_it_reaches_the_spill_size(
        new: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(5000)
    builder = PackBuilder()
    builder.add(b"blob", data, object_id(b"blob", data))
    for limit, spilled in ((builder.size + 1, False), (builder.size, True)):
        monkeypatch.setattr(objects_module, "SPILL_BYTES", limit)
        store = new()
        store.begin()
        blob(store, data)
        assert len(packs(store)) == (1 if spilled else 0)
        if spilled:
            assert (tmp_path / "pending").read_text() == f"pack {packs(store)[0].name}\n"
        store.discard()
        assert (tmp_path / "pending").read_bytes() == b"" and packs(store) == []
        store.close()


def test_sync_makes_the_sealed_batch_durable_once_with_the_journal_and_the_others(
        new: Any, tmp_path: Path, syncs: Syncs) -> None:
    store = new()
    ref = tmp_path / "ref.tmp"
    ref.write_text("x")
    store.begin()
    blob(store, b"durable")
    store.seal(COMMIT)
    [pack] = packs(store)
    assert syncs.take() == []  # the seal itself syncs nothing
    store.sync(ref)
    journal = str(tmp_path / "pending")
    assert syncs.take() == sorted([str(pack), str(pack.with_suffix(".idx")), str(store.pack_dir),
                                   journal, str(ref)])
    store.sync(ref)  # the pack is durable already; the journal is synced again
    assert syncs.take() == sorted([journal, str(ref)])
    store.finish()
    store.sync(ref)  # no batch: only what it is given
    assert syncs.take() == [str(ref)]

    store.begin()  # a batch without a pack: its journal names only the commit
    store.seal(COMMIT)
    assert (tmp_path / "pending").read_text() == f"commit {COMMIT.hex()}\n"
    store.sync()
    assert syncs.take() == [journal]
    store.finish()


def test_a_store_that_is_not_durable_syncs_nothing(new: Any, tmp_path: Path,
                                                   syncs: Syncs) -> None:
    store = new(durable=False, tail=tail_of(tmp_path))
    store.begin()
    blob(store, b"volatile")
    store.seal(COMMIT, parent=None)
    store.append_frame()
    store.pack_tail()
    store.begin()
    blob(store, b"another")
    store.seal(COMMIT)
    store.sync(tmp_path)
    store.finish()
    assert len(packs(store)) == 2 and syncs.paths == []


def test_a_full_disk_is_reported_with_what_was_being_written(
        new: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    store = new()
    store.begin()
    blob(store, b"x" * 100)
    needed = store._builder.size
    with monkeypatch.context() as patched:
        patched.setattr(PackBuilder, "write", full)
        with pytest.raises(DiskFull) as raised:
            store.seal(COMMIT)
    assert (raised.value.what, raised.value.needed, raised.value.then) == (
        "a pack of the op's objects", needed, NOTHING_COMMITTED)
    assert raised.value.path == str(store.pack_dir)
    store.discard()

    store.begin()
    blob(store, b"y")
    with monkeypatch.context() as patched:
        patched.setattr(objects_module, "write_all", full)
        with pytest.raises(DiskFull) as raised:
            store.seal(COMMIT)
    assert (raised.value.what, raised.value.needed, raised.value.then) == (
        "a pack of the op's objects", store._builder.size, NOTHING_COMMITTED)
    store.discard()

    store.begin()  # nothing to pack: the journal is the first write
    with monkeypatch.context() as patched:
        patched.setattr(objects_module, "write_all", full)
        with pytest.raises(DiskFull) as raised:
            store.seal(COMMIT)
    assert (raised.value.what, raised.value.then) == ("the commit journal", NOTHING_COMMITTED)
    assert raised.value.path == str(tmp_path / "pending")
    store.discard()

    store.begin()
    blob(store, b"z")
    store.seal(COMMIT)
    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", full)
        with pytest.raises(DiskFull) as raised:
            store.sync(tmp_path)
    assert (raised.value.what, raised.value.then) == (
        "the op's pack, its journal and audit record (fsync)", NOTHING_COMMITTED)
    assert raised.value.path == str(store.pack_dir)
    store.discard()

    fresh = new()
    real_open = os.open

    def no_room_for_the_journal(path: Any, *args: Any, **kwargs: Any) -> int:
        if Path(path) == tmp_path / "pending":
            full()
        return real_open(path, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(os, "open", no_room_for_the_journal)
        with pytest.raises(DiskFull) as raised:
            fresh.begin()
    assert (raised.value.what, raised.value.then) == ("the commit journal", NOTHING_COMMITTED)


def test_a_full_disk_while_packing_the_tail_leaves_the_tail_to_a_later_fold(
        new: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = new(tail=tail_of(tmp_path))
    store.begin()
    blob(store, b"framed")
    store.seal(COMMIT, parent=None)
    store.append_frame()

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PackBuilder, "write", full)
    with pytest.raises(DiskFull) as raised:
        store.pack_tail()
    frame_objects = store.tail.frames[0].objects if store.tail else {}
    assert (raised.value.what, raised.value.then) == (
        "a pack of the commit tail's objects", NOT_FOLDED)
    assert raised.value.needed == 12 + sum(len(raw) for raw in frame_objects.values())


# -- the commit tail --------------------------------------------------------------------


def test_a_small_batch_with_its_parent_is_kept_for_the_tail_and_appended_as_a_frame(
        new: Any, tmp_path: Path) -> None:
    tail = tail_of(tmp_path, durable=True)
    store = new(tail=tail)
    assert store.framed_parent is ...
    parent = b"\x01" * 20
    store.begin()
    shas = [blob(store, data) for data in (b"one", b"two")]
    store.seal(COMMIT, parent=parent)
    assert store.framed_parent == parent
    assert packs(store) == [] and (tmp_path / "pending").read_bytes() == b""  # nothing written
    entries = dict(store._builder.raw_entries())
    store.append_frame(b"the audit record", sync=False)
    assert store.framed_parent is ...
    assert tail.frames == [Frame(COMMIT, parent, entries, b"the audit record")]
    assert tail.appended == 1 and tail.synced == 0  # the caller syncs (a group commit)
    assert [store.read(sha) for sha in shas] == [(b"blob", b"one"), (b"blob", b"two")]
    assert all(store.exists(sha) for sha in shas)
    out = bytearray(3)
    store.read_blob_into(shas[1], memoryview(out))
    assert bytes(out) == b"two"
    store.finish()

    store.begin()  # the next batch starts with an empty builder: only its own objects
    third = blob(store, b"three")
    store.seal(b"\x02" * 20, parent=None)
    assert store.framed_parent is None  # the first commit of a branch
    store.append_frame()
    assert list(tail.frames[1].objects) == [third] and tail.frames[1].parent is None
    assert tail.frames[1].record == b"" and tail.synced == 2  # synced by default
    store.finish()


class Crashed(BaseException):
    pass


def test_the_frame_crash_point_comes_before_the_frame_is_written(
        new: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``KERNOS_CRASH_AT=frame`` (the durability tests) kills the process there."""
    from kernos import _faults

    def kill(pid: int, signal: int) -> None:
        raise Crashed

    tail = tail_of(tmp_path)
    store = new(tail=tail)
    store.begin()
    commit = blob(store, b"never appended")
    store.seal(commit, parent=None)
    monkeypatch.setattr(_faults, "_armed", "frame")
    monkeypatch.setattr(_faults, "_left", 1)
    monkeypatch.setattr(_faults.os, "kill", kill)
    with pytest.raises(Crashed):
        store.append_frame()
    assert tail.frames == [] and not (tmp_path / "tail").exists()


def test_a_batch_is_packed_rather_than_framed_when_the_tail_cannot_take_it(
        new: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"some object"

    def sealed(store: ObjectStore, **parent: Any) -> bool:
        """Whether the sealed batch was kept for the tail (else it was packed)."""
        store.begin()
        blob(store, data)
        store.seal(COMMIT, **parent)
        framed = store.framed_parent is not ...
        assert framed == (packs(store) == [])
        assert (tmp_path / "pending").read_text() == (
            "" if framed else f"pack {packs(store)[0].name}\ncommit {COMMIT.hex()}\n")
        store.discard()
        assert packs(store) == []
        store.close()
        return framed

    assert sealed(new(tail=tail_of(tmp_path)), parent=None)
    assert not sealed(new(tail=None), parent=None)
    assert not sealed(new(tail=tail_of(tmp_path, writable=False)), parent=None)
    assert not sealed(new(tail=tail_of(tmp_path)))  # no parent given: not for the tail
    builder = PackBuilder()
    builder.add(b"blob", data, object_id(b"blob", data))
    monkeypatch.setattr(objects_module, "FRAME_MAX", builder.size)
    assert sealed(new(tail=tail_of(tmp_path)), parent=None)  # exactly the largest frame
    monkeypatch.setattr(objects_module, "FRAME_MAX", builder.size - 1)
    assert not sealed(new(tail=tail_of(tmp_path)), parent=None)


def test_a_batch_that_spilled_a_pack_is_not_framed(new: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects_module, "SPILL_BYTES", 1)
    store = new(tail=tail_of(tmp_path))
    store.begin()
    blob(store, b"spilled")
    store.seal(COMMIT, parent=None)
    assert store.framed_parent is ...
    [pack] = packs(store)
    assert (tmp_path / "pending").read_text() == f"pack {pack.name}\ncommit {COMMIT.hex()}\n"
    store.finish()


def test_unframe_writes_the_kept_batch_as_a_pack_after_all(
        new: Any, tmp_path: Path, syncs: Syncs) -> None:
    store = new(tail=tail_of(tmp_path))
    store.begin()
    store.unframe()  # nothing kept: nothing to do
    sha = blob(store, b"unframed")
    store.seal(COMMIT, parent=b"\x05" * 20)
    store.unframe()
    assert store.framed_parent is ...
    [pack] = packs(store)
    assert (tmp_path / "pending").read_text() == f"pack {pack.name}\ncommit {COMMIT.hex()}\n"
    store.sync()
    assert syncs.take() == sorted([str(pack), str(pack.with_suffix(".idx")),
                                   str(store.pack_dir), str(tmp_path / "pending")])
    store.unframe()  # once only
    assert len(packs(store)) == 1 and store.read(sha) == (b"blob", b"unframed")
    store.finish()


def test_packing_the_tail_writes_its_objects_once_in_one_durable_pack(
        new: Any, tmp_path: Path, repo: Path, syncs: Syncs) -> None:
    tail = tail_of(tmp_path)
    store = new(tail=tail)
    store.pack_tail()  # an empty tail: no pack
    assert packs(store) == [] and syncs.paths == []
    shared = b"in both frames"
    parent = None
    for number, commit in enumerate((b"\x0a" * 20, b"\x0b" * 20)):
        store.begin()
        blob(store, shared)
        blob(store, b"frame %d" % number)
        store.seal(commit, parent=parent)
        store.append_frame()
        store.finish()
        parent = commit
    syncs.take()
    store.pack_tail()
    [pack] = packs(store)
    assert count(pack) == 3
    assert syncs.take() == sorted([str(pack), str(pack.with_suffix(".idx")), str(store.pack_dir)])
    for data in (shared, b"frame 0", b"frame 1"):
        assert git(repo, "cat-file", "blob", object_id(b"blob", data).hex()) == data
    assert (tmp_path / "pending").read_bytes() == b""  # the fold's pack is not journaled


def test_objects_added_as_pack_entries_are_packed_once(new: Any) -> None:
    store = new(durable=False)
    store.add_packed([])
    assert not store.pack_dir.exists() or packs(store) == []
    builder = PackBuilder()
    for data in (b"a", b"b"):
        builder.add(b"blob", data, object_id(b"blob", data))
    entries = list(builder.raw_entries())
    store.add_packed([*entries, entries[0]])
    [pack] = packs(store)
    assert count(pack) == 2 and store.read(object_id(b"blob", b"b")) == (b"blob", b"b")


# -- reading ------------------------------------------------------------------------------


def test_a_missing_object_is_reported_missing_everywhere(new: Any, tmp_path: Path) -> None:
    store = new(tail=tail_of(tmp_path))
    sha = b"\x42" * 20
    assert not store.exists(sha)
    with pytest.raises(FileNotFoundError, match=f"^object {sha.hex()} is missing$"):
        store.read(sha)
    with pytest.raises(FileNotFoundError, match=f"^object {sha.hex()} is missing$"):
        store.read_blob_into(sha, memoryview(bytearray(1)))


def test_a_reader_finds_what_the_writer_added_since_it_looked(
        new: Any, tmp_path: Path, repo: Path) -> None:
    writer = new(tail=tail_of(tmp_path))
    reader = ObjectStore(repo, journal=tmp_path / "pending", scratch=tmp_path / "scratch",
                         durable=False, tail=tail_of(tmp_path, writable=False))
    framed, packed = b"in a frame", b"in a pack"
    for data in (framed, packed):  # not there yet: the reader looks, and misses
        assert not reader.exists(object_id(b"blob", data))
    writer.begin()
    framed_sha = blob(writer, framed)
    writer.seal(framed_sha, parent=None)  # a frame holds its commit: here, the blob
    writer.append_frame()
    writer.finish()
    writer.begin()
    packed_sha = blob(writer, packed)
    writer.seal(b"\x0d" * 20)
    writer.finish()
    for sha, data in ((framed_sha, framed), (packed_sha, packed)):
        assert reader.read(sha) == (b"blob", data)
        out = bytearray(len(data))
        reader.read_blob_into(sha, memoryview(out))
        assert bytes(out) == data
    second = ObjectStore(repo, journal=tmp_path / "pending", scratch=tmp_path / "scratch",
                         durable=False, tail=tail_of(tmp_path, writable=False))
    assert second.exists(framed_sha)  # a frame written before it opened
    reader.close()
    second.close()
    third = ObjectStore(repo, journal=tmp_path / "pending", scratch=tmp_path / "scratch",
                        durable=False, tail=tail_of(tmp_path, writable=False))
    writer.begin()
    late = blob(writer, b"a later pack")
    writer.seal(b"\x0e" * 20)
    writer.finish()
    assert third.exists(late) and third.exists(packed_sha)
    third.close()


def test_a_reader_sees_a_frame_appended_after_its_first_read(new: Any, tmp_path: Path) -> None:
    writer = new(tail=tail_of(tmp_path))
    reader = new(durable=False, tail=tail_of(tmp_path, writable=False))
    writer.begin()
    first = blob(writer, b"first")
    writer.seal(first, parent=None)  # a frame holds its commit: here, the blob
    writer.append_frame()
    writer.finish()
    assert reader.read(first) == (b"blob", b"first")  # the reader loads the tail
    writer.begin()
    second = blob(writer, b"second")
    writer.seal(second, parent=first)
    writer.append_frame()
    writer.finish()
    assert reader.exists(second)
    assert reader.read(second) == (b"blob", b"second")
    writer.begin()
    third = blob(writer, b"third")
    writer.seal(third, parent=second)
    writer.append_frame()
    writer.finish()
    out = bytearray(5)
    reader.read_blob_into(third, memoryview(out))  # the first look after the append
    assert bytes(out) == b"third"


def test_loose_objects_git_wrote_are_read_by_the_pack_store(new: Any, repo: Path) -> None:
    store = new()
    data = b"loose, written by git"
    sha = bytes.fromhex(git(repo, "hash-object", "-w", "--stdin", data=data).decode().strip())
    assert store.exists(sha) and store.read(sha) == (b"blob", data)
    out = bytearray(len(data))
    store.read_blob_into(sha, memoryview(out))
    assert bytes(out) == data


def test_objects_in_the_tail_or_a_pack_are_read_without_looking_for_loose_files(
        new: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = new(tail=tail_of(tmp_path))
    store.begin()
    framed = blob(store, b"framed")
    store.seal(framed, parent=None)
    store.append_frame()
    store.finish()
    store.begin()
    packed = blob(store, b"packed")
    store.seal(packed)
    store.finish()

    def no_loose(*args: Any) -> Any:
        raise AssertionError("looked for a loose object")

    monkeypatch.setattr(objects_module.LooseObjects, "read", no_loose)
    monkeypatch.setattr(objects_module.LooseObjects, "read_blob_into", no_loose)
    monkeypatch.setattr(store.packs, "refresh", lambda: pytest.fail("rescanned the packs"))
    for sha, data in ((framed, b"framed"), (packed, b"packed")):
        assert store.exists(sha)
        assert store.read(sha) == (b"blob", data)
        out = bytearray(len(data))
        store.read_blob_into(sha, memoryview(out))
        assert bytes(out) == data
        with pytest.raises(ValueError, match=f"^object {sha.hex()} is not a blob of 2 bytes$"):
            store.read_blob_into(sha, memoryview(bytearray(2)))


def test_reading_loose_objects_does_not_rescan_the_packs(new: Any, repo: Path) -> None:
    store = new()
    data = b"an object of an older workspace"
    sha = bytes.fromhex(git(repo, "hash-object", "-w", "--stdin", data=data).decode().strip())
    rescans: list[None] = []
    real = store.packs.refresh

    def counted() -> None:
        rescans.append(None)
        real()

    store.packs.refresh = counted  # type: ignore[method-assign]
    assert store.exists(sha) and store.read(sha) == (b"blob", data)
    out = bytearray(len(data))
    store.read_blob_into(sha, memoryview(out))
    assert bytes(out) == data and rescans == []  # one scandir per chunk restored would cost


def test_a_reader_rereads_the_tail_only_for_what_it_finds_nowhere_else(
        new: Any, tmp_path: Path, repo: Path) -> None:
    writer = new()
    writer.begin()
    packed = blob(writer, b"packed")
    writer.seal(packed)
    writer.finish()
    loose = bytes.fromhex(git(repo, "hash-object", "-w", "--stdin", data=b"loose")
                          .decode().strip())
    tail = tail_of(tmp_path, writable=False)
    reader = new(durable=False, tail=tail)
    rereads: list[None] = []
    tail.refresh = lambda: rereads.append(None)  # type: ignore[method-assign]
    for sha, data in ((packed, b"packed"), (loose, b"loose")):
        assert reader.exists(sha) and reader.read(sha) == (b"blob", data)
        out = bytearray(len(data))
        reader.read_blob_into(sha, memoryview(out))
    assert rereads == []  # a stat of the tail per chunk restored would cost
    assert not reader.exists(b"\x66" * 20) and len(rereads) == 1


def test_a_batch_kept_for_the_tail_leaves_the_journal_out_of_a_sync(
        new: Any, tmp_path: Path, syncs: Syncs) -> None:
    store = new(tail=tail_of(tmp_path))
    ref = tmp_path / "ref.tmp"
    ref.write_text("x")
    store.begin()
    commit = blob(store, b"framed")
    store.seal(commit, parent=None)
    store.sync(ref)
    assert syncs.take() == [str(ref)]
    store.discard()


def test_small_commits_kept_for_the_tail_leave_the_journal_alone(
        new: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = new(tail=tail_of(tmp_path))
    store.begin()
    first = blob(store, b"a packed commit first")
    store.seal(first)  # its journal names its pack and commit
    store.finish()  # and is emptied; it stays open from here on
    touched: list[str] = []
    real_write, real_truncate = os.write, os.ftruncate

    def noted(name: str, real: Any) -> Any:
        def call(fd: int, *args: Any) -> Any:
            if os.readlink(f"/proc/self/fd/{fd}") == str(tmp_path / "pending"):
                touched.append(name)
            return real(fd, *args)
        return call

    monkeypatch.setattr(os, "write", noted("write", real_write))
    monkeypatch.setattr(os, "ftruncate", noted("ftruncate", real_truncate))
    for number in range(3):
        store.begin()
        commit = blob(store, b"small %d" % number)
        store.seal(commit, parent=first)
        store.append_frame()
        store.finish()
    assert touched == []  # a frame is the whole commit: no journal write, no truncation

    fresh = new(tail=Tail(tmp_path / "tail2", ref=lambda: None, writable=True, durable=False))
    fresh.begin()  # the first batch of a process empties the journal it opens
    touched.clear()
    commit = blob(fresh, b"first of a process")
    fresh.seal(commit, parent=None)
    fresh.append_frame()
    fresh.finish()
    assert touched == []  # and a frame then leaves it alone


def test_a_writer_does_not_rescan_its_own_tail(new: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    tail = tail_of(tmp_path)
    store = new(tail=tail)

    def no_refresh() -> None:
        raise AssertionError("a writer's tail is never re-read")

    monkeypatch.setattr(tail, "refresh", no_refresh)
    sha = b"\x44" * 20
    assert not store.exists(sha)
    with pytest.raises(FileNotFoundError):
        store.read(sha)


# -- discarding, closing, recovery -----------------------------------------------------


def test_discard_deletes_the_batchs_packs_and_its_kept_frame(new: Any, tmp_path: Path) -> None:
    store = new(tail=tail_of(tmp_path))
    store.begin()
    kept = blob(store, b"kept")
    store.seal(COMMIT)
    store.finish()
    store.begin()
    gone = blob(store, b"gone")
    store.seal(b"\x0d" * 20)
    assert len(packs(store)) == 2
    store.discard()
    assert len(packs(store)) == 1 and not store.exists(gone) and store.exists(kept)
    assert list(store.pack_dir.glob("*.idx")) == [packs(store)[0].with_suffix(".idx")]
    assert (tmp_path / "pending").read_bytes() == b""
    store.begin()
    blob(store, b"framed")
    store.seal(COMMIT, parent=None)
    store.discard()
    assert store.framed_parent is ... and len(packs(store)) == 1
    with pytest.raises(RuntimeError, match="outside"):
        store.write(b"blob", b"after", object_id(b"blob", b"after"))


def test_close_lets_go_of_the_journal_the_tail_and_the_packs(new: Any, tmp_path: Path) -> None:
    tail = tail_of(tmp_path)
    store = new(tail=tail)
    store.begin()
    blob(store, b"x")
    store.seal(COMMIT, parent=None)
    store.append_frame()
    store.finish()
    store.begin()
    blob(store, b"y")
    store.seal(b"\x0d" * 20)
    store.finish()

    def open_paths() -> set[str]:
        paths = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor, gone
                paths.add(os.readlink(f"/proc/self/fd/{fd}"))
        return paths

    before = open_paths()
    assert str(tmp_path / "pending") in before and str(tmp_path / "tail") in before
    store.close()
    after = open_paths()
    assert str(tmp_path / "pending") not in after and str(tmp_path / "tail") not in after
    assert store._journal_fd is None and len(store.packs) == 0
    ObjectStore(store.git_dir, journal=tmp_path / "other", scratch=tmp_path / "scratch",
                durable=False).close()  # a store without a tail closes too


def test_recovery_keeps_a_published_commit_and_says_so(new: Any, tmp_path: Path) -> None:
    store = new()
    store.begin()
    sha = blob(store, b"published")
    store.seal(COMMIT)
    store.close()  # died after the ref moved
    again = new()
    assert again.recover(COMMIT) == (
        f"the interrupted commit {COMMIT.hex()[:12]} had completed; kept it")
    assert again.read(sha) == (b"blob", b"published")
    assert (tmp_path / "pending").read_bytes() == b""  # emptied, not deleted
    assert again.recover(COMMIT) is None


def test_recovery_deletes_what_the_journal_names_and_the_leftovers(
        new: Any, tmp_path: Path, repo: Path) -> None:
    store = new()
    assert store.recover(None) is None  # no journal
    store.begin()
    kept = blob(store, b"kept")
    store.seal(b"\x0d" * 20)
    store.finish()
    store.begin()
    gone = blob(store, b"half written")
    store.seal(COMMIT)
    store.close()  # died before the ref moved
    loose = bytes.fromhex(git(repo, "hash-object", "-w", "--stdin", data=b"loose")
                          .decode().strip())
    other = store.pack_dir / "unrelated.pack"
    other.write_bytes(b"not ours")
    with open(tmp_path / "pending", "a") as journal:
        journal.write(f"{loose.hex()}\npack pack-{'0' * 40}.pack\n"  # never created
                      "pack unrelated.pack\npack pack-x.idx\n")
    (tmp_path / "scratch" / "leftover").write_bytes(b"x")
    (store.pack_dir / "tmp_kernos_pack_123").write_bytes(b"x")
    (store.pack_dir / "tmp_pack_git").write_bytes(b"x")
    again = new()
    assert again.recover(b"\x0d" * 20) == "discarded a half-written commit (3 packs or objects)"
    assert not again.exists(gone) and not again.exists(loose) and again.exists(kept)
    assert other.exists() and (store.pack_dir / "tmp_pack_git").exists()
    assert not (store.pack_dir / "tmp_kernos_pack_123").exists()
    assert os.listdir(tmp_path / "scratch") == []
    assert (tmp_path / "pending").read_bytes() == b""


def test_recovery_reads_a_torn_journal_without_a_commit_line(new: Any, tmp_path: Path) -> None:
    store = new()
    store.begin()
    gone = blob(store, b"spilled, never sealed")
    store._flush()  # a pack written, the commit not yet named
    store.close()
    with open(tmp_path / "pending", "ab") as journal:
        journal.write(b"\xff\xfe torn\n")
    again = new()
    assert again.recover(COMMIT) == "discarded a half-written commit (1 packs or objects)"
    assert not again.exists(gone) and packs(again) == []


def test_recovery_without_a_ref_or_a_pack_directory_discards(new: Any, tmp_path: Path) -> None:
    store = new()
    store.begin()
    gone = blob(store, b"first commit ever")
    store.seal(COMMIT)
    store.close()
    again = new()
    assert again.recover(None) == "discarded a half-written commit (1 packs or objects)"
    assert not again.exists(gone)
    again.close()
    for leftover in store.pack_dir.iterdir():
        leftover.unlink()
    store.pack_dir.rmdir()
    (tmp_path / "pending").write_text(f"commit {COMMIT.hex()}\n")
    assert new().recover(None) == "discarded a half-written commit (0 packs or objects)"


# -- background repacks -----------------------------------------------------------------


class Repack:
    """Stands for the ``git repack`` process ``maintain`` starts."""

    started: list[Repack]

    def __init__(self, args: list[str], **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs
        self.done: int | None = None
        self.waited: list[float | None] = []
        Repack.started.append(self)

    def poll(self) -> int | None:
        return self.done

    def wait(self, timeout: float | None = None) -> int:
        self.waited.append(timeout)
        self.done = 0
        return 0


@pytest.fixture
def repacks(monkeypatch: pytest.MonkeyPatch) -> list[Repack]:
    Repack.started = []
    monkeypatch.setattr(objects_module.subprocess, "Popen", Repack)
    return Repack.started


def commit_one(store: ObjectStore, data: bytes) -> None:
    store.begin()
    blob(store, data)
    store.seal(object_id(b"blob", data))
    store.finish()  # which calls maintain()


def test_a_geometric_repack_starts_in_the_background_when_packs_pile_up(
        new: Any, repo: Path, monkeypatch: pytest.MonkeyPatch, repacks: list[Repack]) -> None:
    monkeypatch.setattr(objects_module, "REPACK_PACKS", 3)
    store = new()
    commit_one(store, b"1")
    commit_one(store, b"2")
    assert repacks == [] and store.maintain() is False  # 2 packs: below the threshold
    commit_one(store, b"3")  # 3 packs: the threshold
    [repack] = repacks
    # Under the watchdog that ends it with this process, holding the repack lock's fd.
    watchdog, lock = repack.args[:6], repack.kwargs["pass_fds"]
    assert watchdog == [sys.executable, "-I", "-S", str(repack_module.WATCHDOG),
                        str(os.getpid()), str(lock[0])]
    assert repack.args[6:] == [*objects_module._NICE, "git", "-c",
                               "core.fsync=objects,derived-metadata,reference", "-c",
                               "core.fsyncMethod=fsync", f"--git-dir={repo}", "repack", "-d",
                               "-q", "--geometric=2"]
    assert repack.kwargs == {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
                             "stderr": subprocess.DEVNULL, "start_new_session": True,
                             "pass_fds": lock}
    commit_one(store, b"4")
    assert store.maintain() is False and len(repacks) == 1  # one at a time
    repack.done = 0  # it finished: its packs are picked up, and another may start
    assert store.maintain() is True and len(repacks) == 2
    repacks[1].done = 0
    for pack in packs(store)[1:]:
        pack.with_suffix(".idx").unlink()
        pack.unlink()
    assert store.maintain() is False and len(store.packs) == 1  # rescanned: one pack left
    assert store.maintain() is False and len(repacks) == 2  # and nothing runs any more
    store.wait_for_maintenance(1)


def test_no_repack_starts_while_another_holds_the_repack_lock(
        new: Any, repo: Path, monkeypatch: pytest.MonkeyPatch, repacks: list[Repack]) -> None:
    """A dead kernel's repack still ending (or a prune's) holds the lock: none starts
    beside it, and the next commit asks again."""
    import fcntl

    monkeypatch.setattr(objects_module, "REPACK_PACKS", 1)
    store = new()
    held = os.open(repo / repack_module.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        commit_one(store, b"1")
        assert repacks == [] and store.maintain() is False
        assert repack_module.wait_for_repacks(repo, timeout=0) is False
    finally:
        os.close(held)
    assert repack_module.wait_for_repacks(repo, timeout=0) is True
    assert store.maintain() is True and len(repacks) == 1


def test_loose_objects_start_a_repack_from_the_estimate_counted_once(
        new: Any, monkeypatch: pytest.MonkeyPatch, repacks: list[Repack]) -> None:
    counted: list[int] = []
    estimate = objects_module.REPACK_LOOSE - 1

    def estimated(objects: Path) -> int:
        counted.append(estimate)
        return estimate

    monkeypatch.setattr(objects_module, "_estimate_loose", estimated)
    store = new()
    assert store.maintain() is False and store.maintain() is False
    assert counted == [estimate] and repacks == []  # counted at the first ask only
    store._loose_estimate = None
    estimate = objects_module.REPACK_LOOSE
    assert store.maintain() is True and len(repacks) == 1
    repacks[0].done = 0
    estimate = 0
    assert store.maintain() is False  # the repack folded them: counted again
    assert len(counted) == 3 and len(repacks) == 1


def test_waiting_for_maintenance_waits_for_the_repack_and_rescans(
        new: Any, monkeypatch: pytest.MonkeyPatch, repacks: list[Repack]) -> None:
    store = new()
    store.wait_for_maintenance(1.5)  # none running: returns at once
    monkeypatch.setattr(objects_module, "REPACK_PACKS", 1)
    commit_one(store, b"a")
    [repack] = repacks
    [pack] = packs(store)
    pack.with_suffix(".idx").unlink()
    pack.unlink()
    store.wait_for_maintenance(2.5)
    assert repack.waited == [2.5] and len(store.packs) == 0
    store.wait_for_maintenance(3.5)
    assert repack.waited == [2.5] and store._repack is None
    monkeypatch.setattr(objects_module, "_estimate_loose",
                        lambda objects: objects_module.REPACK_LOOSE)
    assert store.maintain() is False and len(repacks) == 1  # the repack folded the loose


def test_a_real_repack_leaves_every_object_readable(new: Any, repo: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects_module, "REPACK_PACKS", 2)
    store = new()
    commit_one(store, b"first")
    commit_one(store, b"second")
    store.wait_for_maintenance(60)
    assert len(packs(store)) == 1
    for data in (b"first", b"second"):
        assert store.read(object_id(b"blob", data)) == (b"blob", data)
