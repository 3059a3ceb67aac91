"""One op against an image: the code runs, then the op commits or rolls back.

An :class:`Op` wraps a :class:`~kernos.transaction.Transaction` with the
image as its participant.  The caller runs the op's code against the
namespace between ``image.begin()`` and ``op.commit()`` / ``op.abort()``.

Commit, step by step:

1. *What changed?*  Names added, deleted or rebound are found by identity
   against the last commit.  Names the op's code could have mutated in place
   are its reach (see ``kernos.analysis``).  Everything else is untouched and
   keeps its stored group as is: no pickling, no hashing, no new objects.
2. *Pickle* the affected names one by one; when more than one is affected,
   note which objects each reaches, and store names that share objects as
   one group so identity survives a restore.
3. *Write* the new chunks, group trees, the manifest, the root tree and the
   commit object.  None of it is reachable yet.
4. *Publish*: move the branch ref (an atomic rename).  That is the commit
   point; the reply that says "committed" is sent only after it.

Abort puts back the exact objects of the last commit for names that were
added, deleted or rebound, and reloads from the snapshot any group in the
op's reach whose pickled form no longer matches what is stored.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import time
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernos import _faults, determinism, readonly
from kernos._time import utc_now
from kernos.analysis import Reach
from kernos.audit.record import AuditParticipant
from kernos.errors import CommitFailed, DiskFull, KernosError, OpVetoed, RestoreError, UsageError
from kernos.personal import created_subjects
from kernos.serialize import segments
from kernos.serialize.kinds import carries_no_identity
from kernos.serialize.pickler import Pickled, SharingRecord
from kernos.serialize.summary import describe, type_name
from kernos.serialize.unpersisted import Unpersisted
from kernos.store.snapshots import (
    SnapshotWriter,
    StoredGroup,
    StoredPart,
    chunk_ids,
    commit_message,
    read_group,
    read_snapshot,
)
from kernos.transaction import Status, Transaction

if TYPE_CHECKING:
    from kernos.events.bus import Event
    from kernos.image import GroupState, Image, NameMeta, Progress

__all__ = ["AbortReport", "CheckoutReport", "CommitReport", "Op"]

_MISSING = object()
_ATOMIC = frozenset({str, bytes, int, float, complex, bool, type(None)})


@dataclass(kw_only=True)
class CommitReport:
    """What a committed op changed, for the reply and the history."""

    op: int
    commit: str
    principal: str
    kind: str
    added: list[str]
    changed: list[str]
    deleted: list[str]
    committed_at: str
    unpersisted: list[dict[str, Any]] = field(default_factory=list)
    bytes_written: int = 0
    image_bytes: int = 0
    """The image's size after the op: the sum of its stored groups' sizes."""
    history_bytes: int = 0
    """The history's size after the op (see :meth:`Image.history_bytes`)."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    reach: str = ""
    audit: dict[str, Any] = field(default_factory=dict)
    """The op's audit record: its ``index`` and ``hash``."""
    failed: dict[str, str] | None = None
    """The error its code raised, for an op kept despite it (``on_error = keep``)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """The committed events, as external subscribers receive them."""
    unchanged: bool = False
    """The op changed nothing: it has an audit record and no snapshot of its own
    (``commit`` is the last snapshot, which is still the image)."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(kw_only=True)
class AbortReport:
    """What a rollback had to undo, so that the user can be told where it happened."""

    op: int
    removed: list[str]
    """Names the op added: gone again."""
    rebound: list[str]
    """Names the op bound to other objects: the committed objects are back."""
    reloaded: list[str]
    """Names the op changed in place: their committed values are back."""
    deleted: list[str] = field(default_factory=list)
    """Names the op deleted: back."""
    not_reset: list[str] = field(default_factory=list)
    """Names the op used whose values are or hold live resources (a file, a connection, a
    client with threads): they are not (wholly) in the image, so whatever the op did to
    them stays done; a copy would still talk to the live parts."""
    left_live: dict[str, str] = field(default_factory=dict)
    """Names left as the op left them rather than replaced by a copy, and why: the
    stored value could not be loaded (a copy would be a placeholder), or the value
    pickles differently each time, so whether the op changed it cannot be told.  A
    rollback never makes a usable value unusable, nor cuts a read value off what
    it shares."""
    random_reset: bool = False
    """The op had moved the global random generators; they are back where they were."""

    @property
    def nothing_undone(self) -> bool:
        return not (self.removed or self.rebound or self.deleted or self.reloaded
                    or self.not_reset or self.left_live or self.random_reset)

    def undone(self) -> dict[str, Any]:
        """The rollback as JSON, for a reply's metadata."""
        return {"added": self.removed, "rebound": self.rebound, "deleted": self.deleted,
                "reloaded": self.reloaded, "not_reset": self.not_reset,
                "left_live": self.left_live, "random": self.random_reset}

    def summary(self) -> str:
        """One line: ``rolled back — not kept: tup (rebound); obj1, obj2 (added)``."""
        kept = [f"{_names(names)} ({why})" for names, why in (
            (self.rebound, "rebound"), (self.removed, "added"), (self.deleted, "deleted"),
            (self.reloaded, "changed in place")) if names]
        if self.random_reset:
            kept.append("the random generators' state (drawn from or seeded)")
        line = "rolled back — " + ("not kept: " + "; ".join(kept) if kept
                                   else "nothing had changed")
        if self.not_reset:
            line += (f"; could not be reset: {_names(self.not_reset)} (they hold live "
                     "resources, so they stay as the cell left them)")
        for why in sorted(set(self.left_live.values())):
            names = sorted(name for name, reason in self.left_live.items() if reason == why)
            line += f"; left as the cell left them: {_names(names)} ({why})"
        return line


AGENT_NAMESPACE = "kernos:ns:"
"""The prefix of an agent's namespace (``kernos.agents.runtime.namespace_key``)."""
SYSTEM_NAMES = {"kernos:agents": "the agents and their grants",
                "kernos:events": "the event subscriptions",
                "kernos:effects": "the pending effects",
                "kernos:supervisor": "the agents' loops and circuits",
                "kernos:random": "the random generators' state",
                "kernos:embeddings": "the memory settings"}
"""How a rollback line names the image's own values, which users never bind themselves."""


def shown_name(name: str) -> str:
    """A name as a user reads it: an agent's namespace is that agent's variables."""
    if name.startswith(AGENT_NAMESPACE):
        return f"{name[len(AGENT_NAMESPACE):]}'s variables"
    return SYSTEM_NAMES.get(name, name)


def _names(names: list[str], limit: int = 8) -> str:
    names = [shown_name(name) for name in names]
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass(kw_only=True)
class CheckoutReport:
    ref: str
    commit: str
    op: int | None
    names: int
    bytes: int


class Op:
    """An op in flight.  Finish it with exactly one of :meth:`commit` or :meth:`abort`."""

    def __init__(self, image: Image, *, op: int, principal: str, source: str | None,
                 kind: str, reach: Reach) -> None:
        self.image = image
        self.id = op
        self.principal = principal
        self.source = source
        self.kind = kind
        self.reach = reach
        self.started = time.perf_counter()
        self.note = ""
        self.facts: dict[str, Any] = {}
        """Extra facts for the snapshot manifest (for example, which tool versions ran)."""
        self.vetoes: list[str] = []
        """Reasons this op must not commit (a capability denial, a breached limit)."""
        self.veto_status = "vetoed"
        """The audit status of a vetoed op (``denied``, ``failed``, ...)."""
        self.events: list[tuple[Event, Any]] = []
        """Events emitted so far, with the payload as the audit log stores it."""
        self.event_depth = 0
        """How deep event delivery is right now (see kernos.events.bus)."""
        self.grants_used: dict[str, str] = {}
        """Grant id -> capability, for every grant the op's principals used."""
        self.denied: list[dict[str, Any]] = []
        """Capabilities that were refused (bounded by the runtime)."""
        self.environ: list[list[str | None]] = []
        """Environment variables its own code read: [name, SHA-256 of the value or None]."""
        self.clock: list[int] = []
        """The op's own code's clock readings, in ns (see kernos.determinism), for its audit."""
        self.effects: list[dict[str, Any]] = []
        """External effects this op queued, or recorded (see kernos.effects), for its audit."""
        self.key: str | None = None
        """An idempotency key from the op's sender, kept in its audit record."""
        self.llm_calls: list[dict[str, Any]] = []
        """The op's LLM calls (kernos.llm), failed ones too, for its audit record."""
        self.recalls: list[tuple[dict[str, Any], str, frozenset[str]]] = []
        """The op's recalls (kernos.memory): (request, the answer as JSON, the data subjects
        whose text it holds), for its audit record, so that a replay serves the same."""
        self.outcome: tuple[str, dict[str, str] | None] = ("rolled back", None)
        """(status, error) of an op that did not commit, for its audit record."""
        self.failure: dict[str, str] | None = None
        """The error of an op whose code raised but which commits what it reached
        (see :meth:`keep_failed`), for its snapshot and audit record."""
        self.checked_out: CheckoutReport | None = None
        """What :meth:`checkout` made the image equal to, for the op's notice."""
        self.report_draft: CommitReport | None = None
        self.report: CommitReport | None = None
        self.abort_report: AbortReport | None = None
        self._adopted: dict[str, tuple[StoredGroup, tuple[object, ...]]] = {}
        self._adopted_meta: dict[str, NameMeta] = {}
        self._participant = _ImageParticipant(self)
        self._audit = AuditParticipant(self, image.audit)
        self._generators = determinism.GeneratorParticipant(self)
        self.transaction = Transaction(op=op, principal=principal)
        self.transaction.join(self._generators)
        self.transaction.join(self._participant)
        self.transaction.join(self._audit)

    @property
    def status(self) -> Status:
        return self.transaction.status

    def scan_everything(self, why: str = "a full scan was requested") -> None:
        """Check every value at commit, not only those in the op's reach."""
        self.reach = Reach.all(why)

    def touch(self, *names: str) -> None:
        """Add names the op changed in place to its reach (the runtime's own state, say)."""
        self.reach = self.reach.union(Reach(frozenset(names)))

    def veto(self, reason: str, *, status: str = "vetoed") -> None:
        """Make this op roll back at commit, whatever its code did with the error.

        ``status`` is what its audit record will say (a denial wins over others).
        """
        self.vetoes.append(reason)
        if self.veto_status != "denied":
            self.veto_status = status

    def keep_failed(self, kind: str, message: str) -> None:
        """Commit this op although its code raised ``kind: message`` (``on_error = keep``).

        Its snapshot and audit record say it failed.  Only the human's ops can be
        kept: an agent's op always rolls back.
        """
        if self.principal != "human":
            raise UsageError(f"an op of {self.principal!r} cannot be kept after an error: "
                             "agents' ops always roll back")
        self.failure = {"kind": kind[:120], "message": message[:500]}

    def act_as(self, principal: str, kind: str) -> None:
        """Attribute this op to another principal (a cell that runs as an agent)."""
        self.principal = principal
        self.transaction.principal = principal
        self.kind = kind

    def commit(self) -> CommitReport:
        """Write the snapshot; on failure the image is rolled back and CommitFailed raised.

        A vetoed op is rolled back instead and raises :class:`OpVetoed`.
        """
        if self.vetoes:
            vetoed = OpVetoed.from_op(self)
            self.abort(status=self.veto_status, error=vetoed)
            raise vetoed
        try:
            self.transaction.commit()
        except DiskFull as error:  # says where and what to do; this says the op rolled back
            raise CommitFailed(self.id, error) from error
        except KernosError:
            raise
        except BaseException as error:
            raise CommitFailed(self.id, error) from error
        finally:
            self.image._release()
        assert self.report is not None
        audit = self.image.audit
        index = self._audit.index
        assert index is not None
        audit.published = index
        self.report.audit = {"index": index, "hash": audit.entries[index].hash}
        record = self._audit.record
        assert record is not None
        self.report.events = [audit.resolve_event(event, record) for event in record["events"]]
        return self.report

    def abort(self, *, status: str | None = None,
              error: BaseException | tuple[str, str] | None = None) -> AbortReport:
        """Put the namespace back exactly as the last commit left it.

        ``status`` and ``error`` are what the audit record says about why
        (by default derived from ``error``: interrupted, denied, failed).
        """
        self.outcome = outcome(self, status, error)
        try:
            self.transaction.abort()
        finally:
            self.image._release()
        assert self.abort_report is not None
        return self.abort_report

    def commit_id(self) -> str | None:
        """The id of the commit being written (from the commit phase on); for an op that
        changed nothing, the last snapshot's (it writes none)."""
        sha = self._participant.commit_sha
        return None if sha is None else sha.hex()

    @property
    def sealed(self) -> frozenset[str]:
        """Data subjects this op tagged: its code is stored sealed for them."""
        return created_subjects()

    def checkout(self, ref: str, progress: Progress | None = None) -> CheckoutReport:
        """Make the namespace equal to snapshot ``ref``, as part of this op.

        History is not rewritten: committing this op records a new snapshot
        whose groups are the old snapshot's own trees.
        """
        from kernos.image import NameMeta
        from kernos.store.workspace import op_of

        image = self.image
        workspace = image.workspace
        commit = workspace.resolve(ref)
        snapshot = read_snapshot(workspace, commit)
        groups = {key: read_group(workspace, key, tree)
                  for key, tree in snapshot.group_trees.items()}
        values, failed = image.load_groups(groups, progress)
        if failed:
            raise RestoreError(
                f"{ref} cannot be checked out: {', '.join(sorted(failed))} could not be "
                "loaded. Nothing was changed.", names=tuple(sorted(failed)))
        for name in image.persisted_names():
            if name not in values:
                image.unbind(name)
        for name, value in values.items():
            image.bind(name, value)
        # The cells after a checkout draw from the generators as the snapshot left them.
        determinism.apply_state(values.get(determinism.STATE_NAME), image.identity)
        self._adopted = {key: (stored, tuple(values[name] for name in stored.names))
                         for key, stored in groups.items()}
        self._adopted_meta = {name: NameMeta.from_json(data)
                              for name, data in snapshot.manifest.get("names", {}).items()}
        self.kind = "checkout"
        self.note = f"checkout {commit.hex()[:12]}"
        self.checked_out = CheckoutReport(
            ref=ref, commit=commit.hex(), op=op_of(snapshot.data), names=len(values),
            bytes=sum(g.size for g in groups.values()))
        return self.checked_out


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


class _ImageParticipant:
    """Moves the image's snapshot history with the op."""

    def __init__(self, op: Op) -> None:
        self.op = op
        self.writer: SnapshotWriter | None = None
        self.commit_sha: bytes | None = None
        self._published = False
        self._state: dict[str, Any] = {}
        self._segmented: dict[str, segments.Segmented] = {}
        self._name_baselines: dict[tuple[bytes, str], str] = {}
        """Image.name_baselines carried over to the groups this commit stores again."""
        """Values this commit stored in segments, as it cut them (see tpc_finish)."""
        self.unchanged = False
        """The op changed nothing: no snapshot is written (see _prepare)."""

    def sort_key(self) -> str:
        return "~kernos.image"  # votes last: its publish is the commit point

    # -- two-phase commit ------------------------------------------------------

    def tpc_begin(self, txn: Transaction) -> None:
        image = self.op.image
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
        audit = self.op.image.audit
        if self.unchanged:
            # Nothing to publish: the objects the analysis wrote again are all stored
            # already (equal content, equal ids), and the head stays.
            self.op.image.workspace.objects.discard()
            audit.sync()
        else:
            self.writer.publish(self.commit_sha,
                                sync_with=[audit.sync_target] if audit.unsynced else [],
                                record=audit.last_line if audit.unsynced else b"")
        audit.unsynced = False
        self._published = True
        image = self.op.image
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
            self.op.image.workspace.objects.discard()

    def abort(self, txn: Transaction) -> None:
        # A rollback may reset containers in place from copies: the cut segments'
        # objects would no longer be the containers' own.
        self.op.image.segmented.clear()
        self.op.abort_report = self._rollback()

    # -- commit work -----------------------------------------------------------

    def _prepare(self) -> None:
        op = self.op
        image = op.image
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
        from kernos.image import GroupState

        for key, (stored, values) in op._adopted.items():
            names = set(stored.names)
            intact = all(current.get(name, _MISSING) is value
                         for name, value in zip(stored.names, values, strict=True))
            if intact and not names & touched:
                final[key] = GroupState(stored=stored)
                claimed |= names
        for key, state in image.groups.items():
            names = set(state.stored.names)
            if names & claimed:
                continue
            unchanged = all(current.get(name, _MISSING) is committed.get(name, _MISSING)
                            for name in names)
            if state.load_error is not None and unchanged:
                final[key] = state  # still the placeholders of a failed restore: keep the data
                claimed |= names
            elif not names & (dirty | set(deleted)):
                final[key] = state
                claimed |= names
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
                and all(current.get(name, _MISSING) is committed.get(name, _MISSING)
                        for name in state.stored.names) for state in reached.values()):
            claimed_names = {name for state in reached.values() for name in state.stored.names}
            if (not set(current) - claimed - claimed_names
                    and all(self._verdict(state) == "same" for state in reached.values())):
                final.update(reached)
                claimed |= claimed_names
        affected = sorted(name for name in current if name not in claimed)
        timings["analyze"] = (time.perf_counter() - clock) * 1000

        clock = time.perf_counter()
        individual, components = self._pickle(
            affected, current, reach.without_uses(set(added) | rebound))
        self._refuse_unstorable_system_state(individual)
        _faults.point("serialize")
        timings["serialize"] = (time.perf_counter() - clock) * 1000

        clock = time.perf_counter()
        new_parts: dict[str, tuple[Pickled, StoredGroup]] = {}
        unloadable: dict[str, str] = {}
        for members in components:
            if len(members) == 1:
                pickled = individual[members[0]]
            else:
                pickled = image.serializer.dump([(name, current[name]) for name in members],
                                                op=op.id)
            if pickled.kinds:
                problem = image.serializer.would_not_load(pickled)
                if problem is not None:
                    unloadable.update(dict.fromkeys(members, problem))
            stored = writer.group(members, pickled, op=op.id)
            if len(members) == 1 and pickled.segmented is not None:
                for piece, part in zip(pickled.segmented.segments, stored.buffers, strict=True):
                    piece.part = part
                self._segmented[members[0]] = pickled.segmented
            final[stored.key] = GroupState(
                stored=stored, live_transients=[t.obj for t in pickled.transients])
            for name in members:
                new_parts[name] = (individual[name], stored)
        _faults.point("objects")

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
            failed=op.failure,
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
            "names": {name: meta[name].to_json() for name in sorted(meta)},
        }
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
                groups=[state.stored for state in final.values()], manifest=manifest,
                source=(_sealed_source(sealed) if sealed and op.source is not None
                        else op.source),
                parent=image.head,
                message=_message(op), author=f"{op.principal} <{op.principal}@kernos.invalid>",
            )
            timings["write"] = (time.perf_counter() - clock) * 1000
            report.bytes_written = writer.bytes_written
            report.history_bytes = image.history_grew(writer.bytes_written)
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
        image = op.image
        if (image.head is None or report.added or report.changed or report.deleted
                or op.failure is not None or op.kind == "checkout" or op._adopted
                or set(op.facts) - {"audit"} or report.unpersisted):
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
        known = {id(obj) for state in self.op.image.groups.values()
                 for obj in state.live_transients}
        return [dict(transient.info(), op=self.op.id) for transient in found
                if id(transient.obj) not in known]

    def _pickle(self, names: list[str], current: dict[str, object], reach: Reach
                ) -> tuple[dict[str, Pickled], list[list[str]]]:
        """Pickle each name alone; find which names share objects."""
        serializer = self.op.image.serializer
        # Recording costs a Python call per object, so only values that can share
        # objects at all are recorded, and only if two or more of them are affected.
        shareable = {name for name in names
                     if type(current[name]) not in _ATOMIC and not carries_no_identity(
                         current[name], serializer.is_by_value)}
        record = SharingRecord() if len(shareable) > 1 else None
        sharing = _UnionFind(names)
        individual = {}
        for name in names:
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
        return individual, sharing.groups()

    def _segments(self, name: str, value: Any, reach: Reach,
                  record: SharingRecord | None) -> Pickled | None:
        """Pickle a big list or dict in segments (see ``kernos.serialize.segments``),
        again only where the op's code may have changed it; None to pickle it whole."""
        image = self.op.image
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
        from kernos.image import NameMeta

        image = self.op.image
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
                digest = _content_hash(pickled, stored, writer)
                size = len(pickled.stream) + sum(view.nbytes for view in pickled.buffers)
            elif name in self.op._adopted_meta and group_of[name] in self.op._adopted:
                adopted = self.op._adopted_meta[name]
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
        image = self.op.image
        key = image.group_of.get(name)
        if key is None:
            return None
        stored = image.groups[key].stored
        known = image.name_baselines.get((stored.tree, name))
        if known is None and stored.names == (name,):
            known = image.baselines.get(stored.tree)
        return known

    # -- rollback --------------------------------------------------------------

    def _rollback(self) -> AbortReport:
        image = self.op.image
        committed = image.committed
        removed = [name for name in image.persisted_names() if name not in committed]
        for name in removed:
            image.unbind(name)
        rebound: list[str] = []
        deleted: list[str] = []
        for name, value in committed.items():
            now = image.lookup(name, _MISSING)
            if now is not value:
                (deleted if now is _MISSING else rebound).append(name)
                image.bind(name, value)
        reach = image.expand(self.op.reach, committed)
        names = set(committed) if reach.everything else reach.names & committed.keys()
        keys = {image.group_of[name] for name in names if name in image.group_of}
        stale: dict[str, StoredGroup] = {}
        left_live: dict[str, str] = {}
        for key in sorted(keys):
            state = image.groups[key]
            if state.load_error is not None:
                continue
            verdict = self._verdict(state, settle=True)
            if verdict == "changed":
                stale[key] = state.stored
            elif verdict == "unsure":
                left_live.update(dict.fromkeys(state.stored.names, _UNSURE))
        reloaded, not_reset = self._reload(stale, left_live)
        image.unreset.update(left_live)
        # A value that is itself a live resource (an open file, a client holding threads)
        # is not in the image: whatever the op did to it stays done.
        not_reset += [name for name in sorted(names - set(not_reset)) if self._is_resource(name)]
        system = {name for name in removed + rebound + deleted if name.startswith("kernos:")}
        return AbortReport(
            op=self.op.id, removed=sorted(set(removed) - system),
            rebound=sorted(set(rebound) - system), deleted=sorted(set(deleted) - system),
            reloaded=sorted(reloaded), not_reset=sorted(not_reset),
            left_live={name: left_live[name] for name in sorted(set(left_live) - system)},
            random_reset=self.op._generators.reset)

    def _reload(self, stale: dict[str, StoredGroup],
                left_live: dict[str, str]) -> tuple[list[str], list[str]]:
        """Put back the committed values of groups the op changed in place.

        A group whose values hold live resources is not replaced by a copy: the
        copy would still talk to the live parts (a client's sockets and threads).
        If each of its names is a live resource itself, a container (a plain
        dict or list, or an instance of a class defined in a cell) or unchanged,
        the containers are reset in place from the copy (the copy holds the
        very same live objects; what it holds directly of the group's values is
        swapped for the live ones), unless something deeper inside the copy
        refers to one of the group's copied values.  Any other such group (a
        library's client holding sockets and threads, say) stays as the op left
        it, is reported, and is written by the next commit.

        A group whose stored values cannot be loaded now stays live too (in
        ``left_live``, with the loader's reason): its copy would be placeholders.
        """
        image = self.op.image
        committed = image.committed
        live = {key: image.groups[key].live_transients for key in stale}
        in_place: dict[str, list[str]] = {}
        loadable: dict[str, StoredGroup] = {}
        not_reset: list[str] = []
        for key, stored in stale.items():
            resources = [obj for obj in live[key] if not isinstance(obj, Unpersisted)]
            if not resources:
                loadable[key] = stored
                continue
            containers = [name for name in stored.names
                          if self._contents(committed[name]) is not None]
            others = [name for name in stored.names if name not in containers
                      and not any(committed[name] is obj for obj in resources)]
            changed = self._changed_names(stored, others) if others else []
            if not changed:
                loadable[key] = stored
                in_place[key] = containers
            else:
                not_reset += self._changed_names(stored)
        values, failed = image.load_groups(loadable, live=live) if loadable else ({}, set())
        reloaded: list[str] = []
        for key in loadable:
            names = loadable[key].names
            if failed & set(names):
                for name in names:
                    reason = getattr(values[name], "reason", "it could not be loaded")
                    left_live[name] = f"its stored value could not be loaded: {reason}"
                continue
            if key not in in_place:
                for name in names:
                    image.bind(name, values[name])
                    committed[name] = values[name]
                reloaded += names
                continue
            containers = in_place[key]
            roots = {id(values[name]): committed[name] for name in names}
            copies = {name: self._contents(values[name]) for name in containers}
            if any(roots.get(id(type(values[name])), type(values[name]))
                   is not type(committed[name]) or copies[name] is None
                   or _reaches(copies[name], roots) for name in containers):
                not_reset += containers
                continue
            for name in containers:
                _transplant(self._contents(committed[name]), copies[name], roots)
            reloaded += containers
        image.unreset.update(not_reset)
        return reloaded, not_reset

    def _is_resource(self, name: str) -> bool:
        """Whether ``name`` holds, as a whole, a live object that could not be persisted."""
        image = self.op.image
        key = image.group_of.get(name)
        value = image.committed.get(name, _MISSING)
        return key is not None and any(
            value is obj for obj in image.groups[key].live_transients
            if not isinstance(obj, Unpersisted))

    def _contents(self, value: object) -> dict[Any, Any] | list[Any] | None:
        """What a rollback may reset in place: a plain dict or list, or the attributes of
        an instance of a class defined in a cell (the user's own object, not a library's)."""
        if type(value) in (dict, list):
            return value  # type: ignore[return-value]
        attributes = getattr(value, "__dict__", None)
        kind = type(value)
        if (type(attributes) is dict and not isinstance(value, type)
                and "__slots__" not in kind.__dict__ and kind.__module__ is not None
                and self.op.image.serializer.is_by_value(kind)):
            return attributes
        return None

    def _changed_names(self, stored: StoredGroup,
                       names: list[str] | None = None) -> list[str]:
        """The names of a group (or those of ``names``) whose values no longer pickle as
        their committed content."""
        image = self.op.image
        changed = []
        for name in stored.names if names is None else names:
            try:
                pickled = image.serializer.dump([(name, image.committed[name])], op=self.op.id)
            except Exception:
                changed.append(name)
                continue
            meta = image.meta.get(name)
            if meta is None or meta.hash != image.content_hash(pickled):
                changed.append(name)
        return changed

    def _verdict(self, state: GroupState, *, settle: bool = False) -> str:
        """Whether the group's live values hold what is stored: ``same`` or ``changed``.

        They are pickled as a commit stores them and compared with the stored
        stream and buffers, or, for values loaded from the store, with what they
        pickled to when loaded (``Image.baselines``).  With ``settle`` (a
        rollback), a group loaded but without a baseline yet gets one, and a
        difference is checked by pickling once more: values that pickle
        differently each time (some library object draws a counter or a clock in
        its ``__getstate__``) are ``unsure``: bytes cannot tell whether the op
        changed them.
        """
        image = self.op.image
        stored = state.stored
        values = [image.committed[name] for name in stored.names]
        try:
            pickled = image.pickle_group(stored.names, values)
        except Exception:
            return "changed"
        if _stored_as(pickled, stored, image):
            return "same"
        if settle:
            image.ensure_baseline(stored)
        if image.baselines.get(stored.tree) == image.content_hash(pickled):
            return "same"
        if settle:
            with contextlib.suppress(Exception):
                again = image.pickle_group(stored.names, values)
                if image.content_hash(again) != image.content_hash(pickled):
                    return "unsure"
        return "changed"


def _stored_as(pickled: Pickled, stored: StoredGroup, image: Image) -> bool:
    """Whether ``pickled`` is, byte for byte, what ``stored`` holds."""
    if len(pickled.buffers) != len(stored.buffers):
        return False
    parts = [(memoryview(pickled.stream), stored.stream)]
    parts += list(zip(pickled.buffers, stored.buffers, strict=True))
    return all(len(data) == part.size
               and chunk_ids(data, image.cache, by_content=part.by_content) == part.chunks
               for data, part in parts)


_UNSURE = ("it pickles differently each time, so whether the cell changed it cannot be "
           "told; a copy would cut it off from what it shares")


def _transplant(live: Any, copy: Any, roots: dict[int, object]) -> None:
    """Give a live dict or list the contents of its reloaded copy, keeping its identity.

    ``roots`` maps the copies of the group's containers to the live ones, so a
    container held directly by another is the live one, not its copy.
    """
    if type(live) is dict:
        live.clear()
        live.update({key: roots.get(id(value), value) for key, value in copy.items()})
    else:
        live[:] = [roots.get(id(value), value) for value in copy]


def _reaches(copy: Any, roots: dict[int, object], budget: int = 100_000) -> bool:
    """Whether anything below the direct contents of ``copy`` refers to a copied container
    (bounded: unsure means yes).  Those references could not be pointed at the live ones."""
    children = list(copy.values()) + list(copy) if type(copy) is dict else list(copy)
    seen = set(roots)
    frontier = [child for child in children if id(child) not in roots]
    while frontier:
        for child in _referents(frontier.pop()):
            if id(child) in roots:
                return True
            if id(child) in seen or type(child) in _ATOMIC or isinstance(child, type):
                continue
            seen.add(id(child))
            frontier.append(child)
            budget -= 1
            if budget <= 0:
                return True
    return False


def _referents(obj: object) -> list[object]:
    """What ``obj`` holds; a function's globals (the namespace, a module) are not its own."""
    if isinstance(obj, types.FunctionType):
        held: list[object] = list(obj.__defaults__ or ())
        for cell in obj.__closure__ or ():
            with contextlib.suppress(ValueError):  # an empty cell
                held.append(cell.cell_contents)
        return held
    if isinstance(obj, types.ModuleType):
        return []
    return gc.get_referents(obj)


def _content_hash(pickled: Pickled, stored: StoredGroup, writer: SnapshotWriter) -> str:
    """A stable content hash of one name: its stream plus the ids of its buffer chunks."""
    digest = hashlib.blake2b(pickled.stream, digest_size=16)
    if len(stored.names) == 1:
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


def outcome(op: Op, status: str | None,
            error: BaseException | tuple[str, str] | None) -> tuple[str, dict[str, str] | None]:
    """The audit status and error of an op that did not commit."""
    if isinstance(error, BaseException):
        name, message = type(error).__name__, str(error)
    elif error is not None:
        name, message = error
    else:
        name = message = ""
    if status is None:
        if op.vetoes:
            status = op.veto_status
        elif name == "KeyboardInterrupt":
            status = "interrupted"
        elif name in ("CapabilityDenied", "OpVetoed") and op.denied:
            status = "denied"
        elif name:
            status = "failed"
        else:
            status = "rolled back"
    shown = {"kind": name[:120], "message": message[:500]} if name else None
    return status, shown


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
