"""Packs: what a commit writes, what git makes of it, and what a crash or a repack leaves.

Every check that matters is made by git itself: ``git fsck --full
--strict`` on the repository, ``git cat-file`` for an object's bytes, and
``git repack`` (with deltas) to produce packs the reader did not write.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import types
from pathlib import Path

import pytest

from kernos import Image, Workspace
from kernos.store import object_store as objects_module
from kernos.store.object_store import ObjectStore
from kernos.store.objects import object_id
from kernos.store.packs import PackSet, apply_delta


def git(git_dir: Path, *args: str, data: bytes | None = None) -> bytes:
    done = subprocess.run(["git", f"--git-dir={git_dir}", *args], input=data,
                          capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def fsck_clean(git_dir: Path) -> None:
    done = subprocess.run(["git", f"--git-dir={git_dir}", "fsck", "--full", "--strict",
                           "--no-dangling"], capture_output=True, text=True, timeout=120)
    complaints = [line for line in done.stderr.splitlines() if not line.startswith("notice:")]
    assert done.returncode == 0 and not complaints, done.stderr


def new_repo(tmp_path: Path) -> Path:
    git_dir = tmp_path / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True)
    return git_dir


def store(git_dir: Path, tmp_path: Path) -> ObjectStore:
    return ObjectStore(git_dir, journal=tmp_path / "pending", scratch=tmp_path / "scratch",
                       durable=True)


def commit_blobs(objects: ObjectStore, blobs: list[bytes]) -> bytes:
    """Write ``blobs``, a tree naming them and a commit of it, as one batch; move master."""
    from kernos.store.objects import BLOB_MODE, CommitData, TreeEntry, encode_commit, encode_tree

    objects.begin()
    entries = []
    for number, blob in enumerate(blobs):
        sha = object_id(b"blob", blob)
        objects.write(b"blob", blob, sha)
        entries.append(TreeEntry(BLOB_MODE, f"b{number}", sha))
    tree = encode_tree(entries)
    tree_sha = object_id(b"tree", tree)
    objects.write(b"tree", tree, tree_sha)
    head = subprocess.run(["git", f"--git-dir={objects.git_dir}", "rev-parse", "-q", "--verify",
                           "refs/heads/master"], capture_output=True, text=True).stdout.strip()
    commit = encode_commit(CommitData(tree=tree_sha, parents=(bytes.fromhex(head),) if head
                                      else (), author="t <t@kernos.invalid>", timestamp=1,
                                      message="batch"))
    commit_sha = object_id(b"commit", commit)
    objects.write(b"commit", commit, commit_sha)
    objects.seal(commit_sha)
    git(objects.git_dir, "update-ref", "refs/heads/master", commit_sha.hex())
    objects.finish()
    return commit_sha


def test_a_batch_is_one_pack_that_git_reads_back_byte_for_byte(tmp_path: Path) -> None:
    git_dir = new_repo(tmp_path)
    objects = store(git_dir, tmp_path)
    rng = random.Random(7)
    blobs = [b"", b"x", rng.randbytes(100), rng.randbytes(70_000), b"a" * 300_000]
    commit = commit_blobs(objects, blobs)
    packs = sorted(p.name for p in (git_dir / "objects" / "pack").iterdir())
    assert len(packs) == 2 and packs[0].endswith(".idx") and packs[1].endswith(".pack")
    assert not list((git_dir / "objects").glob("[0-9a-f][0-9a-f]"))  # nothing loose
    for blob in blobs:
        sha = object_id(b"blob", blob).hex()
        assert git(git_dir, "cat-file", "blob", sha) == blob
        assert objects.read(bytes.fromhex(sha)) == (b"blob", blob)
    assert git(git_dir, "cat-file", "-t", commit.hex()) == b"commit\n"
    fsck_clean(git_dir)
    objects.close()


def test_a_large_batch_is_cut_into_packs_of_bounded_size(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects_module, "SPILL_BYTES", 100_000)
    git_dir = new_repo(tmp_path)
    objects = store(git_dir, tmp_path)
    blobs = [os.urandom(40_000) for _ in range(10)]
    commit_blobs(objects, blobs)
    assert len(list((git_dir / "objects" / "pack").glob("*.pack"))) == 4
    for blob in blobs:
        assert git(git_dir, "cat-file", "blob", object_id(b"blob", blob).hex()) == blob
    fsck_clean(git_dir)
    objects.close()


def test_packs_git_deltified_are_read_back_exactly(tmp_path: Path) -> None:
    git_dir = new_repo(tmp_path)
    objects = store(git_dir, tmp_path)
    rng = random.Random(3)
    base = bytearray(rng.randbytes(50_000))
    versions = []
    for step in range(30):  # similar blobs: git stores most as deltas of others
        base[rng.randrange(len(base))] = step
        base += bytes([step]) * 10
        versions.append(bytes(base))
        commit_blobs(objects, [versions[-1]])
    git(git_dir, "repack", "-a", "-d", "-f", "-q", "--depth=50", "--window=50")
    listing = subprocess.run(["git", "verify-pack", "-v",
                              *map(str, (git_dir / "objects" / "pack").glob("*.idx"))],
                             capture_output=True, check=True).stdout
    assert b"chain length" in listing  # deltas exist, or this test proves nothing
    fresh = PackSet(git_dir / "objects" / "pack")
    for version in versions:
        assert fresh.read(object_id(b"blob", version)) == (b"blob", version)
    fresh.close()
    objects.close()


def test_apply_delta_refuses_a_delta_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        apply_delta(b"abc", bytes([4, 1, 3]))
    with pytest.raises(ValueError, match="past the end"):
        apply_delta(b"abc", bytes([3, 5, 0x80 | 0x01 | 0x10, 2, 5]))


def test_a_discarded_batch_leaves_no_pack(tmp_path: Path) -> None:
    git_dir = new_repo(tmp_path)
    objects = store(git_dir, tmp_path)
    objects.begin()
    blob = os.urandom(1000)
    objects.write(b"blob", blob, object_id(b"blob", blob))
    objects.seal(object_id(b"blob", blob))
    assert len(list((git_dir / "objects" / "pack").glob("*.pack"))) == 1
    objects.discard()
    assert list((git_dir / "objects" / "pack").iterdir()) == []
    objects.close()


def test_recovery_deletes_the_packs_of_a_commit_the_ref_never_named(tmp_path: Path) -> None:
    git_dir = new_repo(tmp_path)
    objects = store(git_dir, tmp_path)
    kept = commit_blobs(objects, [b"kept"])
    objects.begin()
    blob = b"half written"
    objects.write(b"blob", blob, object_id(b"blob", blob))
    objects.seal(b"\x01" * 20)  # the process dies here: the ref never moves
    objects.close()
    again = store(git_dir, tmp_path)
    note = again.recover(kept)
    assert note is not None and "discarded" in note
    assert len(list((git_dir / "objects" / "pack").glob("*.pack"))) == 1
    assert again.read(object_id(b"blob", b"kept"))[1] == b"kept"
    assert (tmp_path / "pending").read_bytes() == b""
    assert again.recover(kept) is None  # an empty journal: nothing was pending
    again.close()


def run_ops(path: Path, count: int, start: int = 0) -> None:
    with Workspace.open(path, purpose="test") as workspace:
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        image.restore()
        for number in range(start, start + count):
            op = image.begin(source=f"log.append({number})")
            module.__dict__.setdefault("log", []).append(number)
            op.commit()
        workspace.objects.wait_for_maintenance(timeout=120)


def restored_log(path: Path) -> list[int]:
    with Workspace.open(path, purpose="test") as workspace:
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        assert image.restore().failed == {}
        return list(module.__dict__["log"])


def test_a_background_repack_keeps_the_packs_few(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects_module, "REPACK_PACKS", 8)
    path = tmp_path / "ws"
    run_ops(path, 40)
    git_dir = path / "history.git"
    assert len(list((git_dir / "objects" / "pack").glob("*.pack"))) < 8
    assert restored_log(path) == list(range(40))
    assert int(git(git_dir, "rev-list", "--count", "HEAD")) == 40
    fsck_clean(git_dir)


def test_a_repack_killed_at_any_instant_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ws"
    run_ops(path, 30)
    git_dir = path / "history.git"
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2):
        repack = subprocess.Popen(["git", f"--git-dir={git_dir}", "repack", "-a", "-d", "-q",
                                   "-f"], start_new_session=True)
        time.sleep(delay)
        os.killpg(repack.pid, signal.SIGKILL)
        repack.wait()
        fsck_clean(git_dir)
        assert restored_log(path) == list(range(30))
    run_ops(path, 5, start=30)
    assert restored_log(path) == list(range(35))
    fsck_clean(git_dir)


def test_an_old_loose_workspace_still_opens_and_is_repacked(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    path = tmp_path / "ws"
    run_ops(path, 10)
    git_dir = path / "history.git"
    from kernos.store.maintenance import loosen

    loosen(git_dir)  # the layout a workspace of an earlier Kernos has
    assert restored_log(path) == list(range(10))
    monkeypatch.setattr(objects_module, "REPACK_LOOSE", 1)
    monkeypatch.setattr(objects_module, "_estimate_loose", lambda objects: 2)
    run_ops(path, 1, start=10)
    assert not list((git_dir / "objects").glob("[0-9a-f][0-9a-f]/*"))
    assert restored_log(path) == list(range(11))
    fsck_clean(git_dir)


def test_kernos_gc_leaves_one_pack_and_the_same_history(tmp_path: Path) -> None:
    import json
    import sys

    from kernos.audit import verify

    path = tmp_path / "ws"
    for number in range(12):  # a session's commits are folded into one pack when it closes
        run_ops(path, 1, start=number)
    git_dir = path / "history.git"
    head = git(git_dir, "rev-parse", "main")
    done = subprocess.run([sys.executable, "-m", "kernos.cli", "gc", "-w", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["before"]["packs"] == 12 and report["after"]["packs"] == 1
    assert report["after"]["loose"] == 0 and report["after"]["files"] < report["before"]["files"]
    assert git(git_dir, "rev-parse", "main") == head
    assert restored_log(path) == list(range(12))
    assert verify(path).ok
    fsck_clean(git_dir)
    missing = subprocess.run([sys.executable, "-m", "kernos.cli", "gc", "-w",
                              str(tmp_path / "nowhere")], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode != 0 and "does not exist" in missing.stderr


def test_kernos_gc_keeps_a_pack_whose_ref_has_not_moved_yet(tmp_path: Path) -> None:
    """A kernel between writing a pack (a commit's, a fold's) and moving its ref."""
    from kernos.store.maintenance import gc

    path = tmp_path / "ws"
    run_ops(path, 2)
    with Workspace.open(path, purpose="test") as workspace:
        objects = workspace.objects
        objects.begin()
        blob = b"written, its commit not yet published"
        sha = object_id(b"blob", blob)
        objects.write(b"blob", blob, sha)
        objects.seal(b"\x02" * 20)  # a pack, and the ref not moved
        gc(path)
        assert git(path / "history.git", "cat-file", "blob", sha.hex()) == blob
        assert len(list((path / "history.git" / "objects" / "pack").glob("*.pack"))) == 1
        objects.discard()
