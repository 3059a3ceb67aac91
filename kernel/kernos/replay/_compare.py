"""Comparing a replay with its source: snapshot against snapshot, and the environment.

:class:`Comparer` tells whether the replay's snapshot of an op equals the
source's.  Each group's state digest is :func:`kernos.replay.digest.state_digest`
of its values, cached per stored tree (a group whose tree is the same bytes
is loaded and digested once); a snapshot's digest combines its groups'.  The
tracked files compare by the id of the snapshot's ``files/`` tree (a hash of
every path, mode and byte), file by file when they differ
(:mod:`kernos.replay.files`).
When they differ, each name that differs is named with the first difference
in it (:mod:`kernos.replay.difference`).  :func:`environment_changed` names
the environment variables an op read whose values differ in the replay.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kernos.audit.canonical import canonical
from kernos.audit.log import AuditLog
from kernos.errors import UsageError
from kernos.image import Image
from kernos.replay.difference import describe_difference
from kernos.replay.digest import state_digest
from kernos.replay.files import file_differences
from kernos.replay.report import Divergence, Step
from kernos.store.snapshots import read_group, read_snapshot
from kernos.store.workspace import Workspace


class Comparer:
    """Compares snapshots of the replay's workspace (the source's history is fetched into it)."""

    def __init__(self, workspace: Workspace, image: Image) -> None:
        self.workspace = workspace
        self.image = image
        self._digests: dict[bytes, str] = {}
        """Stored group tree -> the state digest of its values."""

    def compare(self, step: Step, original: bytes, replayed: bytes) -> Divergence | None:
        """Fills in the two digests of the step; the divergence if they differ."""
        ours_snapshot = read_snapshot(self.workspace, replayed)
        theirs_snapshot = read_snapshot(self.workspace, original)
        ours, theirs = ours_snapshot.group_trees, theirs_snapshot.group_trees
        step.digest = self.snapshot_digest(replayed, ours)
        step.original = self.snapshot_digest(original, theirs)
        step.files = _hex(ours_snapshot.files_tree)
        step.original_files = _hex(theirs_snapshot.files_tree)
        if step.digest == step.original and step.files == step.original_files:
            return None
        names = self._differences(original, replayed) if step.digest != step.original else {}
        names.update(file_differences(self.workspace, theirs_snapshot.files_tree,
                                      ours_snapshot.files_tree))
        return Divergence(op=step.op, reason="the image differs from the original snapshot"
                          + (" (its tracked files)" if step.digest == step.original else ""),
                          names=names)

    def snapshot_digest(self, commit: bytes, trees: dict[str, bytes]) -> str:
        """The state digest of a snapshot: the digests of its groups, in key order."""
        parts = []
        for key in sorted(trees):
            tree = trees[key]
            if tree not in self._digests:
                values = self._load(commit, {key: tree})
                self._digests[tree] = state_digest(values)[0]
            parts.append([key, self._digests[tree]])
        return hashlib.sha256(canonical(parts)).hexdigest()

    def _load(self, commit: bytes, trees: dict[str, bytes]) -> dict[str, object]:
        groups = {key: read_group(self.workspace, key, tree) for key, tree in trees.items()}
        values, failed = self.image.load_groups(groups)
        if failed:
            raise UsageError(f"snapshot {commit.hex()[:12]} could not be loaded for comparison "
                             f"({', '.join(sorted(failed))})")
        return values

    def _differences(self, original: bytes, replayed: bytes) -> dict[str, str]:
        ours = self._load(replayed, read_snapshot(self.workspace, replayed).group_trees)
        theirs = self._load(original, read_snapshot(self.workspace, original).group_trees)
        found: dict[str, str] = {}
        for name in sorted(set(ours) | set(theirs)):
            if name not in theirs:
                found[name] = "only in the replay"
            elif name not in ours:
                found[name] = "missing from the replay"
            else:
                difference = describe_difference(theirs[name], ours[name], root=name)
                if difference is not None:
                    found[name] = difference
        return found


def _hex(tree: bytes | None) -> str | None:
    return None if tree is None else tree.hex()


def environment_changed(record: dict[str, Any], audit: AuditLog) -> dict[str, str]:
    """Variables the original op read that the replayed one saw otherwise (by SHA-256)."""
    original = {str(name): value for name, value in record.get("environ") or []}
    if not original:
        return {}
    ours: dict[str, Any] = {}
    for entry in reversed(audit.entries):
        if entry.type == "op" and entry.op == record.get("op"):
            ours = {str(name): value for name, value in audit.read(entry.index).get(
                "environ") or []}
            break
    return {name: ("unset now" if ours.get(name, value) is None else
                   "unset originally" if value is None else "another value")
            for name, value in original.items()
            if name in ours and ours[name] != value}
