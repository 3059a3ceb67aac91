"""The snapshot format: how an image is laid out as git trees and blobs.

A snapshot is a commit whose tree is::

    kernos.json          the manifest: op facts and per-name metadata
    source.py            the code the op ran (absent for ops without code)
    ns/                  one tree per *group* of variables that share objects
        <group>/
            index.json   member names, chunk sizes, unpersisted values, code refs
            s.000000     the pickle stream, in chunks (see below)
            b000.000000  out-of-band buffer 0, in chunks
            ...
            g000000/     or, for a big list or dict stored in segments
                         (``kernos.serialize.segments``), one tree per segment:
                sizes.json   its chunk sizes
                c.000000     its pickle stream, in chunks cut by content
    files/               the tracked directories, when there are any (``kernos.files``)

Values are chunked so that an 8-byte edit to a 200 MB array writes one
1 MiB chunk, not 200 MB.  Buffers (arrays, frames' blocks) are cut at fixed
1 MiB offsets, which an in-place edit never moves.  A pickle stream of
64 KiB or more is cut where its content says (FastCDC, 32 KiB on average,
8 to 128 KiB), so that a value that grows, such as a list an agent appends
a record to at every op, stores only its last chunk or two again, not the
whole stream; the group's index says ``"stream_chunking": "fastcdc-32k"``.

Whether a chunk changed is decided by a keyed xxh3 digest (a per-process
random key, so agent code cannot craft collisions) looked up in
:class:`ChunkCache`; only new chunks are hashed with sha1, compressed and
written.  An unchanged group keeps its tree id, so it costs
nothing at all.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import xxhash
from pyfastcdc import FastCDC

from kernos import _faults
from kernos.errors import WorkspaceCorrupt
from kernos.serialize.pickler import Pickled
from kernos.store.buffers import map_part
from kernos.store.encoding import encode_json
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
from kernos.store.workspace import Workspace

__all__ = [
    "CHUNK_BYTES",
    "ChunkCache",
    "SnapshotWriter",
    "StoredGroup",
    "StoredPart",
    "chunk_ids",
    "commit_message",
    "group_key",
    "read_group",
    "read_part",
    "read_snapshot",
]

CHUNK_BYTES = 1 << 20
STREAM_CDC_FROM = 64 << 10
"""Pickle streams this long or longer are cut by content; shorter ones are one chunk."""
STREAM_CHUNKING = "fastcdc-32k"
_CDC = FastCDC(avg_size=32 << 10, seed=0)
_SMALL = 4096  # below this, hashing with sha1 directly is cheaper than a cache lookup
MANIFEST = "kernos.json"
SOURCE = "source.py"
NAMESPACE = "ns"
FILES = "files"
INDEX = "index.json"
SIZES = "sizes.json"


@dataclass(frozen=True, kw_only=True)
class StoredPart:
    """One byte sequence (a stream or a buffer) as a list of chunk blobs."""

    chunks: tuple[bytes, ...]
    sizes: tuple[int, ...]
    readonly: bool = False
    by_content: bool = False
    """Cut by content (a long pickle stream), not at fixed offsets."""
    tree: bytes | None = None
    """The tree that holds it on its own (a segment), if it has one."""

    @property
    def size(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True, kw_only=True)
class StoredGroup:
    """A group of variables as stored in one snapshot."""

    key: str
    names: tuple[str, ...]
    tree: bytes
    stream: StoredPart
    buffers: tuple[StoredPart, ...]
    code_refs: frozenset[str] = frozenset()
    unpersisted: tuple[dict[str, Any], ...] = ()

    @functools.cached_property
    def size(self) -> int:  # a commit sums every group's: worked out once
        return self.stream.size + sum(part.size for part in self.buffers)


def group_key(names: Iterable[str]) -> str:
    """A stable, git-safe tree entry name for a group: its smallest member, escaped."""
    return quote(min(names), safe="") or "%00"


class ChunkCache:
    """Keyed digest of a chunk's bytes -> the id of the blob that holds them."""

    def __init__(self, capacity: int = 200_000) -> None:
        self._seed = int.from_bytes(os.urandom(8), "little")
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self._capacity = capacity

    def digest(self, data: bytes | memoryview) -> bytes:
        return xxhash.xxh3_128_digest(data, seed=self._seed)

    def get(self, digest: bytes) -> bytes | None:
        sha = self._entries.get(digest)
        if sha is not None:
            self._entries.move_to_end(digest)
        return sha

    def update(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        for digest, sha in entries:
            self._entries[digest] = sha
            self._entries.move_to_end(digest)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


class SnapshotWriter:
    """Writes the objects of one commit; nothing is visible until the ref moves."""

    def __init__(self, workspace: Workspace, cache: ChunkCache) -> None:
        self.workspace = workspace
        self.cache = cache
        self._new_cache_entries: dict[bytes, bytes] = {}
        self.bytes_written = 0
        """What the new objects take on disk (compressed, as git stores them)."""

    def __enter__(self) -> SnapshotWriter:
        """Start the batch; leaving with an error deletes what it wrote.

        An op's commit is spread over the transaction's phases, so the image
        participant calls ``objects.begin()``/``discard()`` itself instead.
        """
        self.workspace.objects.begin()
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if error is not None:
            self.workspace.objects.discard()

    def blob(self, data: bytes | memoryview, *, aligned: bool = True) -> bytes:
        """Write a blob unless the chunk cache knows it; return its id.  ``aligned``:
        a long one that does not compress is laid out for restores to map
        (:mod:`kernos.store.aligned`)."""
        if len(data) < _SMALL:
            return self._write(b"blob", data)
        digest = self.cache.digest(data)
        sha = self.cache.get(digest) or self._new_cache_entries.get(digest)
        if sha is None:
            sha = self._write(b"blob", data, aligned=aligned)
            self._new_cache_entries[digest] = sha
        return sha

    def _write(self, kind: bytes, data: bytes | memoryview, *, aligned: bool = True) -> bytes:
        sha = object_id(kind, data)
        self.bytes_written += self.workspace.objects.write(kind, data, sha, aligned=aligned)
        return sha

    def tree(self, entries: Iterable[TreeEntry]) -> bytes:
        """Write a tree of ``entries`` (a higher floor's own subtree); return its id."""
        return self._write(b"tree", encode_tree(entries))

    def part(self, data: bytes | memoryview, *, readonly: bool = False,
             stream: bool = False,
             known: tuple[StoredPart, frozenset[int]] | None = None) -> StoredPart:
        """Store ``data`` in chunks; a pickle ``stream`` is cut by content when long.

        ``known``: the part that stored these bytes at the last commit, and the
        indices of the only pieces that can differ since (the caller knows where
        the op wrote).  Every other piece keeps its chunk without being read.  It
        is used only if the part was cut as this one is.  The pieces it writes are
        not laid out page-aligned: they are few, their small pack is soon repacked by
        git (which moves them), and a restore copies them in a moment.
        """
        view = _bytes_view(data)
        by_content = stream and len(view) >= STREAM_CDC_FROM
        chunks: list[bytes] = []
        sizes = []
        last, dirty = known if known is not None else (None, frozenset())
        if last is not None and (by_content or last.by_content or last.size != len(view)):
            last = None
        for piece in _pieces(view, by_content):
            at = len(chunks)
            if (last is not None and at not in dirty and at < len(last.chunks)
                    and last.sizes[at] == len(piece)):
                chunks.append(last.chunks[at])  # not written since: not even read
                sizes.append(len(piece))
                continue
            chunks.append(self.blob(piece, aligned=last is None))
            sizes.append(len(piece))
        return StoredPart(chunks=tuple(chunks), sizes=tuple(sizes), readonly=readonly,
                          by_content=by_content)

    def segment(self, data: bytes | memoryview) -> StoredPart:
        """Store one segment's pickle stream as a tree of its own (see the module docstring)."""
        part = self.part(data, readonly=True, stream=True)
        spec: dict[str, Any] = {"sizes": list(part.sizes)}
        if part.by_content:
            spec["chunking"] = STREAM_CHUNKING
        entries = [TreeEntry(BLOB_MODE, SIZES, self.blob(_json(spec)))]
        entries += [TreeEntry(BLOB_MODE, f"c.{i:06d}", sha) for i, sha in enumerate(part.chunks)]
        return StoredPart(chunks=part.chunks, sizes=part.sizes, readonly=True,
                          by_content=part.by_content,
                          tree=self._write(b"tree", encode_tree(entries)))

    def group(self, names: Sequence[str], pickled: Pickled, *, op: int | None,
              known: Sequence[tuple[StoredPart, frozenset[int]]] = ()) -> StoredGroup:
        """Store one group.  A value stored in segments has pickle streams for buffers:
        they are cut by content, and a segment the last commit wrote keeps its chunks.
        ``known``: for a buffer, the part that stored it last and the only pieces that
        may differ since (see :meth:`part`)."""
        stream = self.part(pickled.stream, stream=True)
        segmented = pickled.segmented if len(names) == 1 else None
        if segmented is not None:
            buffers = tuple(
                piece.part if piece.part is not None else self.segment(view)
                for piece, view in zip(segmented.segments, pickled.buffers, strict=True))
        else:
            buffers = tuple(
                self.part(view, readonly=view.readonly,
                          known=known[number] if number < len(known) else None)
                for number, view in enumerate(pickled.buffers))
        unpersisted = tuple(dict(transient.info(), op=op) for transient in pickled.transients)
        index: dict[str, Any] = {
            "names": list(names),
            "stream": list(stream.sizes),
            "buffers": [] if segmented is not None else [
                {"sizes": list(part.sizes), "readonly": part.readonly} for part in buffers],
            "code_refs": sorted(pickled.code_refs),
            "unpersisted": list(unpersisted),
        }
        if segmented is not None:
            index["segments"] = len(buffers)
        if stream.by_content:  # absent otherwise: groups written before keep their ids
            index["stream_chunking"] = STREAM_CHUNKING
        entries = [TreeEntry(BLOB_MODE, INDEX, self.blob(_json(index)))]
        entries += [TreeEntry(BLOB_MODE, f"s.{i:06d}", sha) for i, sha in enumerate(stream.chunks)]
        if segmented is not None:
            entries += [TreeEntry(TREE_MODE, f"g{number:06d}", part.tree or b"")
                        for number, part in enumerate(buffers)]
        else:
            for number, part in enumerate(buffers):
                entries += [TreeEntry(BLOB_MODE, f"b{number:03d}.{i:06d}", sha)
                            for i, sha in enumerate(part.chunks)]
        tree = self._write(b"tree", encode_tree(entries))
        return StoredGroup(
            key=group_key(names), names=tuple(names), tree=tree, stream=stream,
            buffers=buffers, code_refs=pickled.code_refs, unpersisted=unpersisted,
        )

    def commit(
        self,
        *,
        groups: Iterable[StoredGroup] = (),
        namespace_tree: bytes | None = None,
        manifest: dict[str, Any] | bytes,
        source: str | None,
        parent: bytes | None,
        message: str,
        author: str,
        files_tree: bytes | None = None,
    ) -> bytes:
        """Write the root tree and the commit object; return the commit id.

        The namespace is given either as ``groups`` or, to reuse another
        snapshot's namespace as is, as the id of its ``ns`` tree.  ``files_tree``
        is the tracked directories' tree (``kernos.files``), if there is one.
        """
        if namespace_tree is None:
            namespace = encode_tree(
                TreeEntry(TREE_MODE, group.key, group.tree) for group in groups)
            namespace_tree = self._write(b"tree", namespace)
        entries = [
            TreeEntry(BLOB_MODE, MANIFEST, self.blob(
                manifest if isinstance(manifest, bytes) else _json(manifest))),
            TreeEntry(TREE_MODE, NAMESPACE, namespace_tree),
        ]
        if source is not None:
            entries.append(TreeEntry(BLOB_MODE, SOURCE, self.blob(source.encode())))
        if files_tree is not None:
            entries.append(TreeEntry(TREE_MODE, FILES, files_tree))
        root = self._write(b"tree", encode_tree(entries))
        commit = CommitData(
            tree=root, parents=(parent,) if parent else (), author=author,
            timestamp=int(time.time()), message=message,
        )
        sha = self._write(b"commit", encode_commit(commit))
        self.workspace.objects.seal(sha, parent=parent)
        return sha

    def publish(self, commit: bytes, *, sync_with: Iterable[Path | int] = (),
                record: bytes = b"") -> None:
        """Move the branch to ``commit``.  After this returns the op is durable.

        ``sync_with`` (the audit log) is synced with the snapshot's objects before
        the ref moves, unless the commit goes to the tail with a copy of ``record``
        (``Workspace.set_head``).
        """
        self.workspace.set_head(commit, sync_with=sync_with, record=record)
        _faults.point("published")
        self.workspace.objects.finish()
        self.cache.update(self._new_cache_entries.items())


def _bytes_view(data: bytes | memoryview) -> memoryview:
    return memoryview(data) if isinstance(data, bytes) else memoryview(data).cast("B")


def _pieces(view: memoryview, by_content: bool) -> Iterable[memoryview]:
    if by_content:
        for chunk in _CDC.cut_buf(view):
            yield view[chunk.offset : chunk.offset + chunk.length]
        return
    for start in range(0, max(len(view), 1), CHUNK_BYTES):
        yield view[start : start + CHUNK_BYTES]


def chunk_ids(data: bytes | memoryview, cache: ChunkCache, *,
              by_content: bool = False) -> tuple[bytes, ...]:
    """The blob ids the chunks of ``data`` would have, writing nothing (cached where known).

    ``by_content`` cuts as a long pickle stream is cut (see :meth:`SnapshotWriter.part`).
    """
    ids = []
    for piece in _pieces(_bytes_view(data), by_content):
        sha = cache.get(cache.digest(piece)) if len(piece) >= _SMALL else None
        ids.append(sha or object_id(b"blob", piece))
    return tuple(ids)


def commit_message(*, op: int, principal: str, kind: str, headline: str) -> str:
    """The message of a snapshot commit: the op and principal, then parseable trailers."""
    return (
        f"op {op} by {principal}: {headline}\n\n"
        f"Kernos-Op: {op}\nKernos-Principal: {principal}\nKernos-Kind: {kind}\n"
    )


_json = encode_json


@dataclass(kw_only=True)
class Snapshot:
    """A snapshot as read back: its manifest and where its groups are."""

    commit: bytes
    data: CommitData
    manifest: dict[str, Any]
    group_trees: dict[str, bytes] = field(default_factory=dict)
    namespace_tree: bytes = b""
    source: str | None = None
    files_tree: bytes | None = None
    """The tracked directories' tree (``kernos.files``); None when the snapshot has none."""


def read_snapshot(workspace: Workspace, commit: bytes, *, with_source: bool = False) -> Snapshot:
    data = workspace.read_commit(commit)
    entries = {entry.name: entry for entry in _tree(workspace, data.tree)}
    if MANIFEST not in entries or NAMESPACE not in entries:
        raise WorkspaceCorrupt(str(workspace.path),
                               f"commit {commit.hex()[:12]} is not a Kernos snapshot")
    manifest = _load_json(workspace, entries[MANIFEST].sha)
    groups = {entry.name: entry.sha for entry in _tree(workspace, entries[NAMESPACE].sha)}
    source = None
    if with_source and SOURCE in entries:
        source = workspace.read_object(entries[SOURCE].sha)[1].decode(errors="replace")
    files = entries.get(FILES)
    return Snapshot(commit=commit, data=data, manifest=manifest, group_trees=groups,
                    namespace_tree=entries[NAMESPACE].sha, source=source,
                    files_tree=files.sha if files is not None and files.is_tree else None)


def read_group(workspace: Workspace, key: str, tree: bytes) -> StoredGroup:
    entries = _tree(workspace, tree)
    by_name = {entry.name: entry.sha for entry in entries}
    if INDEX not in by_name:
        raise WorkspaceCorrupt(str(workspace.path), f"group {unquote(key)!r} has no index")
    index = _load_json(workspace, by_name[INDEX])
    stream_sizes = tuple(index["stream"])
    stream = StoredPart(
        chunks=tuple(by_name[f"s.{i:06d}"] for i in range(len(stream_sizes))),
        sizes=stream_sizes,
        by_content=index.get("stream_chunking") == STREAM_CHUNKING,
    )
    buffers = tuple(
        StoredPart(
            chunks=tuple(by_name[f"b{n:03d}.{i:06d}"] for i in range(len(spec["sizes"]))),
            sizes=tuple(spec["sizes"]),
            readonly=bool(spec["readonly"]),
        )
        for n, spec in enumerate(index["buffers"])
    )
    if "segments" in index:
        buffers += tuple(_read_segment(workspace, by_name[f"g{n:06d}"])
                         for n in range(int(index["segments"])))
    return StoredGroup(
        key=key, names=tuple(index["names"]), tree=tree, stream=stream, buffers=buffers,
        code_refs=frozenset(index.get("code_refs", ())),
        unpersisted=tuple(index.get("unpersisted", ())),
    )


def _read_segment(workspace: Workspace, tree: bytes) -> StoredPart:
    by_name = {entry.name: entry.sha for entry in _tree(workspace, tree)}
    if SIZES not in by_name:
        raise WorkspaceCorrupt(str(workspace.path), f"segment tree {tree.hex()} has no sizes")
    spec = _load_json(workspace, by_name[SIZES])
    sizes = tuple(spec["sizes"])
    return StoredPart(chunks=tuple(by_name[f"c.{i:06d}"] for i in range(len(sizes))),
                      sizes=sizes, readonly=True,
                      by_content=spec.get("chunking") == STREAM_CHUNKING, tree=tree)


def _check_in_pool(indexes: Iterable[int], check: Callable[[int], bool]) -> list[bool]:
    return list(_pool().map(check, indexes))


def read_part(
    workspace: Workspace,
    part: StoredPart,
    *,
    writable: bool = False,
    on_chunk: Callable[[int], None] | None = None,
    populate: bool = True,
) -> bytes | bytearray | mmap.mmap | memoryview:
    """The bytes of a part, as an object that supports the buffer protocol.

    A part meant to back a mutable value (``writable``) comes back writable.
    Large parts land in anonymous memory that the kernel maps already zeroed,
    and their chunks are copied in by two threads (file reads and checksums
    release the GIL).  Without ``populate`` that memory is mapped page by page
    as it is written instead of all at once, which holds the interpreter lock
    for less than a chunk at a time (a background restore's choice).
    """
    if len(part.chunks) == 1 and part.size < _LARGE and not writable:
        data = _read_blob(workspace, part.chunks[0])
        if len(data) != part.size:
            raise WorkspaceCorrupt(str(workspace.path),
                                   f"chunk {part.chunks[0].hex()} has the wrong size")
        if on_chunk:
            on_chunk(len(data))
        return data
    # Chunks laid out page-aligned in the packs are mapped, not copied (see buffers.py).
    mapped = None
    if _mappable(part.size, part.by_content):
        mapped = map_part(workspace.objects.packs, part.sizes, part.chunks, _check_in_pool)
    out: bytearray | mmap.mmap
    if mapped is not None:
        out, missing = mapped
        if on_chunk:
            on_chunk(part.size - sum(part.sizes[index] for index in missing))
    else:
        out, missing = _allocate(part.size, populate=populate), list(range(len(part.chunks)))
    view = memoryview(out)
    offsets = []
    position = 0
    for size in part.sizes:
        offsets.append(position)
        position += size

    def copy(index: int) -> int:
        size = part.sizes[index]
        start = offsets[index]
        workspace.read_blob_into(part.chunks[index], view[start : start + size])
        return size

    if len(missing) > 1:
        for size in _pool().map(copy, missing):
            if on_chunk:
                on_chunk(size)
    elif missing:
        size = copy(missing[0])
        if on_chunk:
            on_chunk(size)
    if part.readonly:
        return view.toreadonly()
    return out


_LARGE = 1 << 20

MAPPED_BUFFER_BYTES = 1 << 20
"""Buffers of at least this size are mapped from the packs where they line up (buffers.py)."""


def _mappable(size: int, by_content: bool) -> bool:
    return not by_content and size >= MAPPED_BUFFER_BYTES


_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kernos-read")
    return _executor


def _allocate(size: int, *, populate: bool = True) -> bytearray | mmap.mmap:
    """Zeroed memory for a part.  ``populate`` maps every page at once, which is faster
    in all but it holds the interpreter lock meanwhile (a third of a second per GB)."""
    if size < _LARGE:
        return bytearray(size)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if populate:
        flags |= getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(-1, size, flags=flags)


def _read_blob(workspace: Workspace, sha: bytes) -> bytes:
    kind, data = workspace.read_object(sha)
    if kind != b"blob":
        raise WorkspaceCorrupt(str(workspace.path), f"{sha.hex()} is a {kind.decode()}, not a blob")
    return data


def _tree(workspace: Workspace, sha: bytes) -> list[TreeEntry]:
    kind, data = workspace.read_object(sha)
    if kind != b"tree":
        raise WorkspaceCorrupt(str(workspace.path), f"{sha.hex()} is a {kind.decode()}, not a tree")
    return decode_tree(data)


def _load_json(workspace: Workspace, sha: bytes) -> Any:
    try:
        return json.loads(_read_blob(workspace, sha))
    except ValueError as error:
        raise WorkspaceCorrupt(str(workspace.path), f"{sha.hex()} is not valid JSON ({error})"
                               ) from None
