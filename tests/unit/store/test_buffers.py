"""The buffer cache (``kernos.store.buffers``): commits and restores keep a raw copy of
big buffers' chunks, restores map it, check every mapped chunk, and fall back to git for
anything missing or wrong."""

from __future__ import annotations

import errno
import types
from pathlib import Path

import numpy as np
import pytest

from kernos import Image, Workspace
from kernos.store import buffers as buffers_module
from kernos.store.buffers import PAGE, BufferCache
from kernos.store.snapshots import CHUNK_BYTES

MB = 1 << 20


def opened(path: Path) -> tuple[Workspace, Image, dict[str, object]]:
    workspace = Workspace.open(path)
    module = types.ModuleType("__main__")
    image = Image(workspace, module.__dict__, module=module)
    return workspace, image, module.__dict__


def run(image: Image, ns: dict[str, object], source: str) -> None:
    op = image.begin(source=source)
    exec(source, ns)
    op.commit()


def build(path: Path) -> np.ndarray:
    """A workspace whose head holds a 5 MiB array and 8000 bytes (five whole chunks and a part)."""
    workspace, image, ns = opened(path)
    image.restore()
    run(image, ns, "import numpy as np\n"
                   "big = np.random.default_rng(7).random(5 * 131072 + 1000)\nsmall = 1")
    expected = np.array(ns["big"], copy=True)
    workspace.close()
    return expected


def maps_of_this_process(path: Path) -> int:
    """How many mappings of ``path`` this process holds."""
    return sum(1 for line in Path("/proc/self/maps").read_text().splitlines()
               if line.endswith(str(path)))


def test_a_restore_maps_the_cached_chunks_and_gets_the_same_values(tmp_path: Path) -> None:
    expected = build(tmp_path / "ws")
    cache_file = tmp_path / "ws" / "buffers"
    assert cache_file.stat().st_size == 5 * (PAGE + CHUNK_BYTES)  # the whole chunks only

    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    big = ns["big"]
    assert isinstance(big, np.ndarray) and np.array_equal(big, expected)
    assert maps_of_this_process(cache_file) >= 1
    # Copy on write: the program's writes change neither the file nor the next restore.
    before = cache_file.read_bytes()
    big[:] = -1.0
    assert cache_file.read_bytes() == before
    workspace.close()
    del big, ns
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    assert np.array_equal(ns["big"], expected)  # type: ignore[arg-type]
    workspace.close()


def test_a_commit_adds_the_chunks_it_writes(tmp_path: Path) -> None:
    build(tmp_path / "ws")
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    held = workspace.buffers.entries()
    run(image, ns, "big[3] = 42.0\nbig[-1] = 43.0")  # the first chunk changes, and the tail
    added = set(workspace.buffers.entries()) - set(held)
    assert len(added) == 1  # the new first chunk; the tail is not a whole number of pages
    expected = np.array(ns["big"], copy=True)
    workspace.close()

    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    assert np.array_equal(ns["big"], expected)  # type: ignore[arg-type]
    assert float(ns["big"][3]) == 42.0  # type: ignore[index]
    workspace.close()


def test_a_restore_without_a_cache_copies_from_git_and_leaves_one(tmp_path: Path) -> None:
    expected = build(tmp_path / "ws")
    cache_file = tmp_path / "ws" / "buffers"
    full = cache_file.read_bytes()
    cache_file.unlink()
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    assert np.array_equal(ns["big"], expected)  # type: ignore[arg-type]
    assert maps_of_this_process(cache_file) == 0
    assert len(workspace.buffers.entries()) == 5 and len(cache_file.read_bytes()) == len(full)
    workspace.close()


def test_a_damaged_chunk_in_the_cache_is_read_from_git_instead(tmp_path: Path) -> None:
    expected = build(tmp_path / "ws")
    cache_file = tmp_path / "ws" / "buffers"
    with open(cache_file, "r+b") as handle:  # a byte of the second chunk's data
        handle.seek(2 * PAGE + CHUNK_BYTES + 1000)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))

    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    assert np.array_equal(ns["big"], expected)  # type: ignore[arg-type]
    workspace.close()


def test_a_torn_entry_is_ignored_and_the_writer_starts_a_new_file(tmp_path: Path) -> None:
    build(tmp_path / "ws")
    cache_file = tmp_path / "ws" / "buffers"
    whole = cache_file.read_bytes()
    # A header whose fields look right but whose checksum does not match them, and data.
    torn = (b"KBC1" + b"\x01" * 20 + PAGE.to_bytes(8, "little") + b"\x02" * 16 + b"\0" * 4)
    cache_file.write_bytes(whole[: 2 * (PAGE + CHUNK_BYTES)] + torn.ljust(PAGE, b"\0")
                           + b"x" * PAGE)

    reader = BufferCache(cache_file, writable=False, enabled=True)
    assert len(reader.entries()) == 2 and cache_file.exists()  # readers never delete
    reader.close()
    writer = BufferCache(cache_file, writable=True, enabled=True)
    assert writer.entries() == {} and not cache_file.exists()
    writer.close()


def test_add_refuses_partial_pages_and_readers(tmp_path: Path) -> None:
    writer = BufferCache(tmp_path / "buffers", writable=True, enabled=True)
    with pytest.raises(ValueError, match="whole number"):
        writer.add(b"\1" * 20, memoryview(bytes(PAGE + 1)))
    reader = BufferCache(tmp_path / "buffers", writable=False, enabled=True)
    with pytest.raises(PermissionError):
        reader.add(b"\1" * 20, memoryview(bytes(PAGE)))
    writer.add(b"\1" * 20, memoryview(b"x" * PAGE))
    assert reader.entries() == {b"\1" * 20: PAGE}  # a reader follows what the writer adds


def test_a_restore_rebuilds_a_cache_that_holds_too_much_the_head_no_longer_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kernos.store.snapshots.CACHE_SLACK_BYTES", 0)
    build(tmp_path / "ws")
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    for value in range(12):  # each edit leaves one chunk the head no longer needs
        run(image, ns, f"big[{value % 5 * 131072}] = {value}.5")
    assert len(workspace.buffers.entries()) == 5 + 12
    expected = np.array(ns["big"], copy=True)
    workspace.close()
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    assert np.array_equal(ns["big"], expected)  # type: ignore[arg-type]
    assert len(workspace.buffers.entries()) == 5  # only what the head needs, refilled
    workspace.close()


def test_a_full_disk_turns_the_cache_off_and_fails_no_op(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = build(tmp_path / "ws")
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()

    def full(*_args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(buffers_module.os, "pwritev", full)
    run(image, ns, "big[0] = 1.5\nsmall = 2")
    assert not (tmp_path / "ws" / "buffers").exists() and not workspace.buffers.enabled
    assert "No space left" in (workspace.buffers.off_because or "")
    expected[0] = 1.5
    run(image, ns, "small = 3")  # ops go on
    workspace.close()
    monkeypatch.undo()
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    assert np.array_equal(ns["big"], expected) and ns["small"] == 3  # type: ignore[arg-type]
    workspace.close()


def test_turned_off_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNOS_BUFFER_CACHE", "off")
    expected = build(tmp_path / "ws")
    assert not (tmp_path / "ws" / "buffers").exists()
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    assert np.array_equal(ns["big"], expected)  # type: ignore[arg-type]
    workspace.close()
