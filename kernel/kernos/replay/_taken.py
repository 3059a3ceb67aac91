"""Replaying the harness ops whose recorded source holds no bytes: their changes are taken.

The checkpoint requests (:mod:`kernos.harness.checkpoint_requests`: LangGraph's
``KernosSaver`` stores each checkpoint as one op) and the file requests
(:mod:`kernos.harness.file_requests`) record as their op's source the action,
the ids, paths and sizes, never the bytes: those came from outside the image
(the framework's serializer, the harness client) and are only in the op's
snapshot.  So the replay cannot send such an op again, and does not run its
JSON as code: it *takes* the op's changes from the original, as a follow-up
op of kind ``effect`` takes each outcome from the effects journal.

The rule, for an op of kind ``harness`` whose source is a JSON object whose
``action`` is in :data:`TAKEN_ACTIONS` (an allowlist; any other harness op is
delivered as before):

* *Committed, with a snapshot.*  A new op of the same principal, kind
  ``harness`` and source (so the audit chain lines up as for every replayed
  op; the note is the original snapshot's) applies exactly what the original
  op changed, read from the original's snapshot of that op:

  - a checkpoint action: the image names under the principal's threads
    (``kernos:langgraph:PRINCIPAL:...``, :func:`~kernos.harness.checkpoint_requests.thread_name`)
    that the snapshot's manifest lists as added, changed or deleted (the
    kernel's own comparison of the image before and after the op, made at its
    commit): each added or changed one bound to its value in that snapshot,
    each deleted one unbound;
  - a file action: the files of the workspace's files root that differ between
    the op's snapshot and the one before it (its parent): each added or changed
    file written with the snapshot's bytes and mode
    (:func:`kernos.files.contents.write_back`), each deleted one removed, and
    the directories made or removed likewise.  They land in the replay's own
    files root (:mod:`kernos.replay.files`).

  Nothing outside that scope is applied: a name outside the principal's
  threads, or a file outside the files root, that the original op changed is
  left as it is, so the step's comparison (as for every op) names it.  (One
  such name: ``kernos:random``, stored when another thread of the kernel's
  process drew from ``random`` while the op was open, as LangGraph's checkpoint
  ids do when the graph runs in the image's own process; the graph belongs in
  a process of its own.)
* *Committed, changing nothing* (no snapshot: a read, a write already stored,
  a thread that does not exist): the new op applies nothing, and commits as
  an op that changed nothing.
* *Rolled back* (failed, denied, vetoed, interrupted) or *refused*: the new op
  changes nothing and ends as the original did, with its status and error
  (the driver already does so for ``conflict``, ``rejected`` and ``refused``).

Why take, not re-run: the bytes are not in the record, and the data is the
framework's or the client's, not something the image computes; what the
replay checks is that the image around these ops is reproduced, and every
step's snapshot is still compared with the original's.  An op whose snapshot
a prune deleted cannot be taken (what it stored is gone): it is reported as
not replayable; replay ``--from`` a snapshot after it.  The grants and
circuits are not asked again (the original's outcome says what they decided,
as breakers do not supervise a replay).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernos.analysis import Reach
from kernos.errors import KernosError, UsageError, WorkspaceCorrupt
from kernos.files.contents import OWN_ROOT, Contents, Stored, read_contents, read_index, write_back
from kernos.harness.checkpoint_fields import CHECKPOINT_CHANGES
from kernos.harness.checkpoint_requests import thread_name
from kernos.image import Image
from kernos.replay._source import Source
from kernos.store.snapshots import read_group, read_snapshot
from kernos.store.workspace import Workspace

__all__ = ["CHECKPOINT_ACTIONS", "FILE_ACTIONS", "TAKEN_ACTIONS", "Changes", "Taker",
           "taken_action"]

CHECKPOINT_ACTIONS = CHECKPOINT_CHANGES
"""The checkpoint requests that run as an op (put, writes, delete, copy, prune,
delete_runs): their pages' changes are taken."""
FILE_ACTIONS = frozenset({"files_write", "files_append", "files_delete", "files_read",
                          "files_exists", "files_list"})
"""The file requests (every one is an op; the reads change nothing): the files root's
changes are taken."""
TAKEN_ACTIONS = CHECKPOINT_ACTIONS | FILE_ACTIONS
"""The harness actions whose ops the replay takes from the original (the allowlist)."""


def taken_action(kind: str, code: str) -> str | None:
    """The action of a harness op the replay takes (one of :data:`TAKEN_ACTIONS`), or None."""
    if kind != "harness":
        return None
    try:
        data = json.loads(code)
    except ValueError:
        return None
    action = data.get("action") if isinstance(data, dict) else None
    return action if isinstance(action, str) and action in TAKEN_ACTIONS else None


@dataclass(kw_only=True)
class Changes:
    """What one taken op changes: names to bind or unbind, files to write or remove."""

    note: str = ""
    bind: dict[str, object] = field(default_factory=dict)
    unbind: list[str] = field(default_factory=list)
    write: dict[str, Stored] = field(default_factory=dict)
    """Path in the files root -> what the original's snapshot holds there."""
    delete: list[str] = field(default_factory=list)
    make_dirs: list[str] = field(default_factory=list)
    remove_dirs: list[str] = field(default_factory=list)


class Taker:
    """Re-does the ops of :data:`TAKEN_ACTIONS` in the replay's image from the source's
    snapshots (see the module docstring)."""

    def __init__(self, workspace: Workspace, image: Image, source: Source) -> None:
        self.workspace = workspace
        """The replay's workspace: the source's history is fetched into it."""
        self.image = image
        self.source = source

    def redo(self, record: dict[str, Any], code: str, action: str) -> tuple[str, str | None]:
        """Run the op again as taken; (how it ended, the new commit id)."""
        op = int(record["op"])
        status = str(record.get("status"))
        principal = str(record.get("principal") or "human")
        changes = Changes()
        if status == "committed" and record.get("unchanged") is not True:
            changes = self.changes(record, action, principal)
        replayed = self.image.begin(source=code, principal=principal, kind="harness",
                                    reach=Reach(frozenset()))
        replayed.note = changes.note
        replayed.key = record.get("key")
        if status != "committed":
            error = record.get("error") or {}
            replayed.abort(status=status, error=(str(error.get("kind", "")),
                                                 str(error.get("message", ""))))
            return status, None
        try:
            self.apply(changes)
        except BaseException:
            replayed.abort()
            raise
        try:
            report = replayed.commit()
        except KernosError as error:
            raise UsageError(f"op {op} ({action}) could not commit in the replay: {error}"
                             ) from None
        return "committed", report.commit

    # -- what the original changed --------------------------------------------------------

    def changes(self, record: dict[str, Any], action: str, principal: str) -> Changes:
        """What the original op changed in its scope, read from its snapshot."""
        op = int(record["op"])
        recorded = record.get("commit")
        if not isinstance(recorded, str):
            raise UsageError(f"op {op} ({action}) committed, but its audit record names no "
                             "snapshot to take its changes from")
        now, by = self.source.prunes.resolve(recorded, int(record.get("index", -1)))
        if now is None:
            raise UsageError(f"op {op} ({action}) stored bytes that only its snapshot held, "
                             f"and that snapshot was pruned (audit record {by}): replay "
                             "--from a snapshot after it")
        commit = bytes.fromhex(now)
        try:
            snapshot = read_snapshot(self.workspace, commit)
            changes = Changes(note=str(snapshot.manifest.get("note") or ""))
            if action in CHECKPOINT_ACTIONS:
                self._names(changes, commit, snapshot.manifest, snapshot.group_trees,
                            thread_name(principal, ""))
            else:
                parents = snapshot.data.parents
                before = (read_snapshot(self.workspace, parents[0]).files_tree
                          if parents else None)
                self._files(changes, before, snapshot.files_tree)
        except (WorkspaceCorrupt, KeyError) as error:
            raise UsageError(f"op {op} ({action}): its snapshot {now[:12]} cannot be read "
                             f"({error})") from None
        return changes

    def _names(self, changes: Changes, commit: bytes, manifest: dict[str, Any],
               trees: dict[str, bytes], prefix: str) -> None:
        listed = manifest.get("changes") or {}
        names: dict[str, dict[str, Any]] = manifest.get("names") or {}
        bound = sorted({name for kind in ("added", "changed") for name in listed.get(kind) or []
                        if name.startswith(prefix)})
        changes.unbind = sorted(name for name in listed.get("deleted") or []
                                if name.startswith(prefix))
        groups = {names[name]["group"] for name in bound}
        stored = {key: read_group(self.workspace, key, trees[key]) for key in sorted(groups)}
        values, failed = self.image.load_groups(stored)
        if failed:
            raise UsageError(f"snapshot {commit.hex()[:12]} could not be loaded "
                             f"({', '.join(sorted(failed))})")
        changes.bind = {name: values[name] for name in bound}

    def _files(self, changes: Changes, before: bytes | None, after: bytes | None) -> None:
        old, new = self._root(before), self._root(after)
        changes.write = {path: stored for path, stored in sorted(new.files.items())
                         if old.files.get(path) != stored}
        changes.delete = sorted(path for path in old.files if path not in new.files)
        changes.make_dirs = sorted(new.dirs - old.dirs)
        changes.remove_dirs = sorted(old.dirs - new.dirs, reverse=True)  # deepest first

    def _root(self, tree: bytes | None) -> Contents:
        """The files root as a snapshot's ``files/`` tree holds it."""
        if tree is None:
            return Contents()
        _roots, trees = read_index(self.workspace, tree)
        return read_contents(self.workspace, trees[OWN_ROOT]) if OWN_ROOT in trees else (
            Contents())

    # -- applying it, inside the replayed op ----------------------------------------------

    def apply(self, changes: Changes) -> None:
        for name, value in changes.bind.items():
            self.image.bind(name, value)
        for name in changes.unbind:
            with contextlib.suppress(KeyError):  # not there in the replay: compared after
                self.image.unbind(name)
        root = self.image.files.root()
        for path in changes.delete:
            _remove(root / path)
        for path in changes.remove_dirs:
            with contextlib.suppress(OSError):
                os.rmdir(root / path)  # one still holding files: the comparison names them
        for path in changes.make_dirs:
            (root / path).mkdir(parents=True, exist_ok=True)
        for path, stored in changes.write.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            write_back(str(root / path), stored, self.workspace)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
