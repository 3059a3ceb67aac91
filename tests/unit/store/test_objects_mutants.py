"""The encoding, the loose writer and the sync helpers of ``kernos.store.objects``, pinned.

These close gaps mutation testing (``scripts/mutation store.objects``) found:
the exact bytes of trees and commits and what decoding keeps, the loose
writer's journal and refusals, what it syncs with and without ``syncfs``, the
recovery notes, the fast copy of stored zlib blocks (every malformed stream
must be refused, so that zlib decides), and ``replace_file``, ``fsync_all``,
``fsync_dir`` and ``sync_filesystem``: which files they sync, which errors they
raise and that they leave no descriptor open.  The pack writer
(:class:`ObjectStore`) is in ``test_objects_store_mutants.py``.
"""

from __future__ import annotations

import copy
import ctypes
import errno
import os
import struct
import sys
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest

from disk_support import Syncs
from kernos import _durable
from kernos._durable import fsync_all, fsync_dir, replace_file, sync_filesystem
from kernos.store import object_store
from kernos.store.loose import LooseObjects
from kernos.store.objects import (
    BLOB_MODE,
    TREE_MODE,
    CommitData,
    TreeEntry,
    decode_commit,
    decode_tree,
    encode_commit,
    encode_tree,
    object_id,
)
from kernos.store.streams import copy_stored_blocks
from support import git


def loose(repo: Path, tmp_path: Path, *, durable: bool = True) -> LooseObjects:
    return LooseObjects(repo, journal=tmp_path / "pending", scratch=tmp_path / "tmp",
                        durable=durable)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Syncs:
    return Syncs(monkeypatch)


# -- trees and commits --------------------------------------------------------------


def test_a_tree_is_encoded_as_git_does_and_decoded_back_entry_for_entry(repo: Path) -> None:
    blob, inner = object_id(b"blob", b"x"), object_id(b"tree", b"")
    entries = [TreeEntry(BLOB_MODE, "b", blob), TreeEntry(TREE_MODE, "a", inner),
               TreeEntry(BLOB_MODE, "é", blob)]
    data = encode_tree(entries)
    assert data == (b"40000 a\0" + inner + b"100644 b\0" + blob
                    + b"100644 \xc3\xa9\0" + blob)
    listing = (f"040000 tree {inner.hex()}\ta\n100644 blob {blob.hex()}\tb\n"
               f"100644 blob {blob.hex()}\t\xe9\n")
    assert object_id(b"tree", data).hex() == git(repo, "mktree", "--missing",
                                                 data=listing.encode()).decode().strip()
    decoded = decode_tree(data)
    assert decoded == sorted(entries, key=lambda entry: entry.name)
    assert [entry.is_tree for entry in decoded] == [True, False, False]
    assert decode_tree(b"") == []


def test_a_tree_sorts_a_subtree_as_if_its_name_ended_with_a_slash(repo: Path) -> None:
    blob, inner = object_id(b"blob", b"x"), object_id(b"tree", b"")
    entries = [TreeEntry(BLOB_MODE, "a0", blob), TreeEntry(TREE_MODE, "a", inner),
               TreeEntry(BLOB_MODE, "a-b", blob), TreeEntry(BLOB_MODE, "b.c", blob),
               TreeEntry(BLOB_MODE, "b", blob)]
    data = encode_tree(entries)
    assert [entry.name for entry in decode_tree(data)] == [  # "-" < "/" < "0", "" < "."
        "a-b", "a", "a0", "b", "b.c"]
    listing = "".join(f"{mode} {kind} {sha.hex()}\t{name}\n" for mode, kind, sha, name in (
        ("100644", "blob", blob, "a0"), ("040000", "tree", inner, "a"),
        ("100644", "blob", blob, "a-b"), ("100644", "blob", blob, "b.c"),
        ("100644", "blob", blob, "b")))
    assert object_id(b"tree", data).hex() == git(repo, "mktree", "--missing",
                                                 data=listing.encode()).decode().strip()


def test_a_tree_cut_inside_an_id_is_refused() -> None:
    data = encode_tree([TreeEntry(BLOB_MODE, "a", b"\x01" * 20)])
    with pytest.raises(ValueError, match=r"^truncated tree object$"):
        decode_tree(data[:-1])


def test_a_commit_is_encoded_as_git_commit_tree_would(repo: Path) -> None:
    tree = bytes.fromhex(git(repo, "mktree", data=b"").decode().strip())
    first = CommitData(tree=tree, parents=(), author="Ann Lee <ann@kernos.invalid>",
                       timestamp=1_700_000_000, message="first")
    body = encode_commit(first)
    assert body == (b"tree " + tree.hex().encode() + b"\n"
                    b"author Ann Lee <ann@kernos.invalid> 1700000000 +0000\n"
                    b"committer Ann Lee <ann@kernos.invalid> 1700000000 +0000\n"
                    b"\nfirst\n")
    assert encode_commit(CommitData(tree=tree, parents=(), author=first.author,
                                    timestamp=first.timestamp, message="first\n")) == body
    one, two = object_id(b"commit", body), b"\x07" * 20
    merge = CommitData(tree=tree, parents=(one, two), author="b <b@x>", timestamp=5,
                       message="two\nlines\n")
    merged = encode_commit(merge)
    assert merged.split(b"\n")[1:3] == [b"parent " + one.hex().encode(),
                                        b"parent " + two.hex().encode()]
    assert decode_commit(merged) == merge
    assert decode_commit(body) == CommitData(tree=tree, parents=(), author=first.author,
                                             timestamp=first.timestamp, message="first\n")


def test_decoding_a_commit_reads_the_author_and_ignores_other_headers() -> None:
    tree = b"\x0a" * 20
    data = (b"tree " + tree.hex().encode() + b"\n"
            b"author Some One <one@x> 1234 +0200\n"
            b"committer Other <other@x> 99 +0000\n"
            b"encoding UTF-8\n"
            b"\nmsg \xc3\xa9\n\nbody")
    assert decode_commit(data) == CommitData(tree=tree, parents=(), author="Some One <one@x>",
                                             timestamp=1234, message="msg é\n\nbody")
    odd = decode_commit(b"tree " + tree.hex().encode() + b"\n"
                        b"author a>b <ab@x> 77 +0000\n\nm\n")
    assert (odd.author, odd.timestamp) == ("a>b <ab@x>", 77)  # the email ends at the last ">"
    assert decode_commit(b"\n\nonly a message") == CommitData(
        tree=b"", parents=(), author="", timestamp=0, message="only a message")


# -- the loose writer ---------------------------------------------------------------


def test_writes_and_seals_outside_a_batch_are_refused(repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    sha = object_id(b"blob", b"a")
    with pytest.raises(RuntimeError, match=r"^LooseObjects\.write called outside "
                                           r"begin\(\)/finish\(\)$"):
        objects.write(b"blob", b"a", sha)
    with pytest.raises(RuntimeError, match=r"^LooseObjects\.seal called outside "
                                           r"begin\(\)/finish\(\)$"):
        objects.seal(sha)
    assert not objects.exists(sha) and not objects.journal.exists()
    objects.begin()
    objects.finish()  # a batch ended: writing is refused again
    with pytest.raises(RuntimeError, match=r"^LooseObjects\.write called outside"):
        objects.write(b"blob", b"a", sha)
    with pytest.raises(RuntimeError, match=r"^LooseObjects\.seal called outside"):
        objects.seal(sha)


def test_the_journal_names_each_new_object_then_the_commit(repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    objects.journal.write_text("left by a crash\n")
    objects.begin()  # a new batch starts an empty journal
    assert objects.scratch.is_dir() and objects.journal.read_bytes() == b""
    first, second = object_id(b"blob", b"one"), object_id(b"blob", b"two")
    objects.write(b"blob", b"one", first)
    objects.write(b"blob", b"one", first)  # already there: not journaled again
    objects.write(b"blob", b"two", second)
    commit = b"\x0c" * 20
    objects.seal(commit)
    assert objects.journal.read_text() == f"{first.hex()}\n{second.hex()}\ncommit {commit.hex()}\n"
    objects.finish()
    assert not objects.journal.exists()
    objects.begin()
    objects.begin()  # a second begin in the same directory is fine
    objects.finish()
    objects.finish()  # and a second finish
    assert os.listdir(objects.scratch) == []


@pytest.fixture
def umask() -> Any:
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_journal_is_a_plain_file_readable_by_all(repo: Path, tmp_path: Path,
                                                     umask: None) -> None:
    objects = loose(repo, tmp_path)
    objects.begin()
    assert objects.journal.stat().st_mode & 0o777 == 0o644
    objects.finish()


def test_a_short_write_is_continued_until_the_object_is_whole(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write

    def short(fd: int, data: Any) -> int:
        return real(fd, bytes(data[:1000]))  # what a filling disk may do

    objects = loose(repo, tmp_path, durable=False)
    objects.begin()
    data = os.urandom(10_000)
    sha = object_id(b"blob", data)
    monkeypatch.setattr(os, "write", short)
    objects.write(b"blob", data, sha)
    monkeypatch.undo()
    objects.finish()
    assert objects.read(sha) == (b"blob", data)


def test_a_loose_object_is_read_only_and_stored_or_compressed_by_content(
        repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path, durable=False)
    objects.begin()
    noise, text = os.urandom(50_000), b"abc" * 20_000
    for data in (noise, text):
        sha = object_id(b"blob", data)
        written = objects.write(b"blob", data, sha)
        path = objects.objects / sha.hex()[:2] / sha.hex()[2:]
        assert path.stat().st_mode & 0o777 == 0o444
        assert written == path.stat().st_size
        assert zlib.decompress(path.read_bytes()) == b"blob %d\0" % len(data) + data
        assert git(repo, "cat-file", "blob", sha.hex()) == data
    objects.finish()
    noise_sha = object_id(b"blob", noise).hex()
    # The object's own file: the text's may share its directory (1 time in 256).
    stored = (objects.objects / noise_sha[:2] / noise_sha[2:]).read_bytes()
    assert (stored[2] >> 1) & 0b11 == 0  # incompressible: zlib level 0 (stored blocks)
    text_sha = object_id(b"blob", text).hex()
    compressed = (objects.objects / text_sha[:2] / text_sha[2:]).read_bytes()
    assert len(compressed) < len(text) // 50  # compressible: deflated
    assert zlib.compress(b"blob %d\0" % len(text) + text, 1) == compressed  # at level 1


def test_a_write_that_fails_leaves_no_temporary_file_and_no_object(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = loose(repo, tmp_path)
    objects.begin()

    def full(source: Any, target: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    sha = object_id(b"blob", b"lost")
    with pytest.raises(OSError, match="No space left"):
        objects.write(b"blob", b"lost", sha)
    monkeypatch.undo()
    assert os.listdir(objects.scratch) == []
    assert not objects.exists(sha)
    objects.discard()


def test_without_syncfs_each_object_file_and_directory_is_fsynced(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs) -> None:
    monkeypatch.setattr(_durable, "_SYNCFS", None)
    objects = loose(repo, tmp_path)
    objects.begin()
    one, two = object_id(b"blob", b"one"), object_id(b"blob", b"two")
    objects.write(b"blob", b"one", one)
    objects.write(b"blob", b"two", two)
    # Each object file is synced before it is renamed into place.
    assert syncs.paths == [str(objects.scratch / f"{sha.hex()}.{os.getpid()}")
                           for sha in (one, two)]
    syncs.paths.clear()
    objects.seal(b"\x01" * 20)
    dirs = {str(objects.objects / sha.hex()[:2]) for sha in (one, two)}
    assert sorted(syncs.paths) == sorted({*dirs, str(objects.objects)})  # new directories too
    objects.finish()

    objects.begin()  # the directories exist now: only those written into are synced
    data = next(data for data in (b"%d" % n for n in range(10_000))
                if object_id(b"blob", data)[0] == one[0])  # into one's directory
    three = object_id(b"blob", data)
    objects.write(b"blob", data, three)
    syncs.paths.clear()
    objects.seal(b"\x02" * 20)
    assert syncs.paths == [str(objects.objects / three.hex()[:2])]
    objects.finish()


def test_with_syncfs_the_batch_is_one_filesystem_sync_at_seal(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs) -> None:
    calls: list[str] = []

    def syncfs(fd: int) -> int:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        return 0

    monkeypatch.setattr(_durable, "_SYNCFS", syncfs)
    objects = loose(repo, tmp_path)
    objects.begin()
    objects.write(b"blob", b"one", object_id(b"blob", b"one"))
    assert calls == [] and syncs.paths == []
    objects.seal(b"\x01" * 20)
    assert calls == [str(objects.objects)] and syncs.paths == []
    objects.finish()


def test_a_loose_writer_that_is_not_durable_syncs_nothing(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs) -> None:
    for syncfs in (None, lambda fd: pytest.fail("syncfs called")):
        monkeypatch.setattr(_durable, "_SYNCFS", syncfs)
        objects = loose(repo, tmp_path, durable=False)
        objects.begin()
        data = os.urandom(100)
        objects.write(b"blob", data, object_id(b"blob", data))
        objects.seal(b"\x01" * 20)
        objects.sync(tmp_path, repo)
        objects.finish()
    assert syncs.paths == []


def test_sync_of_the_loose_writer_syncs_what_it_is_given(
        repo: Path, tmp_path: Path, syncs: Syncs) -> None:
    objects = loose(repo, tmp_path)
    other = tmp_path / "ref.tmp"
    other.write_text("x")
    objects.sync(other, repo)
    assert sorted(syncs.paths) == sorted([str(other), str(repo)])


def test_a_copy_of_the_writer_does_not_share_the_open_journal(
        repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    objects.begin()
    twin = copy.copy(objects)
    assert twin._journal_fd is None and objects._journal_fd is not None
    assert twin.journal == objects.journal and twin.objects == objects.objects
    objects.write(b"blob", b"a", object_id(b"blob", b"a"))
    objects.finish()


def test_recovery_notes_say_what_was_kept_or_discarded(repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    assert objects.recover(b"\x01" * 20) is None  # no journal, no scratch directory
    objects.begin()
    kept = object_id(b"blob", b"kept")
    objects.write(b"blob", b"kept", kept)
    commit = bytes.fromhex("0123456789abcdef" * 2 + "01234567")
    objects.seal(commit)
    objects._close_journal()
    assert objects.recover(commit) == "the interrupted commit 0123456789ab had completed; kept it"
    assert objects.exists(kept) and not objects.journal.exists()

    objects.begin()
    one, two = object_id(b"blob", b"one"), object_id(b"blob", b"two")
    objects.write(b"blob", b"one", one)
    objects.write(b"blob", b"two", two)
    objects.seal(commit)
    objects._close_journal()
    assert objects.recover(None) == "discarded a half-written commit (2 objects)"  # no ref yet
    assert not objects.exists(one) and not objects.exists(two) and objects.exists(kept)
    assert not objects.journal.exists()


def test_recovery_deletes_only_what_well_formed_journal_lines_name(
        repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    objects.begin()
    shas = [object_id(b"blob", b"%d" % number) for number in range(4)]
    for number, sha in enumerate(shas):
        objects.write(b"blob", b"%d" % number, sha)
    objects.finish()
    deleted, upper, short, spaced = shas
    objects.journal.write_text("\n".join([
        deleted.hex(), upper.hex().upper(), short.hex()[:39], " " + spaced.hex(),
        "f" * 40,  # well formed, but no such object: not counted
        "commit " + "ab" * 20]) + "\n")
    assert objects.recover(b"\xcd" * 20) == "discarded a half-written commit (1 objects)"
    assert [objects.exists(sha) for sha in shas] == [False, True, True, True]


def test_recovery_reads_a_torn_journal_without_a_commit_line(repo: Path,
                                                             tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    objects.begin()
    sha = object_id(b"blob", b"torn")
    objects.write(b"blob", b"torn", sha)
    objects._close_journal()  # died before the seal: no commit line
    with open(objects.journal, "ab") as journal:
        journal.write(b"\n\xff\xfe" + sha.hex()[:2].encode() + b"\n" + sha.hex()[:2].encode()
                      + b"\n")  # a torn, undecodable end; a blank line; a directory's name
    assert objects.recover(sha) == "discarded a half-written commit (1 objects)"
    assert not objects.exists(sha) and not objects.journal.exists()
    assert (objects.objects / sha.hex()[:2]).is_dir()  # only objects are deleted


def test_a_journal_line_that_is_not_an_id_deletes_nothing(repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    stray = objects.objects / "XX" / ("X" * 38)
    stray.parent.mkdir()
    stray.write_bytes(b"not an object")
    objects.journal.write_text("X" * 40 + "\n")
    assert objects.recover(None) == "discarded a half-written commit (0 objects)"
    assert stray.exists()


def test_discarding_without_a_journal_does_nothing(repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    objects.discard()
    assert not objects.journal.exists()


# -- reading ------------------------------------------------------------------------


def test_a_missing_object_is_reported_as_missing(repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    sha = b"\x5a" * 20
    assert not objects.exists(sha)
    with pytest.raises(FileNotFoundError, match=f"^object {sha.hex()} is missing or unreadable$"):
        objects.read(sha)
    with pytest.raises(FileNotFoundError, match=f"^object {sha.hex()} is missing or unreadable$"):
        objects.read_blob_into(sha, memoryview(bytearray(3)))
    data = b"after the miss"
    sha = object_id(b"blob", data)
    git(repo, "hash-object", "-w", "--stdin", data=data)  # a fresh cat-file process is used
    assert objects.exists(sha) and objects.read(sha) == (b"blob", data)


def test_an_object_git_packed_is_copied_into_a_buffer(repo: Path, tmp_path: Path) -> None:
    data = b"packed by git " * 50
    sha = git(repo, "hash-object", "-w", "--stdin", data=data).decode().strip()
    tree = git(repo, "mktree", data=f"100644 blob {sha}\tf\n".encode()).decode().strip()
    git(repo, "update-ref", "refs/heads/main", git(repo, "commit-tree", tree, "-m", "x")
        .decode().strip())
    git(repo, "repack", "-a", "-d", "-q")
    git(repo, "prune-packed")
    objects = loose(repo, tmp_path)
    out = bytearray(len(data))
    objects.read_blob_into(bytes.fromhex(sha), memoryview(out))
    assert bytes(out) == data
    with pytest.raises(ValueError, match=f"^object {tree} is not a blob of 3 bytes$"):
        objects.read_blob_into(bytes.fromhex(tree), memoryview(bytearray(3)))


def test_a_deflated_blob_with_nuls_is_copied_whole(repo: Path, tmp_path: Path) -> None:
    content = b"\0head\0" + b"compressible \0" * 2000
    sha = object_id(b"blob", content)
    objects = loose(repo, tmp_path, durable=False)
    objects.begin()
    objects.write(b"blob", content, sha)
    objects.finish()
    out = bytearray(len(content))
    objects.read_blob_into(sha, memoryview(out))
    assert bytes(out) == content
    with pytest.raises(ValueError, match=f"^object {sha.hex()} is not a blob of 5 bytes$"):
        objects.read_blob_into(sha, memoryview(bytearray(5)))


class _Stream:
    def __init__(self, data: bytes, size: int) -> None:
        self.type, self.size, self._data = b"blob", size, data

    def read(self) -> bytes:
        return self._data


class _Reader:
    """Stands for GitPython's ``GitCmdObjectDB``: serves one stream, records resets."""

    def __init__(self, stream: _Stream | None) -> None:
        self.stream_ = stream
        self.cleared = 0
        reader = self

        class _Git:
            def clear_cache(self) -> None:
                reader.cleared += 1

        self._git = _Git()

    def stream(self, sha: bytes) -> _Stream:
        if self.stream_ is None:
            raise OSError("cat-file died")
        return self.stream_


def test_a_short_read_from_git_is_reported_as_damage_and_the_reader_restarted(
        repo: Path, tmp_path: Path) -> None:
    objects = loose(repo, tmp_path)
    sha = b"\x3c" * 20
    short = _Reader(_Stream(b"abc", 5))
    objects._fallback = short  # type: ignore[assignment]
    with pytest.raises(ValueError, match=rf"^object {sha.hex()} is damaged in its pack "
                                         r"\(3 of 5 bytes readable\)$"):
        objects.read(sha)
    assert short.cleared == 1 and objects._fallback is None
    dead = _Reader(None)
    objects._fallback = dead  # type: ignore[assignment]
    with pytest.raises(FileNotFoundError, match="missing or unreadable") as raised:
        objects.read(sha)
    assert isinstance(raised.value.__cause__, OSError)
    assert dead.cleared == 1 and objects._fallback is None
    class Stuck(_Reader):
        def __init__(self) -> None:
            super().__init__(None)

            class _Git:
                def clear_cache(self) -> None:
                    raise OSError("cannot reap cat-file")

            self._git = _Git()

    objects._fallback = Stuck()  # type: ignore[assignment]
    with pytest.raises(FileNotFoundError, match="missing or unreadable"):
        objects.read(sha)  # the reader's own failure to stop does not hide why
    whole = _Reader(_Stream(b"abcde", 5))
    objects._fallback = whole  # type: ignore[assignment]
    assert objects.read(sha) == (b"blob", b"abcde")
    assert whole.cleared == 0 and objects._fallback is whole


# -- the fast copy of stored zlib blocks ---------------------------------------------


def fcheck(cmf: int, *, fdict: bool = False) -> bytes:
    """A zlib header with compression method byte ``cmf`` whose check bits are right."""
    flags = 0x20 if fdict else 0
    flags += (31 - ((cmf << 8 | flags) % 31)) % 31
    return bytes([cmf, flags])


def stored(blocks: list[bytes], *, head: bytes = b"\x78\x01", final: bool = True,
           adler: int | None = None) -> bytes:
    """A zlib stream made of stored deflate blocks carrying ``blocks``."""
    out = bytearray(head)
    for number, block in enumerate(blocks):
        last = final and number == len(blocks) - 1
        out += bytes([1 if last else 0]) + struct.pack("<HH", len(block), len(block) ^ 0xFFFF)
        out += block
    out += struct.pack(">I", zlib.adler32(b"".join(blocks)) if adler is None else adler)
    return bytes(out)


def copied(raw: bytes, size: int) -> bytes | None:
    out = bytearray(b"\xee" * size)
    return bytes(out) if copy_stored_blocks(raw, memoryview(out), git_header=True) else None


@pytest.mark.parametrize("blocks", [
    [b"blob 5\0hello"],
    [b"blob 5\0", b"hello"],
    [b"bl", b"ob 5", b"\0he", b"", b"llo"],
    [b"blob 5\0h", b"ell", b"o"],
    [b"blob 0\0", b"hello"[:0]],
    [b"blob 5\0he\0lo"],  # the header ends at the first NUL
])
def test_a_stored_stream_is_copied_whatever_its_block_boundaries(blocks: list[bytes]) -> None:
    raw = stored(blocks)
    content = zlib.decompress(raw).partition(b"\0")[2]
    assert copied(raw, len(content)) == content


def test_the_stream_zlib_writes_at_level_0_is_copied() -> None:
    content = os.urandom(200_000)  # several stored blocks of at most 64 KiB
    raw = zlib.compress(b"blob %d\0" % len(content) + content, 0)
    assert copied(raw, len(content)) == content


@pytest.mark.parametrize(("raw", "size"), [
    (stored([b"blob 5\0hello"])[:5], 5),  # too short to hold anything
    (fcheck(0x79) + stored([b"blob 5\0hello"])[2:], 5),  # not deflate
    (fcheck(0x78, fdict=True) + stored([b"blob 5\0hello"])[2:], 5),  # a preset dictionary
    (stored([b"blob 5\0hello"], head=b"\x78\x02"), 5),  # header check bits wrong
    (stored([b"blob 5\0hello"], final=False)[:-4], 5),  # ends without a final block
    (stored([b"blob 5\0hello"])[:-6], 5),  # the block is cut short
    (stored([b"blob 5\0hello"])[:-1], 5),  # the trailer is cut short
    (stored([b"blob 5\0hello"], adler=1), 5),  # wrong checksum
    (stored([b"tree 5\0hello"]), 5),  # not a blob
    (stored([b"blob x\0hello"]), 5),  # no size
    (stored([b"blob 4\0hello"]), 5),  # another size
    (stored([b"blob 5\0hell"]), 5),  # shorter than it says
    (stored([b"blob 5\0hello", b"!"]), 5),  # longer than it says
    (zlib.compress(b"blob 5\0hello", 9), 5),  # deflated, not stored
    # Headers longer than git writes ("blob 00...05"): not looked for past 64 bytes.
    (stored([b"blob " + b"0" * 58 + b"5\0hello"]), 5),
    (stored([b"blob " + b"0" * 58 + b"5", b"\0hello"]), 5),
])
def test_anything_but_a_whole_stored_blob_of_the_size_is_left_to_zlib(raw: bytes,
                                                                      size: int) -> None:
    assert copied(raw, size) is None


def test_a_stored_block_with_a_wrong_length_check_is_refused() -> None:
    raw = bytearray(stored([b"blob 5\0hello"]))
    raw[5] ^= 0x01  # NLEN is no longer the complement of LEN
    assert copied(bytes(raw), 5) is None
    raw = bytearray(stored([b"blob 5\0hello"]))
    raw[2] = 0b011  # a final block of fixed Huffman codes
    assert copied(bytes(raw), 5) is None


def test_a_loose_blob_of_stored_blocks_is_read_without_inflating(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    content = os.urandom(100_000)
    sha = object_id(b"blob", content)
    objects = loose(repo, tmp_path, durable=False)
    objects.begin()
    objects.write(b"blob", content, sha)
    objects.finish()

    def no_inflate(*args: Any) -> bytes:
        raise AssertionError("zlib.decompress called")

    monkeypatch.setattr(zlib, "decompress", no_inflate)
    out = bytearray(len(content))
    objects.read_blob_into(sha, memoryview(out))
    assert bytes(out) == content


# -- replace_file and the sync helpers -----------------------------------------------


def test_replace_file_syncs_the_data_then_the_directory(tmp_path: Path, syncs: Syncs) -> None:
    target = tmp_path / "ref"
    target.write_bytes(b"old")
    replace_file(target, b"new", durable=True)
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o644
    assert syncs.paths == [str(tmp_path / "ref.tmp"), str(tmp_path)]
    assert os.listdir(tmp_path) == ["ref"]
    syncs.paths.clear()
    replace_file(target, b"newer", durable=False, mode=0o600,
                 temporary=tmp_path / "elsewhere")
    assert target.read_bytes() == b"newer" and target.stat().st_mode & 0o777 == 0o600
    assert syncs.paths == [] and os.listdir(tmp_path) == ["ref"]


def test_replace_file_that_fails_keeps_the_old_file_and_no_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ref"
    target.write_bytes(b"old")
    before = open_fds()

    def refused(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", refused)
    with pytest.raises(OSError, match="Input/output error"):
        replace_file(target, b"new", durable=True)
    monkeypatch.undo()
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["ref"]
    assert open_fds() == before


def test_fsync_all_syncs_paths_and_descriptors_and_raises_the_first_error(
        tmp_path: Path, syncs: Syncs) -> None:
    files = [tmp_path / f"f{number}" for number in range(3)]
    for file in files:
        file.write_text("x")
    fsync_all([])
    callers: list[str] = []
    real = os.fsync

    def on_which_thread(fd: int) -> None:
        callers.append(threading.current_thread().name)
        real(fd)

    os.fsync = on_which_thread  # wrapped by the recorder's monkeypatch, undone after the test
    fsync_all([files[0]])
    os.fsync = real
    assert syncs.paths == [str(files[0])]
    assert callers == [threading.current_thread().name]  # one job: no hop to the pool
    syncs.paths.clear()
    fd = os.open(files[2], os.O_RDONLY)
    try:
        fsync_all([files[0], tmp_path, fd])
        assert sorted(syncs.paths) == sorted([str(files[0]), str(tmp_path), str(files[2])])
        syncs.paths.clear()
        with pytest.raises(FileNotFoundError) as raised:
            fsync_all([tmp_path / "first", files[0], tmp_path / "second", files[1]])
        assert raised.value.filename == str(tmp_path / "first")
        assert sorted(syncs.paths) == sorted([str(files[0]), str(files[1])])  # all were tried
        with pytest.raises(FileNotFoundError):
            fsync_all([tmp_path / "alone"])
        syncs.paths.clear()
        with pytest.raises(FileNotFoundError):
            fsync_all([tmp_path / "missing", files[2]])  # two: the second is synced all the same
        assert syncs.paths == [str(files[2])]
    finally:
        os.close(fd)


def test_the_six_syncs_of_a_commit_are_in_flight_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit syncs its pack, index, their directory, the journal, the ref and the audit
    record: concurrent fsyncs share one journal commit of the filesystem."""
    arrived = threading.Barrier(6, timeout=5)
    threads: set[str] = set()

    def fsync(fd: int) -> None:
        threads.add(threading.current_thread().name)
        arrived.wait()

    monkeypatch.setattr(os, "fsync", fsync)
    fsync_all([tmp_path] * 6)
    assert len(threads) == 6 and threading.current_thread().name not in threads
    assert _durable._fsync_pool() is _durable._fsync_pool()


def test_fsync_dir_closes_what_it_opens_even_when_the_sync_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs) -> None:
    before = open_fds()
    fsync_dir(tmp_path)
    assert syncs.paths == [str(tmp_path)] and open_fds() == before
    monkeypatch.undo()

    def refused(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", refused)
    with pytest.raises(OSError, match="Input/output error"):
        fsync_dir(tmp_path)
    assert open_fds() == before


def test_sync_filesystem_uses_syncfs_and_reports_its_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs) -> None:
    before = open_fds()
    seen: list[str] = []

    def syncfs(fd: int) -> int:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return 0

    monkeypatch.setattr(_durable, "_SYNCFS", syncfs)
    sync_filesystem(tmp_path)
    assert seen == [str(tmp_path)] and syncs.paths == []

    monkeypatch.setattr(_durable, "_SYNCFS", lambda fd: -1)
    monkeypatch.setattr(_durable.ctypes, "get_errno", lambda: errno.EIO)
    with pytest.raises(OSError) as raised:
        sync_filesystem(tmp_path)
    assert raised.value.errno == errno.EIO and raised.value.filename == str(tmp_path)
    assert raised.value.strerror == f"syncfs failed: {os.strerror(errno.EIO)}"

    monkeypatch.setattr(_durable, "_SYNCFS", None)
    sync_filesystem(tmp_path)  # no syncfs: an fsync of the path
    assert syncs.paths == [str(tmp_path)] and open_fds() == before


def test_syncfs_is_found_on_linux_only(monkeypatch: pytest.MonkeyPatch) -> None:
    if sys.platform.startswith("linux"):
        found = _durable._find_syncfs()
        assert found is not None and found.__name__ == "syncfs"
        ctypes.set_errno(0)
        assert found(-1) == -1 and ctypes.get_errno() == errno.EBADF  # errno is kept
    monkeypatch.setattr(_durable.ctypes, "CDLL", lambda *args, **kwargs: object())
    assert _durable._find_syncfs() is None  # a libc without syncfs
    monkeypatch.setattr(sys, "platform", "darwin")
    assert _durable._find_syncfs() is None
    monkeypatch.setattr(sys, "platform", "linux")

    def no_libc(*args: Any, **kwargs: Any) -> Any:
        raise OSError("no libc")

    monkeypatch.setattr(_durable.ctypes, "CDLL", no_libc)
    assert _durable._find_syncfs() is None


def test_the_loose_estimate_counts_one_fan_out_directory(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    assert object_store._estimate_loose(objects) == 0
    (objects / "17").mkdir(parents=True)
    (objects / "18").mkdir()
    for name in ("a", "b", "c"):
        (objects / "17" / name).write_bytes(b"")
        (objects / "18" / name).write_bytes(b"")
    assert object_store._estimate_loose(objects) == 3 * 256
