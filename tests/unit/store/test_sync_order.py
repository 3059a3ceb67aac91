"""What a durable commit syncs, and in which order (``Workspace.set_head``).

A crash of the machine loses what was written but not synced, so the order
of the syncs is the promise.  The syscalls are recorded as they happen.

* A small commit goes to the tail (``kernos.store.tail``): the op's audit
  record is synced before its frame is even written, and the frame is synced
  before the op returns.  Nothing else is written.
* A fold: the tail's pack, its index and their directory are synced before
  the ref's file is renamed into place, the ref's directory after it, and the
  tail is emptied only then.
* A commit too big for a frame: before the ref is renamed, the commit's pack
  and index, their directory, the pending journal, the new ref's file and the
  op's audit record must all be synced; the ref's directory after the rename.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from core_support import CoreEnv


class Syscalls:
    """Records fsync, fdatasync, write and ftruncate (by the path of the fd, from /proc)
    and rename, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        real_fsync, real_replace = os.fsync, os.replace
        real_fdatasync, real_write, real_ftruncate = os.fdatasync, os.write, os.ftruncate

        def recorded(kind: str, real: Any) -> Any:
            def call(fd: int, *args: Any) -> Any:
                path = os.readlink(f"/proc/self/fd/{fd}")
                result = real(fd, *args)
                with self._lock:
                    self.events.append((kind, path))
                return result
            return call

        fsynced = recorded("fsync", real_fsync)
        monkeypatch.setattr(os, "fdatasync", recorded("fdatasync", real_fdatasync))
        monkeypatch.setattr(os, "write", recorded("write", real_write))
        monkeypatch.setattr(os, "ftruncate", recorded("ftruncate", real_ftruncate))

        def replaced(source: Any, target: Any) -> None:
            real_replace(source, target)
            with self._lock:
                self.events.append(("rename", os.fspath(target)))

        monkeypatch.setattr(os, "fsync", fsynced)
        monkeypatch.setattr(os, "replace", replaced)

    def clear(self) -> None:
        self.events.clear()

    def index(self, kind: str, path: Path | str) -> int:
        found = [number for number, event in enumerate(self.events)
                 if event == (kind, str(path))]
        assert len(found) == 1, (kind, path, self.events)
        return found[0]


BIG = "x = bytes(range(256)) * 8192 + os.urandom(2_000_000)"
"""A value too big for a frame (``FRAME_MAX``): its commit is written as a pack."""


def test_a_small_commit_is_one_synced_frame_carrying_its_audit_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
    env = CoreEnv(tmp_path / "ws")
    assert env.workspace is not None and env.workspace.durable
    env.run("x = 0")
    calls = Syscalls(monkeypatch)
    env.run("x += 1")
    tail = tmp_path / "ws" / "tail"
    assert calls.index("write", tail) < calls.index("fdatasync", tail), calls.events
    syncs = [event for event in calls.events if event[0] in ("fsync", "fdatasync")]
    assert syncs == [("fdatasync", str(tail))], calls.events  # one sync, nothing else
    assert not [event for event in calls.events if event[0] == "rename"], calls.events
    assert env.workspace.tail.frames and env.workspace.head() == env.workspace.tail.head
    record = env.image.audit.last_line
    assert env.workspace.tail.frames[-1].record == record and b'"op":2' in record


def test_the_open_puts_back_an_audit_record_only_a_frame_kept(tmp_path: Path) -> None:
    """A power cut after the frame's sync can lose the chain's unsynced end."""
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 0")
    env.run("x += 1")
    env.run("x += 1")
    assert env.workspace is not None and len(env.workspace.tail.frames) == 3
    chain = tmp_path / "ws" / "audit" / "chain.jsonl"
    whole = chain.read_bytes()
    lines = whole.splitlines(keepends=True)
    last_two = b"".join(lines[-2:])
    env.workspace.objects.close()  # the process dies: no fold, no close
    env.workspace.lock.release()  # type: ignore[union-attr]
    env.workspace = None
    chain.write_bytes(whole[: -len(last_two)] + lines[-2][:10])  # lost, and torn
    env.reopen()
    assert env.ns["x"] == 2
    assert chain.read_bytes() == whole
    assert "put back 2 audit record(s)" in (env.restore_report.recovery or "")
    from kernos.audit import verify

    assert verify(tmp_path / "ws").ok


def test_a_fold_syncs_the_pack_before_the_ref_and_empties_the_tail_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
    env = CoreEnv(tmp_path / "ws")
    assert env.workspace is not None
    env.run("x = 0")
    env.run("x += 1")
    head = env.workspace.head()
    calls = Syscalls(monkeypatch)
    assert env.workspace.fold() == 2
    ref = tmp_path / "ws" / "history.git" / "refs" / "heads" / "main"
    renamed = calls.index("rename", ref)
    before = {Path(path).name for kind, path in calls.events[:renamed] if kind == "fsync"}
    assert any(name.startswith("pack-") and name.endswith(".pack") for name in before)
    assert any(name.startswith("pack-") and name.endswith(".idx") for name in before)
    assert "pack" in before and "main.lock" in before, calls.events
    assert calls.index("fsync", ref.parent) > renamed
    emptied = calls.index("ftruncate", tmp_path / "ws" / "tail")
    assert emptied > renamed
    # The frames' audit records, which the chain has not synced, are synced before.
    assert calls.index("fsync", tmp_path / "ws" / "audit" / "chain.jsonl") < emptied
    assert env.workspace.head() == head and not env.workspace.tail.frames
    assert ref.read_text().strip() == head.hex()


def test_everything_a_big_commit_needs_is_synced_before_the_ref_moves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
    env = CoreEnv(tmp_path / "ws")
    assert env.workspace is not None and env.workspace.durable
    env.run("import os\nx = 0")
    calls = Syscalls(monkeypatch)
    env.run(BIG)
    ref = str(tmp_path / "ws" / "history.git" / "refs" / "heads" / "main")
    renames = [index for index, (kind, path) in enumerate(calls.events)
               if kind == "rename" and path == ref]
    assert len(renames) == 2, calls.events  # the fold of "x = 0", then this commit
    renames = renames[1:]
    before = {path for kind, path in calls.events[: renames[0]] if kind == "fsync"}
    after = {path for kind, path in calls.events[renames[0] :] if kind == "fsync"}
    names = {Path(path).name for path in before}
    packs = tmp_path / "ws" / "history.git" / "objects" / "pack"
    assert any(name.startswith("pack-") and name.endswith(".pack") for name in names), names
    assert any(name.startswith("pack-") and name.endswith(".idx") for name in names), names
    assert str(packs) in before
    assert str(tmp_path / "ws" / "pending") in before  # the journal naming the commit
    assert ref + ".lock" in before
    assert str(tmp_path / "ws" / "audit" / "chain.jsonl") in before
    assert str(Path(ref).parent) in after


def test_a_failed_frame_sync_leaves_the_head_and_rolls_the_op_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 0")
    assert env.workspace is not None
    head = env.workspace.head()
    tail = tmp_path / "ws" / "tail"
    size = tail.stat().st_size
    real_fdatasync = os.fdatasync
    failing = {"on": True}

    def broken(fd: int) -> None:
        if failing["on"] and os.readlink(f"/proc/self/fd/{fd}") == str(tail):
            raise OSError(5, "Input/output error")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(Exception, match=r"Input/output error|could not be committed"):
        env.run("x += 1")
    failing["on"] = False
    assert env.workspace.head() == head and env.ns["x"] == 0
    assert tail.stat().st_size == size  # the frame written is cut off again
    env.run("x += 2")
    env.reopen()
    assert env.ns["x"] == 2


def test_a_failed_sync_leaves_the_ref_and_rolls_the_op_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
    env = CoreEnv(tmp_path / "ws")
    env.run("import os\nx = 0")
    assert env.workspace is not None
    env.workspace.fold()  # so that the sync that fails is this commit's, not a fold's
    head = env.workspace.head()
    real_fsync = os.fsync
    failing = {"on": True}

    def broken(fd: int) -> None:
        if failing["on"] and os.readlink(f"/proc/self/fd/{fd}").endswith("main.lock"):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(Exception, match=r"Input/output error|could not be committed"):
        env.run(BIG)
    failing["on"] = False
    assert env.workspace.head() == head and env.ns["x"] == 0
    assert not (tmp_path / "ws" / "history.git" / "refs" / "heads" / "main.lock").exists()
    env.run("x += 2")
    env.reopen()
    assert env.ns["x"] == 2
