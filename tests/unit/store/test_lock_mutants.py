"""The workspace lock's record of its owner, its refusals and its release, pinned exactly.

These close gaps mutation testing (``scripts/mutation store.lock``) found: what
the lock file says about who holds it (the next comer's error is made of it,
and so is a person's judgement whether the holder is alive), how an owner
is described when the file says less, or nothing, or garbage, that one
process is refused a second lock on the same directory under any of its
names, that a refused attempt leaks no descriptor, and that a release
forgets the owner, lets go of the lock and can be repeated.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from disk_support import descriptors_of
from kernos.errors import WorkspaceLocked
from kernos.store import lock as lock_module
from kernos.store.lock import WorkspaceLock, _describe_owner

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, sys.argv[2].encode())
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[object]:
    """Another process holding ``<workspace>/lock`` and saying ``owner`` in it."""
    started: list[subprocess.Popen[str]] = []

    def hold(workspace: Path, owner: str) -> subprocess.Popen[str]:
        process = subprocess.Popen([sys.executable, "-c", HOLD, str(workspace / "lock"), owner],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout is not None and process.stdout.readline() == "held\n"
        return process

    yield hold
    for process in started:
        process.communicate("", timeout=30)




def test_the_lock_file_names_its_owner(tmp_path: Path) -> None:
    before = time.strftime("%Y-%m-%d %H:%M:%S")
    lock = WorkspaceLock.acquire(tmp_path, "kernel")
    after = time.strftime("%Y-%m-%d %H:%M:%S")
    owner = json.loads((tmp_path / "lock").read_text())
    assert set(owner) == {"pid", "host", "purpose", "since"}
    assert (owner["pid"], owner["host"], owner["purpose"]) == (
        os.getpid(), socket.gethostname(), "kernel")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", owner["since"])
    assert before <= owner["since"] <= after
    assert (tmp_path / "lock").stat().st_mode & 0o777 == 0o644 & ~_umask()
    assert lock.held and lock.workspace == tmp_path
    lock.release()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_new_owner_replaces_what_a_longer_old_record_said(tmp_path: Path) -> None:
    (tmp_path / "lock").write_text(json.dumps({"purpose": "x" * 500}) + "\n" * 100)
    lock = WorkspaceLock.acquire(tmp_path, "gc")
    assert json.loads((tmp_path / "lock").read_text())["purpose"] == "gc"
    lock.release()


def test_one_process_gets_one_lock_per_directory_whatever_its_name(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "ws")
    lock = WorkspaceLock.acquire(tmp_path / "ws", "kernel")
    assert descriptors_of(tmp_path / "ws" / "lock") == 1
    for name in (tmp_path / "ws", tmp_path / "link", tmp_path / "ws" / ".." / "ws"):
        with pytest.raises(WorkspaceLocked) as refused:
            WorkspaceLock.acquire(name, "replay")
        assert refused.value.owner == f"this process (pid {os.getpid()}) already"
        assert str(refused.value).startswith(
            f"The workspace {(tmp_path / 'ws').resolve()} is in use by this process (pid "
            f"{os.getpid()}) already. ")
    assert descriptors_of(tmp_path / "ws" / "lock") == 1  # a refusal opens nothing
    assert json.loads((tmp_path / "ws" / "lock").read_text())["purpose"] == "kernel"
    lock.release()
    again = WorkspaceLock.acquire(tmp_path / "link", "replay")  # released: free again
    assert again.held
    again.release()


def test_one_process_may_hold_the_locks_of_several_workspaces(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = WorkspaceLock.acquire(tmp_path / "one", "kernel")
    second = WorkspaceLock.acquire(tmp_path / "two", "kernel")
    assert first.held and second.held
    first.release()
    with pytest.raises(WorkspaceLocked):  # releasing one leaves the other held
        WorkspaceLock.acquire(tmp_path / "two", "gc")
    second.release()


def test_another_process_holding_it_is_named_in_the_refusal(tmp_path: Path, holder) -> None:  # type: ignore[no-untyped-def]
    owner = {"pid": 4242, "host": "lab-7", "purpose": "kernel", "since": "2026-01-02 03:04:05"}
    process = holder(tmp_path, json.dumps(owner))
    with pytest.raises(WorkspaceLocked) as refused:
        WorkspaceLock.acquire(tmp_path, "gc")
    assert refused.value.owner == "a kernel (pid 4242 on lab-7, since 2026-01-02 03:04:05)"
    assert str(tmp_path.resolve()) in str(refused.value)
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    assert descriptors_of(tmp_path / "lock") == 0  # the refused attempt closed its descriptor
    assert json.loads((tmp_path / "lock").read_text()) == owner  # the holder's record stays
    process.communicate("", timeout=30)  # the holder goes: the lock is free
    lock = WorkspaceLock.acquire(tmp_path, "gc")
    assert json.loads((tmp_path / "lock").read_text())["purpose"] == "gc"
    lock.release()


@pytest.mark.parametrize(("record", "described"), [
    (b"", "another process"),
    (b"{}", "another process"),
    (b"not json at all", "another process"),
    (b'{"pid": 7', "another process"),  # a record torn as it was written
    (b"5", "another process"),  # JSON, but not an owner record (edited by hand)
    (b'["kernel", 7]', "another process"),
    (b'{"pid": 7}', "a process (pid 7 on ?, since ?)"),
    (b'{"purpose": "replay", "host": "h"}', "a replay (pid ? on h, since ?)"),
])
def test_an_owner_is_described_by_what_its_record_says(tmp_path: Path, record: bytes,
                                                        described: str) -> None:
    path = tmp_path / "lock"
    path.write_bytes(record)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _describe_owner(fd) == described
    finally:
        os.close(fd)


def test_an_owner_whose_record_cannot_be_read_is_another_process(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)  # a directory: pread fails
    try:
        assert _describe_owner(fd) == "another process"
    finally:
        os.close(fd)


def test_an_owner_is_read_from_the_start_of_its_record(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    path.write_text(json.dumps({"purpose": "kernel", "pid": 1}))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 0, os.SEEK_END)  # wherever the descriptor stands
        assert _describe_owner(fd) == "a kernel (pid 1 on ?, since ?)"
    finally:
        os.close(fd)


def test_a_release_forgets_the_owner_and_frees_the_lock(tmp_path: Path, holder) -> None:  # type: ignore[no-untyped-def]
    lock = WorkspaceLock.acquire(tmp_path, "kernel")
    assert descriptors_of(tmp_path / "lock") == 1
    lock.release()
    assert not lock.held and (tmp_path / "lock").read_bytes() == b""
    assert str(tmp_path.resolve()) not in lock_module._held
    assert descriptors_of(tmp_path / "lock") == 0
    lock.release()  # twice is fine, and touches nothing
    assert not lock.held
    holder(tmp_path, "")  # another process can take it now
    with pytest.raises(WorkspaceLocked) as refused:
        WorkspaceLock.acquire(tmp_path, "gc")
    assert refused.value.owner == "another process"



def test_a_lock_taken_by_a_relative_path_is_released_after_the_process_changed_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel's user code may ``os.chdir`` anywhere while the kernel holds its workspace."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    lock = WorkspaceLock.acquire(Path("ws"), "kernel")
    monkeypatch.chdir(tmp_path / "elsewhere")
    lock.release()
    assert not lock.held and lock not in lock_module._held.values()
    again = WorkspaceLock.acquire(tmp_path / "ws", "kernel")  # nobody holds it now
    assert again.held
    again.release()
