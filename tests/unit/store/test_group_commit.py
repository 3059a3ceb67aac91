"""Group commit (``Workspace.group_commit``, ``Tail.sync``): small commits made in a group
are synced together, nothing that depends on them leaves before the sync, and a sync the
disk refuses stops the workspace from committing more."""

from __future__ import annotations

import errno
import types
from pathlib import Path

import pytest

from kernos import Image, Workspace
from kernos.store import tail as tail_module


def opened(path: Path) -> tuple[Workspace, Image, dict[str, object]]:
    workspace = Workspace.open(path)
    module = types.ModuleType("__main__")
    image = Image(workspace, module.__dict__, module=module)
    image.restore()
    return workspace, image, module.__dict__


def run(image: Image, ns: dict[str, object], source: str) -> None:
    op = image.begin(source=source)
    exec(source, ns)
    op.commit()



def test_commits_in_a_group_share_one_sync(tmp_path: Path, syncs: list[int]) -> None:
    workspace, image, ns = opened(tmp_path / "ws")
    run(image, ns, "n = 0")
    assert len(syncs) == 1  # outside a group: each commit syncs its frame
    before = workspace.commit_ticket
    with workspace.group_commit():
        for _ in range(3):
            run(image, ns, "n += 1")
    ticket = workspace.commit_ticket
    assert ticket == before + 3 and len(syncs) == 1
    assert workspace.durable_through(before) and not workspace.durable_through(ticket)
    workspace.make_durable()
    assert len(syncs) == 2 and workspace.durable_through(ticket)
    workspace.make_durable()  # nothing left to sync: no second call
    assert len(syncs) == 2 and workspace.tail.syncs == 2
    workspace.close()

    workspace, image, ns = opened(tmp_path / "ws")
    assert ns["n"] == 3
    workspace.close()


def test_a_fold_makes_a_group_durable(tmp_path: Path, syncs: list[int]) -> None:
    workspace, image, ns = opened(tmp_path / "ws")
    with workspace.group_commit():
        run(image, ns, "n = 1")
    ticket = workspace.commit_ticket
    assert not workspace.durable_through(ticket)
    assert image.fold() == 1  # a pack and a ref, each synced
    assert workspace.durable_through(ticket) and syncs == []
    workspace.close()


def test_a_refused_sync_sticks_and_no_more_commits_are_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workspace, image, ns = opened(tmp_path / "ws")
    run(image, ns, "n = 1")
    with workspace.group_commit():
        run(image, ns, "n = 2")

    def refused(_fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(tail_module.os, "fdatasync", refused)
    with pytest.raises(OSError, match=r"did not confirm .* Restart the kernel"):
        workspace.make_durable()
    monkeypatch.undo()
    with pytest.raises(OSError, match="did not confirm"):
        workspace.make_durable()  # it sticks: the frames' fate is unknown
    with pytest.raises(Exception, match="did not confirm"):
        run(image, ns, "n = 3")  # refused, and rolled back
    assert ns["n"] == 2
    workspace.tail.close()  # the process "restarts" without folding
    workspace.objects.close()
    if workspace.lock is not None:
        workspace.lock.release()

    workspace, image, ns = opened(tmp_path / "ws")
    assert ns["n"] in (1, 2)  # the unsynced frame survived here (the page cache kept it)
    run(image, ns, "n = 4")
    workspace.close()


def test_a_sync_in_another_thread_covers_what_was_appended_before_it(
        tmp_path: Path, syncs: list[int]) -> None:
    import threading

    workspace, image, ns = opened(tmp_path / "ws")
    with workspace.group_commit():
        run(image, ns, "n = 1")
        first = workspace.commit_ticket
        worker = threading.Thread(target=workspace.make_durable)
        worker.start()
        worker.join()
        run(image, ns, "n = 2")  # after that sync: the next one covers it
    assert workspace.durable_through(first)
    assert not workspace.durable_through(workspace.commit_ticket)
    workspace.make_durable()
    assert workspace.durable_through(workspace.commit_ticket) and len(syncs) == 2
    workspace.close()
