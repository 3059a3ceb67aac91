"""Page-aligned blobs (``kernos.store.aligned``): the zlib streams a pack holds for big
chunks that do not compress, laid out so that restores can map their bytes.

Pinned here: every stream inflates (with zlib itself) to its data, for many sizes and
for every start offset over two pages, the awkward ones included (where the first gap
would be 8 or 9 bytes, which no run of empty blocks fills); every run starts on a page
of the file and at a page multiple of the blob; ``runs`` finds them and the adler32,
and finds nothing in a stream that is shifted, too short, not ours or damaged; what
``PackBuilder`` lays out so (blobs only, big ones that do not compress, unless told not
to); what ``Pack`` reads from such entries (and refuses when a run is damaged);
and that git itself reads a pack of them, fsck and all.
"""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from kernos.store import aligned
from kernos.store.aligned import ALIGN_FROM, PAGE, RUN, layout, runs, stream
from kernos.store.objects import object_id
from kernos.store.packs import Pack, PackBuilder, PackSet
from support import git

MIB = 1 << 20
SIZES = [ALIGN_FROM, ALIGN_FROM + 1, ALIGN_FROM + PAGE - 1, 5 * RUN, 5 * RUN + 1,
         5 * RUN - 1, MIB - PAGE, MIB, MIB + 5, 2 * MIB + 3 * PAGE + 17]
"""Blob sizes >= ALIGN_FROM: whole runs, a page short or over, the chunk size and more."""
AWKWARD = [PAGE - 8 - 2, PAGE - 9 - 2]
"""Entry offsets (with no prefix) where the first gap would be 8 or 9 bytes."""


def blob_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def inflated(raw: bytes | bytearray | memoryview) -> bytes:
    """``raw`` inflated by zlib, which must end exactly where ``raw`` does."""
    inflater = zlib.decompressobj()
    out = inflater.decompress(raw)
    assert inflater.eof and inflater.unused_data == b"" and inflater.unconsumed_tail == b""
    return out


def check_runs(file: bytes | bytearray, start: int, data: bytes) -> list[aligned.Run]:
    """The runs of the stream at ``start`` in ``file``: where the layout says, page-aligned
    in the file and in the blob, one page apart, covering the blob in order."""
    found = runs(file, start, len(data))
    assert found is not None
    laid_out, adler = found
    assert adler == zlib.adler32(data)
    done = 0
    for number, (position, offset, length) in enumerate(laid_out):
        assert position % PAGE == 0 and offset % PAGE == 0
        assert offset == done and length == min(RUN, len(data) - done)
        assert file[position : position + length] == data[offset : offset + length]
        if number:
            previous, _, before = laid_out[number - 1]
            assert position - (previous + before) == PAGE  # the gap between two runs
        done += length
    assert done == len(data)
    first_gap = laid_out[0][0] - (start + 2)
    assert 5 <= first_gap <= PAGE + 9 and first_gap not in (8, 9)
    # The cost: the zlib header, the first gap, a page between runs, the trailer.
    end = laid_out[-1][0] + laid_out[-1][2]
    assert file[end : end + 4] == struct.pack(">I", zlib.adler32(data))
    assert end + 4 - start == 2 + first_gap + len(data) + (len(laid_out) - 1) * PAGE + 4
    return laid_out


# -- the layout --------------------------------------------------------------------------


def test_every_stream_inflates_and_lines_up_for_every_start_over_two_pages() -> None:
    """A blob of ALIGN_FROM bytes (five runs) at every offset from 0 to 2 pages: the gap
    before the first run takes every length from 5 to a page and 9 (the layout depends
    on the offset in the page only)."""
    data = blob_bytes(ALIGN_FROM)
    seen_gaps = set()
    for at in range(2 * PAGE + 1):
        file = stream(data, bytes(at), 0)  # ``at`` bytes before it: as if it started there
        assert inflated(memoryview(file)[at:]) == data
        laid_out = check_runs(file, at, data)
        seen_gaps.add(laid_out[0][0] - at - 2)
    assert seen_gaps == {5, 6, 7, *range(10, PAGE + 5), PAGE + 8, PAGE + 9}
    for at in (0, 1, PAGE - 11, PAGE + 3):  # and so does a stream written for its place
        assert stream(data, b"", at) == stream(data, bytes(at), 0)[at:]


@pytest.mark.parametrize("size", SIZES)
def test_big_blobs_inflate_and_line_up_at_many_offsets(size: int) -> None:
    data = blob_bytes(size, seed=size)
    prefix = b"\xb5\x80\x40"  # a pack entry's header: the layout counts it in
    for at in [0, 1, 2, 3, 7, 12, 100, PAGE - 5, PAGE - 3, *AWKWARD, PAGE - 1, PAGE, PAGE + 1,
               PAGE + 12, 2 * PAGE - 1, 2 * PAGE, 12345]:
        raw = stream(data, prefix, at)
        assert raw[:3] == prefix
        assert inflated(raw[3:]) == data
        check_runs(bytes(at) + raw, at + 3, data)


def test_where_the_first_gap_would_be_8_or_9_bytes_it_is_a_page_longer() -> None:
    for gap in (8, 9):
        pieces = layout(ALIGN_FROM, PAGE - gap)  # the deflate stream starts here
        assert len(pieces[0][0]) == PAGE + gap
        assert [offset for _, offset, _ in pieces] == list(range(0, ALIGN_FROM, RUN))
    assert [len(gap) for gap, _, _ in layout(ALIGN_FROM, PAGE - 10)][:2] == [10, PAGE]
    assert [len(gap) for gap, _, _ in layout(ALIGN_FROM, PAGE - 7)][:2] == [7, PAGE]
    assert [len(gap) for gap, _, _ in layout(ALIGN_FROM, 0)][:2] == [PAGE, PAGE]
    for at in AWKWARD:
        data = blob_bytes(ALIGN_FROM, seed=at)
        raw = stream(data, b"", at)
        assert inflated(raw) == data
        assert check_runs(bytes(at) + raw, at, data)[0][0] == 2 * PAGE


def test_a_run_is_at_most_15_pages_each_behind_its_own_stored_block_header() -> None:
    assert RUN == 15 * PAGE if PAGE == 4096 else RUN <= 0xFFFF
    pieces = layout(3 * RUN + 1, 0)
    assert [length for _, _, length in pieces] == [RUN, RUN, RUN, 1]
    for gap, _, length in pieces:
        assert gap[-4:] == struct.pack("<HH", length, length ^ 0xFFFF)
    # Only the last block is final: zlib stops there (``inflated`` checks), not before.
    data = blob_bytes(3 * RUN + 1)
    assert inflated(stream(data, b"", 0)) == data


def test_no_gap_of_1_to_4_8_or_9_bytes_and_no_empty_blob() -> None:
    for size in (1, 2, 3, 4, 8, 9):
        with pytest.raises(ValueError, match=f"no gap of {size} bytes"):
            aligned._gap(size, 1, True)
    for size in (5, 6, 7, *range(10, 40), PAGE, PAGE + 9):
        assert len(aligned._gap(size, 1, True)) == size
    with pytest.raises(ValueError, match="5, 6 or 7 bytes"):
        aligned._unit(4, 0, False)
    with pytest.raises(ValueError, match="only a blob with bytes"):
        layout(0, 0)


# -- finding the runs ---------------------------------------------------------------------


def test_runs_finds_nothing_in_a_stream_shifted_short_not_ours_or_damaged() -> None:
    data = blob_bytes(ALIGN_FROM + 3 * PAGE + 5, seed=3)
    at = 12
    file = bytearray(bytes(at) + stream(data, b"", at))
    laid_out = check_runs(file, at, data)
    for shift in (1, 2, 5, 17, PAGE - 1):  # the same stream, elsewhere in a file
        assert runs(bytes(shift) + file, at + shift, len(data)) is None
    assert runs(bytes(PAGE) + file, at + PAGE, len(data)) is not None  # a page on: lines up
    small = blob_bytes(ALIGN_FROM - 1)
    assert runs(bytes(at) + stream(small, b"", at), at, len(small)) is None  # below the floor
    assert runs(file, at, len(data) + 1) is None and runs(file, at, len(data) - 1) is None
    other_header = bytearray(file)
    other_header[at + 1] = 0x9C  # a valid zlib header (default level), not this layout's
    assert runs(other_header, at, len(data)) is None
    for where in (at + 2, at + 3, laid_out[0][0] - 1, laid_out[0][0] - 3,
                  laid_out[1][0] - PAGE, laid_out[1][0] - 2, laid_out[-1][0] - 5):
        damaged = bytearray(file)
        damaged[where] ^= 0x01  # one bit of a gap: an empty block's or a run's header
        assert runs(damaged, at, len(data)) is None, where
    assert runs(file[:-1], at, len(data)) is None  # the adler32 trailer torn
    damaged = bytearray(file)
    damaged[laid_out[1][0] + 10] ^= 0xFF  # a byte of a run: found, but its adler32 differs
    found = runs(damaged, at, len(data))
    assert found is not None and found[1] == zlib.adler32(data)
    assert zlib.adler32(b"".join(bytes(damaged[p : p + n]) for p, _, n in found[0])) != found[1]


# -- packs --------------------------------------------------------------------------------


def written(directory: Path, objects: list[tuple[bytes, bytes]]) -> tuple[Path, list[bytes]]:
    """A pack (and its index) of ``(kind, data)`` objects; the path and the ids."""
    builder = PackBuilder()
    shas = []
    for kind, data in objects:
        sha = object_id(kind, data)
        builder.add(kind, data, sha)
        shas.append(sha)
    directory.mkdir(parents=True, exist_ok=True)
    return builder.write(directory, lambda _path: None), shas


def test_a_pack_builder_lays_out_big_blobs_and_pack_reads_them(tmp_path: Path) -> None:
    big = [blob_bytes(size, seed=size) for size in (MIB, ALIGN_FROM, MIB + 5)]
    objects = [(b"blob", b"small"), (b"blob", big[0]), (b"blob", bytes(MIB)),
               (b"blob", big[1]), (b"tree", blob_bytes(ALIGN_FROM, seed=9)),
               (b"blob", big[2])]
    path, shas = written(tmp_path / "pack", objects)
    pack = Pack(path)
    try:
        file = path.read_bytes()
        assert pack.size == len(file) and bytes(pack.slice(1000, 77)) == file[1000:1077]
        for (kind, data), sha in zip(objects, shas, strict=True):
            offset = pack.find(sha)
            assert offset is not None
            start = pack.entry(offset)[2]
            laid_out = aligned.runs(file, start, len(data))
            if kind == b"blob" and data in big:
                assert laid_out is not None and pack.runs(offset, len(data)) == laid_out
                check_runs(file, start, data)
                assert pack.runs(offset, len(data) - 1) is None  # not the blob's size
            else:  # small, zeros (which compress), a tree
                assert laid_out is None and pack.runs(offset, len(data)) is None
            out = bytearray(len(data))
            if kind == b"blob" and data in big:
                assert pack.read_into(offset, memoryview(out)) is True and out == data
            elif kind == b"blob":  # deflated: read otherwise
                assert pack.read_into(offset, memoryview(out)) is False
            assert pack.read_into(offset, memoryview(bytearray(len(data) + 1))) is False
    finally:
        pack.close()


def test_a_damaged_run_fails_the_copy_and_the_inflate_says_so(tmp_path: Path) -> None:
    data = blob_bytes(MIB, seed=11)
    path, (sha, other) = written(tmp_path / "pack", [(b"blob", data),
                                                     (b"blob", blob_bytes(MIB, seed=12))])
    pack = Pack(path)
    offset = pack.find(sha)
    assert offset is not None
    found = pack.runs(offset, MIB)
    assert found is not None
    position = found[0][3][0] + 123  # in the fourth run of the first blob
    pack.close()
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    copy = damaged / path.name
    shutil.copyfile(path.with_suffix(".idx"), copy.with_suffix(".idx"))
    file = bytearray(path.read_bytes())
    file[position] ^= 0xFF
    copy.write_bytes(file)
    packs = PackSet(damaged)
    try:
        out = bytearray(MIB)
        assert packs.read_blob_into(sha, memoryview(out)) is False  # the adler32 differs
        with pytest.raises(ValueError, match=f"object {sha.hex()} is damaged"):
            packs.read(sha)
        assert packs.read_blob_into(other, memoryview(out)) is True  # the other is sound
        assert out == blob_bytes(MIB, seed=12)
    finally:
        packs.close()


def test_git_reads_and_checks_a_pack_of_aligned_blobs(repo: Path) -> None:
    objects = [(b"blob", blob_bytes(size, seed=size)) for size in SIZES[:6]]
    objects += [(b"blob", b"small"), (b"blob", bytes(MIB)), (b"blob", blob_bytes(3 * PAGE))]
    path, shas = written(repo / "objects" / "pack", objects)
    pack = Pack(path)
    try:
        offsets = [pack.find(sha) for sha in shas]
        aligned_ones = [sha for (_, data), sha, offset in zip(objects, shas, offsets, strict=True)
                        if offset is not None and pack.runs(offset, len(data)) is not None]
    finally:
        pack.close()
    assert aligned_ones == shas[:6]
    checked = subprocess_output(repo, "fsck", "--full", "--strict", "--no-dangling")
    # Nothing but notices that the repository has no branch yet.
    assert [line for line in checked.splitlines() if not line.startswith(b"notice:")] == []
    assert git(repo, "verify-pack", str(path.with_suffix(".idx"))) == b""
    for (_, data), sha in zip(objects, shas, strict=True):
        assert git(repo, "cat-file", "-p", sha.hex()) == data
        assert int(git(repo, "cat-file", "-s", sha.hex())) == len(data)


def subprocess_output(repo: Path, *args: str) -> bytes:
    """``git ARGS``, which must succeed: its stdout and stderr together."""
    done = subprocess.run(["git", f"--git-dir={repo}", *args], capture_output=True, check=True)
    return done.stdout + done.stderr


def test_a_blob_the_writer_asks_not_to_align_is_stored_compactly(tmp_path: Path) -> None:
    data = blob_bytes(ALIGN_FROM, seed=5)
    sha = object_id(b"blob", data)
    builder = PackBuilder()
    assert builder.add(b"blob", data, sha, aligned=False) < len(data) + 64  # no page gaps
    directory = tmp_path / "pack"
    directory.mkdir()
    pack = Pack(builder.write(directory, lambda _path: None))
    offset = pack.find(sha)
    assert offset is not None and pack.runs(offset, len(data)) is None
    out = memoryview(bytearray(len(data)))
    assert pack.read_into(offset, out) and bytes(out) == data
    pack.close()
