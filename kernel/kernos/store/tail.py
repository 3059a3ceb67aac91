"""The commit tail: small commits made durable by one append, folded into git later.

Why.  Moving git's branch creates files: a pack, its index, the ref's lock
file, each renamed into place, each synced with its directory.  On the
filesystems measured here creating or renaming a file costs more than all the
rest of a small commit, and syncing five of them more again.  The tail makes a
small commit one ``write`` to a file that stays open and one ``fdatasync``.

The file ``<workspace>/tail`` is a sequence of frames, one per commit::

    frame   = b"KTF1" length:u32 crc32:u32 payload        (big-endian)
    payload = commit:20 parent:20 count:u32 entry*count size:u32 record
                                                          (parent: 20 zero bytes if none)
    entry   = object:20 size:u32 raw                       (raw: the object as a pack
                                                            entry, git's header + zlib)

Every new object of the commit is in its frame, the commit object last, and
so is the op's audit record (its line in ``audit/chain.jsonl``, or nothing).

Rules.

1. The frame is the commit point: it is durable (one ``fdatasync``) before
   the op is acknowledged (``Workspace.set_head``).  The op's audit record is
   appended to the chain without a sync of its own: the frame carries a copy,
   and the chain is synced before a fold empties the tail.  So after a crash
   the open puts back a record the chain lost (``restore_records``) before it
   folds; an audit record whose frame did not survive names a commit that
   never became visible, which the audit recovery voids as it voids an
   unpublished commit.
2. A frame counts only whole: a torn or zeroed end fails its length, magic or
   CRC, and it is cut off there with everything after it.
3. The branch is the ref followed by the frames that continue it: skip the
   frames up to the one naming the ref's commit (already folded), then take
   frames while each one's parent is the commit before it.  Anything else in
   the file is stale and is dropped at the next fold.
4. *Folding* writes the objects of the frames as one pack (``PackBuilder``,
   durably), moves the ref to the newest frame's commit (durably) and only
   then empties the file.  A crash between these steps leaves frames that
   rule 3 skips, or a pack whose objects are stored twice until a repack.

*Group commit.*  A frame may be appended without its sync
(``append(frame, sync=False)``, inside ``Workspace.group_commit``); then
:meth:`Tail.sync` makes every frame appended so far durable with one
``fdatasync``, and nothing may tell anyone of those commits before it
returns.  While one sync runs, the next ops run and append theirs, and the
next sync covers them all.  The counters :attr:`Tail.appended` and
:attr:`Tail.synced` say how far durability has reached.  A sync that fails
sticks (:attr:`Tail.sync_error`): the frames after the last good sync may be
lost, so the tail takes no more frames, and a restart recovers from what is
on disk.

The workspace folds at :data:`FOLD_FRAMES` frames or :data:`FOLD_BYTES`,
before a commit too big for a frame, before anything reads the history
through git itself (``Workspace.repo``), on close, and, in the kernel, when
no request has come for :data:`FOLD_IDLE` seconds.  So ``git log`` and
``git fsck`` run by hand on a workspace whose kernel is idle or stopped see
every commit; while ops stream in, git's own view lags by at most a fold.
Kernos's own readers (a read-only ``Workspace``: ``kernos log``, ``audit
verify``) read the tail too and see every commit.

A kernel folds from two threads (its event loop when idle, ipykernel's control
thread in ``Workspace.close`` at shutdown), so the workspace lets one thread at
a time move the branch: ``set_head``, ``fold``, ``close`` and the ref's rename
hold one lock; after ``close`` a fold does nothing and a commit is refused (the
workspace lock, and so the branch, may be another process's by then).
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kernos import _faults
from kernos._durable import write_all
from kernos.errors import DiskFull, is_disk_full
from kernos.store.space import NOTHING_COMMITTED, reporting_full_disk

__all__ = ["FOLD_BYTES", "FOLD_FRAMES", "FOLD_IDLE", "FRAME_MAX", "Frame", "Tail"]

MAGIC = b"KTF1"
_HEAD = struct.Struct(">4sII")
_ENTRY = struct.Struct(">20sI")
_NONE = b"\0" * 20

FRAME_MAX = 1 << 20
"""A commit whose new objects take more than this (compressed) is written as a pack."""
FOLD_FRAMES = 64
FOLD_BYTES = 8 << 20
FOLD_IDLE = 0.05


@dataclass(slots=True)
class Frame:
    commit: bytes
    parent: bytes | None
    objects: dict[bytes, bytes] = field(default_factory=dict)
    """Object id -> its raw pack entry (header and zlib stream), in the order written."""
    record: bytes = b""
    """The op's audit record, as its line in the chain (empty if none came with it)."""


def encode_frame(commit: bytes, parent: bytes | None, objects: Iterable[tuple[bytes, bytes]],
                 record: bytes = b"") -> bytes:
    parts = [commit, parent or _NONE, b""]
    count = 0
    for sha, raw in objects:
        parts.append(_ENTRY.pack(sha, len(raw)))
        parts.append(raw)
        count += 1
    parts[2] = struct.pack(">I", count)
    parts.append(struct.pack(">I", len(record)))
    parts.append(record)
    payload = b"".join(parts)
    return _HEAD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def decode_frames(data: bytes) -> tuple[list[Frame], int]:
    """The whole frames at the start of ``data``, and where they end."""
    frames: list[Frame] = []
    position = 0
    view = memoryview(data)
    while position + _HEAD.size <= len(data):
        magic, length, crc = _HEAD.unpack_from(data, position)
        start = position + _HEAD.size
        end = start + length
        if magic != MAGIC or end > len(data) or length < 48:
            break
        payload = view[start:end]
        if zlib.crc32(payload) != crc:
            break
        commit = bytes(payload[:20])
        parent = bytes(payload[20:40])
        (count,) = struct.unpack_from(">I", payload, 40)
        objects: dict[bytes, bytes] = {}
        offset = 44
        try:
            for _ in range(count):
                sha, size = _ENTRY.unpack_from(payload, offset)
                offset += _ENTRY.size
                if offset + size > length:
                    raise ValueError("entry past the frame")
                objects[sha] = bytes(payload[offset : offset + size])
                offset += size
            (size,) = struct.unpack_from(">I", payload, offset)
            offset += 4
            record = bytes(payload[offset : offset + size])
            offset += size
        except (struct.error, ValueError):
            break
        if offset != length or commit not in objects:
            break
        frames.append(Frame(commit, None if parent == _NONE else parent, objects, record))
        position = end
    return frames, position


def _datasync(fd: int) -> None:
    _faults.pause("tail.sync")  # a slow disk, for the tests and the group-commit bench
    os.fdatasync(fd)


def _lost(error: OSError) -> str:
    return (f"the disk did not confirm the commit tail's last frames (fdatasync: "
            f"{error.strerror or error}); commits since the last confirmed one may be lost, "
            "so this process commits nothing more. Restart the kernel: it restores the last "
            "commit that is on disk")


def _sync_failure(path: Path, error: OSError) -> OSError:
    """The sticky error of a failed sync: :class:`DiskFull` if the disk said it is full."""
    lost = _lost(error)
    if is_disk_full(error):
        return DiskFull.from_os_error(error, path=path, what="the commit tail",
                                      then=lost[0].upper() + lost[1:] + ".")
    return OSError(error.errno, lost)


def continuing(frames: list[Frame], ref: bytes | None) -> list[Frame]:
    """The frames that continue the branch whose ref names ``ref`` (rule 3)."""
    start = 0
    for index, frame in enumerate(frames):
        if frame.commit == ref:
            start = index + 1
    kept = []
    expected = ref
    for frame in frames[start:]:
        if frame.parent != expected:
            break
        kept.append(frame)
        expected = frame.commit
    return kept


class Tail:
    """The tail file of one workspace, and the frames in it that continue the branch.

    ``ref()`` reads the branch's ref (rule 3 needs it).  A writer keeps the
    file open between commits; a reader re-reads it when it changed.
    """

    def __init__(self, path: Path, *, ref: Callable[[], bytes | None], writable: bool,
                 durable: bool) -> None:
        self.path = path
        self.ref = ref
        self.writable = writable
        self.durable = durable
        self.frames: list[Frame] = []
        self.objects: dict[bytes, bytes] = {}
        """Every object of every whole frame in the file (id -> raw pack entry); a reader
        may look up objects of frames already folded, which are right all the same."""
        self.size = 0
        self.appended = 0
        """Frames this process appended, ever (a ticket for :meth:`sync`)."""
        self.synced = 0
        """How many of those are durable."""
        self.syncs = 0
        """The ``fdatasync`` calls that made them so."""
        self.sync_error: OSError | None = None
        self._fd: int | None = None
        self._seen: tuple[object, ...] = ()
        self._lock = threading.Lock()

    @property
    def head(self) -> bytes | None:
        return self.frames[-1].commit if self.frames else None

    def load(self) -> bool:
        """Read the file and keep the frames that continue the ref; whether it holds
        anything else (a torn end, frames already folded or not continuing the branch)."""
        ref = self.ref()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        frames, end = decode_frames(data)
        self.frames = continuing(frames, ref)
        self.objects = {sha: raw for frame in frames for sha, raw in frame.objects.items()}
        self.size = end
        return end != len(data) or len(self.frames) != len(frames)

    def refresh(self) -> None:
        """A reader's view: re-read the file if it (or the ref) changed since the last look."""
        try:
            stat = self.path.stat()
            key: tuple[object, ...] = (stat.st_size, stat.st_mtime_ns, stat.st_ino, self.ref())
        except FileNotFoundError:
            key = (0, self.ref())
        if key != self._seen:
            self.load()
            self._seen = key

    def append(self, frame: Frame, *, sync: bool = True) -> None:
        """Append a frame and make it durable: the op's commit point (rule 1).

        Without ``sync`` the frame is written but not synced: the caller makes
        it durable with :meth:`sync` before it tells anyone of the commit.
        """
        if self.sync_error is not None:
            raise _sync_failure(self.path, self.sync_error) from self.sync_error
        data = encode_frame(frame.commit, frame.parent, frame.objects.items(), frame.record)
        with reporting_full_disk(self.path, "the commit tail", needed=len(data),
                                 then=NOTHING_COMMITTED):
            fd = self._open()
            try:
                # A write that fails (a full disk) made nothing durable: cut it off and
                # go on, the frames before it are untouched and still wait for their sync.
                write_all(fd, data)
            except BaseException:
                os.ftruncate(fd, self.size)
                raise
            try:
                if sync and self.durable:
                    _datasync(fd)
            except BaseException as error:
                os.ftruncate(fd, self.size)  # what was written must not count after a crash
                if isinstance(error, OSError) and self.synced < self.appended:
                    self.sync_error = error  # frames before it were waiting for this sync
                    raise _sync_failure(self.path, error) from error
                raise
        self.frames.append(frame)
        self.objects.update(frame.objects)
        self.size += len(data)
        with self._lock:  # a sync in another thread counts under the same lock
            self.appended += 1
            if sync and self.durable:
                self.syncs += 1
            if sync or not self.durable:
                self.synced = self.appended

    def sync(self) -> None:
        """Make every frame appended so far durable: one ``fdatasync``, or none if they
        are already.  Safe from another thread while frames are appended; those
        appended meanwhile may wait for the next sync.  Raises (every time, from
        then on) if the sync fails."""
        with self._lock:
            target = self.appended
            if self.synced >= target:
                return
            if self.sync_error is not None:
                raise _sync_failure(self.path, self.sync_error)
            # A descriptor of its own: a close on another thread (a kernel's shutdown) must
            # not leave it syncing a closed descriptor, or one reused for another file.
            fd = os.dup(self._fd) if self._fd is not None else None
        try:
            if fd is None:  # closed since they were appended: the file still has to reach
                fd = os.open(self.path, os.O_RDONLY)  # the disk
            try:
                _datasync(fd)
            finally:
                os.close(fd)
        except OSError as error:
            with self._lock:
                self.sync_error = error
            raise _sync_failure(self.path, error) from error
        with self._lock:
            self.syncs += 1
            self.synced = max(self.synced, target)

    def clear(self) -> None:
        """Empty the file (after a fold made its frames part of git's history)."""
        fd = self._open()
        os.ftruncate(fd, 0)
        self.frames = []
        self.objects = {}
        self.size = 0
        with self._lock:  # the fold made them part of a durable pack and ref
            self.synced = self.appended

    def __getstate__(self) -> dict[str, object]:
        # A value that refers to the workspace copies the tail; the open file stays here.
        return {**self.__dict__, "_fd": None, "_lock": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _open(self) -> int:
        if not self.writable:
            raise RuntimeError("the commit tail was opened read-only")
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def close(self) -> None:
        with self._lock:  # not while a sync takes its own descriptor
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

