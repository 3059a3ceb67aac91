"""The workspace's object store: each commit's new objects written as one pack.

:class:`ObjectStore` keeps the crash rules of loose objects
(:mod:`kernos.store.loose`) with a pack (:mod:`kernos.store.packs`) in place
of each object, and reads back from memory-mapped packs.

A small batch, sealed with its commit's parent, is not written here at all:
it becomes a frame of the commit tail (:mod:`kernos.store.tail`,
:meth:`ObjectStore.append_frame`), which the workspace folds into a pack
later.  What follows is the path of a batch too big for a frame, and of a fold.

Durability: :meth:`ObjectStore.seal` syncs nothing itself.  It leaves the
pack, its index, their directory and the pending journal to
:meth:`ObjectStore.sync`, which the workspace calls when it moves the ref,
together with the new ref's temporary file and the op's audit record: every
file is fsynced at once, from a small thread pool, so the filesystem folds
them into one journal commit (``syncfs`` would also flush whatever else is
dirty on the filesystem: another workspace's, a build's).  Then the rename,
then the ref's directory.  Two sync points per commit, in that order: nothing
the ref names can be missing after a crash, and the audit record of a
published commit is always there.

Maintenance: a background geometric repack keeps the number of packs small
(:meth:`ObjectStore.maintain`, :mod:`kernos.store.repack`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from kernos import _faults
from kernos._durable import fsync_all, write_all
from kernos.store import repack
from kernos.store.loose import LooseObjects, copy_blob
from kernos.store.packs import SPILL_BYTES, PackBuilder, PackSet, inflate_entry
from kernos.store.space import NOT_FOLDED, NOTHING_COMMITTED, reporting_full_disk
from kernos.store.tail import FRAME_MAX, Frame, Tail

__all__ = ["GIT_FSYNC", "KEEP_PACK_BYTES", "REPACK_LOOSE", "REPACK_PACKS", "ObjectStore"]


REPACK_PACKS = 64
"""Start a background repack when this many packs exist (a geometric repack leaves a
handful, so one runs about every 60 commits)."""
REPACK_LOOSE = 6700
"""... or when about this many loose objects do (git's own ``gc.auto``)."""
KEEP_PACK_BYTES = 32 << 20
"""The background repack leaves packs this big alone (and does not count them): their
big buffers' chunks stay page-aligned where they are, for restores to map
(:mod:`kernos.store.aligned`).  ``kernos prune`` and ``kernos gc`` repack everything."""
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

    def write(self, kind: bytes, data: bytes | memoryview, sha: bytes, *,
              aligned: bool = True) -> int:
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
        written = self._builder.add(kind, data, sha, aligned=aligned)
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
        # Big packs hold big buffers' chunks, laid out for restores to map: git would
        # move them (and they are few, and merging them saves no lookups worth it).
        kept = [pack.path.name for pack in self.packs if pack.size >= KEEP_PACK_BYTES]
        if (len(self.packs) - len(kept) < REPACK_PACKS
                and self._loose_estimate < REPACK_LOOSE):
            return False
        # Under a watchdog that ends it with this process, and under a lock that keeps
        # it alone (kernos.store.repack): a dead kernel's repack may still be ending.
        self._repack = repack.start(self.git_dir, [
            *_NICE, "git", *GIT_FSYNC, f"--git-dir={self.git_dir}", "repack", "-d", "-q",
            "--geometric=2", *(f"--keep-pack={name}" for name in kept)])
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
        found = self._from_tail(sha, refresh=False)
        if found is None and self.packs.read_blob_into(sha, out):
            return  # straight from the pack's mapping: no decompress, one copy
        found = found or self.packs.read(sha, rescan=False)
        if found is None:
            try:
                super().read_blob_into(sha, out)
                return
            except FileNotFoundError:
                found = self._from_tail(sha, refresh=True)
                if found is None:
                    raise
        copy_blob(sha.hex(), found[0], found[1], out)

    def exists(self, sha: bytes) -> bool:
        if self._in_tail(sha, refresh=False):
            return True
        if self.packs.locate(sha) is not None or os.path.exists(self._loose_path(sha.hex())):
            return True
        self.packs.refresh()
        return self.packs.locate(sha) is not None or self._in_tail(sha, refresh=True)
