"""The tracked directories of one image, and the participant that moves them with each op.

:class:`TrackedFiles` is what the image holds (``Image.files``): the list of
tracked directories and, for each, what the last commit stored
(:class:`~kernos.files.contents.Contents`) with the stat key of every file
when its bytes were last read.  :class:`FilesParticipant` joins every op
(``Image.begin``); the image's own participant drives it at the two
moments only it knows:

* while it writes the snapshot, :meth:`FilesParticipant.prepare` looks at
  every tracked directory, stores what changed through the same writer,
  into the same batch of objects, and hands back the ``files/`` tree the
  snapshot's root tree takes;
* once the branch moved (the commit point), :meth:`FilesParticipant.published`
  makes what it prepared the committed state.

A rollback (its ``abort``) puts every directory tracked when the op began
back as the last commit holds it: files the op created are removed, the
ones it changed or deleted are written back (:func:`contents.write_back`,
all or nothing each), directories it made are removed if empty.  A restore
at open (:meth:`TrackedFiles.restore`) does the same against the head
snapshot, which is what makes a ``kill -9`` in the middle of an op safe;
it compares by content, since no stat key is trusted across processes.
Only directories this machine may write take part (:meth:`TrackedFiles.is_local`,
:mod:`kernos.files.here`): the others are kept in every snapshot as the history
has them, and never touched.
"""

from __future__ import annotations

import contextlib
import os
import stat
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from kernos.errors import WorkspaceCorrupt
from kernos.files import contents as stored_files
from kernos.files.contents import OWN_ROOT, Contents, StillWriting, Unreadable
from kernos.files.here import add_here, read_here
from kernos.files.paths import PathRefused, tracked_directory
from kernos.files.scan import Key, Listing, is_racy, key_of, scan
from kernos.files.watch import Watcher
from kernos.store.snapshots import ChunkCache, SnapshotWriter
from kernos.store.workspace import Workspace
from kernos.transaction import Transaction

__all__ = ["OWN_ROOT", "FilesParticipant", "Prepared", "TrackedFiles", "current"]

_current: weakref.ReferenceType[TrackedFiles] | None = None


def current() -> TrackedFiles | None:
    """The tracked files of the image made last in this process (a kernel has one)."""
    return _current() if _current is not None else None


@dataclass(kw_only=True)
class Committed:
    """One tracked directory as the last commit left it."""

    contents: Contents = field(default_factory=Contents)
    keys: dict[str, Key] = field(default_factory=dict)
    """Stat keys of files known to hold what ``contents`` says (read, written or compared)."""
    racy: set[str] = field(default_factory=set)
    """Files whose key is not trusted yet (see ``kernos.files.scan``)."""
    found: dict[str, Key] | None = None
    """In a workspace with no snapshot yet: the files its files root held at open, which
    no commit holds, so a rollback cannot put them back; it leaves them as long as
    their key is the same."""


@dataclass(kw_only=True)
class Prepared:
    """What a commit found and stored, adopted once it is published."""

    tree: bytes | None
    roots: dict[str, dict[str, str]]
    committed: dict[str, Committed]
    changes: dict[str, list[str]]
    learned: list[tuple[bytes, bytes]]


class TrackedFiles:
    """The tracked directories of one image and what its head snapshot holds of them."""

    def __init__(self, workspace: Workspace, cache: ChunkCache) -> None:
        global _current
        self.workspace = workspace
        self.cache = cache
        """The image's chunk cache (the snapshot writer's): known chunks are not hashed."""
        self.roots = _own_root()
        self.committed_roots = _own_root()
        """The tracked directories the head snapshot lists."""
        self.committed: dict[str, Committed] = {}
        self.tree: bytes | None = None
        """The head snapshot's ``files/`` tree (None: it has none)."""
        self.watchers: dict[str, Watcher] = {}
        """Per tracked directory (its absolute path): its listing, kept by inotify."""
        self.reported: set[tuple[str, str]] = set()
        """(path, why) already told to the human: each is told once per process."""
        self.here = read_here(workspace.path)
        """The absolute directories tracked on this machine (``kernos.files.here``): the
        only ones outside the workspace that are ever written."""
        self.accepting: set[str] = set()
        """Absolute directories the running op tracks: recorded here once it commits."""
        self.carry: dict[str, Committed] = {}
        """Directories not tracked here that the running op's checkout changed: what its
        snapshot keeps of them."""
        self.foreign_notices: list[str] = []
        """What the next commit's report tells of directories not tracked here."""
        self.outside_allowed = True
        """Whether :meth:`track` may take a directory outside the workspace (a replay's
        image may not: ``kernos.replay.files``)."""
        previous = current()
        if previous is not None:  # one image at a time keeps inotify instances (see watch)
            for watcher in previous.watchers.values():
                watcher.close()
        _current = weakref.ref(self)

    # -- where --------------------------------------------------------------------

    def directory(self, key: str) -> Path:
        spec = self.roots[key]
        if spec["base"] == "workspace":
            return self.workspace.path / spec["path"]
        return Path(spec["path"])

    def root(self) -> Path:
        """The workspace's own files root (made if missing)."""
        path = self.directory(OWN_ROOT)
        path.mkdir(exist_ok=True)
        return path

    def track(self, path: str | os.PathLike[str]) -> str:
        """Track the directory ``path`` from the running op on; its key.  A directory the
        image lists but that was tracked elsewhere (see :meth:`is_local`) is accepted: the
        op's commit records what it holds here, and from then on it moves with the ops."""
        absolute = tracked_directory(path, self.workspace.path)
        if not self.outside_allowed and absolute.resolve() != self.root().resolve():
            raise PathRefused(os.fspath(path), "this image (a replay's) writes only its own "
                              "workspace's files root; directories outside it are left as "
                              "the history has them")
        for key in self.roots:
            if self.directory(key).resolve() == absolute.resolve():
                if self.roots[key]["base"] == "absolute":
                    self.accepting.add(self.roots[key]["path"])
                return key
        for key in self.roots:
            other = self.directory(key).resolve()
            if other in absolute.resolve().parents or absolute.resolve() in other.parents:
                raise PathRefused(os.fspath(path), f"it overlaps the tracked directory {other}")
        key = base = absolute.name or "root"
        number = 1
        while key in self.roots:
            number += 1
            key = f"{base}~{number}"
        self.roots[key] = {"path": str(absolute), "base": "absolute"}
        self.accepting.add(str(absolute))
        return key

    def is_local(self, key: str) -> bool:
        """Whether tracked directory ``key`` may be written here: the workspace's own files
        root, or an absolute directory tracked on this machine (``kernos.files.here``) or
        by the running op.  Any other came with a snapshot from elsewhere: it is left
        alone, and the snapshots keep it as the history has it."""
        spec = self.roots[key]
        return spec["base"] == "workspace" or (self.outside_allowed and (
            spec["path"] in self.here or spec["path"] in self.accepting))

    def _foreign(self, key: str) -> None:
        path = self.roots[key]["path"]
        why = "tracked elsewhere"
        if (path, why) not in self.reported:
            self.reported.add((path, why))
            self.foreign_notices.append(
                f"{path}: tracked in another workspace or on another machine, so it is left "
                "alone here (neither restored nor looked at; the history keeps it as it "
                f"was): run `%kernos track {path}` to track it here")

    def untrack(self, path: str | os.PathLike[str]) -> bool:
        """Stop tracking ``path`` (its files stay on disk); whether it was tracked."""
        absolute = Path(os.path.abspath(os.fspath(path))).resolve()
        for key in list(self.roots):
            if key != OWN_ROOT and self.directory(key).resolve() == absolute:
                del self.roots[key]
                return True
        return False

    # -- restore and checkout -----------------------------------------------------

    def load(self, tree: bytes | None, commit: bytes | None = None
             ) -> tuple[dict[str, dict[str, str]], dict[str, Committed]]:
        """The tracked directories ``tree`` lists, and each as committed state (no stat
        keys), checked whole before anything is written (``kernos.files.contents``): a
        :class:`~kernos.errors.WorkspaceCorrupt` naming ``commit`` and the problem."""
        if tree is None:
            return _own_root(), {}
        try:
            roots, trees = stored_files.read_index(self.workspace, tree)
            loaded = {key: Committed(contents=stored_files.read_contents(self.workspace, sha))
                      for key, sha in trees.items()}
            for key, state in loaded.items():
                spec = roots[key]
                if spec["base"] == "workspace" or spec["path"] in self.here | self.accepting:
                    place = (str(self.workspace.path / spec["path"])
                             if spec["base"] == "workspace" else spec["path"])
                    stored_files.check_links(self.workspace, state.contents, place)
        except WorkspaceCorrupt as error:
            named = f"snapshot {commit.hex()[:12]}" if commit is not None else "a snapshot"
            raise WorkspaceCorrupt(
                str(self.workspace.path), f"{named}'s tracked files were refused, and no "
                f"tracked file was changed: {error.problem}") from None
        return roots, loaded

    def restore(self, tree: bytes | None, *, has_head: bool = True,
                commit: bytes | None = None) -> list[str]:
        """Make the tracked directories hold what the head's ``files/`` tree holds (before
        any op runs); what had to be put back.  A workspace without a snapshot yet puts
        nothing back: its first op commits what its files root holds.  Directories not
        tracked here are left alone (reported by the next commit)."""
        self.roots, self.committed = self.load(tree, commit)
        self.committed_roots = dict(self.roots)
        self.tree = tree
        notes: list[str] = []
        for key in self.roots:
            state = self.committed.setdefault(key, Committed())
            if not self.is_local(key):
                self._foreign(key)
            elif has_head:
                notes += self.put_back(key, state)
            else:
                state.found = dict(scan(str(self.directory(key))).entries)
        return notes

    def check_out(self, tree: bytes | None, commit: bytes | None = None) -> list[str]:
        """Make the tracked directories hold what an older snapshot's ``files/`` tree holds
        (a checkout, inside an op: its commit records them, its rollback undoes it).
        Directories not tracked here are left alone; the op's snapshot keeps them as the
        older one has them."""
        before = dict(self.roots)
        roots, wanted = self.load(tree, commit)  # checked whole: nothing changed if refused
        self.roots = roots
        notes: list[str] = []
        for key in self.roots:
            target = wanted.setdefault(key, Committed())
            if not self.is_local(key):
                self._foreign(key)
                self.carry[key] = target
                continue
            known = self.committed.get(key)
            if known is not None and before.get(key) == self.roots[key]:
                # Files the head holds as the target does, unchanged on disk, stay unread.
                target.keys = {path: key_ for path, key_ in known.keys.items()
                               if target.contents.files.get(path) == known.contents.files.get(path)}
                target.racy = set(known.racy)
            notes += self.put_back(key, target)
        return notes

    def put_back(self, key: str, committed: Committed) -> list[str]:
        """Make tracked directory ``key`` hold ``committed``; what it had to undo."""
        root = str(self.directory(key))
        watcher = self._watcher(root)
        listing = watcher.look()  # the op's own look: only what changed since is lstat'ed
        if listing.unreadable is not None:
            watcher.listing = None
            return [f"{root} could not be put back: {listing.unreadable}"]
        wanted = committed.contents
        if listing.missing:
            watcher.listing = None
            if not wanted.files and not wanted.dirs:
                return []
            os.makedirs(root, exist_ok=True)
            listing = watcher.look()
        undone: list[str] = []
        for path in sorted(set(listing.entries) - set(wanted.files), reverse=True):
            if committed.found is not None and committed.found.get(path) == (
                    listing.entries[path]):
                continue  # there before the first commit, as it was then: not the op's
            os.unlink(os.path.join(root, path))
            committed.keys.pop(path, None)
            undone.append(f"{self.shown(key, path)} (removed)")
        for path in sorted(listing.dirs - wanted.dirs, reverse=True):
            try:
                os.rmdir(os.path.join(root, path))
            except OSError:  # it still holds what is never tracked: left, as that is
                continue
        for path in sorted(wanted.dirs - listing.dirs):
            full = os.path.join(root, path)
            try:
                if not stat.S_ISDIR(os.lstat(full).st_mode):
                    os.unlink(full)  # a file, or a link left untracked: never followed
            except FileNotFoundError:
                pass
            os.makedirs(full, exist_ok=True)
        for path, stored in sorted(wanted.files.items()):
            found = listing.entries.get(path)
            full = os.path.join(root, path)
            if found is not None and committed.keys.get(path) == found and (
                    path not in committed.racy):
                continue
            if found is not None and stored_files.same_bytes(full, stored, self.cache):
                committed.keys[path] = found
                if is_racy(found, listing.taken_ns):
                    committed.racy.add(path)
                continue
            stored_files.write_back(full, stored, self.workspace)
            committed.keys[path] = key_of(os.lstat(full))
            committed.racy.add(path)  # just written: read once more by the next op
            undone.append(f"{self.shown(key, path)} ("
                          + ("changed" if found is not None else "deleted") + ")")
        return undone

    def _watcher(self, root: str) -> Watcher:
        watcher = self.watchers.get(root)
        if watcher is None:
            watcher = self.watchers[root] = Watcher(root)
        return watcher

    def shown(self, key: str, path: str) -> str:
        """A file as a person reads it: relative to the workspace's files root, or
        ``KEY:path`` in another tracked directory."""
        return path if key == OWN_ROOT else f"{key}:{path}"

    # -- commit -------------------------------------------------------------------

    def prepare(self, writer: SnapshotWriter) -> Prepared:
        """Look at every tracked directory; store what changed; the ``files/`` tree."""
        changes: dict[str, list[str]] = {"added": [], "changed": [], "deleted": [],
                                         "notices": list(self.foreign_notices)}
        learned: list[tuple[bytes, bytes]] = []
        committed: dict[str, Committed] = {}
        rebuild: list[tuple[Contents, set[str]]] = []
        for key in self.roots:
            if not self.is_local(key):  # kept as the history (or the checkout) has it
                committed[key] = self.carry.get(key) or self.committed.get(key) or Committed()
                if "" not in committed[key].contents.trees:
                    rebuild.append((committed[key].contents, {""}))
                continue
            before = self.committed.get(key) or Committed()
            after, dirty = self._look(key, before, writer, changes, learned)
            if (dirty or "" not in after.contents.trees) and after is before:
                # Trees are written into this op's batch: never into the committed state.
                after = Committed(contents=before.contents.copy(), keys=dict(before.keys),
                                  racy=set(before.racy))
            committed[key] = after
            if dirty or "" not in after.contents.trees:
                rebuild.append((after.contents, dirty))
        if self.roots == _own_root() and all(
                not state.contents.files and not state.contents.dirs
                for state in committed.values()):
            tree = None  # no file, nothing tracked but the files root: no files/ tree
        else:
            for contents, dirty in rebuild:
                stored_files.build_tree(writer, contents, dirty)
            if rebuild or self.carry or self.tree is None or (
                    self.roots != self.committed_roots):
                tree = stored_files.write_index(
                    writer, self.roots,
                    {key: state.contents.trees[""] for key, state in committed.items()})
            else:
                tree = self.tree
        return Prepared(tree=tree, roots=dict(self.roots), committed=committed,
                        changes={kind: paths for kind, paths in changes.items() if paths},
                        learned=learned)

    def _look(self, key: str, before: Committed, writer: SnapshotWriter,
              changes: dict[str, list[str]], learned: list[tuple[bytes, bytes]]
              ) -> tuple[Committed, set[str]]:
        root = str(self.directory(key))
        watcher = self._watcher(root)
        listing = watcher.look()
        if listing.missing or listing.unreadable is not None:
            watcher.listing = None  # looked at in full until it is back
            if before.contents.files or before.contents.dirs:
                why = listing.unreadable or "it vanished"
                self._notice(changes, root, f"the tracked directory {root} cannot be read "
                             f"({why}): the snapshot keeps it as the last commit had it")
            return before, set()
        self._refusals(key, listing, changes)
        if (listing.entries == before.keys and listing.dirs == before.contents.dirs
                and not before.racy):
            return before, set()  # the common case: nothing read, nothing written
        old = before.contents
        after = Committed(contents=Contents(dirs=set(listing.dirs), trees=dict(old.trees)))
        files = after.contents.files
        dirty: set[str] = set(listing.dirs ^ old.dirs)
        for path, found in listing.entries.items():
            previous = old.files.get(path)
            if previous is not None and before.keys.get(path) == found and (
                    path not in before.racy):
                files[path] = previous
                after.keys[path] = found
                continue
            try:
                stored, read_key = stored_files.store_entry(
                    os.path.join(root, path), found, writer, previous, learned)
            except StillWriting:
                self._notice(changes, self.shown(key, path), "it was still being written at "
                             "commit: the snapshot keeps it as the last commit had it")
                if previous is not None:
                    files[path] = previous
                continue
            except Unreadable as error:
                self._notice(changes, self.shown(key, path), f"it cannot be read "
                             f"({error.reason}): the snapshot keeps it as the last "
                             "commit had it")
                if previous is not None:
                    files[path] = previous
                continue
            files[path] = stored
            after.keys[path] = read_key
            if is_racy(read_key, listing.taken_ns):
                after.racy.add(path)
            if previous is None:
                changes["added"].append(self.shown(key, path))
                dirty.add(path)
            elif previous != stored:
                changes["changed"].append(self.shown(key, path))
                dirty.add(path)
        unlisted = tuple(path for path in listing.refused if path.endswith("/"))
        for path, previous in old.files.items():
            if path in files:
                continue
            if path in listing.refused or path.startswith(unlisted):
                # Not a file we can store any more, or in a directory that cannot be
                # listed: kept as it was.
                files[path] = previous
                continue
            changes["deleted"].append(self.shown(key, path))
            dirty.add(path)
        return after, _with_ancestors(dirty)

    def _refusals(self, key: str, listing: Listing, changes: dict[str, list[str]]) -> None:
        for path, why in listing.refused.items():
            self._notice(changes, self.shown(key, path), f"{why}: not tracked")

    def _notice(self, changes: dict[str, list[str]], path: str, why: str) -> None:
        if (path, why) not in self.reported:
            self.reported.add((path, why))
            changes["notices"].append(f"{path}: {why}")

    def adopt(self, prepared: Prepared) -> None:
        """The op that prepared this committed: it is the committed state now."""
        self.roots = prepared.roots
        self.committed_roots = dict(prepared.roots)
        self.committed = prepared.committed
        self.tree = prepared.tree
        self.cache.update(prepared.learned)
        self.carry.clear()
        self.foreign_notices.clear()
        accepted = {spec["path"] for spec in prepared.roots.values()} & self.accepting
        self.accepting.clear()
        if accepted - self.here:
            self.here |= accepted
            # Past the commit point, which never fails: kept for this process at least.
            with contextlib.suppress(OSError):
                add_here(self.workspace.path, accepted, durable=self.workspace.durable)

    def forget_op(self) -> None:
        """The running op rolled back: what it tracked or checked out is not kept."""
        self.accepting.clear()
        self.carry.clear()


def _own_root() -> dict[str, dict[str, str]]:
    return {OWN_ROOT: {"path": OWN_ROOT, "base": "workspace"}}


def _with_ancestors(paths: set[str]) -> set[str]:
    """The directories that hold ``paths``, up to the tracked one (``""``)."""
    dirty = {""}
    for path in paths:
        while path:
            path = path.rpartition("/")[0]
            dirty.add(path)
    return dirty


class FilesParticipant:
    """Moves the tracked directories with one op (see the module docstring)."""

    def __init__(self, files: TrackedFiles) -> None:
        self.files = files
        self.roots = {key: dict(spec) for key, spec in files.roots.items()}
        """The directories tracked when the op began: what a rollback puts back."""
        self.prepared: Prepared | None = None
        self.undone: list[str] = []
        """What the rollback put back (for the op's abort report)."""

    def sort_key(self) -> str:
        return "kernos.files"

    def prepare(self, writer: SnapshotWriter) -> Prepared:
        self.prepared = self.files.prepare(writer)
        return self.prepared

    def changed_tree(self) -> bool:
        """Whether the prepared ``files/`` tree differs from the head's."""
        return self.prepared is not None and self.prepared.tree != self.files.tree

    def published(self) -> None:
        """The op committed (the branch moved): what it stored is the committed state."""
        if self.prepared is not None:
            self.files.adopt(self.prepared)

    def tpc_begin(self, txn: Transaction) -> None:
        pass

    def commit(self, txn: Transaction) -> None:
        pass  # the image's participant calls prepare() while it writes the snapshot

    def tpc_vote(self, txn: Transaction) -> None:
        pass

    def tpc_finish(self, txn: Transaction) -> None:
        pass  # published() is called after the branch moved

    def tpc_abort(self, txn: Transaction) -> None:
        self.prepared = None

    def abort(self, txn: Transaction) -> None:
        files = self.files
        files.roots = self.roots
        files.forget_op()
        for key in self.roots:
            if not files.is_local(key):
                continue  # never written by this op: left alone
            state = files.committed.setdefault(key, Committed())
            self.undone += files.put_back(key, state)
