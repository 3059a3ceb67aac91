"""Git objects written by Kernos are the objects git itself would write."""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

import pytest

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
from support import git


@pytest.fixture
def objects(repo: Path, tmp_path: Path) -> LooseObjects:
    return LooseObjects(repo, journal=tmp_path / "pending", scratch=tmp_path / "tmp",
                        durable=True)


def test_object_id_matches_git_hash_object(repo: Path) -> None:
    data = b"hello kernos\n" * 1000
    expected = git(repo, "hash-object", "--stdin", data=data).decode().strip()
    assert object_id(b"blob", data).hex() == expected


def test_written_blob_is_readable_by_git_and_by_us(objects: LooseObjects, repo: Path) -> None:
    data = os.urandom(300_000)  # incompressible: stored with zlib level 0
    sha = object_id(b"blob", data)
    objects.begin()
    written = objects.write(b"blob", data, sha)
    path = objects.objects / sha.hex()[:2] / sha.hex()[2:]
    assert written == path.stat().st_size > 0  # what it takes on disk, compressed
    assert objects.write(b"blob", data, sha) == 0  # already there: not written twice
    objects.finish()
    assert git(repo, "cat-file", "-p", sha.hex()) == data
    assert objects.read(sha) == (b"blob", data)


def test_tree_and_commit_encoding_is_accepted_by_git_fsck(objects: LooseObjects,
                                                          repo: Path) -> None:
    objects.begin()
    blob = object_id(b"blob", b"x")
    objects.write(b"blob", b"x", blob)
    inner = encode_tree([TreeEntry(BLOB_MODE, "s.000000", blob)])
    inner_sha = object_id(b"tree", inner)
    objects.write(b"tree", inner, inner_sha)
    # "a" as a tree sorts after "a.b" as a blob in git's order ("a/" > "a.b").
    root = encode_tree([TreeEntry(TREE_MODE, "a", inner_sha), TreeEntry(BLOB_MODE, "a.b", blob),
                        TreeEntry(BLOB_MODE, "Z", blob)])
    root_sha = object_id(b"tree", root)
    objects.write(b"tree", root, root_sha)
    commit = CommitData(tree=root_sha, parents=(), author="human <human@kernos.invalid>",
                        timestamp=1_700_000_000, message="op 1 by human: x\n")
    body = encode_commit(commit)
    commit_sha = object_id(b"commit", body)
    objects.write(b"commit", body, commit_sha)
    objects.seal(commit_sha)
    (repo / "refs" / "heads" / "main").write_text(commit_sha.hex() + "\n")
    objects.finish()
    (repo / "HEAD").write_text("ref: refs/heads/main\n")
    subprocess.run(["git", "-C", str(repo), "fsck", "--full", "--strict"], check=True,
                   capture_output=True)
    listing = git(repo, "ls-tree", root_sha.hex()).decode().splitlines()
    assert [line.split("\t")[1] for line in listing] == ["Z", "a.b", "a"]
    assert [entry.name for entry in decode_tree(root)] == ["Z", "a.b", "a"]
    assert decode_commit(body) == commit


def test_tree_rejects_names_git_cannot_hold() -> None:
    sha = b"\0" * 20
    for bad in ("", "a/b", "nul\0"):
        with pytest.raises(ValueError, match="cannot be a git tree entry name"):
            encode_tree([TreeEntry(BLOB_MODE, bad, sha)])


def test_discard_deletes_exactly_what_the_batch_wrote(objects: LooseObjects) -> None:
    objects.begin()
    kept = object_id(b"blob", b"kept")
    objects.write(b"blob", b"kept", kept)
    objects.finish()
    objects.begin()
    objects.write(b"blob", b"kept", kept)  # exists: not journaled, must survive
    new = object_id(b"blob", b"new")
    objects.write(b"blob", b"new", new)
    objects.discard()
    assert objects.exists(kept)
    assert not objects.exists(new)
    assert not objects.journal.exists()


def test_recover_discards_an_unpublished_batch_and_keeps_a_published_one(
    objects: LooseObjects,
) -> None:
    objects.begin()
    orphan = object_id(b"blob", b"orphan")
    objects.write(b"blob", b"orphan", orphan)
    objects.seal(b"\x01" * 20)
    objects._close_journal()  # the process dies here: the journal stays behind
    (objects.scratch / "leftover.123").write_bytes(b"half an object")
    note = objects.recover(head=b"\x02" * 20)
    assert note is not None and "discarded" in note
    assert not objects.exists(orphan)
    assert list(objects.scratch.iterdir()) == []

    objects.begin()
    published = object_id(b"blob", b"published")
    objects.write(b"blob", b"published", published)
    objects.seal(b"\x03" * 20)
    objects._close_journal()  # died after the ref moved, before the journal was removed
    note = objects.recover(head=b"\x03" * 20)
    assert note is not None and "completed" in note
    assert objects.exists(published)
    assert not objects.journal.exists()


def test_truncated_object_is_reported_not_misread(objects: LooseObjects) -> None:
    data = b"y" * 10_000
    sha = object_id(b"blob", data)
    objects.begin()
    objects.write(b"blob", data, sha)
    objects.finish()
    path = objects.objects / sha.hex()[:2] / sha.hex()[2:]
    raw = zlib.decompress(path.read_bytes())
    os.chmod(path, 0o644)
    path.write_bytes(zlib.compress(raw[:-10]))
    with pytest.raises(ValueError, match="truncated"):
        objects.read(sha)


def test_packed_objects_are_read_through_gitpython(objects: LooseObjects, repo: Path) -> None:
    data = b"packed " * 100
    sha = git(repo, "hash-object", "-w", "--stdin", data=data).decode().strip()
    git(repo, "update-ref", "refs/heads/keep",
        git(repo, "commit-tree", git(repo, "mktree", data=f"100644 blob {sha}\tf\n".encode())
            .decode().strip(), "-m", "x").decode().strip())
    git(repo, "repack", "-a", "-d", "-q")
    git(repo, "prune-packed")
    assert not (repo / "objects" / sha[:2] / sha[2:]).exists()
    assert objects.exists(bytes.fromhex(sha))
    assert objects.read(bytes.fromhex(sha)) == (b"blob", data)


@pytest.mark.parametrize("content", [os.urandom(300_000), b"compressible " * 30_000, b""])
def test_read_blob_into_copies_any_blob_exactly(objects: LooseObjects, content: bytes) -> None:
    sha = object_id(b"blob", content)
    objects.begin()
    objects.write(b"blob", content, sha)
    objects.finish()
    out = bytearray(len(content))
    objects.read_blob_into(sha, memoryview(out))
    assert bytes(out) == content
    with pytest.raises(ValueError, match="not a blob of"):
        objects.read_blob_into(sha, memoryview(bytearray(len(content) + 1)))


def test_read_blob_into_detects_a_flipped_bit_in_a_stored_chunk(objects: LooseObjects) -> None:
    content = os.urandom(200_000)  # stored with zlib level 0: copied without inflating
    sha = object_id(b"blob", content)
    objects.begin()
    objects.write(b"blob", content, sha)
    objects.finish()
    path = objects.objects / sha.hex()[:2] / sha.hex()[2:]
    damaged = bytearray(path.read_bytes())
    damaged[100_000] ^= 0x01
    os.chmod(path, 0o644)
    path.write_bytes(bytes(damaged))
    with pytest.raises(zlib.error):
        objects.read_blob_into(sha, memoryview(bytearray(len(content))))
