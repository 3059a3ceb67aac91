"""Committing an op: what changed in the image, and the snapshot that stores it.

:class:`ImageParticipant` moves the image's snapshot history with each op
(:meth:`kernos.image.Image.begin` joins it to the op's transaction; it votes
last, since its publish, the branch moving, is the commit point).  At
commit, step by step:

1. *What changed?*  Names added, deleted or rebound are found by identity
   against the last commit.  Names the op's code could have mutated in place
   are its reach (see ``kernos.analysis``).  Everything else is untouched and
   keeps its stored group as is: no pickling, no hashing, no new objects.
2. *Pickle* the affected names one by one; when more than one is affected,
   note which objects each reaches, and store names that share objects as
   one group so identity survives a restore.  A stored group that the op
   rebound names of (a cell that makes a new figure and its axes, which
   share objects with each other and perhaps with the data they plot) is
   pickled once, whole, each name noted as its own owner: if its names still
   share objects with each other and with nothing else, that one dump is
   their group.  A rebound name's content hash is then the group's with its
   name (it is reported changed when its group's content changed); the
   others are pickled alone too, without recording, for their own hash.
   Otherwise the op pickles them one by one after all.
3. *Write* the new chunks, group trees, the tracked files that changed
   (``kernos.files``: its participant's ``prepare``), the manifest, the root
   tree and the commit object.  None of it is reachable yet.
4. *Publish*: move the branch ref (an atomic rename).  That is the commit
   point; the reply that says "committed" is sent only after it.

An op that changed nothing writes no snapshot.  Its abort is
:class:`kernos.image.rollback.Rollback`'s.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from typing import Any

from kernos import _faults, readonly
from kernos._time import utc_now
from kernos.analysis import Reach
from kernos.determinism import GeneratorParticipant
from kernos.errors import OpVetoed
from kernos.files import FilesParticipant
from kernos.image.rollback import ATOMIC, MISSING, Rollback
from kernos.image.state import GroupState, ImageState, NameMeta
from kernos.image.written import known_pieces
from kernos.op import CommitReport, Op
from kernos.serialize import segments
from kernos.serialize.kinds import carries_no_identity
from kernos.serialize.pickler import Pickled, SharingRecord
from kernos.serialize.summary import describe, type_name
from kernos.serialize.unpersisted import Unpersisted
from kernos.store.encoding import manifest_json
from kernos.store.snapshots import SnapshotWriter, StoredGroup, StoredPart, commit_message
from kernos.transaction import Transaction

__all__ = ["ImageParticipant"]


class _UnionFind:
    def __init__(self, items: list[str]) -> None:
        self.parent = {item: item for item in items}

    def find(self, item: str) -> str:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: str, b: str) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a != root_b:
            self.parent[max(root_a, root_b)] = min(root_a, root_b)

    def groups(self) -> list[list[str]]:
        found: dict[str, list[str]] = {}
        for item in self.parent:
            found.setdefault(self.find(item), []).append(item)
        return [sorted(members) for members in found.values()]


class ImageParticipant(Rollback):
    """Moves the image's snapshot history with the op."""

    def __init__(self, image: ImageState, op: Op, generators: GeneratorParticipant,
                 files: FilesParticipant) -> None:
        self.image = image
        self.op = op
        self.generators = generators
        """The op's random generators' participant: a rollback says whether it reset them."""
        self.files = files
        """The op's tracked files: stored in this snapshot (``kernos.files``)."""
        self.adopted: dict[str, tuple[StoredGroup, tuple[object, ...]]] = {}
        """Groups a checkout made the image hold, with the values loaded for them: a commit
        stores them as the old snapshot's own trees (see :meth:`Image.checkout`)."""
        self.adopted_meta: dict[str, NameMeta] = {}
        """The checked-out snapshot's facts about each of its names."""
        self.writer: SnapshotWriter | None = None
        self.commit_sha: bytes | None = None
        self._published = False
        self._state: dict[str, Any] = {}
        self._segmented: dict[str, segments.Segmented] = {}
        self._together: dict[tuple[str, ...], Pickled] = {}
        """Groups pickled once, whole, in this commit (see _pickle)."""
        self._name_baselines: dict[tuple[bytes, str], str] = {}
        """Image.name_baselines carried over to the groups this commit stores again."""
        """Values this commit stored in segments, as it cut them (see tpc_finish)."""
        self.unchanged = False
        """The op changed nothing: no snapshot is written (see _prepare)."""

    def sort_key(self) -> str:
        return "~kernos.image"  # votes last: its publish is the commit point

    # -- two-phase commit ------------------------------------------------------

    def tpc_begin(self, txn: Transaction) -> None:
        image = self.image
        self.writer = SnapshotWriter(image.workspace, image.cache)
        image.workspace.objects.begin()

    def commit(self, txn: Transaction) -> None:
        self._prepare()

    def tpc_vote(self, txn: Transaction) -> None:
        assert self.writer is not None and self.commit_sha is not None
        _faults.point("sealed")

    def tpc_finish(self, txn: Transaction) -> None:
        assert self.writer is not None and self.commit_sha is not None
        started = time.perf_counter()
        audit = self.image.audit
        if self.unchanged:
            # Nothing to publish: the objects the analysis wrote again are all stored
            # already (equal content, equal ids), and the head stays.
            self.image.workspace.objects.discard()
            audit.sync()
        else:
            self.writer.publish(self.commit_sha,
                                sync_with=[audit.sync_target] if audit.unsynced else [],
                                record=audit.last_line if audit.unsynced else b"")
        audit.unsynced = False
        self._published = True
        self.files.published()
        image = self.image
        image.head = self.commit_sha
        if not self.unchanged:
            image.head_op = self.op.id
        image.groups = self._state["groups"]
        image.group_of = {name: key for key, state in image.groups.items()
                          for name in state.stored.names}
        image.meta = self._state["meta"]
        image.committed = self._state["current"]
        affected = self._state["affected"]
        kept = {name: state for name, state in image.segmented.items()
                if name not in affected and image.committed.get(name) is state.value}
        image.segmented = {**kept, **self._segmented}
        image.unreset.clear()
        trees = {state.stored.tree for state in image.groups.values()}
        image.baselines = {tree: digest for tree, digest in image.baselines.items()
                           if tree in trees}
        image.name_baselines = {key: digest for key, digest in {
            **image.name_baselines, **self._name_baselines}.items() if key[0] in trees}
        image.unbaselined &= trees
        report = self._state["report"]
        report.timings_ms["publish"] = (time.perf_counter() - started) * 1000
        report.timings_ms["total"] = (time.perf_counter() - self.op.started) * 1000
        self.op.report = report

    def tpc_abort(self, txn: Transaction) -> None:
        if self.writer is not None and not self._published:
            self.image.workspace.objects.discard()

    def abort(self, txn: Transaction) -> None:
        # A rollback may reset containers in place from copies: the cut segments'
        # objects would no longer be the containers' own.
        self.image.segmented.clear()
        self.op.abort_report = self._rollback()
        self.op.abort_report.files = list(self.files.undone)

    # -- commit work -----------------------------------------------------------

    def _prepare(self) -> None:
        op = self.op
        image = self.image
        writer = self.writer
        assert writer is not None
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        current = image.persisted_names()
        committed = image.committed
        added = [name for name in current if name not in committed]
        deleted = [name for name in committed if name not in current]
        rebound = {name for name in current
                   if name in committed and current[name] is not committed[name]}
        reach = image.expand(op.reach, current)
        touched = set(current) if reach.everything else reach.names & current.keys()
        if not reach.everything:
            # Names the code only read, holding values that such reads cannot change
            # (kernos.readonly): neither re-pickled nor re-hashed.
            touched -= {name for name in touched
                        if name in committed and current[name] is committed[name]
                        and (type(current[name]) in readonly.IMMUTABLE
                             or (name in reach.reads
                                 and readonly.unchanged_by(current[name], reach.reads[name],
                                                           current)))}
        dirty = set(added) | rebound | touched

        final: dict[str, GroupState] = {}
        claimed: set[str] = set()
        for key, (stored, values) in self.adopted.items():
            names = set(stored.names)
            intact = all(current.get(name, MISSING) is value
                         for name, value in zip(stored.names, values, strict=True))
            if intact and not names & touched:
                final[key] = GroupState(stored=stored)
                claimed |= names
        gone = dirty | set(deleted)
        for key, state in image.groups.items():  # every group: cheap checks first
            stored_names = state.stored.names
            if claimed and not claimed.isdisjoint(stored_names):
                continue
            if gone.isdisjoint(stored_names) or (state.load_error is not None and all(
                    current.get(name, MISSING) is committed.get(name, MISSING)
                    for name in stored_names)):  # still the placeholders of a failed restore
                final[key] = state
                claimed.update(stored_names)
        # Loaded values the op reached but left as they were pickle to other bytes than
        # stored only as a restore makes them (see Image.baselines): keep their groups,
        # but only if nothing else is pickled, since whatever is pickled may have come to
        # share their objects, and sharing is found among the values pickled together.
        # Only when every group reached was loaded (not written by this session, whose
        # bytes match unless changed), so a commit rarely pickles anything twice.
        reached = {key: state for key, state in image.groups.items()
                   if key not in final and not set(state.stored.names) & claimed}
        if reached and all(
                (state.stored.tree in image.baselines or state.stored.tree in image.unbaselined)
                and all(current.get(name, MISSING) is committed.get(name, MISSING)
                        for name in state.stored.names) for state in reached.values()):
            claimed_names = {name for state in reached.values() for name in state.stored.names}
            if (not set(current) - claimed - claimed_names
                    and all(self._verdict(state) == "same" for state in reached.values())):
                final.update(reached)
                claimed |= claimed_names
        affected = sorted(name for name in current if name not in claimed)
        timings["analyze"] = (time.perf_counter() - clock) * 1000

        clock = time.perf_counter()
        reach = reach.without_uses(set(added) | rebound)
        individual, components = self._pickle(affected, current, reach, rebound)
        self._refuse_unstorable_system_state(individual)
        _faults.point("serialize")
        timings["serialize"] = (time.perf_counter() - clock) * 1000

        clock = time.perf_counter()
        new_parts: dict[str, tuple[Pickled, StoredGroup]] = {}
        unloadable: dict[str, str] = {}
        for members in components:
            if len(members) == 1:
                pickled = individual[members[0]]
            elif tuple(members) in self._together:
                pickled = self._together[tuple(members)]  # their one dump (see _pickle)
            else:
                pickled = image.serializer.dump([(name, current[name]) for name in members],
                                                op=op.id)
            if pickled.kinds:
                problem = image.serializer.would_not_load(pickled)
                if problem is not None:
                    unloadable.update(dict.fromkeys(members, problem))
            stored = writer.group(members, pickled, op=op.id, known=known_pieces(
                image, members[0], current[members[0]], reach.uses.get(members[0]), pickled)
                                  if len(members) == 1 else ())
            if len(members) == 1 and pickled.segmented is not None:
                for piece, part in zip(pickled.segmented.segments, stored.buffers, strict=True):
                    piece.part = part
                self._segmented[members[0]] = pickled.segmented
            final[stored.key] = GroupState(
                stored=stored, live_transients=[t.obj for t in pickled.transients])
            for name in members:
                new_parts[name] = (individual[name], stored)
        _faults.point("objects")
        looked = time.perf_counter()
        files = self.files.prepare(writer)  # the tracked files' changes, into this batch
        timings["files"] = (time.perf_counter() - looked) * 1000

        now = utc_now()  # one instant: each changed name's changed_at is its op's committed_at
        meta, changed = self._metadata(current, new_parts, final, rebound, now)
        report = CommitReport(
            op=op.id, commit="", principal=op.principal, kind=op.kind,
            added=sorted(added), changed=sorted(changed - set(added)), deleted=sorted(deleted),
            committed_at=now,
            unpersisted=self._new_transients(sorted(changed), new_parts) + [
                {"name": name, "path": name, "type_name": type_name(current[name]),
                 "reason": f"it would not load back from the snapshot ({problem})",
                 "op": op.id} for name, problem in sorted(unloadable.items())],
            reach="everything: " + reach.why if reach.everything else f"{len(touched)} names",
            failed=op.failure, files=files.changes,
        )
        manifest = {
            "format": 1,
            "op": op.id,
            "principal": op.principal,
            "kind": op.kind,
            "note": op.note,
            "committed_at": report.committed_at,
            "changes": {"added": report.added, "changed": report.changed,
                        "deleted": report.deleted},
        }  # and "names", each name's facts: encoded as they change (manifest_names)
        stored_changes = {kind: paths for kind, paths in files.changes.items()
                          if kind != "notices"}
        if stored_changes:
            manifest["files"] = stored_changes
        if op.facts:
            manifest["facts"] = op.facts
        if op.failure is not None:
            manifest["failed"] = op.failure
        sealed = op.sealed
        if sealed:
            manifest["sealed_for"] = sorted(sealed)
        self.op.report_draft = report
        self.unchanged = report.unchanged = self._changes_nothing(report, final)
        if self.unchanged:  # no snapshot: the image is still the head's
            assert image.head is not None
            self.commit_sha = image.head
            final, meta = image.groups, image.meta
            report.history_bytes = image.history_bytes()
        else:
            self.commit_sha = writer.commit(
                groups=[state.stored for state in final.values()],
                manifest=manifest_json(manifest, image.manifest_names(meta)),
                source=(_sealed_source(sealed) if sealed and op.source is not None
                        else op.source),
                parent=image.head,
                message=_message(op), author=f"{op.principal} <{op.principal}@kernos.invalid>",
                files_tree=files.tree,
            )
            timings["write"] = (time.perf_counter() - clock) * 1000
            report.bytes_written = writer.bytes_written
            report.history_bytes = image.history_grew(writer.bytes_written)
        op.commit_sha = self.commit_sha
        report.commit = self.commit_sha.hex()
        report.image_bytes = sum(state.stored.size for state in final.values())
        report.timings_ms = timings
        self._state = {"groups": final, "meta": meta, "current": current, "report": report,
                       "affected": set(affected)}

    def _changes_nothing(self, report: CommitReport, final: dict[str, GroupState]) -> bool:
        """Whether the op left the image exactly as the last snapshot holds it.

        Such an op writes no snapshot (its audit record says ``unchanged``): no
        name added, deleted or with other content, every group stored as the same
        tree, and nothing else for a manifest to say (a failure kept, a checkout,
        facts other than the audit binding).
        """
        op = self.op
        image = self.image
        if (image.head is None or report.added or report.changed or report.deleted
                or op.failure is not None or op.kind == "checkout" or self.adopted
                or set(op.facts) - {"audit"} or report.unpersisted
                or self.files.changed_tree()):
            return False
        trees = {key: state.stored.tree for key, state in final.items()}
        return trees == {key: state.stored.tree for key, state in image.groups.items()}

    def _refuse_unstorable_system_state(self, individual: dict[str, Pickled]) -> None:
        """Veto the op if a runtime name (``kernos:*``) would not be stored whole.

        The principals, grants, tools, subscribers and agent namespaces must
        come back after any restart: an op whose code left something in them
        that cannot be stored (agent code can, through a tool's module state or
        a handler's defaults) rolls back, naming what could not be stored.
        Placeholders of a failed restore are not news and do not veto.
        """
        lost = [transient for name, pickled in individual.items() if name.startswith("kernos:")
                for transient in pickled.transients
                if not transient.lossless and not isinstance(transient.obj, Unpersisted)]
        if not lost:
            return
        shown = "; ".join(f"{transient.path[:160]} ({transient.type_name}: "
                          f"{transient.reason[:160]})" for transient in lost[:3])
        reason = (f"what {self.op.principal!r} did left the runtime's own state unstorable: "
                  f"{shown} could not be stored, and kernos:* names must always persist "
                  "(a restart would lose the principals, grants, tools or subscribers)")
        self.op.veto(reason)
        raise OpVetoed(self.op.id, [reason])

    def _new_transients(self, names: list[str],
                        new_parts: dict[str, tuple[Pickled, StoredGroup]]) -> list[dict[str, Any]]:
        """What of ``names`` cannot be persisted and was not there before this op.

        A live object that a commit already reported (it is still the same
        object) and a placeholder a restore put there are not news.
        """
        found = [transient for name in names if name in new_parts
                 for transient in new_parts[name][0].transients
                 if not isinstance(transient.obj, Unpersisted)]
        if not found:
            return []
        known = {id(obj) for state in self.image.groups.values()
                 for obj in state.live_transients}
        return [dict(transient.info(), op=self.op.id) for transient in found
                if id(transient.obj) not in known]

    def _pickle(self, names: list[str], current: dict[str, object], reach: Reach,
                rebound: set[str]) -> tuple[dict[str, Pickled], list[list[str]]]:
        """Pickle each name alone, or a group rebound whole at once; find which names
        share objects."""
        serializer = self.image.serializer
        # Recording costs a Python call per object, so only values that can share
        # objects at all are recorded, and only if two or more of them are affected.
        shareable = {name for name in names
                     if type(current[name]) not in ATOMIC and not carries_no_identity(
                         current[name], serializer.is_by_value)}
        record = SharingRecord() if len(shareable) > 1 else None
        sharing = _UnionFind(names)
        individual: dict[str, Pickled] = {}
        self._together = {}
        joint = self._rebound_groups(set(names) & shareable, rebound, current) if record else []
        for members in joint:
            together = serializer.dump([(name, current[name]) for name in members],
                                       op=self.op.id, record=record)
            if set(together.owners_by_root) != set(members) or together.transients:
                return self._pickle(names, current, reach, set())  # one by one after all
            self._together[tuple(members)] = together
            for name in members:
                individual[name] = (replace(together, joint=tuple(members)) if name in rebound
                                    else serializer.dump([(name, current[name])], op=self.op.id))
                for other in together.owners_by_root[name]:
                    sharing.union(name, other)
        for name in names:
            if name in individual:
                continue
            pickled = None
            if segments.candidate(current[name]) and not name.startswith("kernos:"):
                pickled = self._segments(name, current[name], reach,
                                         record if name in shareable else None)
            if pickled is None:
                pickled = serializer.dump([(name, current[name])], op=self.op.id,
                                          record=record if name in shareable else None)
            individual[name] = pickled
            for other in pickled.touched_owners:
                sharing.union(name, other)
        groups = sharing.groups()
        if not self._together.keys() <= set(map(tuple, groups)):
            return self._pickle(names, current, reach, set())  # they no longer share alone
        return individual, groups

    def _rebound_groups(self, shareable: set[str], rebound: set[str],
                        current: dict[str, object]) -> list[list[str]]:
        """The stored groups of two or more names, all affected and shareable, that the
        op rebound names of."""
        image = self.image
        found = []
        for key in {image.group_of[name] for name in rebound if name in image.group_of}:
            members = sorted(image.groups[key].stored.names)
            if (len(members) > 1 and shareable.issuperset(members)
                    and not image.groups[key].live_transients
                    and not any(name.startswith("kernos:") or segments.candidate(current[name])
                                for name in members)):
                found.append(members)
        return sorted(found)

    def _segments(self, name: str, value: Any, reach: Reach,
                  record: SharingRecord | None) -> Pickled | None:
        """Pickle a big list or dict in segments (see ``kernos.serialize.segments``),
        again only where the op's code may have changed it; None to pickle it whole."""
        image = self.image
        serializer = image.serializer
        dump = segments.dump_with(lambda piece, own: serializer.dump(
            [(name, piece)], op=self.op.id, record=own))
        previous = image.segmented.get(name)
        state = segments.segment(value, dump, use=None if reach.everything
                                 else reach.uses.get(name), previous=previous)
        if state is None:
            return None
        stream, buffers = segments.joined_stream(state)
        owners: set[str] = set()
        if record is not None:
            owners = record.add(name, state.objects.values(), ids=state.objects.keys(),
                                roots=(value,), home=serializer.module_name)
        return Pickled(stream=stream, buffers=buffers, transients=[], code_refs=frozenset(),
                       touched_owners=frozenset(owners), segmented=state)

    def _metadata(
        self,
        current: dict[str, object],
        new_parts: dict[str, tuple[Pickled, StoredGroup]],
        final: dict[str, GroupState],
        rebound: set[str],
        now: str,
    ) -> tuple[dict[str, NameMeta], set[str]]:
        image = self.image
        writer = self.writer
        assert writer is not None
        group_of = {name: key for key, state in final.items() for name in state.stored.names}
        old = image.meta
        meta: dict[str, NameMeta] = {}
        changed: set[str] = set()
        for name in image.pending_names:  # not loaded yet (a background restore): as stored
            if name in old and name in group_of:
                meta[name] = old[name]
        for name, value in current.items():
            if name in new_parts:
                pickled, stored = new_parts[name]
                digest = _content_hash(pickled, stored, writer, name)
                size = len(pickled.stream) + sum(view.nbytes for view in pickled.buffers)
            elif name in self.adopted_meta and group_of[name] in self.adopted:
                adopted = self.adopted_meta[name]
                digest, size = adopted.hash, adopted.size
            else:
                kept = old[name]
                meta[name] = (kept if kept.group == group_of[name]
                              else NameMeta(**{**kept.to_json(), "group": group_of[name]}))
                continue
            previous = old.get(name)
            # A rebound name holding a live resource holds a *new* one (another
            # connection), even though both pickle to the same placeholder record.
            new_resource = name in rebound and name in new_parts and bool(
                new_parts[name][0].transients)
            if previous is not None and previous.hash == digest and not new_resource:
                meta[name] = NameMeta(**{**previous.to_json(), "group": group_of[name]})
                continue
            base = (self._loaded_baseline(name)
                    if previous is not None and name not in rebound and name in new_parts
                    else None)
            if (previous is not None and base is not None
                    and image.content_hash(new_parts[name][0]) == base):
                # As it was loaded: only its bytes differ, as a restore makes them.
                meta[name] = NameMeta(**{**previous.to_json(), "group": group_of[name]})
                self._name_baselines[final[group_of[name]].stored.tree, name] = base
                continue
            changed.add(name)
            meta[name] = NameMeta(
                group=group_of[name], type=type_name(value), summary=describe(value),
                size=size, hash=digest, version=(previous.version + 1) if previous else 1,
                op=self.op.id, principal=self.op.principal, changed_at=now,
            )
        return meta, changed

    def _loaded_baseline(self, name: str) -> str | None:
        """What ``name`` alone pickled to when it was loaded (its content hash), if known."""
        image = self.image
        key = image.group_of.get(name)
        if key is None:
            return None
        stored = image.groups[key].stored
        known = image.name_baselines.get((stored.tree, name))
        if known is None and stored.names == (name,):
            known = image.baselines.get(stored.tree)
        return known


def _content_hash(pickled: Pickled, stored: StoredGroup, writer: SnapshotWriter,
                  name: str) -> str:
    """A stable content hash of one name: its stream plus the ids of its buffer chunks."""
    digest = hashlib.blake2b(pickled.stream, digest_size=16)
    if pickled.joint:  # the group's one dump: its content, and which of its names
        digest.update(b"\0".join(member.encode() for member in pickled.joint))
        digest.update(b"\1" + name.encode())
    if len(stored.names) == 1 or pickled.joint:
        parts: tuple[StoredPart, ...] = stored.buffers
    else:
        parts = tuple(writer.part(view, readonly=view.readonly) for view in pickled.buffers)
    for part in parts:
        for sha in part.chunks:
            digest.update(sha)
    return digest.hexdigest()


def _sealed_source(subjects: frozenset[str]) -> str:
    return (f"# The code of this op tagged personal data of {', '.join(sorted(subjects))}, so it "
            "is kept\n# only in the audit log, sealed under those subjects' keys (see "
            "kernos.personal).\n")


def _message(op: Op) -> str:
    if op.note:
        headline = op.note
    elif op.sealed:
        headline = "(code sealed: it tagged personal data)"
    else:
        lines = [line.strip() for line in (op.source or "").splitlines() if line.strip()]
        if len(lines) > 1 and lines[0].startswith("%%agent "):
            lines = lines[1:]  # the agent's own code (the op's principal names the agent)
        headline = lines[0] if lines else f"({op.kind})"
        if len(headline) > 60:
            headline = headline[:57] + "..."
        if len(lines) > 1:
            headline += f" (+{len(lines) - 1} lines)"
    if op.failure is not None:
        headline += f" [failed: {op.failure['kind']}, kept]"
    return commit_message(op=op.id, principal=op.principal, kind=op.kind, headline=headline)
