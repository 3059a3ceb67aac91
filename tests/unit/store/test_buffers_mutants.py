"""The buffer cache's file, its mappings and its failures, pinned exactly.

These close gaps mutation testing (``scripts/mutation store.buffers``) found:
the byte layout of an entry (its header page, then the chunk), what
``map_part`` maps and what it leaves to the caller (chunks not cached, of
another size, not on a page boundary, or whose bytes differ from their
digest, which are then never mapped again), how a failed fixed mapping is
undone, how a reader follows the writer's file (new entries, a deletion, a
new file), which damage makes the writer start a new file and which does not,
the switch in the environment, and the refusals and the short write that
turns the cache off.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import xxhash

from disk_support import descriptors_of
from kernos.store import buffers as buffers_module
from kernos.store.buffers import PAGE, BufferCache, _address, _map_fixed, cache_enabled

A, B, C = b"\xaa" * 20, b"\xbb" * 20, b"\xcc" * 20


def chunk(letter: bytes, pages: int) -> bytes:
    return letter * (pages * PAGE)


def entry(sha: bytes, data: bytes) -> bytes:
    """An entry as the module's docstring lays it out, built by hand."""
    fields = b"KBC1" + sha + struct.pack("<Q", len(data)) + xxhash.xxh3_128_digest(data)
    return (fields + struct.pack("<I", zlib.crc32(fields))).ljust(PAGE, b"\0") + data


def cache(path: Path, *, writable: bool = True) -> BufferCache:
    return BufferCache(path, writable=writable, enabled=True)




def test_an_entry_is_a_header_page_then_the_chunk(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    writer = cache(path)
    old = os.umask(0o022)
    try:
        writer.add(A, memoryview(chunk(b"a", 2)))
    finally:
        os.umask(old)
    writer.add(B, memoryview(chunk(b"b", 1)))
    writer.add(A, memoryview(chunk(b"a", 2)))  # there already: not again
    assert path.read_bytes() == entry(A, chunk(b"a", 2)) + entry(B, chunk(b"b", 1))
    assert path.stat().st_mode & 0o777 == 0o600  # it holds the workspace's bytes
    assert writer.entries() == {A: 2 * PAGE, B: PAGE}
    assert writer.size == 5 * PAGE
    writer.close()


def test_a_restore_maps_what_is_cached_and_leaves_the_rest_to_copy(tmp_path: Path) -> None:
    writer = cache(tmp_path / "buffers")
    writer.add(A, memoryview(chunk(b"a", 2)))
    writer.add(B, memoryview(chunk(b"b", 1)))
    seen: list[list[int]] = []

    def check(order: Iterable[int], matches: Callable[[int], bool]) -> list[bool]:
        indexes = list(order)
        seen.append(indexes)
        return [matches(index) for index in indexes]

    found = writer.map_part((PAGE, 2 * PAGE, PAGE, PAGE), (C, A, B, C), check)
    assert found is not None
    memory, missing = found
    assert missing == [0, 3] and seen == [[1, 2]]
    assert len(memory) == 5 * PAGE
    assert memory[:] == bytes(PAGE) + chunk(b"a", 2) + chunk(b"b", 1) + bytes(PAGE)
    memory.close()
    # Without a check of its own, the same, in this thread.
    found = writer.map_part((2 * PAGE, PAGE), (A, B))
    assert found is not None and found[1] == [] and found[0][:] == chunk(b"a", 2) + chunk(b"b", 1)
    found[0].close()
    writer.close()


def test_nothing_is_mapped_when_no_chunk_of_that_size_is_cached(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    writer = cache(path)
    assert writer.map_part((PAGE,), (A,)) is None  # no file yet
    writer.add(A, memoryview(chunk(b"a", 2)))
    assert writer.map_part((PAGE,), (A,)) is None  # cached, but not of this size
    assert writer.map_part((PAGE,), (B,)) is None
    assert writer.map_part((), ()) is None
    assert BufferCache(path, writable=False, enabled=False).map_part((2 * PAGE,), (A,)) is None
    writer.close()


def test_a_chunk_off_a_page_boundary_is_copied_not_mapped(tmp_path: Path) -> None:
    writer = cache(tmp_path / "buffers")
    writer.add(B, memoryview(chunk(b"b", 1)))
    found = writer.map_part((100, PAGE), (C, B))
    assert found is not None
    memory, missing = found
    assert missing == [0, 1] and memory[:] == bytes(100 + PAGE)
    memory.close()
    writer.close()


def test_a_chunk_whose_bytes_differ_is_copied_and_never_mapped_again(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    writer = cache(path)
    writer.add(A, memoryview(chunk(b"a", 1)))
    writer.add(B, memoryview(chunk(b"b", 1)))
    with open(path, "r+b") as handle:  # one byte of A's chunk, by hand
        handle.seek(PAGE + 7)
        handle.write(b"!")
    found = writer.map_part((PAGE, PAGE), (A, B))
    assert found is not None and found[1] == [0] and found[0][PAGE:] == chunk(b"b", 1)
    found[0].close()
    assert writer.entries() == {B: PAGE}
    found = writer.map_part((PAGE, PAGE), (A, B))
    assert found is not None and found[1] == [0] and found[0][:PAGE] == bytes(PAGE)
    found[0].close()
    # A check that rejects B (another thread's verdict) is believed too.
    found = writer.map_part((PAGE,), (B,), lambda order, matches: [False for _ in order])
    assert found is not None and found[1] == [0]
    found[0].close()
    assert writer.entries() == {}
    writer.close()


def test_a_mapping_that_fails_leaves_the_chunk_to_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = cache(tmp_path / "buffers")
    writer.add(A, memoryview(chunk(b"a", 1)))
    monkeypatch.setattr(buffers_module, "_map_fixed", lambda *args: False)
    found = writer.map_part((PAGE,), (A,))
    assert found is not None and found[1] == [0]
    found[0].close()
    assert writer.entries() == {A: PAGE}  # not damaged: tried again next time
    writer.close()


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
    memory[PAGE:PAGE + 1] = b"!"  # private: the file does not change
    assert path.read_bytes() == b"q" * PAGE + b"r" * PAGE
    memory.close()


def test_a_reader_follows_the_writers_file(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    reader = cache(path, writable=False)
    assert reader.entries() == {} and reader.size == 0
    writer = cache(path)
    writer.add(A, memoryview(chunk(b"a", 1)))
    assert reader.entries() == {A: PAGE} and reader.size == 2 * PAGE
    writer.add(B, memoryview(chunk(b"b", 2)))
    assert reader.entries() == {A: PAGE, B: 2 * PAGE} and reader.size == 5 * PAGE
    found = reader.map_part((2 * PAGE,), (B,))
    assert found is not None and found[1] == [] and found[0][:] == chunk(b"b", 2)
    found[0].close()
    writer.drop()
    assert not path.exists()
    assert reader.entries() == {} and reader.size == 0
    writer.add(C, memoryview(chunk(b"c", 1)))  # a new file: only what it holds
    assert reader.entries() == {C: PAGE} and reader.size == 2 * PAGE
    writer.close()
    reader.close()


def test_a_new_writer_appends_after_what_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    first = cache(path)
    first.add(A, memoryview(chunk(b"a", 1)))
    first.close()
    assert first.entries() == {A: PAGE}  # closed, it reads the file again when asked
    first.close()
    second = cache(path)
    second.add(A, memoryview(chunk(b"a", 1)))  # there: not written twice
    second.add(B, memoryview(chunk(b"b", 1)))
    assert path.read_bytes() == entry(A, chunk(b"a", 1)) + entry(B, chunk(b"b", 1))
    second.close()


def flags_of(fd: int | None) -> int:
    assert fd is not None
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8)
    raise AssertionError("no flags")


def test_a_reader_opens_the_file_read_only_and_no_child_inherits_it(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    writer = cache(path)
    writer.add(A, memoryview(chunk(b"a", 1)))  # creates the file
    reader = cache(path, writable=False)
    assert reader.entries() == {A: PAGE}
    for opened, mode in ((writer, os.O_RDWR), (reader, os.O_RDONLY)):
        flags = flags_of(opened._fd)
        assert flags & os.O_ACCMODE == mode and flags & os.O_CLOEXEC
    writer.close()
    again = cache(path)  # a writer that opens the file it finds
    assert again.entries() == {A: PAGE}
    flags = flags_of(again._fd)
    assert flags & os.O_ACCMODE == os.O_RDWR and flags & os.O_CLOEXEC
    again.close()
    reader.close()


def test_a_cache_that_is_closed_holds_no_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    writer = cache(path)
    writer.add(A, memoryview(chunk(b"a", 1)))
    assert descriptors_of(path) == 1
    writer.close()
    assert descriptors_of(path) == 0 and path.exists()
    writer.drop()
    assert not path.exists()
    writer.drop()  # nothing left to delete: fine


def damaged(sha: bytes, length: int, magic: bytes = b"KBC1") -> bytes:
    """A header whose checksum is right but whose fields are not."""
    fields = magic + sha + struct.pack("<Q", length) + b"\1" * 16
    return (fields + struct.pack("<I", zlib.crc32(fields))).ljust(PAGE, b"\0")


@pytest.mark.parametrize("bad", [
    damaged(B, PAGE, magic=b"KBC2") + chunk(b"b", 1),
    damaged(B, 0) + chunk(b"b", 1),
    damaged(B, PAGE + 1) + chunk(b"b", 2),
    damaged(B, 4 * PAGE) + chunk(b"b", 1),  # its chunk past the end of the file
], ids=["magic", "empty", "partial-page", "past-the-end"])
def test_damage_ends_the_entries_and_the_writer_starts_a_new_file(tmp_path: Path,
                                                                   bad: bytes) -> None:
    path = tmp_path / "buffers"
    path.write_bytes(entry(A, chunk(b"a", 1)) + bad + entry(C, chunk(b"c", 1)))
    reader = cache(path, writable=False)
    assert reader.entries() == {A: PAGE} and reader.size == 2 * PAGE
    assert path.exists()  # a reader never deletes
    reader.close()
    writer = cache(path)
    assert writer.entries() == {} and not path.exists()
    writer.close()


def test_a_header_page_torn_from_its_chunk_at_the_end_starts_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    path.write_bytes(entry(A, chunk(b"a", 1)) + entry(B, chunk(b"b", 1))[:PAGE])
    reader = cache(path, writable=False)
    assert reader.entries() == {A: PAGE} and path.exists()
    reader.close()
    writer = cache(path)
    assert writer.entries() == {} and not path.exists()
    writer.close()


def test_a_torn_last_page_is_written_over_not_taken_for_damage(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    path.write_bytes(entry(A, chunk(b"a", 1)) + b"KBC1 torn")
    writer = cache(path)
    assert writer.entries() == {A: PAGE} and writer.size == 2 * PAGE and path.exists()
    writer.add(B, memoryview(chunk(b"b", 1)))
    assert path.read_bytes() == entry(A, chunk(b"a", 1)) + entry(B, chunk(b"b", 1))
    writer.close()


@pytest.mark.parametrize(("setting", "on"), [
    (None, True), ("on", True), ("yes", True), ("off", False), ("0", False), ("no", False),
    ("false", False), (" Off ", False), ("FALSE", False),
])
def test_the_environment_turns_the_cache_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             setting: str | None, on: bool) -> None:
    if setting is None:
        monkeypatch.delenv("KERNOS_BUFFER_CACHE", raising=False)
    else:
        monkeypatch.setenv("KERNOS_BUFFER_CACHE", setting)
    assert cache_enabled() is on
    assert BufferCache(tmp_path / "buffers", writable=True).enabled is on
    assert BufferCache(tmp_path / "buffers", writable=True, enabled=not on).enabled is not on
    monkeypatch.setattr(buffers_module.sys, "platform", "darwin")
    assert cache_enabled() is False  # mapping at a fixed address needs Linux


def test_only_a_writer_with_the_cache_on_accepts_chunks(tmp_path: Path) -> None:
    path = tmp_path / "buffers"
    assert BufferCache(path, writable=True, enabled=True).accepting is True
    assert BufferCache(path, writable=False, enabled=True).accepting is False
    off = BufferCache(path, writable=True, enabled=False)
    assert off.accepting is False
    off.add(A, memoryview(chunk(b"a", 1)))
    assert not path.exists() and off.entries() == {} and off.size == 0
    with pytest.raises(PermissionError) as refused:
        BufferCache(path, writable=False, enabled=False).add(A, memoryview(chunk(b"a", 1)))
    assert str(refused.value) == f"{path} is not writable by this process"
    writer = cache(path)
    for size in (0, PAGE - 1, PAGE + 1):
        with pytest.raises(ValueError) as wrong:
            writer.add(A, memoryview(bytes(size)))
        assert str(wrong.value) == (f"a cached chunk is a whole number of {PAGE}-byte pages, "
                                    f"not {size} bytes")
    assert not path.exists()


def test_a_short_write_deletes_the_file_and_turns_the_cache_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "buffers"
    writer = cache(path)
    writer.add(A, memoryview(chunk(b"a", 1)))
    assert writer.off_because is None and writer.enabled is True
    real = os.pwritev

    def short(fd: int, buffers: list[bytes], offset: int) -> int:
        return real(fd, buffers[:1], offset)  # the header only: the disk took no more

    monkeypatch.setattr(buffers_module.os, "pwritev", short)
    writer.add(B, memoryview(chunk(b"b", 2)))
    assert not path.exists() and writer.enabled is False and writer.accepting is False
    assert writer.off_because == (f"writing {path} failed: a short write ({PAGE} of "
                                  f"{3 * PAGE} bytes)")
    monkeypatch.undo()
    writer.add(C, memoryview(chunk(b"c", 1)))  # off: nothing more is written
    assert not path.exists() and writer.entries() == {} and writer.size == 0
    assert writer.map_part((PAGE,), (A,)) is None


def test_a_failed_write_says_why_the_cache_is_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "buffers"
    writer = cache(path)

    def full(*_args: object) -> int:
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(buffers_module.os, "pwritev", full)
    writer.add(A, memoryview(chunk(b"a", 1)))
    assert writer.off_because == (f"writing {path} failed: [Errno {errno.EDQUOT}] "
                                  "Disk quota exceeded")
    assert not path.exists() and not writer.enabled


def test_chunks_and_their_sizes_must_pair_up(tmp_path: Path) -> None:
    writer = cache(tmp_path / "buffers")
    writer.add(A, memoryview(chunk(b"a", 1)))
    with pytest.raises(ValueError):
        writer.map_part((PAGE,), (A, B))
    with pytest.raises(ValueError):
        writer.map_part((PAGE, PAGE), (A,))
    with pytest.raises(ValueError):  # a check must answer for every chunk it was given
        writer.map_part((PAGE,), (A,), lambda order, matches: [])
    writer.close()


def test_a_damaged_chunk_the_buffer_holds_twice_is_copied_twice(tmp_path: Path) -> None:
    """Identical chunks (zeros, say) are one blob: a buffer may name it more than once."""
    path = tmp_path / "buffers"
    writer = cache(path)
    writer.add(A, memoryview(chunk(b"a", 1)))
    found = writer.map_part((PAGE, PAGE), (A, A))
    assert found is not None and found[1] == [] and found[0][:] == chunk(b"a", 2)
    found[0].close()
    with open(path, "r+b") as handle:
        handle.seek(PAGE)
        handle.write(b"!")
    found = writer.map_part((PAGE, PAGE), (A, A))
    assert found is not None and found[1] == [0, 1]
    found[0].close()
    assert writer.entries() == {}
    writer.close()


def test_the_memory_is_private_to_this_process(tmp_path: Path) -> None:
    """A child the kernel forks may write to its copy of a buffer: never to the kernel's."""
    writer = cache(tmp_path / "buffers")
    writer.add(A, memoryview(chunk(b"a", 1)))
    found = writer.map_part((PAGE, PAGE), (A, B))
    assert found is not None and found[1] == [1]
    memory = found[0]
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        memory[:] = b"!" * (2 * PAGE)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert memory[:] == chunk(b"a", 1) + bytes(PAGE)
    memory.close()
    writer.close()


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
