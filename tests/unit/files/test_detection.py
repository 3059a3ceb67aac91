"""What a commit reads and stores of tracked files, and what it refuses (kernos.files)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import kernos.files
from core_support import CoreEnv
from kernos.files import PathRefused, contents, scan
from kernos.store.snapshots import CHUNK_BYTES


@pytest.fixture
def env(tmp_path: Path) -> Iterator[CoreEnv]:
    opened = CoreEnv(tmp_path / "ws")
    yield opened
    opened.close()


def commit(env: CoreEnv, action: object = None) -> kernos.CommitReport:
    op = env.image.begin(source="# files")
    if callable(action):
        action()
    return op.commit()


def settle(env: CoreEnv) -> None:
    """Let the files just written age past the racy window, and one op read them again."""
    time.sleep(scan.RACY_NS / 1e9 + 0.05)
    commit(env)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tracked files a commit opens to read, in order."""
    seen: list[str] = []
    real = contents._open

    def counted(path: str) -> int:
        seen.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(contents, "_open", counted)
    return seen


def test_an_op_that_touches_no_file_reads_none(env: CoreEnv, opened: list[str]) -> None:
    root = kernos.files.root()
    for number in range(50):
        (root / f"f{number:02d}").write_bytes(os.urandom(100 + number))
    commit(env)
    assert len(opened) == 50
    settle(env)
    opened.clear()
    report = commit(env)
    assert opened == []
    assert report.unchanged and report.files == {}
    report = commit(env, lambda: (root / "f07").write_bytes(b"edited"))
    assert opened == ["f07"]
    assert report.files == {"changed": ["f07"]}


def test_a_rewrite_of_equal_size_with_the_old_mtime_put_back_is_seen(env: CoreEnv) -> None:
    path = kernos.files.root() / "same-size"
    path.write_bytes(b"aaaa")
    commit(env)
    settle(env)
    before = os.stat(path)
    path.write_bytes(b"bbbb")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # ctime cannot be put back
    report = commit(env)
    assert report.files == {"changed": ["same-size"]}


def test_a_one_byte_edit_in_a_big_file_stores_about_one_chunk(env: CoreEnv) -> None:
    path = kernos.files.root() / "big.bin"
    size = 16 * CHUNK_BYTES
    path.write_bytes(os.urandom(size))
    first = commit(env)
    assert first.bytes_written > size
    with open(path, "r+b") as file:
        file.seek(size // 2 + 12345)
        file.write(b"\xff")
    edited = commit(env)
    assert edited.files == {"changed": ["big.bin"]}
    assert CHUNK_BYTES <= edited.bytes_written <= CHUNK_BYTES + 32 * 1024
    with open(path, "ab") as file:
        file.write(b"appended")
    appended = commit(env)
    assert appended.bytes_written <= 32 * 1024  # a new last chunk of 8 bytes, and trees
    env.reopen()
    assert path.stat().st_size == size + 8


def test_a_file_that_keeps_changing_while_read_keeps_its_committed_version(
        env: CoreEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    path = kernos.files.root() / "log"
    path.write_bytes(b"line 1\n")
    commit(env)
    real = contents._pieces

    def growing(fd: int, size: int, name: str = "") -> Iterator[bytes]:
        with open(path, "ab") as writer:  # another thread, appending meanwhile
            writer.write(b"more\n")
        yield from real(fd, size, name)

    monkeypatch.setattr(contents, "_pieces", growing)
    path.write_bytes(b"line 1\nline 2\n")
    report = commit(env)
    assert report.files["notices"] == ["log: it was still being written at commit: the "
                                       "snapshot keeps it as the last commit had it"]
    monkeypatch.undo()
    report = commit(env)
    assert report.files == {"changed": ["log"]}


def test_paths_that_leave_the_files_root_are_refused(env: CoreEnv) -> None:
    root = kernos.files.root()
    assert kernos.files.path("reports/r.md") == root / "reports" / "r.md"
    assert kernos.files.path(str(root / "a" / "b")) == root / "a" / "b"
    for bad in ("../outside", "a/../../b", "/etc/passwd", "a\0b", "", "."):
        with pytest.raises(PathRefused):
            kernos.files.path(bad)


def test_links_and_special_files_are_reported_once_and_left_alone(
        env: CoreEnv, tmp_path: Path) -> None:
    root = kernos.files.root()
    outside = tmp_path / "secret"
    outside.write_text("not the image's")
    (root / "to-outside").symlink_to(outside)
    (root / "target").write_text("inside")
    (root / "to-inside").symlink_to("target")
    os.link(outside, root / "hard")
    os.mkfifo(root / "pipe")
    report = commit(env)
    assert report.files["added"] == ["target", "to-inside"]
    notices = report.files["notices"]
    assert sorted(notice.split(":")[0] for notice in notices) == ["hard", "pipe", "to-outside"]
    assert commit(env, lambda: (root / "target").write_text("again")).files == {
        "changed": ["target"]}  # told once only
    op = env.image.begin(source="# fails")
    (root / "to-inside").unlink()
    op.abort(error=RuntimeError("no"))
    assert os.readlink(root / "to-inside") == "target"
    assert (root / "pipe").exists() and (root / "to-outside").is_symlink()
    env.reopen()
    assert (root / "hard").read_text() == "not the image's"


def test_the_workspace_cannot_track_itself(env: CoreEnv) -> None:
    assert env.workspace is not None
    with pytest.raises(PathRefused):
        env.image.files.track(env.workspace.path)
    with pytest.raises(PathRefused):
        env.image.files.track(env.workspace.path / "history.git")
