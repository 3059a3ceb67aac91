"""One owner per workspace.

The lock is a POSIX record lock (``fcntl.lockf``) on ``<workspace>/lock``:

* the kernel releases it when its process dies, ``kill -9`` included, so a
  crash never leaves a stale lock behind;
* unlike ``flock``, it is not inherited by children the kernel forks, so a
  subprocess that outlives the kernel cannot keep the workspace locked.

POSIX locks do not conflict inside one process, so a registry of the paths
this process holds catches a second open from the same process as well.
The file also records who holds it, for the error the next comer sees.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path

from kernos.errors import WorkspaceLocked

__all__ = ["WorkspaceLock"]

_held: dict[str, WorkspaceLock] = {}
_held_guard = threading.Lock()


class WorkspaceLock:
    """An exclusive, crash-released lock on a workspace directory."""

    def __init__(self, workspace: Path, fd: int) -> None:
        self.workspace = workspace
        self._key = str(workspace.resolve())
        """The name it is held under: ``workspace`` may be relative, and the cwd may change."""
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, workspace: Path, purpose: str) -> WorkspaceLock:
        key = str(workspace.resolve())
        with _held_guard:
            if key in _held:
                raise WorkspaceLocked(key, f"this process (pid {os.getpid()}) already")
            path = workspace / "lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                owner = _describe_owner(fd)
                os.close(fd)
                raise WorkspaceLocked(key, owner) from None
            lock = cls(workspace, fd)
            lock._write_owner(purpose)
            _held[key] = lock
            return lock

    def _write_owner(self, purpose: str) -> None:
        assert self._fd is not None
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "purpose": purpose,
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(owner).encode(), 0)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        with _held_guard:
            _held.pop(self._key, None)
            try:
                os.ftruncate(self._fd, 0)
                fcntl.lockf(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


def _describe_owner(fd: int) -> str:
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        owner = {}
    if not owner or not isinstance(owner, dict):  # the file is another program's, or edited
        return "another process"
    return (
        f"a {owner.get('purpose', 'process')} (pid {owner.get('pid', '?')} on "
        f"{owner.get('host', '?')}, since {owner.get('since', '?')})"
    )
