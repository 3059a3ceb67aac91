"""The commit tail (``kernos.store.tail``): frames, their recovery rules, and its readers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from core_support import CoreEnv
from kernos import Workspace
from kernos.store.objects import object_id
from kernos.store.tail import Frame, Tail, continuing, decode_frames, encode_frame


def raw_blob(data: bytes) -> tuple[bytes, bytes]:
    """A blob as a pack entry (whole object, zlib), with its id."""
    import zlib

    from kernos.store.packs import _entry_header

    return object_id(b"blob", data), _entry_header(3, len(data)) + zlib.compress(data)


def frame(commit: bytes, parent: bytes | None, *blobs: bytes) -> bytes:
    entries = [raw_blob(blob) for blob in blobs] + [(commit, raw_blob(commit)[1])]
    return encode_frame(commit, parent, entries)


A, B, C = b"\xaa" * 20, b"\xbb" * 20, b"\xcc" * 20


def test_a_torn_or_damaged_frame_ends_the_tail_there() -> None:
    data = frame(A, None, b"one") + frame(B, A, b"two") + frame(C, B, b"three")
    frames, end = decode_frames(data)
    assert [f.commit for f in frames] == [A, B, C] and end == len(data)
    for cut in (len(data) - 1, len(data) - 30):
        frames, end = decode_frames(data[:cut])
        assert [f.commit for f in frames] == [A, B]
    first = len(frame(A, None, b"one"))
    damaged = bytearray(data)
    damaged[first + 50] ^= 0x01  # one bit inside the second frame
    frames, end = decode_frames(bytes(damaged))
    assert [f.commit for f in frames] == [A] and end == first
    frames, _ = decode_frames(data[:first] + b"\0" * 200)  # a zeroed end
    assert [f.commit for f in frames] == [A]


def test_only_frames_that_continue_the_ref_count() -> None:
    frames = [Frame(A, None), Frame(B, A), Frame(C, B)]
    assert [f.commit for f in continuing(frames, None)] == [A, B, C]
    assert [f.commit for f in continuing(frames, A)] == [B, C]  # A was folded already
    assert continuing(frames, C) == []  # all folded; the tail was not emptied yet
    assert continuing(frames, b"\x01" * 20) == []  # another branch: stale
    assert [f.commit for f in continuing([Frame(A, None), Frame(C, A)], None)] == [A, C]
    assert [f.commit for f in continuing([Frame(A, None), Frame(C, B)], None)] == [A]


def test_load_reports_what_it_did_not_keep(tmp_path: Path) -> None:
    path = tmp_path / "tail"
    path.write_bytes(frame(A, None, b"one") + frame(B, A, b"two")[:-3])
    tail = Tail(path, ref=lambda: None, writable=True, durable=False)
    assert tail.load() is True and tail.head == A
    assert object_id(b"blob", b"one") in tail.objects
    path.write_bytes(frame(A, None, b"one"))
    assert tail.load() is False


def test_a_reader_sees_the_writers_commits_before_and_after_a_fold(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    env.run("x += 1")
    writer = env.workspace
    assert writer is not None and len(writer.tail.frames) == 2
    with Workspace.open(tmp_path / "ws", writable=False) as reader:
        assert reader.head() == writer.head()
        assert reader.read_commit(writer.head()).parents  # read from the tail file
        assert writer.fold() == 2
        env.run("x += 1")
        assert reader.head() == writer.head()  # the ref moved, one new frame
        assert reader.read_commit(writer.head()).parents[0] == writer.tail.frames[0].parent
    env.close()


def test_closing_folds_so_that_git_sees_every_commit(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    env.run("x += 1")
    assert env.workspace is not None
    head = env.workspace.head()
    assert head is not None
    env.close()
    git = ["git", "-C", str(tmp_path / "ws" / "history.git")]
    assert subprocess.run([*git, "rev-parse", "main"], capture_output=True, text=True,
                          check=True).stdout.strip() == head.hex()
    assert (tmp_path / "ws" / "tail").read_bytes() == b""
    fsck = subprocess.run([*git, "fsck", "--full", "--strict"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr


@pytest.mark.parametrize("frames", [64, 3])
def test_the_tail_folds_by_itself_when_it_grows(tmp_path: Path, frames: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import kernos.store.workspace as workspace_module

    monkeypatch.setattr(workspace_module, "FOLD_FRAMES", frames)
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 0")
    for _ in range(frames - 1):
        env.run("x += 1")
    assert env.workspace is not None and not env.workspace.tail.frames
    ref = (tmp_path / "ws" / "history.git" / "refs" / "heads" / "main").read_text().strip()
    assert ref == env.workspace.head().hex()
    env.close()


def test_a_fold_that_fails_after_a_commit_does_not_fail_the_op(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kernos.store.workspace as workspace_module

    monkeypatch.setattr(workspace_module, "FOLD_FRAMES", 2)
    env = CoreEnv(tmp_path / "ws")
    assert env.workspace is not None
    objects = env.workspace.objects
    real = objects.pack_tail

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(objects, "pack_tail", full_disk)
    for number in range(4):
        assert env.run(f"x = {number}").commit  # committed: the frames are durable
    assert len(env.workspace.tail.frames) == 4
    monkeypatch.setattr(objects, "pack_tail", real)
    env.run("x = 9")  # the next commit over the threshold folds them all
    assert not env.workspace.tail.frames
    env.reopen()
    assert env.ns["x"] == 9
    env.close()


@pytest.mark.parametrize("folded_before", [0, 2])
def test_a_replay_reads_commits_a_dead_kernel_left_in_the_tail(tmp_path: Path,
                                                                folded_before: int) -> None:
    from kernos.replay import replay

    env = CoreEnv(tmp_path / "ws")
    for number in range(folded_before):
        env.run(f"x = {number}")
    assert env.workspace is not None
    env.workspace.fold()
    env.run("items = [1, 2]")
    env.run("items.append(3)")
    assert len(env.workspace.tail.frames) == 2
    env.workspace.objects.close()  # the process dies: no fold
    env.workspace.lock.release()  # type: ignore[union-attr]
    env.workspace = None
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.divergence
    committed = [step for step in report.steps if step.status == "committed"]
    assert len(committed) == folded_before + 2
    assert all(step.digest == step.original for step in committed)
