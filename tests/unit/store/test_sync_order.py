"""What a durable commit syncs, and in which order (``Workspace.set_head``).

A crash of the machine loses what was written but not synced, so the order
of the syncs is the promise: before the branch's ref is renamed into place,
the commit's pack and index, their directory, the pending journal, the new
ref's file and the op's audit record must all be synced; the ref's directory
after the rename.  The syscalls are recorded as they happen.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from core_support import CoreEnv


class Syscalls:
    """Records fsync (by the path of the fd, from /proc) and rename, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        real_fsync, real_replace = os.fsync, os.replace

        def fsynced(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            real_fsync(fd)
            with self._lock:
                self.events.append(("fsync", path))

        def replaced(source: Any, target: Any) -> None:
            real_replace(source, target)
            with self._lock:
                self.events.append(("rename", os.fspath(target)))

        monkeypatch.setattr(os, "fsync", fsynced)
        monkeypatch.setattr(os, "replace", replaced)

    def clear(self) -> None:
        self.events.clear()


def test_everything_a_commit_needs_is_synced_before_the_ref_moves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
    env = CoreEnv(tmp_path / "ws")
    assert env.workspace is not None and env.workspace.durable
    env.run("x = 0")
    calls = Syscalls(monkeypatch)
    env.run("x += 1")
    ref = str(tmp_path / "ws" / "history.git" / "refs" / "heads" / "main")
    renames = [index for index, (kind, path) in enumerate(calls.events)
               if kind == "rename" and path == ref]
    assert len(renames) == 1, calls.events
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


def test_a_failed_sync_leaves_the_ref_and_rolls_the_op_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 0")
    assert env.workspace is not None
    head = env.workspace.head()
    real_fsync = os.fsync
    failing = {"on": True}

    def broken(fd: int) -> None:
        if failing["on"] and os.readlink(f"/proc/self/fd/{fd}").endswith("main.lock"):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(Exception, match=r"Input/output error|could not be committed"):
        env.run("x += 1")
    failing["on"] = False
    assert env.workspace.head() == head and env.ns["x"] == 0
    assert not (tmp_path / "ws" / "history.git" / "refs" / "heads" / "main.lock").exists()
    env.run("x += 2")
    env.reopen()
    assert env.ns["x"] == 2
