"""A fork never holds a commit its source can still lose (``kernos.fork``, group commit).

Under a group commit the source's kernel writes a commit's frame and audit
record before it syncs them.  The power cut is modelled exactly: every
``fsync`` and ``fdatasync`` is recorded (the file, by inode, and its size
then), and the cut truncates the source's tail and audit chain to what was
last synced, which is all a machine that loses power keeps of an appended
file.  The interleaving is fixed: the op commits in a group, the fork runs,
the power goes, before the group's sync.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from core_support import CoreEnv
from kernos.audit import verify
from kernos.fork import fork


class PowerCut:
    """The size of each file (by inode) at its last sync; :meth:`cut` keeps only that."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.synced: dict[int, int] = {}

        def recorded(real: Any) -> Any:
            def sync(fd: int) -> None:
                stat = os.fstat(fd)
                real(fd)
                self.synced[stat.st_ino] = stat.st_size
            return sync

        monkeypatch.setattr(os, "fsync", recorded(os.fsync))
        monkeypatch.setattr(os, "fdatasync", recorded(os.fdatasync))

    def cut(self, path: Path) -> int:
        """Truncate ``path`` to its last synced size; how many bytes were lost."""
        size = path.stat().st_size
        kept = self.synced.get(path.stat().st_ino, 0)
        os.truncate(path, min(size, kept))
        return size - min(size, kept)


def _lose_power(env: CoreEnv, power: PowerCut) -> int:
    """The source's process dies without a fold or a close, then its machine loses power."""
    workspace = env.workspace
    assert workspace is not None and workspace.lock is not None
    env.image.audit.close()
    workspace.tail.close()
    workspace.objects.close()
    workspace.lock.release()
    env.workspace = None
    return power.cut(env.path / "tail") + power.cut(env.path / "audit" / "chain.jsonl")


def test_a_fork_during_a_group_commit_holds_only_what_the_source_keeps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
    power = PowerCut(monkeypatch)
    source, dest = tmp_path / "src", tmp_path / "dst"
    env = CoreEnv(source)
    env.run("n = 1")  # acknowledged: its frame synced
    assert env.workspace is not None
    with env.workspace.group_commit():
        env.run("n = 2")  # its frame and record written, the group's sync not yet run
    workspace = env.workspace
    assert not workspace.durable_through(workspace.commit_ticket)
    head = workspace.head()
    assert head is not None

    made = fork(source, dest)  # beside the writer, between the op's commit and its sync
    assert made.commit == head.hex()  # HEAD is the newest commit, acknowledged or not

    _lose_power(env, power)
    env.reopen()  # the source's next kernel: what survived the cut
    restored = env.ns["n"]
    env.run("n = 3")  # the source goes on: its chain grows past the record the fork names
    env.close()
    # The fork's origin is checked against the source's chain as it is after the cut.
    report = verify(dest)
    assert report.ok, report.summary()
    assert report.origin is not None and "confirmed" in report.origin, report.origin
    report = verify(source)
    assert report.ok, report.summary()
    assert restored == 2, "the source lost a commit its fork holds"
    forked = CoreEnv(dest)
    try:
        assert forked.ns["n"] == 2
    finally:
        forked.close()
    genesis = json.loads((dest / "audit" / "chain.jsonl").read_text().splitlines()[0])
    named = genesis["forked_from"]["audit"]
    lines = (source / "audit" / "chain.jsonl").read_text().splitlines()
    assert json.loads(lines[named["index"]])["hash"] == named["hash"]


def test_the_model_loses_what_was_not_synced(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The power cut above can fail: without the fork, the unsynced commit is lost."""
    monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
    power = PowerCut(monkeypatch)
    env = CoreEnv(tmp_path / "src")
    env.run("n = 1")
    assert env.workspace is not None
    with env.workspace.group_commit():
        env.run("n = 2")
    assert _lose_power(env, power) > 0
    env.reopen()
    assert env.ns["n"] == 1
    env.close()
    report = verify(tmp_path / "src")
    assert report.ok, report.summary()


def test_a_sync_the_disk_refuses_refuses_the_fork(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    env = CoreEnv(tmp_path / "src")
    env.run("n = 1")
    assert env.workspace is not None
    with env.workspace.group_commit():
        env.run("n = 2")
    real = os.fdatasync
    source_tail = os.stat(tmp_path / "src" / "tail").st_ino

    def refused(fd: int) -> None:
        if os.fstat(fd).st_ino == source_tail:
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", refused)
    from kernos.errors import WorkspaceError

    with pytest.raises(WorkspaceError, match=r"did not confirm .*tail.*nothing was forked"):
        fork(tmp_path / "src", tmp_path / "dst")
    assert not (tmp_path / "dst").exists()
    assert not list(tmp_path.glob(".dst.forking-*"))
    monkeypatch.undo()
    env.close()
