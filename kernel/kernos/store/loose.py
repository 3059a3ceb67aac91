"""Loose git objects: one ``objects/xx/yyyy`` file per object, with a pending journal.

:class:`LooseObjects` is the layout of workspaces before packs, still read,
and the baseline of ``bench/pack_writers.py``; the workspace's
:class:`~kernos.store.object_store.ObjectStore` builds on it.  Writing git's
objects directly is the hot path of every commit: a GitPython index commit
costs ~24 ms, this well under one.  It also reads objects git packed itself
(through ``git cat-file``), and copies a stored blob straight into a buffer
(:meth:`LooseObjects.read_blob_into`, :func:`copy_blob`).

Crash safety comes from three rules:

1. an object file appears only by ``rename`` of a complete temporary file;
2. before an object is created its id is appended to the *pending journal*;
3. the branch ref is the commit point: it is replaced by ``rename`` too.

After a crash, :meth:`LooseObjects.recover` finds the journal: if the ref
already names the journal's commit the commit finished and the journal is
dropped; otherwise every object the journal lists is deleted (none of them
existed before, so nothing reachable is lost) and the half-written commit is
gone.  ``git fsck`` then sees neither dangling objects nor temporary files.

Durability: a batch's objects and their directory entries are made durable
together in :meth:`LooseObjects.seal`, before the ref moves: one ``syncfs``
of the workspace's filesystem on Linux (one journal commit), otherwise an
fsync per object file and per directory.
"""

from __future__ import annotations

import contextlib
import os
import threading
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos._durable import fsync_all, fsync_dir, has_syncfs, sync_filesystem
from kernos.store.streams import compresses, copy_stored_blocks

if TYPE_CHECKING:
    from git.db import GitCmdObjectDB

__all__ = ["LooseObjects", "copy_blob"]


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
                if self.durable and not has_syncfs():
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
            if has_syncfs():
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
            copy_blob(hexsha, kind, data, out)
            return
        if not copy_stored_blocks(raw, out, git_header=True):
            data = zlib.decompress(raw)
            nul = data.index(b"\0")
            copy_blob(hexsha, data[:nul].partition(b" ")[0], memoryview(data)[nul + 1 :], out)

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


def copy_blob(hexsha: str, kind: bytes, data: bytes | memoryview, out: memoryview) -> None:
    """Copy the content of blob ``hexsha`` (``kind`` and ``data`` as read) into ``out``."""
    if kind != b"blob" or len(data) != len(out):
        raise ValueError(f"object {hexsha} is not a blob of {len(out)} bytes")
    out[:] = data
