"""Big buffers mapped from the packs: a restore's memory, without a copy.

Why
---
A big array is stored as 1 MiB chunk blobs (``snapshots.CHUNK_BYTES``), and a
pack keeps each one laid out page-aligned (:mod:`kernos.store.aligned`): runs of
up to 15 pages that start on page boundaries of the pack file and at page
multiples of the chunk.  A restore maps those runs into the buffer's memory
(``mmap`` with ``MAP_PRIVATE`` and ``MAP_FIXED``) instead of copying them out:
pages the program never writes stay shared with the page cache, and a write
copies one page.  The bytes are on disk once, in git's packs, where ``git
fsck``, ``kernos audit verify``, prune, erasure and remotes already cover them.

The contract
------------
* A pack is never written over: git and Kernos only create and delete packs,
  and a mapping of a deleted pack keeps its inode until the memory goes.
* Every mapped chunk is checked against the adler32 of its zlib stream before
  the caller sees it (in ``check``'s threads), as a copy out of the pack is.  A
  chunk that differs, or that is not laid out page-aligned (a pack rewritten by
  ``git repack``, a clone's, a tail frame's), is left to the caller to copy.
* Each run is a mapping of its own to the kernel (runs are not contiguous in
  the file): a process maps at most a quarter of ``vm.max_map_count`` runs
  (about 1 GiB of buffers at Linux's default); past that, chunks are copied.
* ``KERNOS_MAP_BUFFERS=off`` turns mapping off (reads copy from the packs).
  Mapping needs Linux; elsewhere it is off.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

from kernos.store.aligned import PAGE
from kernos.store.packs import PackSet

__all__ = ["PAGE", "map_part", "mapping_enabled"]

_MAX_MAP_SHARE = 4
"""Map at most 1/this of the process's allowed mappings (``vm.max_map_count``)."""


def mapping_enabled() -> bool:
    """Whether this process maps big buffers from the packs (Linux, and not turned off)."""
    setting = os.environ.get("KERNOS_MAP_BUFFERS", "on").strip().lower()
    return sys.platform.startswith("linux") and setting not in {"off", "0", "no", "false"}


def _mapping_room() -> int:
    """How many more runs this process may map (see the module docstring)."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as maps:
            used = sum(1 for _ in maps)
    except (OSError, ValueError):
        return 0
    return max(0, limit // _MAX_MAP_SHARE - used)


def map_part(packs: PackSet, sizes: tuple[int, ...], chunks: tuple[bytes, ...],
             check: Callable[[Iterable[int], Callable[[int], bool]], list[bool]] | None = None,
             ) -> tuple[mmap.mmap, list[int]] | None:
    """Memory for a buffer of these chunks, with the page-aligned ones mapped in.

    Returns the memory (private and writable, zero where nothing is mapped)
    and the indexes of the chunks the caller must still copy in, or None when
    no chunk is laid out page-aligned.  Every chunk mapped has been checked
    against its adler32 (in ``check``'s threads, if given: a map over chunk
    indexes); one that differs is left to the caller to copy.
    """
    if not mapping_enabled() or not chunks:
        return None
    found = {}
    for index, (sha, size) in enumerate(zip(chunks, sizes, strict=True)):
        located = packs.locate(sha)
        if located is None:
            continue
        pack, offset = located
        with contextlib.suppress(IndexError, ValueError):
            laid_out = pack.runs(offset, size)
            if laid_out is not None:
                found[index] = (pack, laid_out)
    if not found:
        return None
    room = _mapping_room()
    memory = mmap.mmap(-1, sum(sizes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = _address(memory)
    view = memoryview(memory)
    starts = []
    position = 0
    for size in sizes:
        starts.append(position)
        position += size
    descriptors: dict[Path, int | None] = {}
    try:
        for index, (pack, (runs, _adler)) in found.items():
            for file_offset, at, length in runs:
                start = starts[index] + at
                lines_up = start % PAGE == 0 and file_offset % PAGE == 0 and length % PAGE == 0
                fd = _descriptor(descriptors, pack.path) if lines_up and room > 0 else None
                if fd is not None and _map_fixed(base + start, length, fd, file_offset):
                    room -= 1
                else:  # a run that does not line up (the end of a buffer): copied
                    view[start : start + length] = pack.slice(file_offset, length)
    finally:
        for fd in descriptors.values():
            if fd is not None:
                os.close(fd)

    def matches(index: int) -> bool:
        adler = found[index][1][1]
        return zlib.adler32(view[starts[index] : starts[index] + sizes[index]]) == adler

    order = sorted(found)
    verdicts = check(order, matches) if check is not None else [matches(i) for i in order]
    good = {index for index, ok in zip(order, verdicts, strict=True) if ok}
    view.release()
    return memory, [index for index in range(len(chunks)) if index not in good]


def _descriptor(descriptors: dict[Path, int | None], path: Path) -> int | None:
    """A descriptor of ``path`` to map from, opened once per call; None for a pack a
    repack deleted meanwhile (its chunks are copied from the mapping the reader holds)."""
    if path not in descriptors:
        try:
            descriptors[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            descriptors[path] = None
    return descriptors[path]


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
