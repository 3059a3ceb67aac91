"""Durable file writes: the primitives every writer of a workspace syncs with.

A file appears all or nothing (:func:`replace_file`: a complete temporary
file renamed over it), and is durable once its data and its directory entry
are synced (:func:`fsync_dir`, :func:`fsync_all`, :func:`sync_filesystem`).
:func:`write_all` writes a whole buffer or raises the reason it could not (a
full disk), never a short write.

These sit on the bottom floor, below the store, so that every floor that keeps
a file of its own (the store's objects and refs, the audit log, personal
values' keys, the LLM store, a fork) writes it the same way.  They know
nothing of workspaces.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["fsync_all", "fsync_dir", "has_syncfs", "replace_file", "sync_filesystem",
           "write_all"]


def write_all(fd: int, data: bytes | memoryview) -> None:
    """``os.write`` until all of ``data`` is written: a short write (a disk filling up)
    is followed by one more, which raises the reason (ENOSPC) instead of hiding it."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(f"write took {written} of {len(view)} bytes")
        view = view[written:]


def replace_file(path: Path, data: bytes, *, durable: bool, mode: int = 0o644,
                 temporary: Path | None = None) -> None:
    """Make ``path`` hold ``data``, all or nothing: write a temporary file, rename it over.

    With ``durable`` the data and the rename are synced before this returns.
    """
    temporary = temporary or path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(fd, data)  # a short write (a full disk) must not be renamed into place
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        temporary.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(temporary, path)
    if durable:
        fsync_dir(path.parent)


def _find_syncfs() -> Any:
    """Linux's syncfs(2): one sync of a filesystem instead of one fsync per file and directory.

    A commit writes several small objects in several directories; syncing them
    one by one cost 16 fsyncs (each a journal commit), syncfs costs one.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return getattr(libc, "syncfs", None)


_SYNCFS = _find_syncfs()


def has_syncfs() -> bool:
    """Whether :func:`sync_filesystem` is one ``syncfs`` (else it is a plain fsync, and a
    writer syncs each file and directory itself)."""
    return _SYNCFS is not None


def sync_filesystem(path: Path) -> None:
    """Make everything written to ``path``'s filesystem durable (data and names)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _SYNCFS is None:
            os.fsync(fd)
        elif _SYNCFS(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"syncfs failed: {os.strerror(error)}", str(path))
    finally:
        os.close(fd)


def fsync_all(paths: Iterable[Path | int]) -> None:
    """fsync every path (a file or a directory) or open fd, concurrently; the first error
    is raised once all have finished."""
    jobs = list(paths)
    if len(jobs) <= 1:
        for job in jobs:
            _fsync_one(job)
        return
    errors = [error for error in _fsync_pool().map(_fsync_quietly, jobs) if error is not None]
    if errors:
        raise errors[0]


def _fsync_one(job: Path | int) -> None:
    if isinstance(job, int):
        os.fsync(job)
    else:
        fsync_dir(job)  # any path: a directory or a file


def _fsync_quietly(job: Path | int) -> OSError | None:
    try:
        _fsync_one(job)
    except OSError as error:
        return error
    return None


_fsync_executor: ThreadPoolExecutor | None = None
_fsync_executor_lock = threading.Lock()


def _fsync_pool() -> ThreadPoolExecutor:
    global _fsync_executor
    with _fsync_executor_lock:
        if _fsync_executor is None:
            _fsync_executor = ThreadPoolExecutor(max_workers=6, thread_name_prefix="kernos-fsync")
        return _fsync_executor


def fsync_dir(directory: Path) -> None:
    """fsync a directory (its entries), or any path opened read-only."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
