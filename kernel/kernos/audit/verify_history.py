"""The history half of :func:`kernos.audit.verify.verify`: snapshots, prunes, objects.

:class:`HistoryChecks` checks the snapshots the committed records name
against the records (manifest, binding of the chain, parents), the branch
against the records (nothing rewritten, nothing committed without a record),
and re-hashes every object those snapshots reach.  Prune records
(``kernos prune``, :mod:`kernos.audit.pruning`) are followed: a record whose
snapshot a later prune deleted verifies by the chain alone, and a snapshot a
prune renamed is checked at its new id, whose bytes must hash to the old id
once its old parent is put back.  :class:`Checks` is the state both halves
share; ``verify.py`` reads the chain into it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from kernos.audit.pruning import Prunes, Pruning
from kernos.audit.report import Problem
from kernos.audit.suffix import Suffix
from kernos.errors import KernosError
from kernos.store.objects import CommitData, decode_commit, decode_tree, object_id
from kernos.store.retention import with_parent
from kernos.store.snapshots import MANIFEST

__all__ = ["Checks", "HistoryChecks", "HistorySource", "ObjectSource"]


class ObjectSource(Protocol):
    """Where the checks read objects from: a workspace's ``ObjectStore``, or a view of
    objects not in the workspace yet (a pull's, before it lands)."""

    @property
    def journal(self) -> Path:
        """The file that names a half-written batch (``unpublished``)."""

    def read(self, sha: bytes) -> tuple[bytes, bytes]: ...


class HistorySource(Protocol):
    """What the checks read: a :class:`~kernos.store.workspace.Workspace`, or a candidate
    that looks like one (what a pull would make of it: ``kernos.remote.pull``)."""

    @property
    def path(self) -> Path: ...

    @property
    def objects(self) -> ObjectSource: ...

    def head(self) -> bytes | None: ...

    def read_object(self, sha: bytes) -> tuple[bytes, bytes]: ...

    def read_commit(self, sha: bytes) -> CommitData: ...

    def history(self, start: bytes | None = None) -> Iterator[tuple[bytes, CommitData]]: ...

_UNKNOWN = "?"
"""A commit not known (with ``since``, before a record says): no commit id is ``?``."""


class Checks:
    """What verify has read and found so far."""

    def __init__(self, workspace: HistorySource) -> None:
        self.workspace = workspace
        self.problems: list[Problem] = []
        self.records: list[dict[str, Any] | None] = []
        self.hashes: list[str] = []
        self.seen_objects: set[bytes] = set()
        self.commits = 0
        self.adopted = 0
        """Snapshots of the history the genesis adopts (a fork's source's, up to its REF;
        or history from before the log), checked with it."""
        self.base = 0
        """The index of ``records[0]`` (the anchor's, with ``since``)."""
        self.since: int | None = None
        """With ``since``: the anchor's index; the range verified starts after it."""
        self.suffix: Suffix | None = None
        self.prunes = Prunes(())
        self.pruned_records: dict[int, int] = {}
        """Prune record -> committed op records in the range whose snapshot it deleted."""
        self.unfinished: str | None = None
        """The newest op record, if it names a commit that was never published."""
        self.known_head: str | None = _UNKNOWN
        """With ``since``: the branch as the records up to the anchor left it, when the
        caller knows it (None: empty); ``_UNKNOWN`` otherwise."""

    def bad(self, index: int, what: str) -> None:
        self.problems.append(Problem(index=index, what=what))

    @property
    def end(self) -> int:
        """The index after the newest record read."""
        return self.base + len(self.records)

    @property
    def first(self) -> int:
        """The first record in the range verified."""
        return 0 if self.since is None else self.since + 1

    def in_range(self) -> list[tuple[int, dict[str, Any] | None]]:
        """(index, record) of every record in the range verified."""
        skip = self.first - self.base
        return [(self.base + skip + position, record)
                for position, record in enumerate(self.records[skip:])]

    def record_at(self, index: int) -> dict[str, Any] | None:
        position = index - self.base
        return self.records[position] if 0 <= position < len(self.records) else None


class HistoryChecks(Checks):
    """The checks of the snapshots, the branch and the objects (see the module docstring)."""

    # -- snapshots and history -------------------------------------------------------------

    def snapshots(self, check_objects: bool) -> None:
        voided = {record.get("voids") for _index, record in self.in_range()
                  if record is not None and record.get("type") == "void"}
        self._voids()
        self.prunes = prunes = Prunes(
            (index, record) for index, record in self.in_range()
            if record is not None and record.get("type") == "prune" and index not in voided)
        for index in prunes.malformed:
            self.bad(index, "it is a malformed prune record (it does not say which commits it "
                            "pruned and rewrote)")
        # ``head``: the branch as it stood after each record, in the commit ids of that
        # time (_UNKNOWN with ``since`` until a record says); ``current``: the id *now*
        # of the newest snapshot kept so far (prunes after it may have renamed it).
        head: str | None = _UNKNOWN
        current: str | None = _UNKNOWN
        previous_index = self.base
        if self.since is None:
            genesis = self.records[0] if self.records else None
            adopted = genesis.get("adopts") if genesis is not None else None
            head = current = adopted if isinstance(adopted, str) else None
            if head is not None:
                current, _by = prunes.resolve(head, 0)
                if current is None:  # the history from before the log was pruned
                    current = _UNKNOWN
                else:
                    forked = genesis is not None and isinstance(genesis.get("forked_from"),
                                                                dict)
                    self._adoption(current, forked=forked)
                    if check_objects:
                        self._history_objects(current, 0)
        elif self.known_head is not _UNKNOWN:
            # The caller knows the branch as the records up to the anchor left it (a pull:
            # this workspace's own head, the anchor being its newest record).
            head = current = self.known_head
        else:
            anchor = self.records[0]
            committed = (anchor is not None and anchor.get("type") == "op"
                         and anchor.get("status") == "committed"
                         and isinstance(anchor.get("commit"), str))
            # The commit the next one must descend from is known only if the anchor
            # itself committed (the records before it are not read).
            if committed and self.since not in voided:
                assert anchor is not None
                head = str(anchor["commit"])
                now, _by = prunes.resolve(head, self.since)
                current = _UNKNOWN if now is None else now
        # A crash between an op's audit record and its commit point leaves the newest
        # committed record naming a commit that was never published (the branch is
        # not on it).  The next writable open voids it (AuditLog.recover); until then
        # it is an unfinished op, not tampering.
        branch = self.workspace.head()
        branch_hex = None if branch is None else branch.hex()
        newest = max((index for index, record in self.in_range()
                      if record is not None and index not in voided
                      and record.get("type") == "op" and record.get("status") == "committed"
                      and record.get("unchanged") is not True), default=None)
        for index, record in self.in_range():
            if record is None or index in voided:
                continue
            if record.get("type") == "prune":
                pruning = prunes.at(index)
                if pruning is not None:
                    head, current = self._prune(index, pruning, head, current)
                    previous_index = index
                continue
            if record.get("type") != "op" or record.get("status") != "committed":
                continue
            commit = record.get("commit")
            if record.get("unchanged") is True:  # it changed nothing and wrote no snapshot
                if head != _UNKNOWN and commit != head:
                    self.bad(index, f"it changed nothing, so it must name the last snapshot "
                                    f"{(head or 'nothing')[:12]}, not {str(commit)[:12]}")
                continue
            if not isinstance(commit, str):
                self.bad(index, "a committed op without a commit id")
                continue
            now, by = prunes.resolve(commit, index)
            if now is None:  # deleted by a prune: this record verifies by the chain alone
                assert by is not None
                self.pruned_records[by] = self.pruned_records.get(by, 0) + 1
                head, previous_index = commit, index
                continue
            if (index == newest and commit != branch_hex and by is None
                    and unpublished(self.workspace, commit)):
                self.unfinished = (
                    f"record {index} (op {record.get('op')}) names the commit {commit[:12]}, "
                    "which was never published: the process died before its commit point "
                    "(or is committing it now); the next kernel or writable command to open "
                    "the workspace voids it")
                continue
            self.commits += 1
            self._snapshot(index, record, commit, now, by, head, current, check_objects)
            head, current, previous_index = commit, now, index
        if head == _UNKNOWN:
            self._unrecorded_after_anchor(branch_hex)
        elif current != _UNKNOWN and branch_hex != current:
            self._head_mismatch(branch_hex, current, previous_index)

    def _prune(self, index: int, pruning: Pruning, head: str | None,
               current: str | None) -> tuple[str | None, str | None]:
        """Check a prune record against the branch before it; (head, current) after it."""
        if head != _UNKNOWN and pruning.source != head:
            self.bad(index, f"it prunes the history from {pruning.source[:12]}, but the records "
                            f"before it leave the branch at {(head or 'nothing')[:12]}")
        if pruning.moves(pruning.source) != pruning.target:
            self.bad(index, "its new head is not what it made of its old head (HEAD is always "
                            "kept): the record was forged")
        now, _by = self.prunes.resolve(pruning.target, index)
        if now is None:
            return pruning.target, _UNKNOWN
        if current != _UNKNOWN and now != current:
            self.bad(index, f"the snapshot it kept as HEAD is {now[:12]} now, but the newest "
                            f"snapshot kept before it is {(current or 'none')[:12]}")
        return pruning.target, now

    def _snapshot(self, index: int, record: dict[str, Any], commit: str, now: str,
                  by: int | None, head: str | None, current: str | None,
                  check_objects: bool) -> None:
        """Check one committed op's snapshot: ``commit`` as recorded, ``now`` its id now."""
        renamed = "" if by is None else f" ({now[:12]} since the prune record {by})"
        try:
            kind, raw = self.workspace.read_object(bytes.fromhex(now))
            if kind != b"commit":
                raise ValueError(kind)
            data = decode_commit(raw)
        except (KernosError, ValueError):
            self.bad(index, f"its snapshot commit {commit[:12]}{renamed} is missing or "
                            "unreadable")
            return
        parent = data.parents[0].hex() if data.parents else None
        if now == commit:
            if head != _UNKNOWN and parent != head:
                self.bad(index, f"its commit {commit[:12]} has the parent "
                                f"{(parent or 'none')[:12]}, but the op recorded before it "
                                f"committed {(head or 'nothing')[:12]} (the history was "
                                "rewritten)")
        else:
            # A prune changes only the parent line: with the old parent put back, the
            # new commit's bytes must hash to the id this record names.
            if head != _UNKNOWN and object_id(
                    b"commit", with_parent(raw, head)) != bytes.fromhex(commit):
                self.bad(index, f"its snapshot {commit[:12]} was rewritten by the prune record "
                                f"{by} as {now[:12]}, which is not the same snapshot (its tree, "
                                "author, time or message differ)")
            if current != _UNKNOWN and parent != current:
                self.bad(index, f"its snapshot{renamed} has the parent "
                                f"{(parent or 'none')[:12]}, but the snapshot kept before it "
                                f"is {(current or 'none')[:12]} (the history was rewritten "
                                "after the prune)")
        manifest = self._manifest(index, data.tree)
        if manifest is not None:
            self._agrees(index, record, manifest)
        if check_objects:
            self._objects(bytes.fromhex(now), index, "commit")

    def _adoption(self, commit: str, *, forked: bool = False) -> None:
        """A genesis may adopt only history that was never audited (it predates the log),
        or, for a fork, the source's audited history (its origin is checked apart)."""
        try:
            data = self.workspace.read_commit(bytes.fromhex(commit))
        except (KernosError, ValueError):
            self.bad(0, f"it adopts the commit {commit[:12]}, which is missing")
            return
        try:
            self.adopted = sum(1 for _snapshot in self.workspace.history(bytes.fromhex(commit)))
        except KernosError as error:
            self.bad(0, f"the history it adopts is unreadable ({error})")
        if forked:
            return
        manifest = self._manifest(0, data.tree)
        if manifest is not None and isinstance((manifest.get("facts") or {}).get("audit"), dict):
            self.bad(0, f"it adopts {commit[:12]} as history from before the log, but that "
                        "snapshot was audited: the audit log was deleted and started afresh")

    def _voids(self) -> None:
        """A void is true only for a commit that never became visible (it does not exist)."""
        for index, record in self.in_range():
            if record is None or record.get("type") != "void":
                continue
            target = record.get("voids")
            voided = None
            if type(target) is int and self.base <= target < index:
                voided = self.record_at(target)
            elif type(target) is int and 0 <= target < self.base and self.suffix is not None:
                found = self.suffix.before(target)  # before the anchor: read for this alone
                voided = None if found is None else found.record
            if voided is not None and voided.get("type") == "prune":
                # True or harmless: without the prune its renames do not apply, so a
                # snapshot it did delete is reported missing.
                continue
            if voided is None or voided.get("type") != "op" or voided.get(
                    "status") != "committed":
                self.bad(index, f"it voids {target!r}, which is not an earlier committed op "
                                "or prune")
                continue
            commit = voided.get("commit")
            try:
                self.workspace.read_commit(bytes.fromhex(str(commit)))
            except (KernosError, ValueError):
                continue
            self.bad(index, f"it voids op {voided.get('op')}, but that op's commit "
                            f"{str(commit)[:12]} exists: the op did happen (a forged void)")

    def _head_mismatch(self, head: str | None, expected: str | None, last: int) -> None:
        ahead = []
        if head is not None:
            for sha, _commit in self.workspace.history(bytes.fromhex(head)):
                if sha.hex() == expected:
                    break
                ahead.append(sha.hex())
            else:
                if expected is not None:
                    self.bad(last, f"the branch points at {head[:12]}, which does not descend "
                                   f"from this record's commit {expected[:12]} (the history "
                                   "was rewritten or reset)")
                    return
        if head is None:
            self.bad(last, "the history's branch is gone")
            return
        self.bad(self.end,
                 f"{len(ahead)} snapshot(s) after record {last}'s commit have no audit record "
                 f"(newest {head[:12]}): records were truncated or deleted")

    def _unrecorded_after_anchor(self, head: str | None) -> None:
        """Without a known last commit: no snapshot may say it was committed after the anchor."""
        assert self.since is not None
        if head is None:
            return
        ahead = 0
        try:
            for _sha, commit in self.workspace.history(bytes.fromhex(head)):
                bound = _bound_index(self.workspace, commit.tree)
                if bound is None or bound <= self.since:
                    break
                ahead += 1
        except KernosError as error:
            self.bad(self.end, f"the history after the anchor is unreadable ({error})")
            return
        if ahead:
            self.bad(self.end, f"{ahead} snapshot(s) committed after the anchored record "
                               f"{self.since} have no audit record (newest {head[:12]}): "
                               "records were truncated or deleted")

    def _manifest(self, index: int, tree: bytes) -> dict[str, Any] | None:
        try:
            _, data = self.workspace.read_object(tree)
            entries = {entry.name: entry.sha for entry in decode_tree(data)}
            _kind, raw = self.workspace.read_object(entries[MANIFEST])
            manifest: dict[str, Any] = json.loads(raw)
            return manifest
        except (KernosError, KeyError, ValueError):
            self.bad(index, "its snapshot's manifest is unreadable")
            return None

    def _agrees(self, index: int, record: dict[str, Any], manifest: dict[str, Any]) -> None:
        for key in ("op", "principal"):
            if manifest.get(key) != record.get(key):
                self.bad(index, f"its {key} {record.get(key)!r} differs from its snapshot's "
                                f"{manifest.get(key)!r}")
        if record.get("changes") is not None and manifest.get("changes") != record["changes"]:
            self.bad(index, "its changes differ from its snapshot's")
        binding = (manifest.get("facts") or {}).get("audit")
        if not isinstance(binding, dict):
            self.bad(index, "its snapshot does not bind the audit chain")
            return
        if binding.get("index") != index:
            self.bad(index, f"its snapshot was committed as record {binding.get('index')!r}")
        start = binding.get("from")
        bound = binding.get("hashes")
        if type(start) is not int or type(bound) is not list:
            self.bad(index, "its snapshot's binding of the chain is malformed")
            return
        for offset, expected in enumerate(bound):
            position = start + offset
            if position < self.base:
                continue  # before the anchor: not read
            if position >= self.end or self.hashes[position - self.base] != expected:
                self.bad(position, f"its hash differs from the one record {index}'s snapshot "
                                   "bound when it committed (the record was rewritten)")
                return

    def _history_objects(self, commit: str, index: int) -> None:
        try:
            for sha, _data in self.workspace.history(bytes.fromhex(commit)):
                self._objects(sha, index, "commit")
        except KernosError as error:
            self.bad(index, f"the history it adopts is unreadable ({error})")

    def _objects(self, root: bytes, index: int, path: str) -> None:
        """Re-hash every object ``root`` reaches that no earlier snapshot reached, once each."""
        stack = [(root, path)]
        while stack:
            sha, where = stack.pop()
            if sha in self.seen_objects:
                continue
            self.seen_objects.add(sha)
            try:
                kind, data = self.workspace.objects.read(sha)
            except Exception as error:
                self.bad(index, f"the object {sha.hex()[:12]} ({where}) of its snapshot is "
                                f"unreadable ({type(error).__name__})")
                continue
            if object_id(kind, data) != sha:
                self.bad(index, f"the object {sha.hex()[:12]} ({where}) of its snapshot was "
                                "modified (its content no longer matches its id)")
                continue
            if kind == b"commit":
                stack.append((bytes.fromhex(data.split(b"\n", 1)[0].split(b" ")[1].decode()),
                              "tree"))
            elif kind == b"tree":
                try:
                    entries = decode_tree(data)
                except (ValueError, UnicodeDecodeError):
                    continue
                prefix = "" if where == "tree" else where + "/"
                stack.extend((entry.sha, prefix + entry.name) for entry in reversed(entries)
                             if entry.sha not in self.seen_objects)


def unpublished(workspace: HistorySource, commit: str) -> bool:
    """Whether ``commit`` was never published: it is not in the history, or it is the
    batch the pending journal says is half-written (its pack may be on disk; the next
    open deletes it: ``ObjectStore.recover``)."""
    try:
        kind, _raw = workspace.read_object(bytes.fromhex(commit))
    except (KernosError, ValueError):
        return True
    if kind != b"commit":
        return True
    try:
        lines = workspace.objects.journal.read_text(errors="replace").splitlines()
    except OSError:
        return False
    return f"commit {commit}" in lines


def _bound_index(workspace: HistorySource, tree: bytes) -> int | None:
    """The record index a snapshot's manifest says its op got, if it binds the chain."""
    try:
        _, data = workspace.read_object(tree)
        entries = {entry.name: entry.sha for entry in decode_tree(data)}
        _kind, raw = workspace.read_object(entries[MANIFEST])
        binding = (json.loads(raw).get("facts") or {}).get("audit")
    except (KernosError, KeyError, ValueError, AttributeError):
        return None
    index = binding.get("index") if isinstance(binding, dict) else None
    return index if type(index) is int else None
