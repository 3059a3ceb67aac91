"""Git objects on disk: the encoding, and the crash-safe writers.

A workspace uses :class:`ObjectStore`: each commit's new objects become one
pack (:mod:`kernos.store.packs`), read back from memory-mapped packs.  Its
base, :class:`LooseObjects`, writes one ``objects/xx/yyyy`` file per object
(the layout of workspaces before packs, still read, and the baseline of
``bench/pack_writers.py``); writing git's objects directly is the hot path of
every commit: a GitPython index commit costs ~24 ms, this well under one.
The rules below are the loose writer's; the pack writer keeps them with a
pack in place of each object.

Crash safety comes from three rules:

1. an object file appears only by ``rename`` of a complete temporary file;
2. before an object is created its id is appended to the *pending journal*;
3. the branch ref is the commit point: it is replaced by ``rename`` too.

After a crash, :meth:`LooseObjects.recover` finds the journal: if the ref
already names the journal's commit the commit finished and the journal is
dropped; otherwise every object the journal lists is deleted (none of them
existed before, so nothing reachable is lost) and the half-written commit is
gone.  ``git fsck`` then sees neither dangling objects nor temporary files.

Durability (loose writer): a batch's objects and their directory entries are
made durable together in :meth:`LooseObjects.seal`, before the ref moves: one
``syncfs`` of the workspace's filesystem on Linux (one journal commit),
otherwise an fsync per object file and per directory.

A small batch, sealed with its commit's parent, is not written here at all:
it becomes a frame of the commit tail (:mod:`kernos.store.tail`,
:meth:`ObjectStore.append_frame`), which the workspace folds into a pack
later.  What follows is the path of a batch too big for a frame, and of a fold.

Durability (pack writer): :meth:`ObjectStore.seal` syncs nothing itself.  It
leaves the pack, its index, their directory and the pending journal to
:meth:`ObjectStore.sync`, which the workspace calls when it moves the ref,
together with the new ref's temporary file and the op's audit record: every
file is fsynced at once, from a small thread pool, so the filesystem folds
them into one journal commit (``syncfs`` would also flush whatever else is
dirty on the filesystem: another workspace's, a build's).  Then the rename,
then the ref's directory.  Two sync points per commit, in that order: nothing
the ref names can be missing after a crash, and the audit record of a
published commit is always there.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos import _faults
from kernos.store import repack
from kernos.store.packs import SPILL_BYTES, PackBuilder, PackSet, compresses, inflate_entry
from kernos.store.space import (
    NOT_FOLDED,
    NOTHING_COMMITTED,
    reporting_full_disk,
    write_all,
)
from kernos.store.tail import FRAME_MAX, Frame, Tail

if TYPE_CHECKING:
    from git.db import GitCmdObjectDB

__all__ = [
    "BLOB_MODE",
    "TREE_MODE",
    "CommitData",
    "LooseObjects",
    "ObjectStore",
    "TreeEntry",
    "decode_commit",
    "decode_tree",
    "encode_commit",
    "encode_tree",
    "fsync_dir",
    "object_id",
    "replace_file",
]

BLOB_MODE = b"100644"
TREE_MODE = b"40000"

def object_id(kind: bytes, data: bytes | memoryview) -> bytes:
    """The binary git id of an object of ``kind`` holding ``data``."""
    digest = hashlib.sha1(b"%s %d\0" % (kind, len(data)))
    digest.update(data)
    return digest.digest()


@dataclass(frozen=True, slots=True)
class TreeEntry:
    mode: bytes
    name: str
    sha: bytes

    @property
    def is_tree(self) -> bool:
        return self.mode == TREE_MODE


def _sort_key(entry: TreeEntry) -> bytes:
    name = entry.name.encode()
    return name + b"/" if entry.is_tree else name


def encode_tree(entries: Iterable[TreeEntry]) -> bytes:
    parts = []
    for entry in sorted(entries, key=_sort_key):
        if not entry.name or "/" in entry.name or "\0" in entry.name:
            raise ValueError(f"{entry.name!r} cannot be a git tree entry name")
        parts.append(b"%s %s\0%s" % (entry.mode, entry.name.encode(), entry.sha))
    return b"".join(parts)


def decode_tree(data: bytes) -> list[TreeEntry]:
    entries = []
    position = 0
    while position < len(data):
        space = data.index(b" ", position)
        nul = data.index(b"\0", space)
        sha = data[nul + 1 : nul + 21]
        if len(sha) != 20:
            raise ValueError("truncated tree object")
        entries.append(TreeEntry(data[position:space], data[space + 1 : nul].decode(), sha))
        position = nul + 21
    return entries


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitData:
    tree: bytes
    parents: tuple[bytes, ...]
    author: str
    timestamp: int
    message: str


def encode_commit(commit: CommitData) -> bytes:
    lines = [b"tree " + commit.tree.hex().encode()]
    lines += [b"parent " + parent.hex().encode() for parent in commit.parents]
    signature = f"{commit.author} {commit.timestamp} +0000".encode()
    lines += [b"author " + signature, b"committer " + signature]
    message = commit.message if commit.message.endswith("\n") else commit.message + "\n"
    return b"\n".join(lines) + b"\n\n" + message.encode()


def decode_commit(data: bytes) -> CommitData:
    header, _, message = data.partition(b"\n\n")
    tree = b""
    parents = []
    author = ""
    timestamp = 0
    for line in header.split(b"\n"):
        key, _, value = line.partition(b" ")
        if key == b"tree":
            tree = bytes.fromhex(value.decode())
        elif key == b"parent":
            parents.append(bytes.fromhex(value.decode()))
        elif key == b"author":
            who, _, rest = value.decode().rpartition(">")
            author = who + ">"
            timestamp = int(rest.split()[0])
    return CommitData(tree=tree, parents=tuple(parents), author=author.strip(),
                      timestamp=timestamp, message=message.decode())


class LooseObjects:
    """Reads and writes loose objects of one repository, with a pending journal."""

    def __init__(self, git_dir: Path, *, journal: Path, scratch: Path, durable: bool) -> None:
        self.git_dir = git_dir
        self.objects = git_dir / "objects"
        self._objects_dir = str(self.objects)  # reads join strings: pathlib costs ~15 us each
        self.journal = journal
        self.scratch = scratch
        self.durable = durable
        self._journal_fd: int | None = None
        self._packed_lock = threading.Lock()
        """Packed objects are read through one ``git cat-file`` process: one reader at a
        time (a restore reads chunks on several threads)."""
        self._touched_dirs: set[Path] = set()
        self._fallback: GitCmdObjectDB | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A value that refers to the workspace copies the store; the open journal stays here.
        return {**self.__dict__, "_journal_fd": None}

    # -- writing -----------------------------------------------------------

    def begin(self) -> None:
        """Start a batch of writes that ends with :meth:`finish` or :meth:`discard`."""
        self.scratch.mkdir(exist_ok=True)
        self._journal_fd = os.open(self.journal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._touched_dirs.clear()

    def write(self, kind: bytes, data: bytes | memoryview, sha: bytes) -> int:
        """Store the object ``sha`` unless it is already loose.

        Returns the bytes it takes on disk (compressed), 0 if it was there already.
        """
        hexsha = sha.hex()
        directory = self.objects / hexsha[:2]
        path = directory / hexsha[2:]
        if path.exists():
            return 0
        if self._journal_fd is None:
            raise RuntimeError("LooseObjects.write called outside begin()/finish()")
        os.write(self._journal_fd, hexsha.encode() + b"\n")
        header = b"%s %d\0" % (kind, len(data))
        level = 1 if compresses(data) else 0
        compressor = zlib.compressobj(level)
        payload = compressor.compress(header) + compressor.compress(data) + compressor.flush()
        temporary = self.scratch / f"{hexsha}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444)
        try:
            try:
                view = memoryview(payload)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                if self.durable and _SYNCFS is None:
                    os.fsync(fd)  # else seal() syncs the whole batch at once
            finally:
                os.close(fd)
            if not directory.exists():
                directory.mkdir(exist_ok=True)
                self._touched_dirs.add(self.objects)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)  # a full disk must not keep half an object
            raise
        self._touched_dirs.add(directory)
        return len(payload)

    def seal(self, commit: bytes) -> None:
        """Make the batch's objects durable and name the commit they belong to."""
        if self._journal_fd is None:
            raise RuntimeError("LooseObjects.seal called outside begin()/finish()")
        if self.durable:
            if _SYNCFS is not None:
                sync_filesystem(self.objects)
            else:
                for directory in self._touched_dirs:
                    fsync_dir(directory)
        os.write(self._journal_fd, b"commit " + commit.hex().encode() + b"\n")

    def sync(self, *others: Path | int) -> None:
        """Sync ``others`` (the batch itself was synced by :meth:`seal`)."""
        if self.durable:
            fsync_all(others)

    def finish(self) -> None:
        """The ref now names the batch's commit: forget the journal."""
        self._close_journal()
        self.journal.unlink(missing_ok=True)

    def discard(self) -> None:
        """The batch will never be committed: delete what it wrote."""
        self._close_journal()
        self._delete_journaled()

    def _close_journal(self) -> None:
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None

    # -- recovery ----------------------------------------------------------

    def recover(self, head: bytes | None) -> str | None:
        """Finish or undo a batch that a crash interrupted; say what was done."""
        self._clear_scratch()
        if not self.journal.exists():
            return None
        lines = self.journal.read_text(errors="replace").splitlines()
        commit = next((line[7:] for line in lines if line.startswith("commit ")), None)
        if head is not None and commit is not None and commit == head.hex():
            self.journal.unlink()
            return f"the interrupted commit {commit[:12]} had completed; kept it"
        removed = self._delete_journaled()
        return f"discarded a half-written commit ({removed} objects)"

    def _delete_journaled(self) -> int:
        if not self.journal.exists():
            return 0
        removed = self._delete_loose(self.journal.read_text(errors="replace").splitlines())
        self.journal.unlink()
        return removed

    def _delete_loose(self, lines: list[str]) -> int:
        """Delete the loose objects whose ids are journal ``lines``; how many there were."""
        removed = 0
        for line in lines:
            if len(line) == 40 and all(c in "0123456789abcdef" for c in line):
                path = self.objects / line[:2] / line[2:]
                if path.exists():
                    path.unlink()
                    removed += 1
        return removed

    def _clear_scratch(self) -> None:
        for leftover in self.scratch.glob("*") if self.scratch.exists() else ():
            leftover.unlink(missing_ok=True)

    # -- reading -----------------------------------------------------------

    def _loose_path(self, hexsha: str) -> str:
        return f"{self._objects_dir}/{hexsha[:2]}/{hexsha[2:]}"

    def read(self, sha: bytes) -> tuple[bytes, bytes]:
        """``(kind, data)`` of an object, loose or packed."""
        hexsha = sha.hex()
        try:
            with open(self._loose_path(hexsha), "rb") as handle:
                raw = zlib.decompress(handle.read())
        except FileNotFoundError:
            return self._read_packed(sha)
        nul = raw.index(b"\0")
        kind, _, size = raw[:nul].partition(b" ")
        data = raw[nul + 1 :]
        if len(data) != int(size):
            raise ValueError(f"object {hexsha} is truncated")
        return kind, data

    def read_blob_into(self, sha: bytes, out: memoryview) -> None:
        """Copy the content of blob ``sha`` into ``out``, which has exactly its size.

        Large chunks are stored with zlib level 0, whose deflate stream is the
        data itself in "stored" blocks.  Copying those blocks straight into
        ``out`` (and checking the zlib adler32 as zlib would) avoids a decompress
        and a copy per chunk; that is most of the cost of restoring a big array.
        Anything else is decompressed normally.
        """
        hexsha = sha.hex()
        try:
            with open(self._loose_path(hexsha), "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            kind, data = self._read_packed(sha)
            _copy_blob(hexsha, kind, data, out)
            return
        if not _copy_stored_blocks(raw, out):
            data = zlib.decompress(raw)
            nul = data.index(b"\0")
            _copy_blob(hexsha, data[:nul].partition(b" ")[0], memoryview(data)[nul + 1 :], out)

    def _packed(self) -> GitCmdObjectDB:
        if self._fallback is None:
            from git.cmd import Git
            from git.db import GitCmdObjectDB

            self._fallback = GitCmdObjectDB(str(self.objects), Git(str(self.git_dir)))
        return self._fallback

    def _read_packed(self, sha: bytes) -> tuple[bytes, bytes]:
        with self._packed_lock:
            try:
                stream = self._packed().stream(sha)
                data = stream.read()
            except Exception as error:
                self._reset_packed()  # its `git cat-file` process may have died with the error
                raise FileNotFoundError(f"object {sha.hex()} is missing or unreadable") \
                    from error
            if len(data) != stream.size:
                self._reset_packed()
                raise ValueError(f"object {sha.hex()} is damaged in its pack ({len(data)} of "
                                 f"{stream.size} bytes readable)")
            return stream.type, data

    def _reset_packed(self) -> None:
        fallback, self._fallback = self._fallback, None
        if fallback is not None:
            with contextlib.suppress(Exception):
                fallback._git.clear_cache()

    def exists(self, sha: bytes) -> bool:
        hexsha = sha.hex()
        if os.path.exists(self._loose_path(hexsha)):
            return True
        with self._packed_lock:
            try:
                self._packed().info(sha)
            except Exception:
                return False
        return True


REPACK_PACKS = 64
"""Start a background repack when this many packs exist (a geometric repack leaves a
handful, so one runs about every 60 commits)."""
REPACK_LOOSE = 6700
"""... or when about this many loose objects do (git's own ``gc.auto``)."""
GIT_FSYNC = ("-c", "core.fsync=objects,derived-metadata,reference",
              "-c", "core.fsyncMethod=fsync")


# The repack yields the processor to ops: on a small machine it competes with the kernel.
_NICE = ("nice", "-n", "10") if shutil.which("nice") else ()


def _estimate_loose(objects: Path) -> int:
    """About how many loose objects there are: those of one fan-out directory, times 256."""
    try:
        return 256 * sum(1 for _ in os.scandir(objects / "17"))
    except FileNotFoundError:
        return 0


class ObjectStore(LooseObjects):
    """The workspace's objects: each commit's new objects written as one pack.

    The crash rules are those of :class:`LooseObjects`, with packs for
    objects: the journal names each pack before it is created (``pack
    <path>``), the batch is synced once in :meth:`seal`, and recovery deletes
    the packs of a commit the ref never named.  The journal stays open between
    commits (emptied, not deleted): creating a file costs more than a commit's
    other work on some filesystems.

    Loose objects are still read (workspaces written before packs, objects
    git itself left loose) and a repack folds them into packs.

    Maintenance: when a commit leaves :data:`REPACK_PACKS` packs or more (or
    an estimated :data:`REPACK_LOOSE` loose objects), git's geometric repack
    is started in the background (``git repack -d --geometric=2``): it merges
    the small packs so that their number stays logarithmic in the history,
    folds loose objects in, and deletes what it merged only once the new pack
    is durable, so a ``kill -9`` at any instant loses nothing.  Ops never
    wait for it: the packs it replaces stay readable until the next rescan.
    It ends with its kernel and never runs beside another repack of the
    workspace (:mod:`kernos.store.repack`).
    """

    def __init__(self, git_dir: Path, *, journal: Path, scratch: Path, durable: bool,
                 tail: Tail | None = None) -> None:
        super().__init__(git_dir, journal=journal, scratch=scratch, durable=durable)
        self.tail = tail
        """Small commits go here instead of into a pack (:mod:`kernos.store.tail`)."""
        self._framed: tuple[bytes, bytes | None] | None = None
        """``(commit, parent)`` of a sealed batch kept in memory for the tail."""
        self.pack_dir = self.objects / "pack"
        self.packs = PackSet(self.pack_dir)
        self._builder = PackBuilder()
        self._batch: set[bytes] = set()
        self._written: list[Path] = []
        self._journal_open = False
        self._journal_dirty = False
        self._repack: subprocess.Popen[bytes] | None = None
        self._loose_estimate: int | None = None  # counted when a commit first asks
        self._unsynced: list[Path] = []
        """What the sealed batch left to :meth:`sync` (paths; the journal is synced by fd)."""

    def begin(self) -> None:
        if self._journal_fd is None:
            with reporting_full_disk(self.journal, "the commit journal", then=NOTHING_COMMITTED):
                self.scratch.mkdir(exist_ok=True)
                self._journal_fd = os.open(self.journal, os.O_WRONLY | os.O_CREAT, 0o644)
            self._journal_dirty = True
        if self._journal_dirty:  # a batch kept for the tail writes nothing to it
            os.ftruncate(self._journal_fd, 0)
            os.lseek(self._journal_fd, 0, os.SEEK_SET)
            self._journal_dirty = False
        self._journal_open = True
        self._builder = PackBuilder()
        self._framed = None
        self._batch.clear()
        self._written.clear()

    def write(self, kind: bytes, data: bytes | memoryview, sha: bytes) -> int:
        """Add the object ``sha`` to the batch's pack unless the batch has it already.

        Only this batch is checked: an object that an older pack (or a loose
        file) holds too is stored twice until a repack merges them, which costs
        a little space and no lookup per object on the commit path.  Unchanged
        chunks never get here: the snapshot writer's chunk cache skips them.
        """
        if not self._journal_open:
            raise RuntimeError("ObjectStore.write called outside begin()/finish()")
        if sha in self._batch:
            return 0
        self._batch.add(sha)
        written = self._builder.add(kind, data, sha)
        if self._builder.size >= SPILL_BYTES:
            self._flush()
        return written

    def _flush(self) -> None:
        if not len(self._builder):
            return
        with reporting_full_disk(self.pack_dir, "a pack of the op's objects",
                                 needed=self._builder.size, then=NOTHING_COMMITTED):
            self.pack_dir.mkdir(parents=True, exist_ok=True)
            pack = self._builder.write(self.pack_dir, self._announce)
        self._builder = PackBuilder()
        self.packs.add(pack)

    def _announce(self, pack: Path) -> None:
        assert self._journal_fd is not None
        self._journal_dirty = True
        write_all(self._journal_fd, f"pack {pack.name}\n".encode())
        self._written.append(pack)

    def seal(self, commit: bytes, *, parent: bytes | object | None = ...) -> None:
        """End the batch: its objects are complete, ``commit`` the last of them.

        Given the commit's ``parent``, a batch small enough is kept in memory
        for the tail (:meth:`append_frame`) instead of being written as a pack.
        """
        if not self._journal_open or self._journal_fd is None:
            raise RuntimeError("ObjectStore.seal called outside begin()/finish()")
        if (self.tail is not None and self.tail.writable and parent is not ...
                and not self._written and self._builder.size <= FRAME_MAX):
            self._framed = (commit, parent if isinstance(parent, bytes) else None)
            return  # nothing is written before the frame: the journal has nothing to name
        self._flush()
        self._name_commit(commit)

    def _name_commit(self, commit: bytes) -> None:
        assert self._journal_fd is not None
        self._journal_dirty = True
        with reporting_full_disk(self.journal, "the commit journal", then=NOTHING_COMMITTED):
            write_all(self._journal_fd, b"commit " + commit.hex().encode() + b"\n")
        self._note_unsynced()

    def _note_unsynced(self) -> None:
        if self.durable:
            self._unsynced = [path for pack in self._written
                              for path in (pack, pack.with_suffix(".idx"))]
            if self._written:
                self._unsynced.append(self.pack_dir)

    @property
    def framed_parent(self) -> bytes | object | None:
        """The parent of the sealed batch kept for the tail, or ``...`` if there is none."""
        return ... if self._framed is None else self._framed[1]

    def unframe(self) -> None:
        """Write the sealed batch kept for the tail as a pack after all."""
        if self._framed is not None:
            commit = self._framed[0]
            self._framed = None
            self._flush()
            self._name_commit(commit)

    def append_frame(self, record: bytes = b"", *, sync: bool = True) -> None:
        """Commit the sealed batch to the tail, with a copy of the op's audit ``record``:
        one append and one sync (the tail's rule 1; without ``sync``, see its group
        commit)."""
        assert self.tail is not None and self._framed is not None
        commit, parent = self._framed
        _faults.point("frame")
        self.tail.append(Frame(commit, parent, dict(self._builder.raw_entries()), record),
                         sync=sync)
        self._builder = PackBuilder()
        self._framed = None

    def pack_tail(self) -> None:
        """Write the objects of the tail's frames as one pack, durably (a fold's first step)."""
        assert self.tail is not None
        self.add_packed(sha_raw for frame in self.tail.frames
                        for sha_raw in frame.objects.items())

    def add_packed(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Write objects given as pack entries (id, raw) as one pack, durably."""
        builder = PackBuilder()
        seen: set[bytes] = set()
        for sha, raw in entries:
            if sha not in seen:
                seen.add(sha)
                builder.add_raw(sha, raw)
        if not seen:
            return
        with reporting_full_disk(self.pack_dir, "a pack of the commit tail's objects",
                                 needed=builder.size, then=NOT_FOLDED):
            self.pack_dir.mkdir(parents=True, exist_ok=True)
            pack = builder.write(self.pack_dir, lambda _path: None)
            self.packs.add(pack)
            if self.durable:
                fsync_all([pack, pack.with_suffix(".idx"), self.pack_dir])

    def sync(self, *others: Path | int) -> None:
        """Make the sealed batch durable, with ``others`` (paths or open fds), at once.

        Each is fsynced from its own thread: concurrent fsyncs on one
        filesystem share a journal commit.  The journal goes too, so that
        recovery reads the commit it names.
        """
        if not self.durable:
            return
        journal = ([self._journal_fd] if self._journal_open and self._journal_fd is not None
                   and self._journal_dirty else [])
        jobs = [*self._unsynced, *others, *journal]
        self._unsynced = []
        with reporting_full_disk(self.pack_dir, "the op's pack, its journal and audit record "
                                 "(fsync)", then=NOTHING_COMMITTED):
            fsync_all(jobs)

    def finish(self) -> None:
        self._end_batch()
        self.maintain()

    def maintain(self) -> bool:
        """Start a background repack if the packs (or loose objects) call for one.

        Returns whether one was started.  A repack that has finished since the
        last call is noticed here, and the packs it replaced are let go.
        """
        if self._repack is not None:
            if self._repack.poll() is None:
                return False
            self._repack = None
            self.packs.refresh()
            self._loose_estimate = None
        if self._loose_estimate is None:
            self._loose_estimate = _estimate_loose(self.objects)
        if len(self.packs) < REPACK_PACKS and self._loose_estimate < REPACK_LOOSE:
            return False
        # Under a watchdog that ends it with this process, and under a lock that keeps
        # it alone (kernos.store.repack): a dead kernel's repack may still be ending.
        self._repack = repack.start(self.git_dir, [
            *_NICE, "git", *GIT_FSYNC, f"--git-dir={self.git_dir}", "repack", "-d", "-q",
            "--geometric=2"])
        if self._repack is None:
            return False
        self._loose_estimate = 0
        return True

    def wait_for_maintenance(self, timeout: float | None = None) -> None:
        """Wait for a running background repack, this process's or another's (a kernel
        killed meanwhile) (tests, ``kernos prune``, a replay)."""
        if self._repack is not None:
            self._repack.wait(timeout)
            self._repack = None
            self.packs.refresh()
        repack.wait_for_repacks(self.git_dir, timeout)

    def discard(self) -> None:
        self._builder = PackBuilder()
        self._framed = None
        self._delete_written(self._written)
        self._end_batch()

    def _end_batch(self) -> None:
        if self._journal_fd is not None and self._journal_dirty:
            os.ftruncate(self._journal_fd, 0)
            os.lseek(self._journal_fd, 0, os.SEEK_SET)
            self._journal_dirty = False
        self._journal_open = False
        self._unsynced = []
        self._batch.clear()
        self._written.clear()

    def close(self) -> None:
        self._close_journal()
        if self.tail is not None:
            self.tail.close()
        self.packs.close()

    def _delete_written(self, packs: list[Path]) -> int:
        for pack in packs:
            pack.with_suffix(".idx").unlink(missing_ok=True)  # the index first: git's rule
            pack.unlink(missing_ok=True)
        if packs:
            self.packs.refresh()
        return len(packs)

    def recover(self, head: bytes | None) -> str | None:
        self._clear_scratch()
        if self.pack_dir.exists():
            for leftover in self.pack_dir.glob("tmp_kernos_*"):
                leftover.unlink(missing_ok=True)
        if not self.journal.exists():
            return None
        lines = self.journal.read_text(errors="replace").splitlines()
        if not lines:
            return None
        commit = next((line[7:] for line in lines if line.startswith("commit ")), None)
        if head is not None and commit is not None and commit == head.hex():
            os.truncate(self.journal, 0)
            return f"the interrupted commit {commit[:12]} had completed; kept it"
        packs = [self.pack_dir / Path(line[5:]).name for line in lines
                 if line.startswith("pack pack-") and line.endswith(".pack")]
        # Object ids in the journal are what a loose writer (an older Kernos) left.
        removed = self._delete_written(packs) + self._delete_loose(lines)
        os.truncate(self.journal, 0)
        return f"discarded a half-written commit ({removed} packs or objects)"

    def _read_packed(self, sha: bytes) -> tuple[bytes, bytes]:
        found = self.packs.read(sha)
        if found is None:
            raise FileNotFoundError(f"object {sha.hex()} is missing")
        return found

    def _raw_in_tail(self, sha: bytes, *, refresh: bool) -> bytes | None:
        tail = self.tail
        if tail is None:
            return None
        if refresh and not tail.writable:
            tail.refresh()  # a reader: the writer may have appended (or folded) since
        return tail.objects.get(sha)

    def _in_tail(self, sha: bytes, *, refresh: bool) -> bool:
        return self._raw_in_tail(sha, refresh=refresh) is not None

    def _from_tail(self, sha: bytes, *, refresh: bool) -> tuple[bytes, bytes] | None:
        raw = self._raw_in_tail(sha, refresh=refresh)
        return None if raw is None else inflate_entry(raw)

    def read(self, sha: bytes) -> tuple[bytes, bytes]:
        found = self._from_tail(sha, refresh=False) or self.packs.read(sha, rescan=False)
        if found is not None:
            return found
        try:
            return super().read(sha)
        except FileNotFoundError:
            found = self._from_tail(sha, refresh=True)
            if found is None:
                raise
            return found

    def read_blob_into(self, sha: bytes, out: memoryview) -> None:
        found = self._from_tail(sha, refresh=False) or self.packs.read(sha, rescan=False)
        if found is None:
            try:
                super().read_blob_into(sha, out)
                return
            except FileNotFoundError:
                found = self._from_tail(sha, refresh=True)
                if found is None:
                    raise
        _copy_blob(sha.hex(), found[0], found[1], out)

    def exists(self, sha: bytes) -> bool:
        if self._in_tail(sha, refresh=False):
            return True
        if self.packs.locate(sha) is not None or os.path.exists(self._loose_path(sha.hex())):
            return True
        self.packs.refresh()
        return self.packs.locate(sha) is not None or self._in_tail(sha, refresh=True)


def replace_file(path: Path, data: bytes, *, durable: bool, mode: int = 0o644,
                 temporary: Path | None = None) -> None:
    """Make ``path`` hold ``data``, all or nothing: write a temporary file, rename it over.

    With ``durable`` the data and the rename are synced before this returns.
    """
    temporary = temporary or path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(fd, data)  # a short write (a full disk) must not be renamed into place
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        temporary.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(temporary, path)
    if durable:
        fsync_dir(path.parent)


def _find_syncfs() -> Any:
    """Linux's syncfs(2): one sync of a filesystem instead of one fsync per file and directory.

    A commit writes several small objects in several directories; syncing them
    one by one cost 16 fsyncs (each a journal commit), syncfs costs one.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return getattr(libc, "syncfs", None)


_SYNCFS = _find_syncfs()


def sync_filesystem(path: Path) -> None:
    """Make everything written to ``path``'s filesystem durable (data and names)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _SYNCFS is None:
            os.fsync(fd)
        elif _SYNCFS(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"syncfs failed: {os.strerror(error)}", str(path))
    finally:
        os.close(fd)


def fsync_all(paths: Iterable[Path | int]) -> None:
    """fsync every path (a file or a directory) or open fd, concurrently; the first error
    is raised once all have finished."""
    jobs = list(paths)
    if len(jobs) <= 1:
        for job in jobs:
            _fsync_one(job)
        return
    errors = [error for error in _fsync_pool().map(_fsync_quietly, jobs) if error is not None]
    if errors:
        raise errors[0]


def _fsync_one(job: Path | int) -> None:
    if isinstance(job, int):
        os.fsync(job)
    else:
        fsync_dir(job)  # any path: a directory or a file


def _fsync_quietly(job: Path | int) -> OSError | None:
    try:
        _fsync_one(job)
    except OSError as error:
        return error
    return None


_fsync_executor: ThreadPoolExecutor | None = None
_fsync_executor_lock = threading.Lock()


def _fsync_pool() -> ThreadPoolExecutor:
    global _fsync_executor
    with _fsync_executor_lock:
        if _fsync_executor is None:
            _fsync_executor = ThreadPoolExecutor(max_workers=6, thread_name_prefix="kernos-fsync")
        return _fsync_executor


def fsync_dir(directory: Path) -> None:
    """fsync a directory (its entries), or any path opened read-only."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_blob(hexsha: str, kind: bytes, data: bytes | memoryview, out: memoryview) -> None:
    if kind != b"blob" or len(data) != len(out):
        raise ValueError(f"object {hexsha} is not a blob of {len(out)} bytes")
    out[:] = data


def _copy_stored_blocks(raw: bytes, out: memoryview) -> bool:
    """Copy a zlib stream made only of stored blocks into ``out``; False if it is not one.

    The uncompressed stream is git's ``blob <size>\\0`` header followed by the
    content; only the content lands in ``out``.  The adler32 trailer is checked.
    """
    if len(raw) < 6 or raw[0] & 0x0F != 8 or raw[1] & 0x20 or (raw[0] << 8 | raw[1]) % 31:
        return False
    view = memoryview(raw)
    position = 2
    header = b""
    written = 0
    checksum = 1
    while True:
        if position + 5 > len(raw):
            return False
        flags = raw[position]
        if (flags >> 1) & 0b11 != 0:  # not a stored block
            return False
        length = raw[position + 1] | raw[position + 2] << 8
        if length ^ (raw[position + 3] | raw[position + 4] << 8) != 0xFFFF:
            return False
        start = position + 5
        block = view[start : start + length]
        if len(block) != length:
            return False
        checksum = zlib.adler32(block, checksum)
        if len(header) < 64 and b"\0" not in header:
            nul = bytes(block[:64]).find(b"\0")
            if nul < 0:
                header += bytes(block)
                block = block[len(block):]
            else:
                header += bytes(block[:nul + 1])
                block = block[nul + 1 :]
                kind, _, size = header[:-1].partition(b" ")
                if kind != b"blob" or not size.isdigit() or int(size) != len(out):
                    return False
        if len(block):
            if written + len(block) > len(out):
                return False
            out[written : written + len(block)] = block
            written += len(block)
        position = start + length
        if flags & 1:  # the final block
            break
    trailer = raw[position : position + 4]
    return (written == len(out) and len(trailer) == 4
            and int.from_bytes(trailer, "big") == checksum)
