"""The zlib streams of git objects: deflated when that pays, else "stored" blocks.

Writing (:func:`zlib_stream`).  Data that compresses (judged on its first 4 KiB,
:func:`compresses`) is deflated at level 1; other data (numbers, images, anything
already compressed or encrypted) goes in deflate "stored" blocks written here,
which is what zlib's level 0 makes, at a fraction of its cost: one copy and an
adler32.  Long blobs in packs are laid out page-aligned instead
(:mod:`kernos.store.aligned`).

Reading (:func:`copy_stored_blocks`).  A stream of stored blocks is copied
straight into the caller's memory, its adler32 checked as zlib would, instead
of being inflated into new memory and copied again.
"""

from __future__ import annotations

import struct
import zlib

__all__ = ["compresses", "copy_stored_blocks", "zlib_stream"]

# Data that does not shrink by a tenth is stored with zlib level 0: compressing
# 200 MB of floats at level 1 costs seconds and saves almost nothing.
_PROBE_BYTES = 4 * 1024
_WORTH_COMPRESSING = 0.9
_STORED_BLOCK = 0xFFFF  # the most a deflate "stored" block holds


def compresses(data: bytes | memoryview) -> bool:
    """Whether zlib is worth its time on ``data`` (judged on its first 4 KiB)."""
    if len(data) <= _PROBE_BYTES:
        return True
    probe = bytes(data[:_PROBE_BYTES])
    return len(zlib.compress(probe, 1)) < _WORTH_COMPRESSING * len(probe)


def zlib_stream(data: bytes | memoryview, prefix: bytes = b"") -> bytes | bytearray:
    """``prefix``, then ``data`` as a zlib stream: deflated at level 1 if that pays
    (:func:`compresses`), else in "stored" blocks written here (one copy and an adler32,
    what zlib's level 0 makes at a fraction of its cost)."""
    if compresses(data):
        compressor = zlib.compressobj(1)
        return prefix + compressor.compress(data) + compressor.flush()
    view = memoryview(data).cast("B")
    size = len(view)
    blocks = max(1, -(-size // _STORED_BLOCK))
    out = bytearray(len(prefix) + 2 + 5 * blocks + size + 4)
    out[: len(prefix)] = prefix
    at = len(prefix)
    out[at : at + 2] = b"\x78\x01"  # deflate, 32 KiB window: (0x78 << 8 | 0x01) % 31 == 0
    at += 2
    for number in range(blocks):
        piece = view[number * _STORED_BLOCK : (number + 1) * _STORED_BLOCK]
        length = len(piece)
        out[at : at + 5] = struct.pack("<BHH", number == blocks - 1, length, length ^ 0xFFFF)
        out[at + 5 : at + 5 + length] = piece
        at += 5 + length
    out[at:] = struct.pack(">I", zlib.adler32(view))
    return out


def copy_stored_blocks(raw: bytes | memoryview, out: memoryview, *, git_header: bool) -> bool:
    """Copy a zlib stream made only of stored blocks into ``out``; False if it is not one.

    Large chunks are stored with zlib level 0, whose deflate stream is the data
    itself in "stored" blocks: copying those blocks straight into ``out`` (and
    checking the adler32 trailer as zlib would) saves a decompress and a copy.  A
    loose object's stream (``git_header``) starts with git's ``blob <size>\\0``
    header, which is checked and left out; a pack entry's is the content alone.
    """
    if len(raw) < 6 or raw[0] & 0x0F != 8 or raw[1] & 0x20 or (raw[0] << 8 | raw[1]) % 31:
        return False
    view = memoryview(raw)
    position = 2
    header = b"" if git_header else b"\0"
    written = 0
    checksum = 1
    while True:
        if position + 5 > len(raw):
            return False
        flags = raw[position]
        if (flags >> 1) & 0b11 != 0:  # not a stored block
            return False
        length = raw[position + 1] | raw[position + 2] << 8
        if length ^ (raw[position + 3] | raw[position + 4] << 8) != 0xFFFF:
            return False
        start = position + 5
        block = view[start : start + length]
        if len(block) != length:
            return False
        checksum = zlib.adler32(block, checksum)
        if len(header) < 64 and b"\0" not in header:
            nul = bytes(block[:64]).find(b"\0")
            if nul < 0:
                header += bytes(block)
                block = block[len(block):]
            else:
                header += bytes(block[:nul + 1])
                block = block[nul + 1 :]
                kind, _, size = header[:-1].partition(b" ")
                if kind != b"blob" or not size.isdigit() or int(size) != len(out):
                    return False
        if len(block):
            if written + len(block) > len(out):
                return False
            out[written : written + len(block)] = block
            written += len(block)
        position = start + length
        if flags & 1:  # the final block
            break
    trailer = raw[position : position + 4]
    return (written == len(out) and len(trailer) == 4
            and int.from_bytes(trailer, "big") == checksum)
