"""Looking at a tracked directory without reading its files: stat keys and refusals.

Every op looks at every tracked directory twice at most: once at commit
(what did the op change?) and, if it rolls back, once more (what must be
put back?).  Looking means one ``lstat`` per entry, never a read: a file's
*stat key* is ``(size, mtime_ns, ctime_ns, inode, mode)``, and a file whose
key is the one recorded when its bytes were last read is taken to hold
those bytes still.  Only files whose key changed are read and hashed
(:mod:`kernos.files.contents`).  ``ctime`` is in the key although the issue
asked for four fields: no program can set it back (``os.utime`` can set
``mtime`` to anything), so an in-place rewrite of equal size that also puts
the old ``mtime`` back is still seen.

*Racily clean* files, after git: a filesystem stamps times from a coarse
clock, so a file written again within one tick of the moment its key was
taken can keep the very same key with other bytes.  A key taken less than
:data:`RACY_NS` after the file's ``ctime`` is therefore not trusted: the
next op reads that file again (a file an op wrote is read once more by the
next op, then trusted).  Filesystems whose timestamps are coarser than that
(FAT, some network filesystems) are not supported.

What is never tracked, each reported once and left alone on disk (neither
stored, nor removed by a rollback, nor put back): devices, FIFOs and
sockets; symbolic links whose target resolves outside the tracked
directory (links inside it are tracked as links); a file with more hard
links than the directory holds (another name for it lives outside, and
writing it back would cut that link); names that are not UTF-8 (a git tree
entry cannot hold them); and directories that cannot be listed.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RACY_NS", "Key", "Listing", "is_racy", "key_of", "scan"]

Key = tuple[int, int, int, int, int]
"""A file's stat key: size, mtime_ns, ctime_ns, inode, mode."""

RACY_NS = 100_000_000
"""A key taken less than this after the file's ctime is checked again by the next op (0.1 s:
ten ticks of the coarsest clock Linux stamps files with)."""


def key_of(info: os.stat_result) -> Key:
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_mode)


def is_racy(key: Key, taken_ns: int) -> bool:
    """Whether ``key``, taken at ``taken_ns``, may miss a later write of equal size."""
    return key[2] >= taken_ns - RACY_NS


@dataclass(kw_only=True)
class Listing:
    """What one look at a tracked directory found (paths relative to it, ``/``-separated)."""

    entries: dict[str, Key] = field(default_factory=dict)
    """Regular files and the symbolic links that stay inside: their stat keys."""
    dirs: set[str] = field(default_factory=set)
    """Every directory below the tracked one (not itself)."""
    refused: dict[str, str] = field(default_factory=dict)
    """Paths left untracked, and why (see the module docstring)."""
    taken_ns: int = 0
    """When the look started (wall clock), for :func:`is_racy`."""
    missing: bool = False
    """The tracked directory does not exist."""
    unreadable: str | None = None
    """Why the tracked directory itself could not be listed."""


def scan(root: str, *, inside: str | None = None,
         on_directory: Callable[[str, str], bool] | None = None) -> Listing:
    """List ``root`` with one ``lstat`` per entry; read no file.

    ``inside`` is the tracked directory links must stay in (``root`` itself by
    default: a subdirectory's listing is looked at apart).  ``on_directory(relative,
    absolute)`` is called before each directory is listed (a watcher watches it
    first, so that nothing created meanwhile goes unseen); False stops the look
    (:attr:`Listing.unreadable` says why).
    """
    listing = Listing(taken_ns=time.time_ns())
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        listing.missing = True
        return listing
    except OSError as error:
        listing.unreadable = error.strerror or str(error)
        return listing
    if not stat.S_ISDIR(top.st_mode):
        listing.unreadable = "it is not a directory"
        return listing
    entries, dirs, refused = listing.entries, listing.dirs, listing.refused
    linked: dict[int, list[str]] = {}
    links: dict[str, int] = {}
    real_root = os.path.realpath(inside or root)
    pending = [("", root)]
    while pending:
        relative, absolute = pending.pop()
        if on_directory is not None and not on_directory(relative, absolute):
            listing.unreadable = "it could not be watched"
            return listing
        try:
            directory = os.scandir(absolute)
        except OSError as error:
            if not relative:
                listing.unreadable = error.strerror or str(error)
                return listing
            refused[relative + "/"] = f"it cannot be listed ({error.strerror})"
            continue
        with directory:
            for entry in directory:
                name = entry.name
                path = f"{relative}/{name}" if relative else name
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:  # gone since it was listed: as if it never was
                    continue
                mode = info.st_mode
                if not name.isascii() and not _utf8(name):
                    refused[path] = "its name is not UTF-8"
                elif stat.S_ISREG(mode):
                    entries[path] = key_of(info)
                    if info.st_nlink > 1:
                        linked.setdefault(info.st_ino, []).append(path)
                        links[path] = info.st_nlink
                elif stat.S_ISDIR(mode):
                    dirs.add(path)
                    pending.append((path, entry.path))
                elif stat.S_ISLNK(mode):
                    if _inside(os.path.realpath(entry.path), real_root):
                        entries[path] = key_of(info)
                    else:
                        refused[path] = "a symbolic link to outside the tracked directory"
                else:
                    refused[path] = "a device, FIFO or socket"
    for paths in linked.values():
        if len(paths) < links[paths[0]]:
            for path in paths:
                del entries[path]
                refused[path] = "a hard link to a file outside the tracked directory"
    return listing


def _utf8(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:  # os.fsdecode's surrogates: bytes that are not UTF-8
        return False
    return True


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
