"""How tracked files are laid out in a snapshot, and their bytes moved in and out.

The ``files/`` tree of a snapshot (``kernos.store.snapshots``)::

    files/
        index.json       {"format": 1, "roots": {KEY: {"path": ..., "base": ...}}}
        KEY/             one tree per tracked directory, mirroring it
            dNAME/       a directory
            fNAME        a file of up to 1 MiB: one blob of its bytes
            cNAME/       a longer file: its bytes in 1 MiB chunk blobs 000000, 000001, ...
            lNAME        a symbolic link: one blob of its target

Every entry's name is the file's own name after a one-letter kind, so no
file name can be mistaken for a part of the format.  The blobs that hold a
file's bytes carry its git mode: ``100755`` if it is executable, else
``100644`` (other permission bits are not kept, as in git); a link's blob
is ``120000``.  ``base`` is ``workspace`` for a path relative to the
workspace (its own files root, ``files``), ``absolute`` otherwise.

Bytes go through the store's chunk path (``SnapshotWriter.blob``, its keyed
chunk cache): a file is cut at fixed 1 MiB offsets
(``kernos.store.snapshots.CHUNK_BYTES``), so an edit in place, or an
append, stores only the chunks it touched, and the tree of a directory is
written again only if an entry in it changed.  A file is read in 1 MiB
``pread`` calls, never mapped (a mapping of a file another thread cuts short
kills the process), with its stat taken before and after: a file that
changed meanwhile is read again (:class:`StillWriting` if it never holds
still).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kernos._durable import write_all
from kernos.errors import WorkspaceCorrupt
from kernos.files.scan import Key, key_of
from kernos.store.objects import BLOB_MODE, TREE_MODE, TreeEntry, decode_tree, object_id
from kernos.store.snapshots import CHUNK_BYTES, ChunkCache, SnapshotWriter
from kernos.store.workspace import Workspace

__all__ = ["EXEC_MODE", "INDEX", "LINK_MODE", "Contents", "StillWriting", "Stored", "Unreadable",
           "build_tree", "read_contents", "read_index", "same_bytes", "store_entry",
           "write_back", "write_index"]

INDEX = "index.json"
EXEC_MODE = b"100755"
LINK_MODE = b"120000"
DIR, FILE, CHUNKED, LINK = "d", "f", "c", "l"
ATTEMPTS = 3
"""How many times a file that changes while it is read is read again."""
_SMALL = 4096  # below this the chunk cache is not consulted (as in SnapshotWriter.blob)


class StillWriting(Exception):
    """A file kept changing while it was read (:data:`ATTEMPTS` times)."""


class Unreadable(Exception):
    """A tracked file could not be read.  Not an OSError: an error writing the store (a
    full disk) must fail the commit, never pass for a file that cannot be read."""

    def __init__(self, path: str, error: OSError) -> None:
        self.path = path
        self.reason = error.strerror or str(error)
        super().__init__(f"{path}: {self.reason}")


@dataclass(frozen=True, slots=True)
class Stored:
    """One file or link as a snapshot holds it."""

    mode: bytes
    """Its git mode: ``100644``, ``100755`` or ``120000`` (a link)."""
    chunks: tuple[bytes, ...]
    """The ids of the blobs that hold its bytes, in order."""
    tree: bytes | None = None
    """The tree of its chunks (a file of more than one chunk)."""


@dataclass(kw_only=True)
class Contents:
    """One tracked directory as a snapshot holds it."""

    files: dict[str, Stored] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    trees: dict[str, bytes] = field(default_factory=dict)
    """Directory (``""``: the tracked one) -> the id of its tree, as last written or read."""

    def copy(self) -> Contents:
        return Contents(files=dict(self.files), dirs=set(self.dirs), trees=dict(self.trees))


def _mode(key: Key) -> bytes:
    if stat.S_ISLNK(key[4]):
        return LINK_MODE
    return EXEC_MODE if key[4] & 0o100 else BLOB_MODE


def _pieces(fd: int, size: int, path: str = "") -> Iterable[bytes]:
    offset = 0
    while True:
        try:
            piece = os.pread(fd, CHUNK_BYTES, offset)
        except OSError as error:
            raise Unreadable(path, error) from error
        if not piece and offset:
            return
        yield piece
        offset += len(piece)
        if len(piece) < CHUNK_BYTES:
            return


def store_entry(path: str, key: Key, writer: SnapshotWriter, previous: Stored | None,
                learned: list[tuple[bytes, bytes]],
                opener: Callable[[str], int] | None = None) -> tuple[Stored, Key]:
    """Store the file or link at ``path`` (its bytes, as chunk blobs); return it and the
    stat key it had while it was read.  Chunks ``previous`` already holds, or the cache
    knows, are not written again; ``learned`` collects the cache entries to keep once the
    op committed."""
    if stat.S_ISLNK(key[4]):
        try:
            target = os.fsencode(os.readlink(path))
            after = key_of(os.lstat(path))
        except OSError as error:
            raise Unreadable(path, error) from error
        return Stored(mode=LINK_MODE, chunks=(writer.blob(target),)), after
    known = set(previous.chunks) if previous is not None else set()
    for _attempt in range(ATTEMPTS):
        try:
            fd = (opener or _open)(path)
        except OSError as error:
            raise Unreadable(path, error) from error
        try:
            before = key_of(os.fstat(fd))
            if not stat.S_ISREG(before[4]):
                raise StillWriting(path)
            chunks = tuple(_store_piece(piece, writer, known, learned)
                           for piece in _pieces(fd, before[0], path))
            after = key_of(os.fstat(fd))
        finally:
            os.close(fd)
        if before == after:
            mode = _mode(after)
            if len(chunks) == 1:
                return Stored(mode=mode, chunks=chunks), after
            tree = writer.tree(TreeEntry(mode, f"{number:06d}", sha)
                               for number, sha in enumerate(chunks))
            return Stored(mode=mode, chunks=chunks, tree=tree), after
    raise StillWriting(path)


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _store_piece(piece: bytes, writer: SnapshotWriter, known: set[bytes],
                 learned: list[tuple[bytes, bytes]]) -> bytes:
    if len(piece) < _SMALL:
        return writer.blob(piece)
    cache = writer.cache
    digest = cache.digest(piece)
    sha = cache.get(digest)
    if sha is None:
        sha = object_id(b"blob", piece)
        if sha not in known:  # else the last commit stored it: not compressed, not written
            writer.blob(piece)
        learned.append((digest, sha))
    return sha


def same_bytes(path: str, stored: Stored, cache: ChunkCache) -> bool:
    """Whether the file or link at ``path`` holds ``stored``'s bytes (it is read, not
    stored).  False when it cannot be read."""
    try:
        info = os.lstat(path)
        if stored.mode == LINK_MODE or stat.S_ISLNK(info.st_mode):
            return (stat.S_ISLNK(info.st_mode) and stored.mode == LINK_MODE
                    and object_id(b"blob", os.fsencode(os.readlink(path))) == stored.chunks[0])
        if _mode(key_of(info)) != stored.mode:
            return False
        fd = _open(path)
    except OSError:
        return False
    try:
        found = []
        for piece in _pieces(fd, info.st_size):
            sha = cache.get(cache.digest(piece)) if len(piece) >= _SMALL else None
            found.append(sha or object_id(b"blob", piece))
            if len(found) > len(stored.chunks) or found[-1] != stored.chunks[len(found) - 1]:
                return False
        return tuple(found) == stored.chunks
    except Unreadable:
        return False
    finally:
        os.close(fd)


def write_back(path: str, stored: Stored, workspace: Workspace) -> None:
    """Make ``path`` hold ``stored``, all or nothing: its bytes go to a temporary file
    beside it that is renamed over it (a full disk leaves ``path`` as it was)."""
    if stored.mode == LINK_MODE:
        target = os.fsdecode(_blob(workspace, stored.chunks[0]))
        if os.path.lexists(path) and not os.path.isdir(path):
            os.unlink(path)
        os.symlink(target, path)
        return
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.kernos-{os.getpid()}")
    mode = 0o755 if stored.mode == EXEC_MODE else 0o644
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        for sha in stored.chunks:
            write_all(fd, _blob(workspace, sha))
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(temporary)
        raise
    os.close(fd)
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)  # a directory the op made where the file was (empty by now)
    os.replace(temporary, path)


def _blob(workspace: Workspace, sha: bytes) -> bytes:
    kind, data = workspace.read_object(sha)
    if kind != b"blob":
        raise WorkspaceCorrupt(str(workspace.path), f"{sha.hex()} is a {kind.decode()}, "
                               "not a blob of a tracked file")
    return data


def build_tree(writer: SnapshotWriter, contents: Contents, dirty: set[str]) -> bytes:
    """Write the trees of ``contents`` whose directories are in ``dirty`` (and those not
    written yet), deepest first; return the tracked directory's tree.  Updates
    ``contents.trees``."""
    children: dict[str, list[TreeEntry]] = {directory: [] for directory in contents.dirs}
    children[""] = []
    for path, stored in contents.files.items():
        parent, _, name = path.rpartition("/")
        if parent not in dirty and parent in contents.trees:
            continue
        if stored.tree is not None:
            children[parent].append(TreeEntry(TREE_MODE, CHUNKED + name, stored.tree))
        else:
            kind = LINK if stored.mode == LINK_MODE else FILE
            children[parent].append(TreeEntry(stored.mode, kind + name, stored.chunks[0]))
    trees = {directory: sha for directory, sha in contents.trees.items()
             if directory in children and directory not in dirty}
    for directory in sorted(children, key=lambda path: -path.count("/") - bool(path)):
        if directory not in trees:
            entries = children[directory]
            prefix = directory + "/" if directory else ""
            entries += [TreeEntry(TREE_MODE, DIR + sub[len(prefix):], trees[sub])
                        for sub in contents.dirs
                        if sub.startswith(prefix) and "/" not in sub[len(prefix):]]
            trees[directory] = writer.tree(entries)
    contents.trees = trees
    return trees[""]


def read_contents(workspace: Workspace, tree: bytes) -> Contents:
    """One tracked directory as the tree ``tree`` holds it."""
    contents = Contents()
    pending = [("", tree)]
    while pending:
        directory, sha = pending.pop()
        contents.trees[directory] = sha
        prefix = directory + "/" if directory else ""
        for entry in _tree(workspace, sha):
            kind, name = entry.name[:1], entry.name[1:]
            path = prefix + name
            if kind == DIR and entry.is_tree:
                contents.dirs.add(path)
                pending.append((path, entry.sha))
            elif kind == CHUNKED and entry.is_tree:
                chunks = sorted(_tree(workspace, entry.sha), key=lambda chunk: chunk.name)
                mode = chunks[0].mode if chunks else BLOB_MODE
                contents.files[path] = Stored(mode=mode, tree=entry.sha,
                                              chunks=tuple(chunk.sha for chunk in chunks))
            elif kind in (FILE, LINK) and not entry.is_tree:
                contents.files[path] = Stored(mode=entry.mode, chunks=(entry.sha,))
            else:
                raise WorkspaceCorrupt(str(workspace.path),
                                       f"tracked-file tree {sha.hex()} holds {entry.name!r}")
    return contents


def write_index(writer: SnapshotWriter, roots: dict[str, dict[str, str]],
                trees: dict[str, bytes]) -> bytes:
    """The ``files/`` tree: the index of tracked directories and one tree each."""
    index = json.dumps({"format": 1, "roots": roots}, sort_keys=True,
                       separators=(",", ":")).encode()
    return writer.tree([TreeEntry(BLOB_MODE, INDEX, writer.blob(index)),
                        *(TreeEntry(TREE_MODE, key, sha) for key, sha in trees.items())])


def read_index(workspace: Workspace, tree: bytes
               ) -> tuple[dict[str, dict[str, str]], dict[str, bytes]]:
    """The tracked directories a ``files/`` tree lists, and the tree of each."""
    entries = {entry.name: entry for entry in _tree(workspace, tree)}
    if INDEX not in entries:
        raise WorkspaceCorrupt(str(workspace.path), f"files tree {tree.hex()} has no index")
    try:
        index = json.loads(_blob(workspace, entries[INDEX].sha))
        roots = {str(key): {"path": str(spec["path"]), "base": str(spec["base"])}
                 for key, spec in index["roots"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise WorkspaceCorrupt(str(workspace.path),
                               f"files index {tree.hex()} is unreadable ({error})") from None
    return roots, {key: entries[key].sha for key in roots if key in entries}


def _tree(workspace: Workspace, sha: bytes) -> list[TreeEntry]:
    kind, data = workspace.read_object(sha)
    if kind != b"tree":
        raise WorkspaceCorrupt(str(workspace.path), f"{sha.hex()} is a {kind.decode()}, "
                               "not a tree of tracked files")
    return decode_tree(data)
