"""The kernel's background repack: it never outlives its kernel, and never runs twice at once.

:class:`kernos.store.object_store.ObjectStore` starts ``git repack --geometric``
in the background when the packs grow many.  Two rules around it:

1. **It dies with its kernel.**  The repack runs under a small watchdog
   (``_repack_watchdog.py``, run by path with ``python -I -S``) in a process
   group of its own; when the kernel dies (``kill -9`` included) the watchdog
   ends the whole group, ``git pack-objects`` too, which outlives a killed
   ``git repack`` on its own.  On Linux the watchdog hears of the death at
   once (``PR_SET_PDEATHSIG``), elsewhere within a second (it polls its
   parent).  Without a Python to run the watchdog the repack runs bare, in
   its own group: the lock below still keeps others off it.
2. **One at a time per workspace.**  The repack holds ``history.git/``
   :data:`LOCK` (``flock``) from before it starts until the last process of
   its tree is gone: the descriptor is passed down to git and its children.
   A kernel whose predecessor's repack is still ending starts none
   (:func:`start` returns None; the next commit asks again), and a prune
   or a replay that must not race a repack waits for the lock
   (:func:`wait_for_repacks`), and ``kernos gc`` holds it while it repacks
   (:func:`held`).

A repack ended half way is harmless: git deletes the packs it merges only
once the new pack is durable, so at worst it leaves a temporary file
(``objects/pack/.tmp-*``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["LOCK", "held", "start", "wait_for_repacks"]

LOCK = "kernos-repack.lock"
"""The repack lock's file, in the workspace's ``history.git``."""
WATCHDOG = Path(__file__).with_name("_repack_watchdog.py")
_WAIT_STEP = 0.05


def _open_lock(git_dir: Path) -> int:
    return os.open(git_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def start(git_dir: Path, command: Sequence[str]) -> subprocess.Popen[bytes] | None:
    """Start ``command`` (a ``git repack``) in the background under the repack lock.

    None if another repack holds the lock (a dead kernel's, still ending, or
    a ``kernos prune``'s), or if it could not be started: a background repack
    is an optimisation, never a reason to fail the op that asked for it.
    """
    try:
        fd = _open_lock(git_dir)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        watched = ([sys.executable, "-I", "-S", str(WATCHDOG), str(os.getpid()), str(fd)]
                   if sys.executable and WATCHDOG.exists() else [])
        try:
            return subprocess.Popen(
                [*watched, *command], pass_fds=(fd,), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return None
    finally:
        os.close(fd)  # the lock stays with the repack's tree, which holds a copy


def wait_for_repacks(git_dir: Path, timeout: float | None = None) -> bool:
    """Wait until no repack holds the lock (any process's); whether it is free."""
    with held(git_dir, timeout) as free:
        return free


@contextlib.contextmanager
def held(git_dir: Path, timeout: float | None = None) -> Iterator[bool]:
    """Hold the repack lock while the block runs (a ``kernos gc``): no background repack
    starts meanwhile.  Waits up to ``timeout`` for one that runs; yields whether the lock
    was taken (True in a read-only workspace, where no kernel of ours repacks)."""
    try:
        fd = _open_lock(git_dir)
    except OSError:
        yield True
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(_WAIT_STEP)
        try:
            yield True
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
