"""Packs byte for byte: the writer's format, the reader's lookups, deltas and damage.

These close gaps mutation testing (scripts/mutation store.packs) found: the
other pack tests go through whole commits, so nothing pinned which data is
compressed (and at which level), the entry header's size encoding, the index
(compared here with the one ``git index-pack`` makes of the same pack, and its
table of offsets past 2 GiB), the names and order of the files a write
renames, the index lookup at the ends of the fanout, the delta encodings
(offset distances of several bytes, reference deltas across packs, copies
with every field), the messages of every refusal, or how a pack set orders,
reuses, skips and rescans its packs.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from kernos.store import packs as packs_module
from kernos.store.objects import object_id
from kernos.store.packs import (
    Pack,
    PackBuilder,
    PackSet,
    _Entry,
    apply_delta,
    inflate_entry,
)
from kernos.store.streams import compresses

BLOB = 3
OFS_DELTA = 6
REF_DELTA = 7


def header(kind: int, size: int) -> bytes:
    """A pack entry's header, encoded independently of the module (git's pack format)."""
    out = [(kind << 4) | (size & 0x0F)]
    size >>= 4
    while size:
        out[-1] |= 0x80
        out.append(size & 0x7F)
        size >>= 7
    return bytes(out)


def varint(value: int) -> bytes:
    """A delta's size field: 7 bits at a time, least significant first."""
    assert value >= 0  # (a negative one would never end)
    out = []
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def ofs_distance(distance: int) -> bytes:
    """How an offset delta names its base (git's ``offset encoding``)."""
    assert distance >= 0, f"a base after its delta ({distance})"  # never ends otherwise
    out = [distance & 0x7F]
    distance >>= 7
    while distance:
        distance -= 1
        out.insert(0, 0x80 | (distance & 0x7F))
        distance >>= 7
    return bytes(out)


def ofs_delta(delta: bytes, distance: int) -> bytes:
    return header(OFS_DELTA, len(delta)) + ofs_distance(distance) + zlib.compress(delta)


def ref_delta(delta: bytes, base: bytes) -> bytes:
    return header(REF_DELTA, len(delta)) + base + zlib.compress(delta)


def whole(data: bytes) -> bytes:
    return header(BLOB, len(data)) + zlib.compress(data)


def write(builder: PackBuilder, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return builder.write(directory, lambda _path: None)


def test_compresses_judges_the_first_4_kib_of_data_longer_than_that() -> None:
    rng = random.Random(1)
    assert compresses(rng.randbytes(4 * 1024))  # short data is always compressed
    assert not compresses(rng.randbytes(4 * 1024 + 1))
    assert compresses(bytes(4 * 1024) + rng.randbytes(100_000))
    # 3,800 random bytes and zeros: only the first 4 KiB (93% random) are probed.
    assert not compresses(rng.randbytes(3_800) + bytes(100_000))
    # Shrinking by less than a tenth is not worth it, by more than a tenth is.
    assert not compresses(bytes(rng.randrange(200) for _ in range(20_000)))  # ~96%
    assert compresses(bytes(rng.randrange(64) for _ in range(20_000)))  # ~76%


def test_each_entry_is_its_header_then_zlib_at_level_1_or_0_and_inflates_back() -> None:
    rng = random.Random(2)
    builder = PackBuilder()
    assert builder.size == 12 and len(builder) == 0
    words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randrange(2, 9)))
             for _ in range(300)]
    text = b" ".join(rng.choice(words) for _ in range(4000))  # each level makes other bytes
    cases = [(b"blob", b""), (b"blob", b"x" * 15), (b"tree", b"t" * 16),
             (b"commit", b"c" * 2047), (b"tag", b"g" * 2048), (b"blob", b"a" * 300_000),
             (b"blob", text), (b"blob", rng.randbytes(40_000))]  # the last one at level 0
    expected_size = 12
    for number, (kind, data) in enumerate(cases):
        taken = builder.add(kind, data, bytes([number]) * 20)
        kinds = {b"commit": 1, b"tree": 2, b"blob": 3, b"tag": 4}
        if compresses(data):
            compressor = zlib.compressobj(1)
            raw = header(kinds[kind], len(data)) + compressor.compress(data) + compressor.flush()
        else:  # stored blocks of 65,535 bytes, written by hand: zlib's level 0 cuts others
            blocks = [data[at:at + 0xFFFF] for at in range(0, len(data), 0xFFFF)]
            raw = header(kinds[kind], len(data)) + b"x\x01" + b"".join(
                struct.pack("<BHH", at == len(blocks) - 1, len(block), len(block) ^ 0xFFFF)
                + block for at, block in enumerate(blocks)) + struct.pack(">I", zlib.adler32(data))
        assert taken == len(raw)
        expected_size += len(raw)
        assert builder.size == expected_size and len(builder) == number + 1
        assert list(builder.raw_entries())[-1] == (bytes([number]) * 20, raw)
        assert inflate_entry(raw) == (kind, data)
    assert [raw[:3] for _, raw in builder.raw_entries()][:5] == [
        b"\x30x\x01", b"\x3fx\x01", b"\xa0\x01x", b"\x9f\x7fx", b"\xc0\x80\x01"]


def test_inflate_entry_refuses_deltas_and_damaged_sizes() -> None:
    with pytest.raises(ValueError, match=r"^a pack entry of type 6 is not a whole object$"):
        inflate_entry(ofs_delta(b"\x03\x03\x03abc", 10))
    with pytest.raises(ValueError, match=r"^a pack entry is damaged \(4 of 300 bytes\)$"):
        inflate_entry(header(BLOB, 300) + zlib.compress(b"abcd"))


def test_a_written_pack_and_its_index_are_what_git_makes_of_them(tmp_path: Path) -> None:
    rng = random.Random(3)
    blobs = [b"", b"one", rng.randbytes(5000), b"z" * 70_000, *(rng.randbytes(50)
                                                                for _ in range(40))]
    builder = PackBuilder()
    for blob in blobs:
        builder.add(b"blob", blob, object_id(b"blob", blob))
    announced: list[tuple[Path, list[str]]] = []
    directory = tmp_path / "pack"
    directory.mkdir()
    pack = builder.write(directory, lambda path: announced.append(
        (path, sorted(os.listdir(directory)))))
    # Named before anything gets its name (the temporary file is any recovery's to delete).
    assert announced == [(pack, [f"tmp_kernos_pack_{os.getpid()}"])]
    content = pack.read_bytes()
    assert content[:12] == b"PACK" + struct.pack(">II", 2, len(blobs))
    assert content[-20:] == hashlib.sha1(content[:-20]).digest()
    assert pack.name == f"pack-{content[-20:].hex()}.pack"
    assert sorted(os.listdir(directory)) == [pack.with_suffix(".idx").name, pack.name]
    ours = pack.with_suffix(".idx").read_bytes()
    theirs = tmp_path / "git.idx"
    subprocess.run(["git", "index-pack", "-o", str(theirs), str(pack)], check=True,
                   capture_output=True)
    assert ours == theirs.read_bytes()
    packs = PackSet(directory)
    for blob in blobs:
        assert packs.read(object_id(b"blob", blob)) == (b"blob", blob)
    packs.close()


def test_a_write_renames_the_pack_then_its_index_from_names_git_ignores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renamed: list[tuple[str, str]] = []
    real_replace = os.replace

    def replace(source: Path, target: Path) -> None:
        renamed.append((Path(source).name, Path(target).name))
        real_replace(source, target)

    monkeypatch.setattr(packs_module.os, "replace", replace)
    builder = PackBuilder()
    builder.add(b"blob", b"data", object_id(b"blob", b"data"))
    pack = write(builder, tmp_path / "pack")
    pid = os.getpid()
    assert renamed == [(f"tmp_kernos_pack_{pid}", pack.name),
                       (f"tmp_kernos_idx_{pid}", pack.with_suffix(".idx").name)]


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real_replace = os.replace

    def replace(source: Path, target: Path) -> None:
        if str(target).endswith(".idx"):
            raise OSError("disk gone")
        real_replace(source, target)

    monkeypatch.setattr(packs_module.os, "replace", replace)
    builder = PackBuilder()
    builder.add(b"blob", b"data", object_id(b"blob", b"data"))
    directory = tmp_path / "pack"
    directory.mkdir()
    with pytest.raises(OSError, match="disk gone"):
        builder.write(directory, lambda _path: None)
    # The pack was renamed (the journal names it for recovery); its index never appears.
    assert [path.suffix for path in directory.iterdir()] == [".pack"]


def test_offsets_past_2_gib_go_to_the_index_large_table_and_are_read_back(
        tmp_path: Path) -> None:
    builder = PackBuilder()
    shas = [bytes([byte]) * 20 for byte in (0x10, 0x20, 0x30, 0x40)]
    offsets = [12, (1 << 31) - 1, 1 << 31, (1 << 33) + 5]
    builder._entries = [_Entry(sha, offset, [], 0)
                        for sha, offset in zip(shas, offsets, strict=True)]
    checksum = b"\x07" * 20
    index = builder._index(checksum)
    count = len(shas)
    table = 8 + 1024 + 24 * count
    small = struct.unpack_from(f">{count}I", index, table)
    assert small == (12, (1 << 31) - 1, 0x80000000, 0x80000001)
    assert struct.unpack_from(">2Q", index, table + 4 * count) == (1 << 31, (1 << 33) + 5)
    assert index[-40:-20] == checksum and index[-20:] == hashlib.sha1(index[:-20]).digest()
    (tmp_path / "pack-x.idx").write_bytes(index)
    (tmp_path / "pack-x.pack").write_bytes(b"PACK" + struct.pack(">II", 2, count) + checksum)
    pack = Pack(tmp_path / "pack-x.pack")
    assert pack.count == count
    assert [pack.find(sha) for sha in shas] == offsets
    pack.close()


def test_find_looks_up_every_id_at_the_ends_of_the_fanout_and_misses_the_others(
        tmp_path: Path) -> None:
    rng = random.Random(4)
    edges = [b"\x00" * 20, b"\x00" * 19 + b"\x01", b"\x7f" + b"\x55" * 19,
             b"\xff" * 19 + b"\xfe", b"\xff" * 20]
    shas = edges + [rng.randbytes(20) for _ in range(300)]
    builder = PackBuilder()
    for number, sha in enumerate(shas):
        builder.add(b"blob", str(number).encode(), sha)
    pack_path = write(builder, tmp_path / "pack")
    pack = Pack(pack_path)
    assert pack.count == len(shas)
    offsets = {sha: pack.find(sha) for sha in shas}
    assert sorted(offsets.values()) == sorted(entry.offset for entry in builder._entries)
    packs = PackSet(tmp_path / "pack")
    for number, sha in enumerate(shas):
        assert packs.read(sha) == (b"blob", str(number).encode())
    for missing in (b"\x00" * 19 + b"\x02", b"\x01" * 20, b"\x80" * 20, b"\xff" * 19 + b"\xfd"):
        assert pack.find(missing) is None
        assert packs.read(missing) is None
    pack.close()
    packs.close()


def test_a_pack_without_the_version_2_signatures_is_refused(tmp_path: Path) -> None:
    builder = PackBuilder()
    builder.add(b"blob", b"data", object_id(b"blob", b"data"))
    pack = write(builder, tmp_path / "pack")
    content = pack.read_bytes()
    pack.write_bytes(b"KCAP" + content[4:])
    with pytest.raises(ValueError, match=rf"^{pack.name} is not a version 2 pack with its index$"):
        Pack(pack)
    pack.write_bytes(content)
    index = pack.with_suffix(".idx")
    index.write_bytes(index.read_bytes()[:7] + b"\x01" + index.read_bytes()[8:])
    with pytest.raises(ValueError, match="not a version 2 pack"):
        Pack(pack)


def test_an_entry_whose_data_is_short_of_its_header_is_reported_damaged(tmp_path: Path) -> None:
    builder = PackBuilder()
    builder.add_raw(b"\x01" * 20, header(BLOB, 10) + zlib.compress(b"short"))
    builder.add_raw(b"\x02" * 20, whole(b"after it"))
    pack = write(builder, tmp_path / "pack")
    packs = PackSet(tmp_path / "pack")
    with pytest.raises(ValueError,
                       match=rf"^an object in {pack.name} is damaged \(5 of 10 bytes\)$"):
        packs.read(b"\x01" * 20)
    assert packs.read(b"\x02" * 20) == (b"blob", b"after it")
    packs.close()


def test_deltas_by_offset_and_by_reference_resolve_across_entries_and_packs(
        tmp_path: Path) -> None:
    rng = random.Random(5)
    base = rng.randbytes(3000)
    directory = tmp_path / "pack"
    first = PackBuilder()
    first.add_raw(b"\x10" * 20, whole(base))
    write(first, directory)
    second = PackBuilder()
    second.add_raw(b"\x20" * 20, whole(base))
    filler = rng.randbytes(400)  # so that the next delta's base is more than 128 bytes back
    second.add_raw(b"\x21" * 20, header(BLOB, len(filler)) + zlib.compress(filler, 0))
    # v1: base with its middle replaced (copy, insert, copy); offset 12 back over the filler.
    v1 = base[:1000] + b"NEW" + base[2000:]
    delta1 = (varint(len(base)) + varint(len(v1)) + bytes([0x80 | 0x10 | 0x20, 0xE8, 0x03])
              + bytes([3]) + b"NEW"
              + bytes([0x80 | 0x01 | 0x02 | 0x10 | 0x20, 0xD0, 0x07, 0xE8, 0x03]))
    second.add_raw(b"\x22" * 20, ofs_delta(delta1, second.size - 12))
    # v2: a delta of v1 (a chain), by offset.
    v2 = v1 + b"tail"
    delta2 = (varint(len(v1)) + varint(len(v2)) + bytes([0x80 | 0x10 | 0x20, len(v1) & 0xFF,
                                                          len(v1) >> 8]) + bytes([4]) + b"tail")
    offset_v1 = second._entries[-1].offset
    second.add_raw(b"\x23" * 20, ofs_delta(delta2, second.size - offset_v1))
    # v3: a delta of the base in the *first* pack, by reference.
    v3 = b"head" + base
    delta3 = (varint(len(base)) + varint(len(v3)) + bytes([4]) + b"head"
              + bytes([0x80 | 0x10 | 0x20, len(base) & 0xFF, len(base) >> 8]))
    second.add_raw(b"\x24" * 20, ref_delta(delta3, b"\x10" * 20))
    write(second, directory)
    packs = PackSet(directory)
    assert packs.read(b"\x22" * 20) == (b"blob", v1)
    assert packs.read(b"\x23" * 20) == (b"blob", v2)
    assert packs.read(b"\x24" * 20) == (b"blob", v3)
    packs.close()


def test_broken_deltas_and_entries_are_refused_with_what_is_wrong(tmp_path: Path) -> None:
    directory = tmp_path / "pack"
    builder = PackBuilder()
    builder.add_raw(b"\x01" * 20, ref_delta(varint(3) + varint(3) + b"\x03abc", b"\x09" * 20))
    builder.add_raw(b"\x02" * 20, header(5, 3) + zlib.compress(b"abc"))
    builder.add_raw(b"\x03" * 20, header(BLOB, 3) + b"not zlib at all")
    pack = write(builder, directory)
    packs = PackSet(directory)
    with pytest.raises(ValueError, match=f"^the delta base {'09' * 20} is in no pack$"):
        packs.read(b"\x01" * 20)
    with pytest.raises(ValueError, match=rf"^{pack.name} has an entry of unknown type 5$"):
        packs.read(b"\x02" * 20)
    with pytest.raises(ValueError, match=rf"^object {'03' * 20} is damaged in {pack.name} "
                                         r"\(Error -3 while decompressing data"):
        packs.read(b"\x03" * 20)
    packs.close()


def test_apply_delta_copies_every_field_width_and_inserts_literals() -> None:
    source = bytes(range(256)) * 300  # 76,800 bytes: offsets and lengths of 3 bytes
    end = len(source) - 0x2345
    out = (source[0x10203 : 0x10203 + 0x100]  # offset bytes 0-2, length byte 1
           + source[:0x10000]  # no offset nor length byte: 64 KiB from the start
           + b"xyz"
           + source[0x2345 : 0x2345 + 0x10203]  # offset bytes 0-1, length bytes 0-2
           + source[end:])  # 4 offset bytes, a copy that ends exactly at the end
    delta = (varint(len(source)) + varint(len(out))
             + bytes([0x80 | 0x07 | 0x20, 0x03, 0x02, 0x01, 0x01])
             + bytes([0x80])
             + bytes([3]) + b"xyz"
             + bytes([0x80 | 0x03 | 0x70, 0x45, 0x23, 0x03, 0x02, 0x01])
             + bytes([0x80 | 0x0F | 0x30, end & 0xFF, (end >> 8) & 0xFF, end >> 16, 0,
                      0x45, 0x23]))
    assert apply_delta(source, delta) == out
    with pytest.raises(ValueError, match=r"^a delta copies past the end of its base$"):
        apply_delta(source, varint(len(source)) + varint(0x2346)
                    + bytes([0x80 | 0x07 | 0x30, end & 0xFF, (end >> 8) & 0xFF, end >> 16,
                             0x46, 0x23]))
    with pytest.raises(ValueError, match=r"^a delta has a reserved instruction$"):
        apply_delta(b"abc", varint(3) + varint(3) + b"\x00")
    with pytest.raises(ValueError, match=r"^a delta produced the wrong size$"):
        apply_delta(b"abc", varint(3) + varint(4) + b"\x03abc")
    with pytest.raises(ValueError, match=r"^a delta does not fit its base$"):
        apply_delta(b"abc", varint(300) + varint(3) + b"\x03abc")


def test_a_pack_set_lists_finished_packs_newest_first_and_reuses_their_mappings(
        tmp_path: Path) -> None:
    directory = tmp_path / "pack"
    assert len(PackSet(directory)) == 0  # no directory yet: no packs
    paths = []
    for number in range(3):
        builder = PackBuilder()
        builder.add(b"blob", b"v%d" % number, object_id(b"blob", b"v%d" % number))
        paths.append(write(builder, directory))
    for age, path in enumerate(paths):  # the last written is the oldest
        os.utime(path.with_suffix(".idx"), ns=(10**18 - age * 10**9,) * 2)
    (directory / "tmp_kernos_idx_1").write_bytes(b"junk")  # being written
    (directory / "pack-half.idx").write_bytes(paths[0].with_suffix(".idx").read_bytes())
    (directory / "other.idx").write_bytes(paths[0].with_suffix(".idx").read_bytes())
    (directory / "other.pack").write_bytes(paths[0].read_bytes())  # not named as a pack
    (directory / "pack-bad.idx").write_bytes(b"not an index")
    (directory / "pack-bad.pack").write_bytes(b"not a pack")
    packs = PackSet(directory)
    assert [pack.path for pack in packs] == paths
    assert len(packs) == 3
    held = list(packs)
    os.utime(paths[2].with_suffix(".idx"), ns=(2 * 10**18,) * 2)
    paths[0].with_suffix(".idx").unlink()
    packs.refresh()
    assert [pack.path for pack in packs] == [paths[2], paths[1]]
    assert list(packs) == [held[2], held[1]]  # the same objects: each pack is mapped once
    copy = pickle.loads(pickle.dumps(packs))
    assert [pack.path for pack in copy] == [paths[2], paths[1]]
    assert copy.directory == directory
    copy.close()
    packs.close()
    assert len(packs) == 0 and list(packs) == []


def test_a_miss_rescans_once_unless_told_not_to_and_an_added_pack_is_read_at_once(
        tmp_path: Path) -> None:
    directory = tmp_path / "pack"
    directory.mkdir()
    reader = PackSet(directory)
    builder = PackBuilder()
    builder.add(b"blob", b"late", object_id(b"blob", b"late"))
    late = write(builder, directory)  # another writer's pack
    sha = object_id(b"blob", b"late")
    assert reader.read(sha, rescan=False) is None
    assert reader.locate(sha) is None
    assert reader.read(sha) == (b"blob", b"late")
    assert reader.locate(sha) is not None
    writer = PackSet(directory)
    builder = PackBuilder()
    builder.add(b"tree", b"mine", b"\x44" * 20)
    mine = write(builder, directory)
    os.utime(mine.with_suffix(".idx"), ns=(1, 1))  # the oldest, by its time
    writer.add(mine)
    assert [pack.path for pack in writer] == [mine, late]  # newest first, whatever the clock
    assert writer.read(b"\x44" * 20, rescan=False) == (b"tree", b"mine")
    added = next(iter(writer))
    writer.refresh()
    assert [pack.path for pack in writer] == [late, mine]
    assert list(writer)[1] is added  # known since it was added: not mapped again
    reader.close()
    writer.close()


def test_a_delta_chain_resolves_at_any_depth_git_makes_and_a_looping_one_is_refused(
        tmp_path: Path) -> None:
    """git repacks with ``--depth`` up to 4095: deeper than Python's recursion limit."""
    builder = PackBuilder()
    builder.add_raw(b"\x00" * 20, whole(b"v"))
    expected = b"v"
    previous = 12
    for step in range(1, 1500):  # each version is the last plus one byte, by offset
        insert = bytes([step % 251 + 1])
        delta = (varint(len(expected)) + varint(len(expected) + 1)
                 + bytes([0x80 | 0x10 | 0x20, len(expected) & 0xFF, len(expected) >> 8])
                 + b"\x01" + insert)
        expected += insert
        offset = builder.size
        builder.add_raw(step.to_bytes(2, "big") + b"\x00" * 18, ofs_delta(delta, offset - previous))
        previous = offset
    # A delta whose base is itself (a damaged distance): the chain never ends.
    builder.add_raw(b"\xff" * 20, ofs_delta(varint(1) + varint(1) + b"\x01x", 0))
    pack = write(builder, tmp_path / "pack")
    packs = PackSet(tmp_path / "pack")
    assert packs.read((1499).to_bytes(2, "big") + b"\x00" * 18) == (b"blob", expected)
    with pytest.raises(ValueError, match=rf"^a delta chain in {pack.name} does not end$"):
        packs.read(b"\xff" * 20)
    packs.close()


def test_closing_lets_go_of_the_mappings_even_while_a_reader_holds_a_view(
        tmp_path: Path) -> None:
    builder = PackBuilder()
    builder.add(b"blob", b"data", object_id(b"blob", b"data"))
    path = write(builder, tmp_path / "pack")
    pack = Pack(path)
    held = memoryview(pack._pack)  # a restore thread inflating from it
    pack.close()  # no BufferError: the mapping goes when the view does
    assert bytes(held[:4]) == b"PACK"
    held.release()
    pack.close()
    assert pack._pack.closed and pack._idx.closed
    packs = PackSet(tmp_path / "pack")
    mapped = list(packs)
    packs.close()
    assert all(pack._pack.closed for pack in mapped)
    packs.refresh()  # a closed set forgot its packs: it maps them anew
    assert packs.read(object_id(b"blob", b"data")) == (b"blob", b"data")
    packs.close()
