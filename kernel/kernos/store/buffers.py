"""The buffer cache: a raw copy of the head's big buffers, mapped by a restore.

Why
---
A big array is stored as 1 MiB chunk blobs (``snapshots.CHUNK_BYTES``), and a
pack keeps each one as a zlib stream of "stored" blocks: the bytes are there,
but cut every 64 KiB by a block header.  A restore therefore copies every byte
of every big buffer out of the packs into fresh memory, which was most of the
time a restart took on a workload of big arrays and frames.  This file keeps
the same chunks once more, raw and page-aligned, so that a restore maps them
into the buffer's memory copy-on-write instead (``mmap`` with ``MAP_PRIVATE``
and ``MAP_FIXED``): no copy, and pages the program never writes stay shared
with the page cache.

Layout
------
``<workspace>/buffers`` is a sequence of entries, each a page-sized header::

    b"KBC1" | blob id (20) | size (8, little-endian) | xxh3-128 of the bytes (16)
    | crc32 of the fields before it (4) | zeros up to the page size

followed by the chunk's bytes (a whole number of pages).

The contract
------------
* It only speeds reads up; it is never trusted and never synced.  Each
  chunk a restore maps is checked against its digest first, and a chunk that
  is missing, short or different is copied from git as before.  Deleting the
  file at any time loses nothing.
* Nothing in it is ever written over or cut short while it exists: a page
  mapped privately shows later writes to the file's page, so the writer only
  appends, and starts a new file (unlink, then create) when it wants a
  smaller one.  Mappings of the old file keep the old inode.  Never edit or
  truncate the file by hand; delete it.
* Only the process holding the workspace's lock adds to it: a commit adds
  the new chunks of big buffers it writes, a restore the chunks it had to
  copy from git (``snapshots.SnapshotWriter.part``, ``snapshots.read_part``).
  A restore first deletes a file that holds more than twice what the head
  needs (``snapshots.trim_buffer_cache``), and refills it.  Anyone may map
  from it.
* It holds the bytes git holds, nothing else: personal values are sealed
  before they are chunked, so erasing a subject (shredding its key) covers
  this copy as it covers the packs.  ``kernos prune`` deletes it, so that
  nothing pruned lingers here; a kernel refills it with what its head needs.
* ``KERNOS_BUFFER_CACHE=off`` turns it off (no file, reads copy from git).
  Mapping needs Linux; elsewhere the cache is off.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
import sys
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import xxhash

__all__ = ["BufferCache", "cache_enabled"]

MAGIC = b"KBC1"
PAGE = mmap.PAGESIZE
_FIELDS = struct.Struct("<4s20sQ16s")
_CRC = struct.Struct("<I")
_HEADER_BYTES = _FIELDS.size + _CRC.size


def cache_enabled() -> bool:
    """Whether this process maps and fills buffer caches (Linux, and not turned off)."""
    setting = os.environ.get("KERNOS_BUFFER_CACHE", "on").strip().lower()
    return sys.platform.startswith("linux") and setting not in {"off", "0", "no", "false"}


@dataclass(frozen=True)
class _Entry:
    offset: int
    """Where the chunk's bytes start in the file (a multiple of the page size)."""
    size: int
    digest: bytes


class BufferCache:
    """The raw, page-aligned copies of chunk blobs in ``<workspace>/buffers``."""

    def __init__(self, path: Path, *, writable: bool, enabled: bool | None = None) -> None:
        self.path = path
        self.writable = writable
        self.enabled = cache_enabled() if enabled is None else enabled
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._index: dict[bytes, _Entry] = {}
        self._end = 0
        """Where the entries read so far end: the next header, or the end of the file."""
        self.off_because: str | None = None

    # -- reading ---------------------------------------------------------------

    def map_part(self, sizes: tuple[int, ...], chunks: tuple[bytes, ...],
                 check: Callable[[Iterable[int], Callable[[int], bool]], list[bool]] | None = None,
                 ) -> tuple[mmap.mmap, list[int]] | None:
        """Memory for a buffer of these chunks, with the cached ones mapped in.

        Returns the memory (private and writable, zero where nothing is mapped)
        and the indexes of the chunks the caller must still copy in, or None
        when none of the chunks is cached.  Every mapped chunk has been checked
        against its digest (in ``check``'s threads, if given: a map over chunk
        indexes); one that differs is left to the caller to copy.
        """
        if not self.enabled or not chunks:
            return None
        with self._lock:
            self._refresh()
            if self._fd is None:
                return None
            found = {index: entry
                     for index, (sha, size) in enumerate(zip(chunks, sizes, strict=True))
                     if (entry := self._index.get(sha)) is not None and entry.size == size}
            if not found:
                return None
            total = sum(sizes)
            memory = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            base = _address(memory)
            starts = []
            position = 0
            for size in sizes:
                starts.append(position)
                position += size
            mapped: dict[int, _Entry] = {}
            for index, entry in found.items():
                if starts[index] % PAGE == 0 and _map_fixed(base + starts[index], entry.size,
                                                            self._fd, entry.offset):
                    mapped[index] = entry
        view = memoryview(memory)

        def matches(index: int) -> bool:
            entry = mapped[index]
            data = view[starts[index] : starts[index] + entry.size]
            return xxhash.xxh3_128_digest(data) == entry.digest

        order = sorted(mapped)
        verdicts = check(order, matches) if check is not None else [matches(i) for i in order]
        good = {index for index, ok in zip(order, verdicts, strict=True) if ok}
        if len(good) < len(mapped):
            with self._lock:  # a stale or damaged copy: never map it again
                for index in set(mapped) - good:
                    self._index.pop(chunks[index], None)
        view.release()
        return memory, [index for index in range(len(chunks)) if index not in good]

    @property
    def size(self) -> int:
        """Bytes in the file (what it costs on disk)."""
        with self._lock:
            self._refresh()
            return self._end if self._fd is not None else 0

    def entries(self) -> dict[bytes, int]:
        """Blob id -> size, of every chunk in the file."""
        with self._lock:
            self._refresh()
            return {sha: entry.size for sha, entry in self._index.items()}

    # -- writing ---------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """Whether :meth:`add` keeps chunks (this process writes, and the cache is on)."""
        return self.writable and self.enabled

    def add(self, sha: bytes, data: memoryview) -> None:
        """Append a chunk (a whole number of pages) under its blob id, unless it is there.

        A write that fails (a full disk) deletes the file and turns the cache
        off for this process (:attr:`off_because` says why): the cache must
        never be the reason an op fails.
        """
        if not self.writable:
            raise PermissionError(f"{self.path} is not writable by this process")
        if not self.enabled:
            return
        if len(data) == 0 or len(data) % PAGE:
            raise ValueError(f"a cached chunk is a whole number of {PAGE}-byte pages, "
                             f"not {len(data)} bytes")
        # The writer follows its own file: only it appends, and a deletion by hand
        # (the file is open) costs nothing but the space, until the next restore.
        with self._lock:
            if self._fd is None:
                self._refresh()
            if sha in self._index:
                return
        fields = _FIELDS.pack(MAGIC, sha, len(data), xxhash.xxh3_128_digest(data))
        header = (fields + _CRC.pack(zlib.crc32(fields))).ljust(PAGE, b"\0")
        with self._lock:
            if sha in self._index or not self.enabled:
                return
            if self._fd is None:
                self._create()
            assert self._fd is not None
            start = self._end
            try:
                written = os.pwritev(self._fd, [header, data], start)
                if written != PAGE + len(data):
                    raise OSError(f"a short write ({written} of {PAGE + len(data)} bytes)")
            except OSError as error:
                self._drop()
                self.enabled = False
                self.off_because = f"writing {self.path} failed: {error}"
                return
            self._index[sha] = _Entry(start + PAGE, len(data), bytes(fields[-16:]))
            self._end = start + PAGE + len(data)

    def drop(self) -> None:
        """Delete the file (mappings made from it stay valid)."""
        with self._lock:
            self._drop()

    def close(self) -> None:
        with self._lock:
            self._close()

    # -- internals -------------------------------------------------------------

    def _create(self) -> None:
        self._close()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        stat = os.fstat(fd)
        self._fd, self._inode = fd, (stat.st_dev, stat.st_ino)
        self._index, self._end = {}, 0
        self._scan(stat.st_size)

    def _drop(self) -> None:
        self._close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._inode, self._index, self._end = None, None, {}, 0

    def _refresh(self) -> None:
        """Follow the file: open it if it appeared, reopen it if it was replaced, read
        the entries appended since (by another process, for a reader)."""
        if not self.enabled:
            return
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._close()
            return
        if self._inode != (stat.st_dev, stat.st_ino):
            self._close()
            try:
                fd = os.open(self.path, (os.O_RDWR if self.writable else os.O_RDONLY)
                             | os.O_CLOEXEC)
            except FileNotFoundError:
                return
            self._fd, self._inode = fd, (stat.st_dev, stat.st_ino)
        if stat.st_size > self._end:
            self._scan(stat.st_size)

    def _scan(self, size: int) -> None:
        assert self._fd is not None
        position = self._end
        while position + PAGE <= size:
            raw = os.pread(self._fd, _HEADER_BYTES, position)
            if len(raw) < _HEADER_BYTES:
                break
            fields, (crc,) = raw[: _FIELDS.size], _CRC.unpack(raw[_FIELDS.size :])
            magic, sha, length, digest = _FIELDS.unpack(fields)
            if (magic != MAGIC or crc != zlib.crc32(fields) or length == 0 or length % PAGE
                    or position + PAGE + length > size):
                break
            self._index[sha] = _Entry(position + PAGE, length, digest)
            position += PAGE + length
        self._end = position
        if position + PAGE <= size and self.writable:
            # Damage, or an entry a crash tore: appending after it would hide what
            # follows from every reader.  Start a new file (the next fill refills it).
            self._drop()


# -- mapping a file's pages at a fixed address -------------------------------------------

_MAP_FIXED = 0x10  # Linux, every architecture Kernos runs on
_libc: ctypes.CDLL | None = None


def _mmap_function() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_long]
    return _libc.mmap


def _address(memory: mmap.mmap) -> int:
    anchor = ctypes.c_char.from_buffer(memory)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def _map_fixed(address: int, size: int, fd: int, offset: int) -> bool:
    """Map ``size`` bytes of ``fd`` at ``offset`` over ``address`` (inside memory this
    process owns), privately; False, with zeroed anonymous memory there, if that fails."""
    mapper = _mmap_function()
    protection = mmap.PROT_READ | mmap.PROT_WRITE
    result = mapper(address, size, protection, mmap.MAP_PRIVATE | _MAP_FIXED, fd, offset)
    if result == address:
        return True
    # A failed fixed mapping may have removed what was there: put zeroed memory back.
    again = mapper(address, size, protection,
                   mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
    if again != address:
        raise MemoryError(f"could not restore memory at {address:#x} after a failed mapping")
    return False
