"""Git objects on disk: the encoding, and a crash-safe loose-object writer.

Writing goes straight to ``objects/xx/yyyy`` files because it is the hot path
of every commit: a GitPython index commit costs ~24 ms, this costs well under
one.  Reading falls back to GitPython's object database for anything that is
not loose (after a ``git gc`` the objects live in packs).

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
together in :meth:`LooseObjects.seal`, before the ref moves: one ``syncfs`` of
the workspace's filesystem on Linux (one journal commit), otherwise an fsync
per object file and per directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import sys
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from git.db import GitCmdObjectDB

__all__ = [
    "BLOB_MODE",
    "TREE_MODE",
    "CommitData",
    "LooseObjects",
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

# Data that does not shrink by a tenth is stored with zlib level 0: compressing
# 200 MB of floats at level 1 costs seconds and saves almost nothing.
_PROBE_BYTES = 16 * 1024
_WORTH_COMPRESSING = 0.9


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
        level = 1 if _compresses(data) else 0
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
        for leftover in self.scratch.glob("*") if self.scratch.exists() else ():
            leftover.unlink(missing_ok=True)
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
        removed = 0
        for line in self.journal.read_text(errors="replace").splitlines():
            if len(line) == 40 and all(c in "0123456789abcdef" for c in line):
                path = self.objects / line[:2] / line[2:]
                if path.exists():
                    path.unlink()
                    removed += 1
        self.journal.unlink()
        return removed

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


def _compresses(data: bytes | memoryview) -> bool:
    if len(data) <= _PROBE_BYTES:
        return True
    probe = bytes(data[:_PROBE_BYTES])
    return len(zlib.compress(probe, 1)) < _WORTH_COMPRESSING * len(probe)


def replace_file(path: Path, data: bytes, *, durable: bool, mode: int = 0o644,
                 temporary: Path | None = None) -> None:
    """Make ``path`` hold ``data``, all or nothing: write a temporary file, rename it over.

    With ``durable`` the data and the rename are synced before this returns.
    """
    temporary = temporary or path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
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


def fsync_dir(directory: Path) -> None:
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
