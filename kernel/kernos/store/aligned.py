"""Page-aligned blobs: pack entries whose bytes a restore maps straight from the pack.

Why
---
A big buffer is stored as 1 MiB chunk blobs (``snapshots.CHUNK_BYTES``), each a
pack entry whose zlib stream is made of deflate "stored" blocks: the bytes are
in the pack as they are, cut every 64 KiB by a block header.  A restore could
only copy them out.  Laid out as this module lays them out, every run of bytes
starts on a page boundary of the pack file *and* at a page multiple of the blob,
so a restore maps the runs into the buffer's memory copy-on-write
(``kernos.store.buffers``): no copy, no second copy on disk, and the pages the
program never writes stay shared with the page cache.  To git, fsck and every
other reader it is an ordinary zlib stream, and the blob id is unchanged.

Layout
------
A zlib header (``78 01``); then, for each run of at most :data:`RUN` bytes
(15 pages: a stored block holds at most 65,535 bytes), a *gap* of deflate
blocks that carry no data, the last of them the run's own stored-block header,
so that the run starts on a page boundary; then the adler32 trailer.  A gap is
made of units of 5, 6 or 7 bytes (an empty stored block, or one or two empty
fixed-Huffman blocks before a stored header), so any gap of 5 to 7 or at least
10 bytes can be made.  Between two runs the gap is one page.  The cost is one
page in 16 (6.25%) plus the first gap, which is why only blobs of
:data:`ALIGN_FROM` bytes or more that do not compress are laid out so.

Reading
-------
The layout is a function of the blob's size and of where its stream starts in
the file (:func:`layout`).  A reader computes it and compares each gap's bytes
with the file's (a few comparisons a chunk) instead of parsing blocks: if every
gap matches, the stream is exactly this layout and the runs are where it says
(:func:`runs`).  A pack rewritten by git (a repack moves entries) holds the same
stream at another offset, where the pages no longer line up: the check fails
there and readers copy, as they do for any other entry.
"""

from __future__ import annotations

import functools
import mmap
import struct
import zlib

__all__ = ["ALIGN_FROM", "PAGE", "RUN", "Run", "layout", "pieces", "runs", "stream"]

PAGE = mmap.PAGESIZE
RUN = (0xFFFF // PAGE) * PAGE
"""The most bytes of one run: the whole pages a stored block can hold."""
ALIGN_FROM = 256 << 10
"""Blobs at least this long that do not compress are laid out page-aligned."""
_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window: (0x78 << 8 | 0x01) % 31 == 0

Run = tuple[int, int, int]
"""``(file offset, offset in the blob, length)`` of one run of a blob's bytes."""


def _unit(size: int, length: int, final: bool) -> bytes:
    """One gap unit of ``size`` bytes ending in a stored-block header for ``length``
    bytes: 5 (the header alone), 6 or 7 (one or two empty fixed-Huffman blocks first;
    each is 10 bits, BFINAL 0, BTYPE 01 and the 7-bit end-of-block code 0)."""
    lengths = struct.pack("<HH", length, length ^ 0xFFFF)
    if size == 5:
        return bytes([final]) + lengths
    if size == 6:
        return bytes([0x02, final << 2]) + lengths
    if size == 7:
        return bytes([0x02, 0x08, final << 4]) + lengths
    raise ValueError(f"a gap unit is 5, 6 or 7 bytes, not {size}")


def _fillable(gap: int) -> bool:
    return gap in (5, 6, 7) or gap >= 10


@functools.lru_cache(maxsize=256)
def _gap(size: int, length: int, final: bool) -> bytes:
    """``size`` bytes of empty blocks ending in the header of a stored block of
    ``length`` bytes (the last block if ``final``)."""
    head = {0: [], 1: [6], 2: [7], 3: [6, 7], 4: [7, 7]}[size % 5]
    fives = (size - sum(head)) // 5
    units = [5] * fives + head
    if not _fillable(size) or fives < 0:
        raise ValueError(f"no gap of {size} bytes can be made")
    return b"".join(_unit(unit, 0, False) for unit in units[:-1]) + _unit(
        units[-1], length, final)


def layout(size: int, at: int) -> list[tuple[bytes, int, int]]:
    """``(gap bytes, offset in the blob, length)`` of each run of a blob of ``size``
    bytes whose deflate stream starts at file offset ``at`` (after the zlib header)."""
    if size <= 0:
        raise ValueError("only a blob with bytes is laid out page-aligned")
    out = []
    position, done = at, 0
    while done < size:
        start = -(-(position + 5) // PAGE) * PAGE
        while not _fillable(start - position):
            start += PAGE
        length = min(RUN, size - done)
        out.append((_gap(start - position, length, done + length == size), done, length))
        done += length
        position = start + length
    return out


def pieces(data: bytes | memoryview, prefix: bytes, at: int
           ) -> list[bytes | bytearray | memoryview]:
    """``prefix`` (a pack entry's header), then ``data`` as a page-aligned zlib stream
    for an entry that starts at file offset ``at``, without its adler32 trailer: gaps,
    and views of ``data`` (nothing is copied)."""
    view = memoryview(data).cast("B")
    out: list[bytes | bytearray | memoryview] = [prefix + _ZLIB_HEADER]
    for gap, offset, length in layout(len(view), at + len(prefix) + len(_ZLIB_HEADER)):
        out.append(gap)
        out.append(view[offset : offset + length])
    return out


def stream(data: bytes | memoryview, prefix: bytes, at: int) -> bytearray:
    """:func:`pieces` and the adler32 trailer, as one buffer."""
    out = bytearray().join(pieces(data, prefix, at))
    out += struct.pack(">I", zlib.adler32(data))
    return out


def runs(pack: bytes | mmap.mmap | memoryview, start: int, size: int
         ) -> tuple[list[Run], int] | None:
    """Where a blob of ``size`` bytes whose zlib stream starts at ``start`` in ``pack``
    has its bytes, and the stream's adler32; None unless the stream is laid out here."""
    if size < ALIGN_FROM or pack[start : start + 2] != _ZLIB_HEADER:
        return None
    position = start + 2
    found = []
    for gap, offset, length in layout(size, position):
        if pack[position : position + len(gap)] != gap:
            return None
        position += len(gap)
        found.append((position, offset, length))
        position += length
    trailer = pack[position : position + 4]
    if len(trailer) != 4:
        return None
    return found, int.from_bytes(trailer, "big")
