"""A big chunk in a pack is copied into its buffer straight from the mapping, and checked.

A pack entry stored with zlib level 0 is the chunk's bytes in "stored" blocks;
``PackSet.read_blob_into`` copies those blocks into the buffer without a
decompress, checking the stream's adler32 as zlib would.  Anything else (a
compressed entry, a wrong size, a damaged entry) is left to the ordinary read,
which decompresses and fails loudly on damage.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import pytest

from kernos.store.packs import PackSet
from kernos.store.streams import copy_stored_blocks, zlib_stream
from support import git


def packed(repo: Path, content: bytes, *, compression: int) -> tuple[bytes, Path]:
    """``content`` as a blob in a pack of its own that git wrote at ``compression``."""
    sha = git(repo, "hash-object", "-w", "--stdin", data=content).decode().strip()
    tree = git(repo, "mktree", data=f"100644 blob {sha}\tchunk\n".encode()).decode().strip()
    commit = git(repo, "commit-tree", tree, "-m", "chunk").decode().strip()
    git(repo, "update-ref", "refs/heads/main", commit)
    git(repo, "-c", f"pack.compression={compression}", "repack", "-a", "-d", "-q", "-F")
    git(repo, "prune-packed")
    return bytes.fromhex(sha), repo / "objects" / "pack"


def test_a_stored_chunk_is_copied_without_a_decompress(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    content = os.urandom(300_000)  # several 64 KiB stored blocks
    sha, directory = packed(repo, content, compression=0)
    packs = PackSet(directory)

    def no_inflate(*args: Any) -> bytes:
        raise AssertionError("zlib.decompress called")

    monkeypatch.setattr(zlib, "decompress", no_inflate)
    out = bytearray(len(content))
    assert packs.read_blob_into(sha, memoryview(out))
    assert bytes(out) == content
    assert not packs.read_blob_into(sha, memoryview(bytearray(len(content) - 1)))
    assert not packs.read_blob_into(b"\x01" * 20, memoryview(out))  # not in the pack


def test_a_compressed_chunk_is_left_to_the_ordinary_read(repo: Path) -> None:
    content = b"squeezable " * 30_000
    sha, directory = packed(repo, content, compression=9)
    packs = PackSet(directory)
    out = bytearray(len(content))
    assert not packs.read_blob_into(sha, memoryview(out))
    assert packs.read(sha) == (b"blob", content)


def test_a_damaged_stored_chunk_is_not_copied_and_the_read_says_so(repo: Path) -> None:
    content = os.urandom(200_000)
    sha, directory = packed(repo, content, compression=0)
    (pack,) = directory.glob("*.pack")
    data = bytearray(pack.read_bytes())
    at = data.find(content[100_000:100_032])
    assert at > 0
    data[at] ^= 0xFF  # one bit of the chunk's bytes, inside a stored block
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))
    packs = PackSet(directory)
    out = bytearray(len(content))
    assert not packs.read_blob_into(sha, memoryview(out))  # the adler32 does not match
    with pytest.raises(ValueError, match="is damaged in"):
        packs.read(sha)


@pytest.mark.parametrize("size", [4097, 65535, 65536, 65535 * 2, (1 << 20) + 3])
def test_stored_blocks_written_by_hand_are_a_zlib_stream_of_the_data(size: int) -> None:
    data = os.urandom(size)  # does not compress: stored blocks
    stream = zlib_stream(data, prefix=b"head")
    assert stream[:4] == b"head" and zlib.decompress(bytes(stream[4:])) == data
    out = bytearray(size)
    assert copy_stored_blocks(memoryview(stream)[4:], memoryview(out), git_header=False)
    assert out == data
    damaged = bytearray(stream)
    damaged[-1] ^= 1  # the adler32
    with pytest.raises(zlib.error):
        zlib.decompress(bytes(damaged[4:]))


def test_data_that_compresses_is_deflated() -> None:
    data = b"abc" * 100_000
    stream = zlib_stream(data)
    assert len(stream) < len(data) // 10 and zlib.decompress(stream) == data
