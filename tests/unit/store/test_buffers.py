"""Big buffers mapped from the packs (``kernos.store.buffers``): ``map_part`` maps the runs
of chunks laid out page-aligned (``kernos.store.aligned``) straight from the pack file,
copy-on-write, checks every mapped chunk's adler32, and leaves to the caller (or copies
itself) whatever does not line up, is damaged, or would take more mappings than allowed.

Pinned here: the memory holds the data and its pages really are the pack file's (read
from ``/proc/self/maps``, run by run, at the run's file offset); a damaged run, a chunk
stored compactly, a pack whose entries moved, a deleted pack, no room left for mappings
and ``KERNOS_MAP_BUFFERS=off`` all give the right bytes without mapping what they must
not; writes never reach the pack; a whole restore through ``Image`` maps a big array and
copies only the chunk an op rewrote.  Also: a workspace opened writable deletes the raw
``buffers`` file older releases kept, and the background repack leaves big packs (whose
chunks restores map) where they are.
"""

from __future__ import annotations

import mmap
import os
import random
import shutil
import subprocess
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kernos import Image, Workspace
from kernos.store import buffers as buffers_module
from kernos.store import object_store as objects_module
from kernos.store import repack as repack_module
from kernos.store.aligned import ALIGN_FROM, Run
from kernos.store.buffers import PAGE, _address, _map_fixed, map_part, mapping_enabled
from kernos.store.object_store import ObjectStore
from kernos.store.objects import object_id
from kernos.store.packs import PackBuilder, PackSet
from kernos.store.snapshots import StoredPart, read_part

MIB = 1 << 20
SIZES = (MIB, MIB, MIB, 8000)
"""Three whole chunks (each laid out page-aligned) and a short last one (too short to be)."""
DATA = random.Random(1).randbytes(sum(SIZES))
PIECES = [DATA[i * MIB : i * MIB + size] for i, size in enumerate(SIZES)]
SHAS = tuple(object_id(b"blob", piece) for piece in PIECES)


def write_pack(directory: Path, pieces: Iterable[bytes], *, aligned: bool = True,
               after: bytes | None = None) -> Path:
    """A pack of these blobs (after the blob ``after``, if given, which shifts them)."""
    builder = PackBuilder()
    if after is not None:
        builder.add(b"blob", after, object_id(b"blob", after))
    for piece in pieces:
        builder.add(b"blob", piece, object_id(b"blob", piece), aligned=aligned)
    directory.mkdir(parents=True, exist_ok=True)
    return builder.write(directory, lambda _path: None)


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    return write_pack(tmp_path / "pack", PIECES)


@pytest.fixture
def packs(pack: Path) -> Iterator[PackSet]:
    opened = PackSet(pack.parent)
    yield opened
    opened.close()


def mapped(address: int, size: int, path: Path) -> list[tuple[int, int, int]]:
    """``(start, end, file offset)`` of this process's mappings of ``path`` (deleted or not)
    over ``size`` bytes from ``address``, relative to it."""
    found = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(bound, 16) - address for bound in fields[0].split("-"))
        name = fields[5] if len(fields) > 5 else ""
        if start < size and end > 0 and name.removesuffix(" (deleted)") == str(path):
            found.append((start, end, int(fields[2], 16)))
    return sorted(found)


def runs_of(packs: PackSet, sha: bytes, size: int) -> list[Run]:
    located = packs.locate(sha)
    assert located is not None
    laid_out = located[0].runs(located[1], size)
    assert laid_out is not None
    return laid_out[0]


def expected_maps(packs: PackSet, indexes: Iterable[int]) -> list[tuple[int, int, int]]:
    """Where the whole-page runs of these chunks of DATA must be mapped."""
    return sorted((index * MIB + at, index * MIB + at + length, position)
                  for index in indexes
                  for position, at, length in runs_of(packs, SHAS[index], SIZES[index])
                  if length % PAGE == 0)


def mapped_part(packs: PackSet, sizes: tuple[int, ...] = SIZES, shas: tuple[bytes, ...] = SHAS,
                check: Callable[[Iterable[int], Callable[[int], bool]], list[bool]] | None = None,
                ) -> tuple[mmap.mmap, list[int]]:
    found = map_part(packs, sizes, shas, check)
    assert found is not None
    return found


# -- mapping -----------------------------------------------------------------------------


def test_the_aligned_chunks_are_mapped_from_the_pack_run_by_run(packs: PackSet,
                                                                pack: Path) -> None:
    seen: list[list[int]] = []

    def check(order: Iterable[int], matches: Callable[[int], bool]) -> list[bool]:
        seen.append(list(order))
        return [matches(index) for index in seen[-1]]

    memory, missing = mapped_part(packs, check=check)
    assert missing == [3] and seen == [[0, 1, 2]]  # the short chunk is the caller's to copy
    assert len(memory) == len(DATA)
    assert memory[: 3 * MIB] == DATA[: 3 * MIB] and memory[3 * MIB :] == bytes(8000)
    maps = mapped(_address(memory), len(memory), pack)
    assert maps == expected_maps(packs, [0, 1, 2])
    assert len(maps) == 3 * 18  # 17 runs of 15 pages and one of a page, per chunk
    assert all(start % PAGE == 0 and offset % PAGE == 0 for start, _, offset in maps)
    memory.close()


def test_a_run_that_is_not_whole_pages_is_copied_and_the_rest_mapped(tmp_path: Path) -> None:
    pieces = [PIECES[0], DATA[MIB : MIB + ALIGN_FROM + 5]]  # laid out, ending in 5 bytes
    pack = write_pack(tmp_path / "pack", pieces)
    packs = PackSet(pack.parent)
    sizes, shas = (MIB, ALIGN_FROM + 5), tuple(object_id(b"blob", p) for p in pieces)
    memory, missing = mapped_part(packs, sizes, shas)
    assert missing == [] and memory[:] == b"".join(pieces)
    whole = [(MIB + at, MIB + at + length, position)
             for position, at, length in runs_of(packs, shas[1], sizes[1])][:-1]
    maps = mapped(_address(memory), len(memory), pack)
    assert maps[-len(whole) :] == whole and len(maps) == 18 + len(whole)
    assert maps[-1][1] == MIB + ALIGN_FROM - 4 * PAGE  # the last run (4 pages, 5 bytes): copied
    memory.close()
    packs.close()


def test_a_damaged_run_leaves_its_chunk_to_copy_and_maps_the_others(tmp_path: Path,
                                                                     packs: PackSet,
                                                                     pack: Path) -> None:
    inside = runs_of(packs, SHAS[1], MIB)[2][0] + 100  # a byte of a run of chunk 1
    gap = runs_of(packs, SHAS[2], MIB)[1][0] - 2  # a byte of a stored-block header of 2
    damaged = tmp_path / "damaged" / pack.name
    damaged.parent.mkdir()
    shutil.copyfile(pack.with_suffix(".idx"), damaged.with_suffix(".idx"))
    content = bytearray(pack.read_bytes())
    content[inside] ^= 0x01
    content[gap] ^= 0x01
    damaged.write_bytes(content)
    seen: list[list[int]] = []

    def check(order: Iterable[int], matches: Callable[[int], bool]) -> list[bool]:
        seen.append(list(order))
        return [matches(index) for index in seen[-1]]

    other = PackSet(damaged.parent)
    memory, missing = mapped_part(other, check=check)
    assert missing == [1, 2, 3] and seen == [[0, 1]]  # 2 is not laid out there any more
    assert memory[:MIB] == PIECES[0]
    assert mapped(_address(memory), len(memory), damaged) == expected_maps(packs, [0, 1])
    memory.close()
    memory, missing = mapped_part(other, (MIB, MIB), (SHAS[1], SHAS[1]))
    assert missing == [0, 1]  # one blob named twice: both copies are the caller's
    memory.close()
    other.close()
    # The sound pack, with a check from another thread that says no: believed.
    memory, missing = mapped_part(packs, check=lambda order, _matches: [False for _ in order])
    assert missing == [0, 1, 2, 3]
    memory.close()
    memory, missing = mapped_part(packs, (MIB, MIB), (SHAS[1], SHAS[1]))
    assert missing == [] and memory[:] == PIECES[1] * 2
    memory.close()


def test_nothing_is_mapped_for_chunks_no_pack_lays_out_at_that_size(packs: PackSet) -> None:
    assert map_part(packs, (), ()) is None
    assert map_part(packs, (MIB,), (b"\x01" * 20,)) is None  # in no pack
    assert map_part(packs, (8000,), (SHAS[3],)) is None  # too short to be laid out
    assert map_part(packs, (MIB - 1,), (SHAS[0],)) is None  # not the blob's size
    memory, missing = mapped_part(packs, (MIB, MIB), (b"\x01" * 20, SHAS[0]))
    assert missing == [0] and memory[:MIB] == bytes(MIB) and memory[MIB:] == PIECES[0]
    memory.close()


def test_chunks_and_sizes_must_pair_up_and_a_check_must_answer_for_each(
        packs: PackSet) -> None:
    with pytest.raises(ValueError):
        map_part(packs, (MIB,), SHAS[:2])
    with pytest.raises(ValueError):
        map_part(packs, (MIB, MIB), SHAS[:1])
    with pytest.raises(ValueError):
        map_part(packs, (MIB,), SHAS[:1], lambda order, matches: [])


def test_compact_or_moved_entries_are_copied_and_read_right(tmp_path: Path) -> None:
    """Chunk 0 laid out in its own pack; 1 and 2 the same entries moved (added raw after a
    small blob, as a pack rewritten elsewhere has them); 3 written compactly; 4 short."""
    data = random.Random(2).randbytes(4 * MIB + 77)
    pieces = [data[i : i + MIB] for i in range(0, len(data), MIB)]
    sizes = tuple(len(piece) for piece in pieces)
    shas = tuple(object_id(b"blob", piece) for piece in pieces)
    workspace = Workspace.open(tmp_path / "ws", durable=False)
    directory = workspace.objects.pack_dir
    first = write_pack(directory, pieces[:1])
    laid_out = PackBuilder()
    for piece in pieces[1:3]:
        laid_out.add(b"blob", piece, object_id(b"blob", piece))
    moved = PackBuilder()
    moved.add(b"blob", b"small", object_id(b"blob", b"small"))
    for sha, raw in laid_out.raw_entries():
        moved.add_raw(sha, raw)
    moved.write(directory, lambda _path: None)
    write_pack(directory, pieces[3:], aligned=False)
    workspace.objects.packs.refresh()
    packs = workspace.objects.packs
    assert len(packs) == 3
    assert map_part(packs, sizes[1:], shas[1:]) is None  # none of these lines up
    memory, missing = mapped_part(packs, sizes, shas)
    assert missing == [1, 2, 3, 4] and memory[:MIB] == pieces[0]
    assert len(mapped(_address(memory), len(memory), first)) == 18
    memory.close()
    out = read_part(workspace, StoredPart(chunks=shas, sizes=sizes))
    assert isinstance(out, mmap.mmap) and out[:] == data
    address = _address(out)
    assert len(mapped(address, len(out), first)) == 18
    assert all(mapped(address, len(out), path) == [] for path in directory.glob("*.pack")
               if path != first)
    for sha, piece in zip(shas, pieces, strict=True):
        into = bytearray(len(piece))
        workspace.read_blob_into(sha, memoryview(into))
        assert into == piece
    out.close()
    workspace.close()


# -- what the memory is -------------------------------------------------------------------


def test_writes_to_the_memory_never_reach_the_pack(packs: PackSet, pack: Path) -> None:
    before = pack.read_bytes()
    memory, _ = mapped_part(packs)
    memory[:] = b"!" * len(memory)
    memory.flush()
    assert memory[:] == b"!" * len(memory) and pack.read_bytes() == before
    again, _ = mapped_part(packs)
    assert again[: 3 * MIB] == DATA[: 3 * MIB]  # the pages the pack file has, unchanged
    child = os.fork()  # a child the kernel forks writes to its copy: never to the kernel's
    if child == 0:  # pragma: no cover - the child
        again[:] = b"?" * len(again)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert again[: 3 * MIB] == DATA[: 3 * MIB] and pack.read_bytes() == before
    memory.close()
    again.close()


def test_a_pack_deleted_after_it_was_loaded_is_copied_from_its_mapping(
        packs: PackSet, pack: Path) -> None:
    pack.unlink()  # as a repack deletes it: the PackSet still holds its mapping
    memory, missing = mapped_part(packs)
    assert missing == [3] and memory[: 3 * MIB] == DATA[: 3 * MIB]
    assert mapped(_address(memory), len(memory), pack) == []
    memory.close()


@pytest.mark.parametrize("room", [0, 5, 54])
def test_only_as_many_runs_are_mapped_as_there_is_room_for(
        packs: PackSet, pack: Path, monkeypatch: pytest.MonkeyPatch, room: int) -> None:
    monkeypatch.setattr(buffers_module, "_mapping_room", lambda: room)
    memory, missing = mapped_part(packs)
    assert missing == [3] and memory[: 3 * MIB] == DATA[: 3 * MIB]  # the rest copied
    assert mapped(_address(memory), len(memory), pack) == expected_maps(packs, [0, 1, 2])[:room]
    memory.close()


def test_a_mapping_that_fails_is_copied_instead(packs: PackSet, pack: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers_module, "_map_fixed", lambda *args: False)
    memory, missing = mapped_part(packs)
    assert missing == [3] and memory[: 3 * MIB] == DATA[: 3 * MIB]
    assert mapped(_address(memory), len(memory), pack) == []
    memory.close()


def test_the_room_is_a_quarter_of_the_allowed_mappings_less_those_held(
        packs: PackSet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    limit = int(Path("/proc/sys/vm/max_map_count").read_text())
    held = len(Path("/proc/self/maps").read_text().splitlines())
    room = buffers_module._mapping_room()
    assert 0 < room <= limit // 4 and abs(room - (limit // 4 - held)) <= 4
    memory, _ = mapped_part(packs)
    assert buffers_module._mapping_room() <= room - 50  # each run is a mapping (54)
    memory.close()
    monkeypatch.setattr(buffers_module, "Path", lambda _name: tmp_path / "no such file")
    assert buffers_module._mapping_room() == 0


@pytest.mark.parametrize(("setting", "on"), [
    (None, True), ("on", True), ("yes", True), ("off", False), ("0", False), ("no", False),
    ("false", False), (" Off ", False), ("FALSE", False),
])
def test_the_environment_turns_mapping_off(monkeypatch: pytest.MonkeyPatch, packs: PackSet,
                                           setting: str | None, on: bool) -> None:
    if setting is None:
        monkeypatch.delenv("KERNOS_MAP_BUFFERS", raising=False)
    else:
        monkeypatch.setenv("KERNOS_MAP_BUFFERS", setting)
    assert mapping_enabled() is on
    found = map_part(packs, SIZES, SHAS)
    assert (found is not None) is on
    if found is not None:
        found[0].close()
    monkeypatch.setattr(buffers_module.sys, "platform", "darwin")
    assert mapping_enabled() is False  # mapping at a fixed address needs Linux
    assert map_part(packs, SIZES, SHAS) is None


def test_a_failed_fixed_mapping_puts_zeroed_memory_back(tmp_path: Path) -> None:
    memory = mmap.mmap(-1, 2 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory[:] = b"z" * (2 * PAGE)
    address = _address(memory)
    assert _map_fixed(address, PAGE, -1, 0) is False  # no such file
    assert memory[:] == bytes(PAGE) + b"z" * PAGE
    path = tmp_path / "data"
    path.write_bytes(b"q" * PAGE + b"r" * PAGE)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _map_fixed(address + PAGE, PAGE, fd, PAGE) is True
    finally:
        os.close(fd)
    assert memory[:] == bytes(PAGE) + b"r" * PAGE
    assert mapped(address, 2 * PAGE, path) == [(PAGE, 2 * PAGE, PAGE)]
    memory[PAGE : PAGE + 1] = b"!"  # private: the file does not change
    assert path.read_bytes() == b"q" * PAGE + b"r" * PAGE
    memory.close()


def test_memory_that_cannot_be_put_back_after_a_failed_mapping_is_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []

    def refusing(*args: int) -> int:
        calls.append(args)
        return 0  # neither the file's pages nor zeroed memory went where they were asked

    monkeypatch.setattr(buffers_module, "_mmap_function", lambda: refusing)
    with pytest.raises(MemoryError) as failed:
        _map_fixed(0x7F0000000000, PAGE, 3, 0)
    assert str(failed.value) == (
        "could not restore memory at 0x7f0000000000 after a failed mapping")
    assert len(calls) == 2 and calls[1][0] == 0x7F0000000000
    assert calls[1][3] & mmap.MAP_ANONYMOUS and calls[1][4:] == (-1, 0)  # no file this time


# -- a whole restore ----------------------------------------------------------------------


def opened(path: Path) -> tuple[Workspace, Image, dict[str, object]]:
    workspace = Workspace.open(path, durable=False)
    module = types.ModuleType("__main__")
    image = Image(workspace, module.__dict__, module=module)
    assert image.restore().failed == {}
    return workspace, image, module.__dict__


def run(image: Image, ns: dict[str, object], source: str) -> None:
    op = image.begin(source=source)
    exec(source, ns)
    op.commit()


def chunks_from_packs(workspace: Workspace, array: np.ndarray) -> list[bool]:
    """For each 1 MiB chunk of ``array``'s memory, whether a pack file backs all of it."""
    address, size = array.ctypes.data, array.nbytes
    backed = [0] * -(-size // MIB)
    for pack in workspace.objects.pack_dir.glob("*.pack"):
        for start, end, _ in mapped(address, size, pack):
            for index in range(start // MIB, -(-end // MIB)):
                backed[index] += min(end, (index + 1) * MIB) - max(start, index * MIB)
    return [mapped_bytes == min(MIB, size - index * MIB)
            for index, mapped_bytes in enumerate(backed)]


def test_a_restored_array_is_mapped_and_an_edited_chunk_copied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ws"
    workspace, image, ns = opened(path)
    run(image, ns, "import numpy as np\n"
                   "big = np.random.default_rng(7).random(5 * 131072 + 1000)\nsmall = 1")
    expected = np.array(ns["big"], copy=True)
    workspace.close()

    workspace, image, ns = opened(path)
    big = ns["big"]
    assert isinstance(big, np.ndarray) and np.array_equal(big, expected)
    assert chunks_from_packs(workspace, big) == [True] * 5 + [False]  # the tail: 8000 bytes
    run(image, ns, "big[3] = 42.0")  # in place: chunk 0 is rewritten, compactly
    expected[3] = 42.0
    workspace.close()
    del big

    workspace, image, ns = opened(path)
    big = ns["big"]
    assert isinstance(big, np.ndarray) and np.array_equal(big, expected)
    assert chunks_from_packs(workspace, big) == [False] + [True] * 4 + [False]
    big[:] = -1.0  # copy on write: the next restore still has the committed values
    workspace.close()
    del big, ns
    monkeypatch.setenv("KERNOS_MAP_BUFFERS", "off")
    workspace, image, ns = opened(path)
    big = ns["big"]
    assert isinstance(big, np.ndarray) and np.array_equal(big, expected)
    assert chunks_from_packs(workspace, big) == [False] * 6  # all copied
    workspace.close()


# -- the buffer cache of older releases, and packs left where they are -------------------


def test_a_writable_open_deletes_the_old_buffer_cache_and_a_reader_leaves_it(
        tmp_path: Path) -> None:
    path = tmp_path / "ws"
    Workspace.open(path, durable=False).close()
    legacy = path / "buffers"
    legacy.write_bytes(b"KBC1" + bytes(PAGE))
    with Workspace.open(path, writable=False) as reader:
        assert reader.lock is None and legacy.exists()  # a reader changes nothing
    assert legacy.read_bytes() == b"KBC1" + bytes(PAGE)
    with Workspace.open(path, durable=False):
        assert not legacy.exists()
    with Workspace.open(path, durable=False):  # and nothing to delete is fine
        assert not legacy.exists()


def commit_blob(store: ObjectStore, data: bytes) -> Path:
    """One batch of one blob, as a pack; its path."""
    before = set(store.pack_dir.glob("*.pack"))
    store.begin()
    sha = object_id(b"blob", data)
    store.write(b"blob", data, sha)
    store.seal(sha)
    store.finish()  # which calls maintain()
    [pack] = set(store.pack_dir.glob("*.pack")) - before
    return pack


def test_the_background_repack_keeps_big_packs_and_does_not_count_them(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects_module, "KEEP_PACK_BYTES", MIB)
    monkeypatch.setattr(objects_module, "REPACK_PACKS", 3)
    started: list[list[str]] = []

    class Done:
        def poll(self) -> int:
            return 0

    def start(git_dir: Path, command: list[str]) -> Done:
        started.append(list(command))
        return Done()

    monkeypatch.setattr(repack_module, "start", start)
    store = ObjectStore(repo, journal=tmp_path / "pending", scratch=tmp_path / "scratch",
                        durable=False)
    big = [commit_blob(store, PIECES[0]), commit_blob(store, PIECES[1][: MIB // 2])]
    assert [path.stat().st_size >= MIB for path in big] == [True, False]
    commit_blob(store, b"one")
    assert started == [] and store.maintain() is False  # 3 packs, 1 kept: 2 counted
    commit_blob(store, b"two")  # 3 counted: the threshold
    [command] = started
    assert command[-2:] == ["--geometric=2", f"--keep-pack={big[0].name}"]
    assert command[:-1] == [*objects_module._NICE, "git", *objects_module.GIT_FSYNC,
                            f"--git-dir={repo}", "repack", "-d", "-q", "--geometric=2"]
    store.close()


def test_a_real_repack_leaves_the_big_pack_mapped(repo: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects_module, "KEEP_PACK_BYTES", MIB)
    monkeypatch.setattr(objects_module, "REPACK_PACKS", 2)
    store = ObjectStore(repo, journal=tmp_path / "pending", scratch=tmp_path / "scratch",
                        durable=False)
    big = commit_blob(store, PIECES[0])
    small = [commit_blob(store, b"one"), commit_blob(store, b"two"),
             commit_blob(store, b"three")]
    store.wait_for_maintenance(60)
    left = set(store.pack_dir.glob("*.pack"))
    assert big in left and not set(small) <= left  # the small ones were merged
    subprocess.run(["git", f"--git-dir={repo}", "fsck", "--no-dangling"], check=True,
                   capture_output=True)
    memory, missing = mapped_part(store.packs, (MIB,), SHAS[:1])
    assert missing == [] and memory[:] == PIECES[0]
    assert len(mapped(_address(memory), MIB, big)) == 18
    memory.close()
    for data in (b"one", b"two", b"three"):
        assert store.read(object_id(b"blob", data)) == (b"blob", data)
    store.close()
