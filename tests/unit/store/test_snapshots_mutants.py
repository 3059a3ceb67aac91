"""The snapshot format pinned: trees, indexes, chunks, the chunk cache and reading back.

These close gaps mutation testing (scripts/mutation store.snapshots) found:
the other tests go through whole ops, so nothing pinned the exact layout of a
group's tree and index (buffers, segments, unpersisted values, code refs),
the root tree and commit, where chunks are cut (1 MiB offsets, content cuts
from 64 KiB, an empty value as one empty chunk), which chunks the cache is
asked about (none under 4 KiB) and when it learns new ones (at publish, not
before, not after a discard), which chunks are laid out page-aligned in the
packs (big ones, not content-cut ones, not the pieces an op rewrote in place),
what ``read_part`` returns (bytes, writable or read-only memory, mapped from the
packs or copied, by one thread or two) and reports as it goes, and the message
of every refusal to read a damaged snapshot.
"""

from __future__ import annotations

import array
import dataclasses
import json
import mmap
import random
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernos.errors import WorkspaceCorrupt
from kernos.serialize.pickler import Pickled
from kernos.serialize.unpersistable import Transient
from kernos.store import snapshots
from kernos.store.buffers import PAGE, _address
from kernos.store.objects import (
    BLOB_MODE,
    TREE_MODE,
    CommitData,
    TreeEntry,
    decode_tree,
    encode_commit,
    encode_tree,
    object_id,
)
from kernos.store.packs import PackBuilder
from kernos.store.snapshots import (
    ChunkCache,
    SnapshotWriter,
    StoredPart,
    chunk_ids,
    commit_message,
    group_key,
    read_group,
    read_part,
    read_snapshot,
)
from kernos.store.workspace import Workspace

MIB = 1 << 20


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    """Without fsyncs (durability is the business of tests/unit/store/test_sync_order.py)."""
    opened = Workspace.open(tmp_path / "ws", durable=False)
    yield opened
    opened.close()


def tree(workspace: Workspace, sha: bytes) -> dict[str, tuple[bytes, bytes]]:
    """A tree's entries: name -> (mode, id)."""
    kind, data = workspace.read_object(sha)
    assert kind == b"tree"
    return {entry.name: (entry.mode, entry.sha) for entry in decode_tree(data)}


def blob(workspace: Workspace, sha: bytes) -> bytes:
    kind, data = workspace.read_object(sha)
    assert kind == b"blob"
    return data


def pickled(stream: bytes, buffers: list[memoryview] | None = None, **fields: object) -> Pickled:
    return Pickled(stream=stream, buffers=buffers or [], transients=[],
                   code_refs=frozenset(), **fields)  # type: ignore[arg-type]


def test_a_group_is_keyed_by_its_smallest_member_escaped_for_git() -> None:
    assert group_key(["zeta", "a/b", "m"]) == "a%2Fb"
    assert group_key(["été"]) == "%C3%A9t%C3%A9"
    assert group_key([""]) == "%00"


def test_the_chunk_cache_forgets_the_least_recently_used_first() -> None:
    cache = ChunkCache(capacity=2)
    one, two, three = cache.digest(b"one"), cache.digest(b"two"), cache.digest(b"three")
    assert len(one) == 16 and one != two
    assert ChunkCache().digest(b"one") != one  # keyed per cache: no precomputed collisions
    assert cache.get(one) is None
    cache.update([(one, b"1"), (two, b"2")])
    assert cache.get(one) == b"1"  # now the most recently used
    cache.update([(three, b"3")])
    assert (cache.get(one), cache.get(two), cache.get(three)) == (b"1", None, b"3")
    cache.update([(one, b"1")])  # known already: becomes the most recent, nothing grows
    cache.update([(two, b"2")])
    assert (cache.get(one), cache.get(two), cache.get(three)) == (b"1", b"2", None)
    cache.clear()
    assert cache.get(one) is None and cache.get(two) is None


def test_blobs_under_4_kib_bypass_the_cache_and_new_chunks_are_hashed_once(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ChunkCache()
    small, large = b"s" * 4095, b"L" * 4096
    cache.update([(cache.digest(small), b"\x01" * 20), (cache.digest(large), b"\x02" * 20)])
    hashed: list[int] = []
    real_object_id = snapshots.object_id

    def counting(kind: bytes, data: bytes | memoryview) -> bytes:
        hashed.append(len(data))
        return real_object_id(kind, data)

    monkeypatch.setattr(snapshots, "object_id", counting)

    def stored(data: bytes) -> int:
        """What an object takes in a pack, the measure of ``bytes_written``."""
        return PackBuilder().add(b"blob", data, object_id(b"blob", data))

    with SnapshotWriter(workspace, cache) as writer:
        assert writer.bytes_written == 0
        assert writer.blob(small) == object_id(b"blob", small)  # not looked up
        assert writer.blob(large) == b"\x02" * 20  # known: trusted, not hashed or written
        assert hashed == [4095] and writer.bytes_written == stored(small)
        new = b"N" * 5000
        assert writer.blob(new) == object_id(b"blob", new)
        assert writer.blob(new) == object_id(b"blob", new)  # the second time from the batch
        assert hashed == [4095, 5000] and writer.bytes_written == stored(small) + stored(new)
        workspace.objects.discard()


def test_parts_are_cut_at_1_mib_and_streams_from_64_kib_by_content(
        workspace: Workspace) -> None:
    rng = random.Random(1)
    cache = ChunkCache()
    with SnapshotWriter(workspace, cache) as writer:
        empty = writer.part(b"")
        assert empty == StoredPart(chunks=(object_id(b"blob", b""),), sizes=(0,))
        data = rng.randbytes(2 * MIB + 5)
        fixed = writer.part(data, readonly=True)
        assert fixed.sizes == (MIB, MIB, 5) and fixed.readonly and not fixed.by_content
        assert fixed.chunks == tuple(object_id(b"blob", data[start : start + MIB])
                                     for start in (0, MIB, 2 * MIB))
        assert fixed.size == 2 * MIB + 5
        assert writer.part(data, stream=False).sizes == (MIB, MIB, 5)
        values = array.array("d", range(1000))  # a buffer of 8-byte items: sized in bytes
        assert writer.part(memoryview(values)).sizes == (8000,)
        short = rng.randbytes(64 * 1024 - 1)
        assert writer.part(short, stream=True) == StoredPart(
            chunks=(object_id(b"blob", short),), sizes=(len(short),))
        stream = rng.randbytes(64 * 1024) + rng.randbytes(400 * 1024)
        cut = writer.part(stream, stream=True)
        assert cut.by_content and not cut.readonly and cut.size == len(stream)
        assert len(cut.chunks) > 3 and all(8 * 1024 <= size <= 128 * 1024
                                           for size in cut.sizes[:-1])
        assert cut.chunks == chunk_ids(stream, cache, by_content=True)
        # Cut by content: bytes inserted at the front change the first chunks only.
        again = writer.part(b"inserted" + stream, stream=True)
        assert again.chunks[-3:] == cut.chunks[-3:] and again.chunks[0] != cut.chunks[0]
        exactly = writer.part(stream[: 64 * 1024], stream=True)
        assert exactly.by_content
        workspace.objects.discard()


def test_chunk_ids_are_the_ids_part_writes_taking_known_ones_from_the_cache(
        workspace: Workspace) -> None:
    rng = random.Random(2)
    cache = ChunkCache()
    data = rng.randbytes(MIB + 4095)
    with SnapshotWriter(workspace, cache) as writer:
        assert chunk_ids(data, cache) == writer.part(data).chunks
        stream = rng.randbytes(200 * 1024)
        assert len(chunk_ids(stream, cache)) == 1  # fixed offsets unless told otherwise
        assert chunk_ids(stream, cache, by_content=True) == writer.part(stream, stream=True).chunks
        workspace.objects.discard()
    head, tail = data[:MIB], data[MIB:]
    cache.update([(cache.digest(head), b"\x0a" * 20), (cache.digest(tail), b"\x0b" * 20)])
    assert chunk_ids(data, cache) == (b"\x0a" * 20, object_id(b"blob", tail))  # 4095 bytes
    longer = data + b"!"
    cache.update([(cache.digest(longer[MIB:]), b"\x0c" * 20)])
    assert chunk_ids(longer, cache) == (b"\x0a" * 20, b"\x0c" * 20)  # 4096 bytes: looked up


def test_a_group_tree_holds_its_index_stream_and_buffers_under_fixed_names(
        workspace: Workspace) -> None:
    rng = random.Random(3)
    stream = rng.randbytes(100)
    buffers = [memoryview(bytearray(rng.randbytes(MIB + 10))), memoryview(b"small")]
    transient = Transient(name="conn", path="conn", type_name="socket.socket",
                          reason="a socket", obj=object(), lossless=True)
    value = Pickled(stream=stream, buffers=buffers, transients=[transient],
                    code_refs=frozenset({"helper", "alpha"}))
    with SnapshotWriter(workspace, ChunkCache()) as writer:
        group = writer.group(["zz", "conn"], value, op=7)
        workspace.objects.seal(b"\x00" * 20)
    assert group.key == "conn" and group.names == ("zz", "conn")
    assert group.code_refs == frozenset({"helper", "alpha"})
    unpersisted = {"name": "conn", "path": "conn", "type_name": "socket.socket",
                   "reason": "a socket", "lossless": True, "op": 7}
    assert group.unpersisted == (unpersisted,)
    assert group.size == 100 + MIB + 10 + 5
    entries = tree(workspace, group.tree)
    assert sorted(entries) == ["b000.000000", "b000.000001", "b001.000000", "index.json",
                               "s.000000"]
    assert {mode for mode, _ in entries.values()} == {BLOB_MODE}
    assert entries["s.000000"][1] == object_id(b"blob", stream)
    assert entries["b000.000001"][1] == object_id(b"blob", bytes(buffers[0][MIB:]))
    index = blob(workspace, entries["index.json"][1])
    assert json.loads(index) == {
        "names": ["zz", "conn"], "stream": [100],
        "buffers": [{"sizes": [MIB, 10], "readonly": False}, {"sizes": [5], "readonly": True}],
        "code_refs": ["alpha", "helper"], "unpersisted": [unpersisted]}
    assert index.startswith(b'{"buffers":[{"readonly":false,"sizes":[1048576,10]}')  # compact
    back = read_group(workspace, group.key, group.tree)
    assert back == group


def test_a_long_stream_is_marked_cut_by_content_and_read_back_so(workspace: Workspace) -> None:
    stream = random.Random(4).randbytes(300 * 1024)
    with SnapshotWriter(workspace, ChunkCache()) as writer:
        group = writer.group(["big"], pickled(stream), op=None)
        workspace.objects.seal(b"\x00" * 20)
    entries = tree(workspace, group.tree)
    index = json.loads(blob(workspace, entries["index.json"][1]))
    assert index["stream_chunking"] == "fastcdc-32k" and index["stream"] == list(
        group.stream.sizes)
    assert sorted(name for name in entries if name.startswith("s.")) == [
        f"s.{i:06d}" for i in range(len(group.stream.chunks))]
    back = read_group(workspace, "big", group.tree)
    assert back.stream.by_content and back == group


def test_a_value_in_segments_stores_a_tree_per_segment_and_keeps_those_written_before(
        workspace: Workspace) -> None:
    rng = random.Random(5)
    segments = [rng.randbytes(200 * 1024), rng.randbytes(1000)]
    value = pickled(b"head", [memoryview(data) for data in segments],
                    segmented=types.SimpleNamespace(segments=[
                        types.SimpleNamespace(part=None), types.SimpleNamespace(part=None)]))
    with SnapshotWriter(workspace, ChunkCache()) as writer:
        group = writer.group(["memory"], value, op=1)
        workspace.objects.seal(b"\x00" * 20)
    first, second = group.buffers
    assert first.by_content and first.readonly and not second.by_content and second.readonly
    entries = tree(workspace, group.tree)
    assert entries["g000000"] == (TREE_MODE, first.tree)
    assert entries["g000001"] == (TREE_MODE, second.tree)
    assert not [name for name in entries if name.startswith("b")]
    index = json.loads(blob(workspace, entries["index.json"][1]))
    assert index["segments"] == 2 and index["buffers"] == []
    assert second.tree is not None
    segment = tree(workspace, second.tree)
    assert sorted(segment) == ["c.000000", "sizes.json"]
    assert json.loads(blob(workspace, segment["sizes.json"][1])) == {"sizes": [1000]}
    assert first.tree is not None
    long_segment = tree(workspace, first.tree)
    assert json.loads(blob(workspace, long_segment["sizes.json"][1])) == {
        "sizes": list(first.sizes), "chunking": "fastcdc-32k"}
    assert read_group(workspace, "memory", group.tree) == group

    # The next commit: the second segment changed, the first is kept as the last wrote it.
    kept = types.SimpleNamespace(part=first)
    value = pickled(b"head", [memoryview(b"never read"), memoryview(b"changed")],
                    segmented=types.SimpleNamespace(segments=[
                        kept, types.SimpleNamespace(part=None)]))
    with SnapshotWriter(workspace, ChunkCache()) as writer:
        again = writer.group(["memory"], value, op=2)
        workspace.objects.seal(b"\x00" * 20)
    assert again.buffers[0] is first
    assert tree(workspace, again.tree)["g000000"] == (TREE_MODE, first.tree)
    assert read_group(workspace, "memory", again.tree).buffers[1].size == len(b"changed")

    # Several names never share segments: the buffers are stored as buffers.
    with SnapshotWriter(workspace, ChunkCache()) as writer:
        shared = writer.group(["a", "b"], value, op=3)
        workspace.objects.seal(b"\x00" * 20)
    assert sorted(tree(workspace, shared.tree)) == ["b000.000000", "b001.000000", "index.json",
                                                    "s.000000"]


def test_a_commit_is_a_root_tree_of_manifest_namespace_and_source(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots.time, "time", lambda: 1_700_000_000.9)
    with SnapshotWriter(workspace, ChunkCache()) as writer:
        group = writer.group(["x"], pickled(b"value of x"), op=1)
        manifest = {"op": 1, "note": "été", "a": [1, 2]}
        message = commit_message(op=1, principal="alice", kind="cell", headline="x = 1")
        first = writer.commit(groups=[group], manifest=manifest, source="x = 1\n",
                              parent=None, message=message, author="alice <a@kernos.invalid>")
        assert workspace.objects.framed_parent is None  # sealed for the tail, with no parent
        writer.publish(first)
    assert workspace.tail.frames[-1].commit == first
    assert workspace.tail.frames[-1].record == b""  # no audit record given: none copied
    assert message == ("op 1 by alice: x = 1\n\n"
                       "Kernos-Op: 1\nKernos-Principal: alice\nKernos-Kind: cell\n")
    data = workspace.read_commit(first)
    assert (data.parents, data.author, data.timestamp, data.message) == (
        (), "alice <a@kernos.invalid>", 1_700_000_000, message)
    root = tree(workspace, data.tree)
    assert sorted(root) == ["kernos.json", "ns", "source.py"]
    assert root["source.py"] == (BLOB_MODE, object_id(b"blob", b"x = 1\n"))
    assert blob(workspace, root["kernos.json"][1]) == (
        '{"a":[1,2],"note":"été","op":1}'.encode())
    assert tree(workspace, root["ns"][1]) == {"x": (TREE_MODE, group.tree)}
    snapshot = read_snapshot(workspace, first, with_source=True)
    assert snapshot.manifest == manifest and snapshot.source == "x = 1\n"
    assert snapshot.commit == first and snapshot.data == data  # the commit as read
    assert snapshot.group_trees == {"x": group.tree} and snapshot.namespace_tree == root["ns"][1]
    assert read_snapshot(workspace, first).source is None

    # A commit that reuses the namespace as is, with no code.
    with SnapshotWriter(workspace, ChunkCache()) as writer:
        second = writer.commit(namespace_tree=snapshot.namespace_tree, manifest={"op": 2},
                               source=None, parent=first, message="checkout",
                               author="bob <b@kernos.invalid>")
        assert workspace.objects.framed_parent == first
        writer.publish(second)
    assert workspace.head() == second
    data = workspace.read_commit(second)
    assert data.parents == (first,)
    assert sorted(tree(workspace, data.tree)) == ["kernos.json", "ns"]
    again = read_snapshot(workspace, second, with_source=True)
    assert again.source is None and again.group_trees == {"x": group.tree}


def test_the_cache_learns_a_commit_s_chunks_when_it_is_published_not_before(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ChunkCache()
    chunk = b"c" * 10_000
    calls: list[tuple[bytes, tuple[object, ...], bytes]] = []
    real_set_head = workspace.set_head

    def set_head(commit: bytes, *, sync_with: object = (), record: bytes = b"") -> None:
        calls.append((commit, tuple(sync_with), record))  # type: ignore[arg-type]
        real_set_head(commit, sync_with=sync_with, record=record)  # type: ignore[arg-type]

    monkeypatch.setattr(workspace, "set_head", set_head)
    with SnapshotWriter(workspace, cache) as writer:
        group = writer.group(["c"], pickled(chunk), op=1)
        commit = writer.commit(groups=[group], manifest={}, source=None, parent=None,
                               message="m", author="a <a@kernos.invalid>")
        assert cache.get(cache.digest(chunk)) is None
        log = workspace.path / "audit.log"
        log.write_text("")
        writer.publish(commit, sync_with=[log], record=b'{"op":1}')
    assert cache.get(cache.digest(chunk)) == object_id(b"blob", chunk)
    assert calls == [(commit, (log,), b'{"op":1}')]
    assert workspace.tail.frames[-1].record == b'{"op":1}'
    with pytest.raises(RuntimeError, match="outside begin"):  # the batch is finished
        workspace.objects.write(b"blob", b"late", object_id(b"blob", b"late"))


def test_leaving_the_writer_with_an_error_discards_the_batch(workspace: Workspace) -> None:
    cache = ChunkCache()
    with pytest.raises(KeyError), SnapshotWriter(workspace, cache) as writer:
        writer.part(b"d" * 10_000)
        raise KeyError("the op failed")
    with pytest.raises(RuntimeError, match="outside begin"):
        workspace.objects.write(b"blob", b"late", object_id(b"blob", b"late"))
    assert cache.get(cache.digest(b"d" * 10_000)) is None
    with SnapshotWriter(workspace, cache) as writer:
        writer.part(b"e" * 10_000)
    workspace.objects.write(b"blob", b"late", object_id(b"blob", b"late"))  # still open
    workspace.objects.discard()


def write_part(workspace: Workspace, data: bytes | bytearray, **options: object) -> StoredPart:
    with SnapshotWriter(workspace, ChunkCache()) as writer:
        part = writer.part(data, **options)  # type: ignore[arg-type]
        workspace.objects.seal(b"\x00" * 20)
        workspace.objects.finish()
    return part


def laid_out(workspace: Workspace, part: StoredPart) -> list[bool]:
    """Which of a part's chunks a pack holds laid out page-aligned (for restores to map)."""
    located = [workspace.objects.packs.locate(sha) for sha in part.chunks]
    return [found is not None and found[0].runs(found[1], size) is not None
            for found, size in zip(located, part.sizes, strict=True)]


def mapped_chunks(workspace: Workspace, out: object, part: StoredPart) -> list[bool]:
    """For each chunk of ``part`` in ``out``, whether a pack file backs all its memory."""
    assert isinstance(out, mmap.mmap)
    packs = {str(path) for path in workspace.objects.pack_dir.glob("*.pack")}
    backed = [0] * len(part.chunks)
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] in packs:
            start, end = (int(bound, 16) - _address(out) for bound in fields[0].split("-"))
            for index, size in enumerate(part.sizes):
                at = sum(part.sizes[:index])
                backed[index] += max(0, min(end, at + size) - max(start, at))
    return [done == size for done, size in zip(backed, part.sizes, strict=True)]


def test_big_chunks_are_laid_out_page_aligned_unless_rewritten_in_place(
        workspace: Workspace) -> None:
    rng = random.Random(6)
    data = rng.randbytes(2 * MIB + 5)
    big = write_part(workspace, data)
    assert laid_out(workspace, big) == [True, True, False]  # 5 bytes: too short to be
    assert write_part(workspace, data) == big  # the same bytes, the same part
    exactly = write_part(workspace, rng.randbytes(MIB))
    smaller = write_part(workspace, rng.randbytes(MIB - PAGE))  # too small to map, but laid
    assert laid_out(workspace, exactly) == laid_out(workspace, smaller) == [True]  # out
    # Cut by content: chunks of at most 128 KiB, never laid out; zeros compress.
    cut = write_part(workspace, rng.randbytes(2 * MIB), stream=True)
    assert cut.by_content and not any(laid_out(workspace, cut))
    zeros = write_part(workspace, bytes(2 * MIB), stream=True)
    assert zeros.by_content and zeros.sizes[0] == 128 * 1024 and len(zeros.chunks) == 16
    assert not any(laid_out(workspace, zeros)) and not any(laid_out(workspace, write_part(
        workspace, bytes(2 * MIB))))
    # A piece rewritten through ``known`` is stored compactly; the others are kept as they
    # are, laid out.  A part of another size is written whole, laid out again.
    edited = bytearray(data)
    edited[MIB + 3] ^= 0xFF
    again = write_part(workspace, edited, known=(big, frozenset({1})))
    assert again.chunks[0] == big.chunks[0] and again.chunks[2] == big.chunks[2]
    assert again.chunks[1] != big.chunks[1] and laid_out(workspace, again) == [True, False, False]
    edited[3] ^= 0xFF
    longer = write_part(workspace, edited + b"!", known=(big, frozenset({0})))
    assert longer.chunks[0] not in big.chunks and laid_out(workspace, longer) == [True, True, False]


def test_read_part_gives_bytes_writable_or_read_only_memory_and_reports_progress(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    small = rng.randbytes(MIB - 1)
    part = write_part(workspace, small)
    progress: list[int] = []
    data = read_part(workspace, part, on_chunk=progress.append)
    assert type(data) is bytes and data == small and progress == [MIB - 1]
    writable = read_part(workspace, part, writable=True)
    assert type(writable) is bytearray and writable == small
    readonly = dataclasses.replace(part, readonly=True)
    view = read_part(workspace, readonly, writable=True)
    assert isinstance(view, memoryview) and view.readonly and view == small

    exactly = rng.randbytes(MIB)  # one chunk, but 1 MiB: mapped from the pack
    one = write_part(workspace, exactly)
    out = read_part(workspace, one)
    assert isinstance(out, mmap.mmap) and out[:] == exactly
    assert mapped_chunks(workspace, out, one) == [True]
    monkeypatch.setenv("KERNOS_MAP_BUFFERS", "off")  # not mapped: allocated, then copied
    out = read_part(workspace, one)
    assert isinstance(out, mmap.mmap) and out[:] == exactly
    assert mapped_chunks(workspace, out, one) == [False]

    pieces = rng.randbytes(300 * 1024)
    cut = write_part(workspace, pieces, stream=True)
    progress.clear()
    out = read_part(workspace, cut, on_chunk=progress.append)
    assert type(out) is bytearray and out == pieces
    assert sorted(progress) == sorted(cut.sizes) and len(progress) == len(cut.chunks)

    pair = rng.randbytes(MIB + 5)
    both = write_part(workspace, pair)  # neither chunk mapped: both copied, by two threads
    progress.clear()
    assert read_part(workspace, both, on_chunk=progress.append)[:] == pair
    assert progress == [MIB, 5]

    two = write_part(workspace, rng.randbytes(2 * 1000), stream=False)
    progress.clear()
    assert read_part(workspace, two, on_chunk=progress.append, writable=True) == bytearray(
        blob(workspace, two.chunks[0]))
    assert progress == [2000]


def test_read_part_maps_the_laid_out_chunks_and_copies_the_rest(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(8)
    data = rng.randbytes(2 * MIB + 5)
    part = write_part(workspace, data)
    progress: list[int] = []
    out = read_part(workspace, part, on_chunk=progress.append)
    assert isinstance(out, mmap.mmap) and out[:] == data
    assert progress == [2 * MIB, 5]  # the mapped chunks at once, then the one copied
    assert mapped_chunks(workspace, out, part) == [True, True, False]
    out[:] = bytes(len(out))  # copy on write: the pack keeps the committed bytes
    readonly = read_part(workspace, dataclasses.replace(part, readonly=True))
    assert isinstance(readonly, memoryview) and readonly.readonly and readonly == data
    # Content-cut parts are never mapped, even where their chunks would line up.
    progress.clear()
    out = read_part(workspace, dataclasses.replace(part, by_content=True),
                    on_chunk=progress.append)
    assert out[:] == data and progress == [MIB, MIB, 5]
    assert mapped_chunks(workspace, out, part) == [False, False, False]
    # Two chunks rewritten in place (compact) are copied by two threads, the kept one mapped.
    longer = bytearray(data[: 2 * MIB] + rng.randbytes(MIB) + data[2 * MIB :])
    three = write_part(workspace, longer)
    longer[10] ^= 1
    longer[MIB + 10] ^= 1
    edited = write_part(workspace, longer, known=(three, frozenset({0, 1})))
    assert laid_out(workspace, edited) == [False, False, True, False]
    progress.clear()
    out = read_part(workspace, edited, on_chunk=progress.append)
    assert out[:] == longer and progress == [MIB, MIB, MIB, 5]
    assert mapped_chunks(workspace, out, edited) == [False, False, True, False]
    monkeypatch.setenv("KERNOS_MAP_BUFFERS", "off")
    progress.clear()
    out = read_part(workspace, part, on_chunk=progress.append)
    assert out[:] == data and progress == [MIB, MIB, 5]
    assert mapped_chunks(workspace, out, part) == [False, False, False]


def test_a_laid_out_chunk_damaged_in_its_pack_is_never_handed_out(workspace: Workspace) -> None:
    data = random.Random(10).randbytes(2 * MIB)
    part = write_part(workspace, data)
    located = workspace.objects.packs.locate(part.chunks[1])
    runs = located[0].runs(located[1], MIB) if located is not None else None
    assert located is not None and runs is not None
    with open(located[0].path, "r+b") as handle:  # a byte of the fourth run, by hand
        handle.seek(runs[0][3][0] + 9)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(WorkspaceCorrupt) as raised:
        read_part(workspace, part)
    assert raised.value.problem.startswith(f"object {part.chunks[1].hex()} is unreadable")


def test_a_chunk_of_the_wrong_size_is_reported_as_damage(workspace: Workspace) -> None:
    part = write_part(workspace, b"four")
    wrong = dataclasses.replace(part, sizes=(5,))
    with pytest.raises(WorkspaceCorrupt) as raised:
        read_part(workspace, wrong)
    assert raised.value.problem == f"chunk {part.chunks[0].hex()} has the wrong size"
    assert raised.value.path == str(workspace.path)


def test_reading_a_damaged_snapshot_says_what_is_wrong(workspace: Workspace) -> None:
    objects = workspace.objects
    objects.begin()

    def put(kind: bytes, data: bytes) -> bytes:
        sha = object_id(kind, data)
        objects.write(kind, data, sha)
        return sha

    def root(*entries: tuple[bytes, str, bytes]) -> bytes:
        return put(b"tree", encode_tree(TreeEntry(*entry) for entry in entries))

    def commit(tree: bytes) -> bytes:
        return put(b"commit", encode_commit(CommitData(
            tree=tree, parents=(), author="a <a@kernos.invalid>", timestamp=1, message="m")))

    manifest, empty = put(b"blob", b'{"op":1}'), put(b"tree", b"")
    not_json = put(b"blob", b"{op")
    only_manifest = commit(root((BLOB_MODE, "kernos.json", manifest)))
    only_ns = commit(root((TREE_MODE, "ns", empty)))
    bad_manifest = commit(root((BLOB_MODE, "kernos.json", not_json), (TREE_MODE, "ns", empty)))
    tree_manifest = commit(root((BLOB_MODE, "kernos.json", empty), (TREE_MODE, "ns", empty)))
    blob_root = commit(manifest)
    latin_source = commit(root((BLOB_MODE, "kernos.json", manifest), (TREE_MODE, "ns", empty),
                               (BLOB_MODE, "source.py", put(b"blob", b"s = '\xe9'\n"))))
    index = put(b"blob", json.dumps({"names": ["a/b"], "stream": [2], "buffers": [],
                                     "segments": 1}).encode())
    no_sizes = root((BLOB_MODE, "c.000000", manifest))
    old_group = root((BLOB_MODE, "index.json", index), (BLOB_MODE, "s.000000", put(b"blob", b"ab")),
                     (TREE_MODE, "g000000", root((BLOB_MODE, "sizes.json", put(
                         b"blob", b'{"sizes":[8]}')), (BLOB_MODE, "c.000000", manifest))))
    broken_group = root((BLOB_MODE, "index.json", index),
                        (BLOB_MODE, "s.000000", put(b"blob", b"ab")),
                        (TREE_MODE, "g000000", no_sizes))
    no_index = root((BLOB_MODE, "s.000000", manifest))
    objects.seal(b"\x00" * 20)
    objects.finish()

    def problem(read: object, *args: object) -> str:
        with pytest.raises(WorkspaceCorrupt) as raised:
            read(workspace, *args)  # type: ignore[operator]
        assert raised.value.path == str(workspace.path)
        return raised.value.problem

    for commit_id in (only_manifest, only_ns):
        assert problem(read_snapshot, commit_id) == (
            f"commit {commit_id.hex()[:12]} is not a Kernos snapshot")
    assert problem(read_snapshot, bad_manifest).startswith(
        f"{not_json.hex()} is not valid JSON (Expecting property name")
    assert problem(read_snapshot, tree_manifest) == f"{empty.hex()} is a tree, not a blob"
    assert problem(read_snapshot, blob_root) == f"{manifest.hex()} is a blob, not a tree"
    assert problem(read_group, "a%2Fb", no_index) == "group 'a/b' has no index"
    # Code that is not UTF-8 (written by something else) is shown, not refused.
    assert read_snapshot(workspace, latin_source, with_source=True).source == "s = '\ufffd'\n"
    assert problem(read_group, "a%2Fb", broken_group) == (
        f"segment tree {no_sizes.hex()} has no sizes")
    group = read_group(workspace, "a%2Fb", old_group)  # written before code refs and unpersisted
    assert group.code_refs == frozenset() and group.unpersisted == ()
    assert group.names == ("a/b",) and not group.stream.by_content
    assert group.buffers[0].sizes == (8,) and not group.buffers[0].by_content
