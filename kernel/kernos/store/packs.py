"""Pack files: how a commit's new objects reach the disk, and how packed objects are read.

Writing (:class:`PackBuilder`).  The objects of one commit go into one pack in
git's format (version 2, whole objects, no deltas) and its index (version 2).
Both are written under temporary names in ``objects/pack``, renamed into place
(the index last: git and :class:`PackSet` see a pack only once its index is
there) and made durable with the commit's one sync.  A commit therefore
creates two files, whatever it stores; ``bench/pack_writers.py`` measured this
against the loose objects it replaces, ``git fast-import``, dulwich's and
libgit2's writers (it was the fastest of them).  A batch larger than
:data:`SPILL_BYTES` is cut into several packs, so a commit of a large value
never holds more than that in memory.

Reading (:class:`PackSet`).  Every pack is memory-mapped with its index; a
lookup is a binary search in the index's fanout range, and an object is
inflated straight from the mapped pack.  Deltas, which ``git repack`` and
``git gc`` make, are resolved (offset and reference deltas, chains of any
depth).  No subprocess and no lock are involved, so the restore threads read
in parallel.  A lookup that misses rescans the directory: a repack may have
replaced the packs (the old mappings stay valid until they are dropped).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from kernos import _faults
from kernos.store.aligned import ALIGN_FROM, Run, pieces
from kernos.store.aligned import runs as aligned_runs
from kernos.store.streams import compresses, copy_stored_blocks, zlib_stream

__all__ = ["SPILL_BYTES", "Pack", "PackBuilder", "PackSet", "inflate_entry"]

SPILL_BYTES = 64 << 20

_KINDS = {b"commit": 1, b"tree": 2, b"blob": 3, b"tag": 4}
_NAMES = {number: kind for kind, number in _KINDS.items()}
_OFS_DELTA = 6
_REF_DELTA = 7
_IDX_MAGIC = b"\377tOc\x00\x00\x00\x02"
_MAX_DELTA_DEPTH = 10_000

def _entry_header(kind: int, size: int) -> bytes:
    byte = (kind << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def inflate_entry(raw: bytes) -> tuple[bytes, bytes]:
    """``(kind, data)`` of a whole (not delta) object encoded as a pack entry."""
    byte = raw[0]
    kind = (byte >> 4) & 7
    size = byte & 0x0F
    shift = 4
    position = 1
    while byte & 0x80:
        byte = raw[position]
        size |= (byte & 0x7F) << shift
        shift += 7
        position += 1
    if kind not in _NAMES:
        raise ValueError(f"a pack entry of type {kind} is not a whole object")
    data = zlib.decompress(memoryview(raw)[position:])
    if len(data) != size:
        raise ValueError(f"a pack entry is damaged ({len(data)} of {size} bytes)")
    return _NAMES[kind], data


class _Entry:
    """One object of a batch: its pack entry's parts, and its crc32 (for the index)."""

    __slots__ = ("_trailer", "crc", "offset", "parts", "sha")

    def __init__(self, sha: bytes, offset: int, parts: list[bytes | bytearray | memoryview],
                 crc: int | None = None, trailer: Future[bytes] | None = None) -> None:
        self.sha, self.offset, self.parts, self.crc = sha, offset, parts, crc
        self._trailer = trailer
        """The background job that sums a page-aligned entry's data for its trailer."""

    def whole(self) -> list[bytes | bytearray | memoryview]:
        """The entry's parts, its trailer among them (waiting for its job if need be).
        Both the writing thread and the checksum's call it: it changes nothing."""
        if self._trailer is None:
            return self.parts
        return [*self.parts, self._trailer.result()]

    def settle(self) -> None:
        """Sum the crc32 of the whole entry if it is not known yet (the index needs it)."""
        if self.crc is None:
            crc = 0
            for part in self.whole():
                crc = zlib.crc32(part, crc)
            self.crc = crc

    def drop(self) -> None:
        """Let go of the data (written): the index's facts stay."""
        self.settle()
        self.parts, self._trailer = [], None


def _trailer(data: memoryview) -> bytes:
    return struct.pack(">I", zlib.adler32(data))


_worker: ThreadPoolExecutor | None = None


def _background() -> ThreadPoolExecutor:
    """One thread beside the committing one: checksums release the interpreter lock, so
    it sums one chunk while the op hashes the next, and hashes a pack while it is written."""
    global _worker
    if _worker is None:
        _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernos-pack")
    return _worker


def _forget_worker() -> None:
    global _worker
    _worker = None


os.register_at_fork(after_in_child=_forget_worker)  # a child has no such thread


class PackBuilder:
    """The objects of one batch, in the order they will be packed.

    A long blob that does not compress is laid out page-aligned
    (:mod:`kernos.store.aligned`) from views of its data, not copied.  Its adler32 is
    summed by a background thread while the committing one hashes the next object; that
    thread sums the pack's checksum too while this one writes the pack and sums the
    entries' crc32s.  The data must not change until :meth:`write` returns.
    """

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self.size = 12  # the pack header

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, kind: bytes, data: bytes | memoryview, sha: bytes, *,
            aligned: bool = True) -> int:
        """Append one object; return what it takes in the pack.  Unless not ``aligned``,
        a long blob that does not compress is laid out page-aligned."""
        prefix = _entry_header(_KINDS[kind], len(data))
        if (aligned and kind == b"blob" and len(data) >= ALIGN_FROM
                and not compresses(data)):
            view = memoryview(data).cast("B")
            parts = pieces(view, prefix, self.size)
            size = sum(len(part) for part in parts) + 4
            trailer = _background().submit(_trailer, view)
            self._entries.append(_Entry(sha, self.size, parts, trailer=trailer))
        else:
            raw = zlib_stream(data, prefix=prefix)
            size = len(raw)
            self._entries.append(_Entry(sha, self.size, [raw], zlib.crc32(raw)))
        self.size += size
        return size

    def add_raw(self, sha: bytes, raw: bytes) -> None:
        """Append an object already encoded as a pack entry (see :meth:`raw_entries`)."""
        self._entries.append(_Entry(sha, self.size, [raw], zlib.crc32(raw)))
        self.size += len(raw)

    def raw_entries(self) -> Iterator[tuple[bytes, bytes]]:
        """``(id, entry)`` of every object added, as the pack will hold it."""
        for entry in self._entries:
            yield entry.sha, b"".join(entry.whole())  # a tail frame's: small (tail.FRAME_MAX)

    def _checksum(self, header: bytes) -> bytes:
        digest = hashlib.sha1(header)
        for entry in self._entries:
            for part in entry.whole():
                digest.update(part)
        return digest.digest()

    def write(self, directory: Path, announce: Callable[[Path], None]) -> Path:
        """Write the pack and its index into ``directory``; return the pack's path.

        ``announce(path)`` is called with the pack's final path before anything
        gets that name, so a journal can name what a crash would leave behind
        (the temporary files written before are deleted by any recovery).
        Nothing is synced here: the caller syncs the whole batch once.
        """
        header = b"PACK" + struct.pack(">II", 2, len(self._entries))
        # Git reads every *.idx in the directory (fsck too): the files being written are
        # named as git names its own, with no such suffix, until they are renamed.
        temporary = {suffix: directory / f"tmp_kernos_{suffix}_{os.getpid()}"
                     for suffix in ("pack", "idx")}  # one batch at a time
        hashing = _background().submit(self._checksum, header)  # after the entries' own jobs
        try:
            with open(temporary["pack"], "wb") as handle:
                handle.write(header)
                for entry in self._entries:
                    handle.writelines(entry.whole())
                for entry in self._entries:  # while the checksum is summed
                    entry.settle()
                checksum = hashing.result()
                handle.write(checksum)
            pack = directory / f"pack-{checksum.hex()}.pack"
            announce(pack)
            with open(temporary["idx"], "wb") as handle:
                index = self._index(checksum)
                handle.write(index[: len(index) // 2])
                if _faults.armed("pack.index"):
                    handle.flush()
                    _faults.point("pack.index")  # an index half written: git must not see it
                handle.write(index[len(index) // 2 :])
            os.replace(temporary["pack"], pack)
            _faults.point("pack")
            os.replace(temporary["idx"], pack.with_suffix(".idx"))
        except BaseException:
            with contextlib.suppress(BaseException):
                hashing.result()  # never leave the job reading what the caller frees
            for path in temporary.values():
                path.unlink(missing_ok=True)
            raise
        for entry in self._entries:
            entry.drop()
        return pack

    def _index(self, checksum: bytes) -> bytes:
        entries = sorted((entry.sha, entry.crc, entry.offset) for entry in self._entries)
        fanout = [0] * 256
        for sha, _crc, _offset in entries:
            fanout[sha[0]] += 1
        running = 0
        for byte in range(256):
            running += fanout[byte]
            fanout[byte] = running
        large: list[int] = []  # offsets past 2 GiB, which the 32-bit table points into
        offsets = []
        for _sha, _crc, offset in entries:
            if offset >= 1 << 31:
                offsets.append(0x80000000 | len(large))
                large.append(offset)
            else:
                offsets.append(offset)
        body = b"".join([
            _IDX_MAGIC,
            struct.pack(">256I", *fanout),
            b"".join(sha for sha, _crc, _offset in entries),
            struct.pack(f">{len(entries)}I", *(crc for _sha, crc, _offset in entries)),
            struct.pack(f">{len(entries)}I", *offsets),
            struct.pack(f">{len(large)}Q", *large),
            checksum,
        ])
        return body + hashlib.sha1(body).digest()


class Pack:
    """One pack and its index, memory-mapped; immutable, so safe to share between threads."""

    def __init__(self, pack: Path) -> None:
        self.path = pack
        with open(pack.with_suffix(".idx"), "rb") as handle:
            self._idx = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        with open(pack, "rb") as handle:
            self._pack = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        if self._idx[:8] != _IDX_MAGIC or self._pack[:4] != b"PACK":
            raise ValueError(f"{pack.name} is not a version 2 pack with its index")
        self._fanout = struct.unpack_from(">256I", self._idx, 8)
        self.count = self._fanout[255]
        self._shas = 8 + 1024
        self._offsets = self._shas + 24 * self.count
        self._large = self._offsets + 4 * self.count
        self._ends: list[int] | None = None

    @property
    def size(self) -> int:
        """The pack file's bytes."""
        return len(self._pack)

    def find(self, sha: bytes) -> int | None:
        """The offset of ``sha`` in the pack, or None."""
        low = self._fanout[sha[0] - 1] if sha[0] else 0
        high = self._fanout[sha[0]]
        idx = self._idx
        base = self._shas
        while low < high:
            middle = (low + high) // 2
            start = base + 20 * middle
            found = idx[start : start + 20]
            if found < sha:
                low = middle + 1
            elif found > sha:
                high = middle
            else:
                return self._offset(middle)
        return None

    def _offset(self, position: int) -> int:
        (offset,) = struct.unpack_from(">I", self._idx, self._offsets + 4 * position)
        if offset & 0x80000000:
            (offset,) = struct.unpack_from(">Q", self._idx,
                                           self._large + 8 * (offset & 0x7FFFFFFF))
        return int(offset)

    def _end(self, offset: int) -> int:
        """Where the entry at ``offset`` ends (the next entry, or the checksum)."""
        if self._ends is None:
            self._ends = sorted(self._offset(i) for i in range(self.count))
            self._ends.append(len(self._pack) - 20)
        ends = self._ends
        low, high = 0, len(ends)
        while low < high:
            middle = (low + high) // 2
            if ends[middle] <= offset:
                low = middle + 1
            else:
                high = middle
        return ends[low]

    def entry(self, offset: int) -> tuple[int, int, int, int | bytes | None]:
        """``(type, size, data offset, delta base)`` of the entry at ``offset``."""
        pack = self._pack
        byte = pack[offset]
        kind = (byte >> 4) & 7
        size = byte & 0x0F
        shift = 4
        position = offset + 1
        while byte & 0x80:
            byte = pack[position]
            size |= (byte & 0x7F) << shift
            shift += 7
            position += 1
        base: int | bytes | None = None
        if kind == _OFS_DELTA:
            byte = pack[position]
            distance = byte & 0x7F
            position += 1
            while byte & 0x80:
                byte = pack[position]
                distance = ((distance + 1) << 7) | (byte & 0x7F)
                position += 1
            base = offset - distance
        elif kind == _REF_DELTA:
            base = bytes(pack[position : position + 20])
            position += 20
        return kind, size, position, base

    def inflate(self, start: int, offset: int, size: int) -> bytes:
        data = zlib.decompress(memoryview(self._pack)[start : self._end(offset)])
        if len(data) != size:
            raise ValueError(f"an object in {self.path.name} is damaged ({len(data)} of "
                             f"{size} bytes)")
        return data

    def runs(self, offset: int, size: int) -> tuple[list[Run], int] | None:
        """Where the blob of ``size`` bytes at ``offset`` has its bytes in the file, and
        its adler32, if it is laid out page-aligned (:mod:`kernos.store.aligned`)."""
        kind, length, start, _ = self.entry(offset)
        if _NAMES.get(kind) != b"blob" or length != size:
            return None
        return aligned_runs(self._pack, start, size)

    def slice(self, position: int, length: int) -> memoryview:
        """``length`` bytes of the pack file from ``position`` (a view of the mapping)."""
        return memoryview(self._pack)[position : position + length]

    def read_into(self, offset: int, out: memoryview) -> bool:
        """Copy the whole blob at ``offset`` into ``out`` (exactly its size) straight from
        the mapping when it is stored uncompressed; False if it is not such a blob."""
        kind, size, start, _ = self.entry(offset)
        if _NAMES.get(kind) != b"blob" or size != len(out):
            return False
        found = aligned_runs(self._pack, start, size)
        if found is not None:
            pack = memoryview(self._pack)
            for position, at, length in found[0]:
                out[at : at + length] = pack[position : position + length]
            return zlib.adler32(out) == found[1]
        return copy_stored_blocks(memoryview(self._pack)[start : self._end(offset)], out,
                                  git_header=False)

    def close(self) -> None:
        for mapping in (self._idx, self._pack):
            # A reader still holding a view keeps the mapping until it lets go.
            with contextlib.suppress(BufferError):
                mapping.close()


class PackSet:
    """Every pack of one ``objects/pack`` directory, newest first."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._packs: list[Pack] = []
        self._seen: dict[str, Pack] = {}
        self._lock = threading.Lock()
        self.refresh()

    def __len__(self) -> int:
        return len(self._packs)

    def __reduce__(self) -> tuple[type[PackSet], tuple[Path]]:
        # Mappings do not pickle: a copy (of a workspace a value refers to) maps anew.
        return PackSet, (self.directory,)

    def __iter__(self) -> Iterator[Pack]:
        return iter(list(self._packs))

    def refresh(self) -> None:
        """Pick up packs added (by a commit, a repack) and drop those deleted."""
        with self._lock:
            try:
                names = [entry for entry in os.scandir(self.directory)
                         if entry.name.startswith("pack-") and entry.name.endswith(".idx")]
            except FileNotFoundError:
                names = []
            names.sort(key=lambda entry: entry.stat().st_mtime_ns, reverse=True)
            current: dict[str, Pack] = {}
            for entry in names:
                stem = entry.name[:-4]
                pack = self._seen.get(stem)
                if pack is None:
                    try:
                        pack = Pack(self.directory / f"{stem}.pack")
                    except (FileNotFoundError, ValueError):
                        continue  # half there (being written or deleted), or not ours
                current[stem] = pack
            # Packs a repack deleted are dropped, not closed: a reader on another thread
            # may be inflating from one; its mapping goes when the last reference does.
            self._seen = current
            self._packs = list(current.values())

    def close(self) -> None:
        with self._lock:
            for pack in self._packs:
                pack.close()
            self._packs = []
            self._seen = {}

    def add(self, pack_path: Path) -> None:
        """A pack this process just wrote: readable at once, without a rescan."""
        pack = Pack(pack_path)
        with self._lock:
            self._seen[pack_path.stem] = pack
            self._packs.insert(0, pack)

    def locate(self, sha: bytes) -> tuple[Pack, int] | None:
        for pack in self._packs:
            offset = pack.find(sha)
            if offset is not None:
                return pack, offset
        return None

    def read_blob_into(self, sha: bytes, out: memoryview) -> bool:
        """Copy blob ``sha`` into ``out`` if a pack holds it as an uncompressed whole
        object of that size (a big buffer's chunk); False otherwise (read it instead)."""
        found = self.locate(sha)
        if found is None:
            return False
        pack, offset = found
        try:
            return pack.read_into(offset, out)
        except (IndexError, struct.error) as error:
            raise ValueError(f"object {sha.hex()} is damaged in {pack.path.name} ({error})"
                             ) from None

    def read(self, sha: bytes, *, rescan: bool = True) -> tuple[bytes, bytes] | None:
        """``(kind, data)`` of a packed object, or None if no pack holds it.

        A miss rescans the directory once (``rescan``) before it is believed.
        """
        found = self.locate(sha)
        if found is None:
            if not rescan:
                return None
            self.refresh()
            found = self.locate(sha)
            if found is None:
                return None
        pack, offset = found
        try:
            kind, data = self._resolve(pack, offset)
        except (zlib.error, IndexError, struct.error) as error:
            raise ValueError(f"object {sha.hex()} is damaged in {pack.path.name} ({error})"
                             ) from None
        return _NAMES[kind], data

    def _resolve(self, pack: Pack, offset: int) -> tuple[int, bytes]:
        """Follow a delta chain down to its whole object, then apply the deltas back up
        (a loop, not recursion: git makes chains up to 4095 deep)."""
        deltas: list[bytes] = []
        while True:
            if len(deltas) > _MAX_DELTA_DEPTH:
                raise ValueError(f"a delta chain in {pack.path.name} does not end")
            kind, size, start, base = pack.entry(offset)
            if kind in _NAMES:
                data = pack.inflate(start, offset, size)
                break
            if kind not in (_OFS_DELTA, _REF_DELTA):
                raise ValueError(f"{pack.path.name} has an entry of unknown type {kind}")
            deltas.append(pack.inflate(start, offset, size))
            if isinstance(base, int):
                offset = base
            else:
                assert isinstance(base, bytes)
                found = self.locate(base)
                if found is None:
                    raise ValueError(f"the delta base {base.hex()} is in no pack")
                pack, offset = found
        for delta in reversed(deltas):
            data = apply_delta(data, delta)
        return kind, data


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def apply_delta(source: bytes, delta: bytes) -> bytes:
    """Git's delta encoding: copy ranges of ``source`` and insert literal bytes."""
    expected, position = _varint(delta, 0)
    if expected != len(source):
        raise ValueError("a delta does not fit its base")
    size, position = _varint(delta, position)
    out = bytearray()
    end = len(delta)
    while position < end:
        command = delta[position]
        position += 1
        if command & 0x80:
            start = length = 0
            for bit in range(4):
                if command & (1 << bit):
                    start |= delta[position] << (8 * bit)
                    position += 1
            for bit in range(3):
                if command & (0x10 << bit):
                    length |= delta[position] << (8 * bit)
                    position += 1
            length = length or 0x10000
            if start + length > len(source):
                raise ValueError("a delta copies past the end of its base")
            out += source[start : start + length]
        elif command:
            out += delta[position : position + command]
            position += command
        else:
            raise ValueError("a delta has a reserved instruction")
    if len(out) != size:
        raise ValueError("a delta produced the wrong size")
    return bytes(out)
