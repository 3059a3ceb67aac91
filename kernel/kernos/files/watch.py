"""Which tracked paths to look at again: inotify events, as hints the stat keys check.

A full look at a tracked directory costs one ``lstat`` per entry, which is
2 to 6 µs here (60 ms for 10,000 files): too much for every op.  So a
:class:`Watcher` keeps the last listing of its directory and an inotify
watch on each of its directories; an op's look drains the events that came
since and looks again (``lstat``) only at the paths they name.  An op that
touched no file costs one ``read`` that finds nothing.

Events only ever add paths to look at: what changed is still decided by the
stat keys (``kernos.files.scan``), so a spurious event costs one ``lstat``.
A missed one would be wrong, so the watcher answers with a full look when
it cannot vouch for the events: the first time; after a queue overflow;
when the tracked directory itself moved or vanished; when a watch could not
be added (the system's ``max_user_watches``); when a touched file has
hard links (their count is the whole directory's business); and every
:data:`FULL_LOOK_SECONDS` whatever happens, because some writes send no
event: through a memory map (``numpy.memmap``), or from another machine
on a network filesystem.  Elsewhere than Linux every look is a full one.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct
import sys
import time
import weakref

from kernos.files.scan import Listing, key_of, scan

__all__ = ["FULL_LOOK_SECONDS", "Watcher"]

FULL_LOOK_SECONDS = 60.0
"""A look finds what no event announced (memory-mapped writes) at most this late."""

_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_Q_OVERFLOW, _IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
_IN_ONLYDIR, _IN_DONT_FOLLOW = 0x01000000, 0x02000000
_MASK = (_IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO
         | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
         | _IN_DONT_FOLLOW)
_EVENT = struct.Struct("iIII")

_libc: ctypes.CDLL | None = None


def _inotify() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    return _libc


class Watcher:
    """The listing of one tracked directory, kept current by inotify (see the module)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.listing: Listing | None = None
        self.full_at = 0.0
        self._wds: dict[int, str] = {}
        self._broken = False
        libc = _inotify()
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC) if libc else -1
        self._closer = weakref.finalize(self, os.close, self._fd) if self._fd >= 0 else None

    def close(self) -> None:
        """Give the inotify instance back (a process has 128); every look is a full one."""
        if self._closer is not None:
            self._closer()
        self._closer, self._fd, self._wds = None, -1, {}

    def look(self) -> Listing:
        """The tracked directory now (see the module docstring for when it is a full look)."""
        if (self._fd < 0 or self.listing is None or self._broken
                or time.monotonic() - self.full_at > FULL_LOOK_SECONDS):
            return self._full()
        taken = time.time_ns()
        touched = self._drain()
        if touched is None:
            return self._full()
        listing = self.listing
        listing.taken_ns = taken
        for path in sorted(touched, key=lambda path: path.count("/")):
            if not self._look_again(listing, path):
                return self._full()
        if self._broken:
            return self._full()
        return listing

    def _full(self) -> Listing:
        self._broken = False
        if self._fd >= 0:
            self._drain()  # what came before this look is in it
        self.listing = scan(self.root, on_directory=self._watch)
        self.full_at = time.monotonic()
        return self.listing

    def _watch(self, relative: str, absolute: str) -> bool:
        if self._fd < 0:
            return True
        libc = _inotify()
        assert libc is not None
        wd = libc.inotify_add_watch(self._fd, os.fsencode(absolute), _MASK)
        if wd < 0:
            self._broken = True  # out of watches, or it went: the next look is a full one
        else:
            self._wds[wd] = relative
        return True

    def _drain(self) -> set[str] | None:
        """The paths named by the events that came since the last drain; None if the
        events cannot vouch for what changed."""
        touched: set[str] = set()
        trusted = True
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            position = 0
            while position + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, position)
                name = data[position + _EVENT.size: position + _EVENT.size + length]
                position += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW:
                    trusted = False
                    continue
                directory = self._wds.get(wd)
                if directory is None:
                    continue
                if mask & _IN_IGNORED:
                    del self._wds[wd]
                    trusted = trusted and directory != ""
                    continue
                if mask & (_IN_DELETE_SELF | _IN_MOVE_SELF) and directory == "":
                    trusted = False
                name = name.rstrip(b"\0")
                if name:
                    text = os.fsdecode(name)
                    touched.add(f"{directory}/{text}" if directory else text)
        return touched if trusted else None

    def _look_again(self, listing: Listing, path: str) -> bool:
        """Update ``listing`` for ``path``; False if only a full look can tell."""
        full = os.path.join(self.root, path)
        parent = path.rpartition("/")[0]
        if parent and parent not in listing.dirs:
            return False  # an event of a directory moved away: a full look tells
        listing.entries.pop(path, None)
        listing.refused.pop(path, None)
        try:
            info = os.lstat(full)
        except FileNotFoundError:
            self._forget(listing, path)
            return True
        except OSError:
            return False
        mode = info.st_mode
        if not stat.S_ISDIR(mode) and path in listing.dirs:
            self._forget(listing, path)
        if not path.isascii():
            try:
                path.encode()
            except UnicodeEncodeError:
                listing.refused[path] = "its name is not UTF-8"
                return True
        if stat.S_ISREG(mode):
            if info.st_nlink > 1:
                return False
            listing.entries[path] = key_of(info)
        elif stat.S_ISDIR(mode):
            if path not in listing.dirs:
                below = scan(full, inside=self.root, on_directory=lambda relative, absolute:
                             self._watch(f"{path}/{relative}" if relative else path, absolute))
                if below.unreadable is not None or any(
                        why.startswith("a hard link") for why in below.refused.values()):
                    return False  # links to the rest of the directory: a full look tells
                listing.dirs.add(path)
                listing.dirs.update(f"{path}/{name}" for name in below.dirs)
                listing.entries.update((f"{path}/{name}", key)
                                       for name, key in below.entries.items())
                listing.refused.update((f"{path}/{name}", why)
                                       for name, why in below.refused.items())
        elif stat.S_ISLNK(mode):
            real = os.path.realpath(full)
            inside = os.path.realpath(self.root)
            if real == inside or real.startswith(inside.rstrip(os.sep) + os.sep):
                listing.entries[path] = key_of(info)
            else:
                listing.refused[path] = "a symbolic link to outside the tracked directory"
        else:
            listing.refused[path] = "a device, FIFO or socket"
        return True

    def _forget(self, listing: Listing, path: str) -> None:
        """``path`` is gone: it and everything listed below it."""
        prefix = path + "/"
        listing.dirs.discard(path)
        for names in (listing.entries, listing.refused):
            for name in [name for name in names if name.startswith(prefix)]:
                del names[name]
        listing.dirs -= {name for name in listing.dirs if name.startswith(prefix)}
