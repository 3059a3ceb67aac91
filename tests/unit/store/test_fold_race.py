"""Two threads of one process move the branch at once: a kernel's idle fold and its shutdown.

A kernel folds its commit tail from its event loop when idle (``FOLD_IDLE``) and
from its control thread when it shuts down (``Workspace.close``).  Both write
``refs/heads/main.lock`` and rename it over the ref.  Interleaved, the second
writer truncated the first one's lock file, the first renamed it away, and the
second's rename failed: "folding the commit tail into git failed: ...
refs/heads/main.lock: No such file" (a bench run of 8 kernels on 2 cores).
These tests hold one thread at that instant (the ``ref.locked`` fault point:
the lock file written and synced, not renamed) and let the other run.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import kernos.store.workspace as workspace_module
from core_support import CoreEnv
from kernos import Workspace

WAIT = 10.0
"""How long the held thread waits for the other to finish (a bound against a hang only:
with the branch serialized the other cannot finish until the held one goes on)."""


def hold_first_at_ref_locked(monkeypatch: pytest.MonkeyPatch,
                             other_done: threading.Event) -> threading.Event:
    """The first thread to reach ``ref.locked`` waits there until ``other_done`` (or WAIT);
    returns the event set when it got there."""
    held = threading.Event()
    real = workspace_module._faults.point

    def point(name: str) -> None:
        if name == "ref.locked" and not held.is_set():
            held.set()
            other_done.wait(WAIT)
        real(name)

    monkeypatch.setattr(workspace_module._faults, "point", point)
    return held


def run_in_thread(target: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def body() -> None:
        try:
            outcome.append(target())
        except BaseException as error:  # reported by the test, not lost in the thread
            outcome.append(error)

    thread = threading.Thread(target=body)
    thread.start()
    return thread, outcome


def git_log(path: Path) -> list[str]:
    return subprocess.run(["git", f"--git-dir={path / 'history.git'}", "log", "--format=%H",
                           "main"], capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.parametrize("second", ["fold", "close"])
def test_two_threads_folding_at_once_both_succeed_and_lose_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: str) -> None:
    env = CoreEnv(tmp_path / "ws")
    for number in range(3):
        env.run(f"x = {number}")
    workspace = env.workspace
    assert workspace is not None and len(workspace.tail.frames) == 3
    head = workspace.head()
    assert head is not None

    other_done = threading.Event()
    held = hold_first_at_ref_locked(monkeypatch, other_done)
    first, first_outcome = run_in_thread(workspace.fold)  # the idle fold
    assert held.wait(WAIT)
    other = workspace.fold if second == "fold" else workspace.close  # shutdown's close
    second_thread, second_outcome = run_in_thread(other)
    # Fixed: the second waits for the branch, so it is not done before the first goes on.
    second_thread.join(WAIT / 4)
    if not second_thread.is_alive():
        other_done.set()
    first.join()
    other_done.set()
    second_thread.join()

    assert not isinstance(first_outcome[0], BaseException), first_outcome
    assert not isinstance(second_outcome[0], BaseException), second_outcome
    assert first_outcome[0] == 3  # the first folded every commit, the second had none left
    assert second_outcome[0] in (0, None)
    assert not (workspace.git_dir / "refs" / "heads" / "main.lock").exists()
    assert (workspace.git_dir / "refs" / "heads" / "main").read_text().strip() == head.hex()
    assert (tmp_path / "ws" / "tail").stat().st_size == 0
    assert git_log(tmp_path / "ws")[0] == head.hex()
    env.workspace = None if second == "close" else env.workspace
    env.reopen()
    assert env.ns["x"] == 2 and env.workspace is not None and env.workspace.head() == head
    env.close()


def test_a_fold_after_close_leaves_the_branch_to_the_next_owner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fold that comes after ``close`` (the idle timer firing after shutdown) does
    nothing: the workspace lock is released, another process may own the branch now.
    The frames the close could not fold stay in the tail and the next open folds them."""
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    workspace = env.workspace
    assert workspace is not None and workspace.fold() == 1
    env.run("x += 1")
    head = workspace.head()
    before = git_log(tmp_path / "ws")
    objects = workspace.objects

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(objects, "pack_tail", full_disk)
    workspace.close()  # its fold fails: the frames are durable, kept for the next open
    env.workspace = None
    monkeypatch.undo()
    tail = (tmp_path / "ws" / "tail").read_bytes()
    assert tail

    assert workspace.fold() == 0
    assert (tmp_path / "ws" / "tail").read_bytes() == tail
    assert git_log(tmp_path / "ws") == before

    with Workspace.open(tmp_path / "ws") as reopened:
        assert reopened.recovery_note is not None and "folded 1 commit" in \
            reopened.recovery_note
        assert reopened.git_ref() == head


def test_an_op_that_commits_after_close_commits_nothing(tmp_path: Path) -> None:
    """A shutdown closes the workspace on the control thread while a cell runs on the
    shell thread: the cell's commit must not append to a tail whose lock is released."""
    from kernos.errors import WorkspaceError

    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    workspace = env.workspace
    assert workspace is not None
    head = workspace.head()
    op = env.image.begin(source="x = 2", principal="human")
    env.ns["x"] = 2
    workspace.close()  # what do_shutdown does, from its own thread
    env.workspace = None
    tail = (tmp_path / "ws" / "tail").read_bytes()
    with pytest.raises(WorkspaceError, match="closed before this op could commit"):
        op.commit()
    assert (tmp_path / "ws" / "tail").read_bytes() == tail
    env.reopen()
    assert env.ns["x"] == 1 and env.workspace is not None and env.workspace.head() == head
    env.close()


def test_a_group_sync_running_while_the_workspace_closes_still_succeeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel waits for a group commit's sync in a worker thread; a shutdown closes the
    workspace (and the tail's file) meanwhile.  The sync must not hit a closed (or reused)
    descriptor and stick as "the disk did not confirm": the close folded those commits."""
    from kernos.store import tail as tail_module

    env = CoreEnv(tmp_path / "ws")
    workspace = env.workspace
    assert workspace is not None
    with workspace.group_commit():
        env.run("x = 1")
    ticket = workspace.commit_ticket
    assert not workspace.durable_through(ticket)

    entered, closed = threading.Event(), threading.Event()
    real = tail_module._datasync

    def slow(fd: int) -> None:
        entered.set()
        closed.wait(WAIT)
        real(fd)

    monkeypatch.setattr(tail_module, "_datasync", slow)
    worker, outcome = run_in_thread(workspace.make_durable)
    assert entered.wait(WAIT)
    workspace.close()  # the control thread's shutdown: folds, closes the tail's file
    env.workspace = None
    closed.set()
    worker.join()
    assert outcome == [None], outcome
    assert workspace.tail.sync_error is None
    assert workspace.durable_through(ticket)
    env.reopen()
    assert env.ns["x"] == 1
    env.close()
