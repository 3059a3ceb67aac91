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

Reading a ``files/`` tree back checks it whole, since a snapshot may come
from a remote (:func:`read_index`, :func:`read_contents`,
:func:`check_links`, :func:`check_files_tree`; the rules are in
:mod:`kernos.files`): anything this module would not have written is
refused with a :class:`~kernos.errors.WorkspaceCorrupt` before a byte is
written.

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

import contextlib
import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kernos._durable import write_all
from kernos.errors import WorkspaceCorrupt
from kernos.files.scan import Key, key_of
from kernos.store.objects import BLOB_MODE, TREE_MODE, TreeEntry, decode_tree, object_id
from kernos.store.snapshots import CHUNK_BYTES, ChunkCache, SnapshotWriter
from kernos.store.workspace import Workspace

__all__ = ["EXEC_MODE", "INDEX", "LINK_MODE", "OWN_ROOT", "Contents", "ObjectSource",
           "StillWriting", "Stored", "Unreadable", "build_tree", "check_files_tree",
           "check_links", "component_problem", "read_contents", "read_index", "same_bytes",
           "store_entry", "write_back", "write_index"]

INDEX = "index.json"
OWN_ROOT = "files"
"""The key (and, relative to the workspace, the path) of a workspace's own files root."""
EXEC_MODE = b"100755"
LINK_MODE = b"120000"
DIR, FILE, CHUNKED, LINK = "d", "f", "c", "l"
ATTEMPTS = 3
"""How many times a file that changes while it is read is read again."""
_SMALL = 4096  # below this the chunk cache is not consulted (as in SnapshotWriter.blob)


class ObjectSource(Protocol):
    """Where a snapshot's objects are read: a workspace, or a pull's candidate history."""

    @property
    def path(self) -> Path: ...

    def read_object(self, sha: bytes) -> tuple[bytes, bytes]: ...


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
            writer.blob(piece, aligned=False)  # files are copied out, never mapped
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
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                os.unlink(path)  # a file, or a link (never followed)
        os.symlink(target, path)
        return
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.kernos-{os.getpid()}")
    mode = 0o755 if stored.mode == EXEC_MODE else 0o644
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)  # a crash's leftover (or anything planted there): never followed
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
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


def _blob(workspace: ObjectSource, sha: bytes) -> bytes:
    try:
        kind, data = workspace.read_object(sha)
    except (KeyError, ValueError, FileNotFoundError) as error:
        raise WorkspaceCorrupt(str(workspace.path), f"the object {sha.hex()[:12]} of tracked "
                               f"files is missing ({error})") from None
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


def read_contents(workspace: ObjectSource, tree: bytes) -> Contents:
    """One tracked directory as the tree ``tree`` holds it, checked whole (see
    :func:`check_links` for its links): every name one plain path component, every mode
    one this format writes, every chunk list numbered without a gap, no path twice; a
    :class:`~kernos.errors.WorkspaceCorrupt` naming the problem otherwise."""
    contents = Contents()
    pending = [("", tree)]
    while pending:
        directory, sha = pending.pop()
        if directory.count("/") >= MAX_DEPTH:
            raise _refused(workspace, tree, f"{directory!r} is more than {MAX_DEPTH} "
                           "directories deep")
        contents.trees[directory] = sha
        prefix = directory + "/" if directory else ""
        for entry in _tree(workspace, sha):
            kind, name = entry.name[:1], entry.name[1:]
            path = prefix + name
            problem = component_problem(name)
            if problem is not None:
                raise _refused(workspace, tree, f"the entry {entry.name!r} in "
                               f"{directory or 'the tracked directory'!r}: {problem}")
            if path in contents.files or path in contents.dirs:
                raise _refused(workspace, tree, f"{path!r} is listed twice")
            if kind == DIR and entry.mode == TREE_MODE:
                contents.dirs.add(path)
                pending.append((path, entry.sha))
            elif kind == CHUNKED and entry.mode == TREE_MODE:
                contents.files[path] = _chunked(workspace, tree, path, entry.sha)
            elif (kind, entry.mode) in _BLOB_KINDS:
                contents.files[path] = Stored(mode=entry.mode, chunks=(entry.sha,))
            else:
                raise _refused(workspace, tree, f"{path!r} has the mode "
                               f"{entry.mode.decode(errors='replace')} and the kind "
                               f"{kind!r}: only directories, files (100644, 100755) and "
                               "links (120000) kept by Kernos are restored")
    return contents


_BLOB_KINDS = {(FILE, BLOB_MODE), (FILE, EXEC_MODE), (LINK, LINK_MODE)}
"""The one-blob entries this format writes: a file, an executable, a link."""

MAX_DEPTH = 256
"""The deepest directory a snapshot's tracked files may hold (a tree is read iteratively,
but a path a kernel cannot even make is refused up front)."""


def component_problem(name: str) -> str | None:
    """Why ``name`` cannot be one component of a path under a tracked directory, or None."""
    if not name:
        return "an empty name"
    if name in (".", ".."):
        return f"the name {name!r} leaves the directory or names it"
    if "/" in name or "\0" in name:
        return "a name holding '/' or a NUL byte"
    if len(name.encode()) > 255:
        return "a name longer than 255 bytes"
    return None


def _chunked(workspace: ObjectSource, tree: bytes, path: str, sha: bytes) -> Stored:
    chunks = _tree(workspace, sha)
    if not chunks:
        raise _refused(workspace, tree, f"the long file {path!r} has no chunk")
    modes = {chunk.mode for chunk in chunks}
    names = sorted(chunk.name for chunk in chunks)
    if names != [f"{number:06d}" for number in range(len(chunks))]:
        raise _refused(workspace, tree, f"the chunks of {path!r} are not numbered 000000, "
                       "000001, ... without a gap")
    if len(modes) != 1 or not modes <= {BLOB_MODE, EXEC_MODE}:
        raise _refused(workspace, tree, f"the chunks of {path!r} are not all blobs of "
                       "one file mode (100644 or 100755)")
    ordered = sorted(chunks, key=lambda chunk: chunk.name)
    return Stored(mode=modes.pop(), tree=sha, chunks=tuple(chunk.sha for chunk in ordered))


def check_links(workspace: ObjectSource, contents: Contents, root: str) -> None:
    """Refuse a link of ``contents`` (a tracked directory to be put at ``root``) that
    leads outside it: each is followed through the snapshot's own links and directories,
    up to 40 links deep; an absolute target must be inside ``root``, a relative one must
    not climb above it, and it must pass only through directories the snapshot holds
    (what else is on disk there is not the snapshot's to vouch for)."""
    links = {path: os.fsdecode(_blob(workspace, stored.chunks[0]))
             for path, stored in contents.files.items() if stored.mode == LINK_MODE}
    base = root.rstrip("/") + "/"
    for path, target in links.items():
        if not target or "\0" in target:
            raise _link_refused(workspace, path, "its target is empty or holds a NUL byte")
        at = path.split("/")[:-1]
        pending = _target_parts(target, base)
        if pending is None:
            raise _link_refused(workspace, path, f"it points to {target!r}, outside {root}")
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "/":  # an absolute target inside the root: from its top
                at = []
                continue
            if part == "..":
                if not at:
                    raise _link_refused(workspace, path, f"its target {target!r} climbs "
                                        f"above {root}")
                at.pop()
                continue
            here = "/".join([*at, part])
            if here in links:
                hops += 1
                if hops > 40:
                    raise _link_refused(workspace, path, "its links loop")
                followed = _target_parts(links[here], base)
                if followed is None:
                    raise _link_refused(workspace, path, f"it passes through {here!r}, "
                                        f"which points outside {root}")
                pending = followed + pending
            elif here in contents.dirs or not pending:
                at.append(part)
            else:
                raise _link_refused(workspace, path, f"its target {target!r} passes "
                                    f"through {here!r}, which the snapshot does not hold "
                                    "as a directory")


def _target_parts(target: str, base: str) -> list[str] | None:
    """A link target's components, relative to the link's directory; an absolute one
    inside ``base`` restarts at the top (marked by enough ``..``: climbing to the top is
    refused only above it).  None: absolute and outside."""
    if not target.startswith("/"):
        return target.split("/")
    if not (target + "/").startswith(base):
        return None
    return ["/", *target[len(base):].split("/")]


def check_files_tree(source: ObjectSource, tree: bytes, workspace: Path,
                     checked: dict[bytes, Contents] | None = None) -> None:
    """Check a snapshot's whole ``files/`` tree as a restore would (index, every tree,
    every link, for a workspace at ``workspace``), writing nothing: what a pull runs on
    each new snapshot.  ``checked`` caches the tracked directories' trees already read."""
    seen = {} if checked is None else checked
    roots, trees = read_index(source, tree)
    for key, sha in trees.items():
        contents = seen.get(sha)
        if contents is None:
            contents = seen[sha] = read_contents(source, sha)
        spec = roots[key]
        place = (str(workspace / spec["path"]) if spec["base"] == "workspace"
                 else spec["path"])
        check_links(source, contents, place)


def _refused(workspace: ObjectSource, tree: bytes, problem: str) -> WorkspaceCorrupt:
    return WorkspaceCorrupt(str(workspace.path),
                            f"the tracked files tree {tree.hex()[:12]} is refused: {problem}")


def _link_refused(workspace: ObjectSource, path: str, problem: str) -> WorkspaceCorrupt:
    return WorkspaceCorrupt(str(workspace.path),
                            f"the tracked link {path!r} is refused: {problem}")


def write_index(writer: SnapshotWriter, roots: dict[str, dict[str, str]],
                trees: dict[str, bytes]) -> bytes:
    """The ``files/`` tree: the index of tracked directories and one tree each."""
    index = json.dumps({"format": 1, "roots": roots}, sort_keys=True,
                       separators=(",", ":")).encode()
    return writer.tree([TreeEntry(BLOB_MODE, INDEX, writer.blob(index)),
                        *(TreeEntry(TREE_MODE, key, sha) for key, sha in trees.items())])


def read_index(workspace: ObjectSource, tree: bytes
               ) -> tuple[dict[str, dict[str, str]], dict[str, bytes]]:
    """The tracked directories a ``files/`` tree lists, and the tree of each, checked
    whole: the index holds exactly ``format`` (1) and ``roots``; each root's key is one
    path component, its spec exactly a ``path`` and a ``base``; the workspace's own root
    (``files``, relative to the workspace) is there, and every other is absolute and
    normalised; the tree holds the index and one tree per root, nothing else."""
    entries: dict[str, TreeEntry] = {}
    for entry in _tree(workspace, tree):
        if entry.name in entries:
            raise _refused(workspace, tree, f"{entry.name!r} is listed twice")
        entries[entry.name] = entry
    index_entry = entries.get(INDEX)
    if index_entry is None or index_entry.mode != BLOB_MODE:
        raise _refused(workspace, tree, "it has no index (a 100644 blob named index.json)")
    try:
        index = json.loads(_blob(workspace, index_entry.sha))
    except ValueError as error:
        raise _refused(workspace, tree, f"its index is not JSON ({error})") from None
    roots = _checked_roots(workspace, tree, index)
    trees: dict[str, bytes] = {}
    for name, entry in entries.items():
        if name == INDEX:
            continue
        if name not in roots or entry.mode != TREE_MODE:
            raise _refused(workspace, tree, f"it holds {name!r}, which its index does not "
                           "list as a tracked directory")
        trees[name] = entry.sha
    return roots, trees


def _checked_roots(workspace: ObjectSource, tree: bytes, index: object
                   ) -> dict[str, dict[str, str]]:
    if not isinstance(index, dict) or set(index) != {"format", "roots"}:
        raise _refused(workspace, tree, "its index must hold exactly 'format' and 'roots'")
    if index["format"] != 1 or isinstance(index["format"], bool):
        raise _refused(workspace, tree, f"its index has the format {index['format']!r}, "
                       "where this Kernos reads format 1: upgrade Kernos")
    listed = index["roots"]
    if not isinstance(listed, dict):
        raise _refused(workspace, tree, "its index's 'roots' is not an object")
    roots: dict[str, dict[str, str]] = {}
    for key, spec in listed.items():
        problem = component_problem(key) if key != INDEX else "the index's own name"
        if problem is not None:
            raise _refused(workspace, tree, f"the tracked directory key {key!r}: {problem}")
        if (not isinstance(spec, dict) or set(spec) != {"path", "base"}
                or not all(isinstance(value, str) for value in spec.values())):
            raise _refused(workspace, tree, f"the tracked directory {key!r} must be an "
                           "object of exactly a 'path' and a 'base', both strings")
        path, base = spec["path"], spec["base"]
        if base == "workspace":
            if key != OWN_ROOT or path != OWN_ROOT:
                raise _refused(workspace, tree, f"the tracked directory {key!r} is relative "
                               f"to the workspace ({path!r}): only its own files root "
                               f"{OWN_ROOT!r} is")
        elif base == "absolute":
            if (key == OWN_ROOT or "\0" in path or not path.startswith("/")
                    or os.path.normpath(path) != path or path == "/"):
                raise _refused(workspace, tree, f"the tracked directory {key!r} names "
                               f"{path!r}, which is not a normalised absolute directory "
                               "other than / (or it is the files root's key)")
        else:
            raise _refused(workspace, tree, f"the tracked directory {key!r} has the base "
                           f"{base!r}: only 'workspace' and 'absolute' are known")
        roots[key] = {"path": path, "base": base}
    if OWN_ROOT not in roots:
        raise _refused(workspace, tree, f"its index does not list the workspace's own "
                       f"files root {OWN_ROOT!r}")
    return roots


def _tree(workspace: ObjectSource, sha: bytes) -> list[TreeEntry]:
    try:
        kind, data = workspace.read_object(sha)
    except (KeyError, ValueError, FileNotFoundError) as error:
        raise WorkspaceCorrupt(str(workspace.path), f"the tree {sha.hex()[:12]} of tracked "
                               f"files is missing ({error})") from None
    if kind != b"tree":
        raise WorkspaceCorrupt(str(workspace.path), f"{sha.hex()} is a {kind.decode()}, "
                               "not a tree of tracked files")
    try:
        return decode_tree(data)
    except (ValueError, UnicodeDecodeError) as error:  # truncated, or a name not UTF-8
        raise WorkspaceCorrupt(str(workspace.path), f"the tree {sha.hex()[:12]} of tracked "
                               f"files cannot be read ({error})") from None
