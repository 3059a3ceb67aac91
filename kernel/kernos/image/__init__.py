"""The image: a live namespace bound to its snapshot history.

An :class:`Image` owns one namespace dict and one open, locked workspace.
It restores the namespace from the head snapshot, and runs *ops* against it:
``image.begin(...)`` returns an :class:`~kernos.op.Op` whose ``commit()``
writes a new snapshot and whose ``abort()`` puts the namespace back exactly
as the last snapshot had it.  One op runs at a time.  The op drives its
transaction; the image joins it the participants that move the image's own
state: its snapshot history (``kernos.image.changes``, with the rollback of
``kernos.image.rollback``), its audit chain (``kernos.audit.record``) and its
random generators (``kernos.determinism``).

What the image keeps in memory mirrors the head snapshot
(``kernos.image.state``: groups, per-name facts, the committed objects).

The persisted names are the namespace's plus the runtime's own entries in
``system``: names that start with ``kernos:`` (the agents' registry and each
agent's namespace; see ``kernos.agents``).  They are not identifiers, so no
cell can name them; they commit, roll back, and show in history like any
other name.  ``bind`` / ``unbind`` / ``lookup`` route a name to its mapping.

Nothing here imports Jupyter; the kernel is a thin adapter over this class.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
import types
from collections.abc import Callable, MutableMapping
from typing import Any

from kernos import _faults, determinism
from kernos.analysis import Reach, reach_of_source
from kernos.audit.erasure import finish_erasures
from kernos.audit.log import AuditLog
from kernos.audit.record import AuditParticipant
from kernos.errors import AuditError, RestoreError, UsageError, WorkspaceCorrupt
from kernos.files import FilesParticipant, TrackedFiles
from kernos.image.changes import ImageParticipant
from kernos.image.state import (
    SYSTEM_PREFIX,
    GroupState,
    ImageState,
    NameMeta,
    Progress,
    RestoreReport,
    default_is_persistent,
)
from kernos.op import CheckoutReport, Op
from kernos.personal import Keyring, forget_created
from kernos.serialize.pickler import Serializer
from kernos.serialize.segments import Segmented
from kernos.store.snapshots import (
    ChunkCache,
    Snapshot,
    StoredGroup,
    read_group,
    read_snapshot,
)
from kernos.store.trust import require_trusted
from kernos.store.workspace import Workspace, op_of

__all__ = ["SYSTEM_PREFIX", "GroupState", "Image", "NameMeta", "Progress", "RestoreReport",
           "default_is_persistent"]

EARLY_BYTES = 1 << 20
"""A background restore loads groups up to this size before any op runs (and the rest after)."""

BETWEEN_OPS_WAIT = 1.0
"""How long a non-blocking :meth:`Image.begin` waits for work done between ops (values a
background restore puts in place hold the op lock for a moment)."""


class Image(ImageState):
    """A namespace whose every op commits to, or rolls back from, a snapshot history."""

    def __init__(
        self,
        workspace: Workspace,
        namespace: MutableMapping[str, Any],
        *,
        module: types.ModuleType | None = None,
        module_name: str = "__main__",
        is_persistent: Callable[[str], bool] = default_is_persistent,
        is_alias: Callable[[str], bool] = lambda name: False,
    ) -> None:
        if not workspace.writable:
            raise UsageError("an Image needs a workspace opened writable (it holds the lock)")
        # Restoring runs pickle, which runs code: not from writers nobody here trusts.
        require_trusted(workspace.path)
        self.workspace = workspace
        self.namespace = namespace
        self.is_persistent = is_persistent
        self.is_alias = is_alias
        self.keyring = Keyring(workspace.path / "keys", durable=workspace.durable)
        self.audit = AuditLog(workspace.path, keyring=self.keyring, durable=workspace.durable)
        head = workspace.head()
        if not len(self.audit) and head is not None and _audited(workspace, head):
            raise AuditError(
                f"the audit log of {workspace.path} is missing or empty, but its history was "
                "audited: Kernos will not start a new log over it (that would hide what "
                "happened). Restore the audit directory from a backup. Nothing was changed.",
                path=str(self.audit.path))
        self.audit.ensure_genesis(None if head is None else head.hex())
        self.serializer = Serializer(namespace, module_name=module_name, module=module)
        self.serializer.keyring = self.keyring
        self.cache = ChunkCache()
        self.files = TrackedFiles(workspace, self.cache)
        """The tracked directories, part of the image (``kernos.files``)."""
        self.head: bytes | None = None
        self.head_op = 0
        self.groups: dict[str, GroupState] = {}
        self.group_of: dict[str, str] = {}
        self.meta: dict[str, NameMeta] = {}
        self.committed: dict[str, object] = {}
        self.segmented: dict[str, Segmented] = {}
        """Big lists and dicts as the last commit cut them (``kernos.serialize.segments``)."""
        self.system: dict[str, object] = {}
        self.current: Op | None = None
        self._changes: ImageParticipant | None = None
        """The running op's image participant (see :meth:`checkout`)."""
        self.last_op = 0
        self._busy = threading.Lock()
        self.restored = threading.Event()
        self.pending: dict[str, StoredGroup] = {}
        """Groups a background restore has not loaded yet (see :meth:`restore`)."""
        self.pending_names: frozenset[str] = frozenset()
        self._loading_behind = False
        """Whether groups are being loaded by a background restore (:meth:`finish_restore`)."""
        self._restore_bytes = (0, 0)
        """Bytes a background restore loaded before ops could run, and of the whole snapshot."""
        self._history_bytes: int | None = None
        self._meta_json: dict[str, tuple[NameMeta, bytes]] = {}
        self.baselines: dict[bytes, str] = {}
        """Stored group (its tree) -> content hash of what its values pickled to when they
        were loaded (see :meth:`_note_baseline`)."""
        self.name_baselines: dict[tuple[bytes, str], str] = {}
        """The same for each name of such a group pickled alone: its content hash then."""
        self.unbaselined: set[bytes] = set()
        """Loaded groups whose baseline is taken when first needed (see :meth:`_note_baseline`)."""
        self.unreset: set[str] = set()
        """Names a rollback could not reset (they hold live resources): the next commit
        writes them as they are."""
        self.identity_override: str | None = None
        """Set by a replay: the identity of the workspace whose ops it re-runs."""
        self.clock_replay: list[int] | None = None
        """Set by a replay: the clock readings the next op is handed (its original's)."""
        determinism.install()


    def fold(self, *, blocking: bool = True) -> int | None:
        """Fold the commits of the workspace's tail into git (``kernos.store.tail``)
        between ops; how many there were, or None if an op runs and ``blocking`` is off."""
        if not self._busy.acquire(blocking=blocking):
            return None
        try:
            return self.workspace.fold()
        finally:
            self._busy.release()

    # -- restore ---------------------------------------------------------------

    def restore(self, progress: Progress | None = None, *,
                background: bool = False) -> RestoreReport:
        """Load the head snapshot into the namespace (before any op runs).

        With ``background``, only the runtime's own state and the groups of up
        to :data:`EARLY_BYTES` are loaded here; the others stay in
        :attr:`pending` until :meth:`finish_restore` loads them, each put in
        place between ops.  Meanwhile ops whose reach names none of
        :attr:`pending_names` (:meth:`needs_pending`) can run and commit: the
        pending groups are kept as they are stored.
        """
        started = time.perf_counter()
        with self._busy:
            try:
                head = self.workspace.head()
                if head is None:
                    report = RestoreReport(commit=None, op=0, names=0, bytes=0, seconds=0.0)
                    put_back = self.files.restore(None, has_head=False)
                else:
                    snapshot = read_snapshot(self.workspace, head)
                    report = self._restore(snapshot, progress, background=background)
                    # A kill -9 in an op may have left its file writes: the head's are back.
                    put_back = self.files.restore(snapshot.files_tree, commit=head)
                # The generators continue from the snapshot's state (numpy's once imported).
                determinism.apply_state(self.committed.get(determinism.STATE_NAME),
                                        self.identity)
                notes = self.audit.recover(None if head is None else head.hex(), self._exists)
                notes += finish_erasures(self)
                if put_back:
                    notes.append("tracked files put back as the last commit had them: "
                                 + ", ".join(put_back[:8])
                                 + (f" and {len(put_back) - 8} more" if len(put_back) > 8
                                    else ""))
                self.last_op = max(self.last_op, self.audit.last_op)
                report.seconds = time.perf_counter() - started
                report.recovery = "; ".join(
                    note for note in [self.workspace.recovery_note, *notes] if note) or None
                return report
            finally:
                if not self.pending:
                    self.restored.set()

    def finish_restore(self, progress: Progress | None = None) -> int:
        """Load what a background restore left, smallest group first; how many names.

        Each group is unpickled without the op lock, then put in place under
        it, between ops.  A group that fails gets placeholders, as in a restore.
        """
        _faults.pause("restore.background")
        # Ops and the kernel's own threads go first: memory is mapped as it is filled
        # (see read_part), this thread runs at a lower priority where the system allows,
        # and every thread hands the interpreter back sooner meanwhile.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, 0.0005))
        self._loading_behind = True
        niceness = _lower_priority()
        try:
            done, total = self._restore_bytes
            names = 0
            for key, group in sorted(self.pending.items(), key=lambda item: item[1].size):

                def advance(done_here: int, _total: int, base: int = done) -> None:
                    if progress is not None:
                        progress(base + done_here, total)
                    while self._busy.locked():  # an op runs: it goes first
                        time.sleep(0.001)

                values, failed = self.load_groups({key: group}, advance)
                done += group.size
                with self._busy:
                    for name, value in values.items():
                        self.bind(name, value)
                    self.committed.update(values)
                    if failed and key in self.groups:
                        self.groups[key].load_error = getattr(
                            values[next(iter(failed))], "reason", "could not be restored")
                    del self.pending[key]
                    self.pending_names = frozenset(
                        name for pending in self.pending.values() for name in pending.names)
                names += len(values)
            return names
        finally:
            if niceness is not None:
                _lower_priority(niceness)
            self._loading_behind = False
            sys.setswitchinterval(interval)
            self.restored.set()

    def needs_pending(self, reach: Reach) -> bool:
        """Whether an op of ``reach`` must wait for groups a background restore is loading."""
        if not self.pending:
            return False
        if reach.everything:
            return True
        expanded = self.expand(reach, self.persisted_names())
        return expanded.everything or bool(expanded.names & self.pending_names)

    def _exists(self, commit: str) -> bool:
        try:
            self.workspace.read_commit(bytes.fromhex(commit))
        except (WorkspaceCorrupt, ValueError):
            return False
        return True

    def _restore(self, snapshot: Snapshot, progress: Progress | None, *,
                 background: bool = False) -> RestoreReport:
        groups = {key: read_group(self.workspace, key, tree)
                  for key, tree in snapshot.group_trees.items()}
        now = groups
        if background:
            now = {key: group for key, group in groups.items()
                   if group.size <= EARLY_BYTES
                   or any(name.startswith(SYSTEM_PREFIX) for name in group.names)}
            # Progress counts the whole snapshot, across both parts of the restore.
            total = sum(group.size for group in groups.values())
            self._restore_bytes = (sum(group.size for group in now.values()), total)
            if progress is not None:
                report_progress = progress

                def progress(done: int, _total: int) -> None:
                    report_progress(done, total)

        loaded, failed = self.load_groups(now, progress)
        for name, value in loaded.items():
            self.bind(name, value)
        self._adopt_snapshot(snapshot, groups, loaded, failed)
        self.pending = {key: group for key, group in groups.items() if key not in now}
        self.pending_names = frozenset(
            name for group in self.pending.values() for name in group.names)
        return RestoreReport(
            commit=snapshot.commit.hex(), op=self.head_op, names=len(loaded),
            bytes=sum(group.size for group in groups.values()), seconds=0.0,
            failed={name: self.groups[self.group_of[name]].load_error or "" for name in failed},
        )

    def _adopt_snapshot(self, snapshot: Snapshot, groups: dict[str, StoredGroup],
                        loaded: dict[str, object], failed: set[str]) -> None:
        self.head = snapshot.commit
        self.head_op = int(snapshot.manifest.get("op", 0))
        self.last_op = max(self.last_op, self.head_op)
        self.meta = {name: NameMeta.from_json(data)
                     for name, data in snapshot.manifest.get("names", {}).items()}
        self.groups = {}
        self.group_of = {}
        for key, stored in groups.items():
            state = GroupState(stored=stored)
            self.groups[key] = state
            for name in stored.names:
                self.group_of[name] = key
        for name in failed:
            self.groups[self.group_of[name]].load_error = getattr(
                loaded[name], "reason", "could not be restored"
            )
        self.committed = dict(loaded)
        self.segmented = {}


    # -- ops -------------------------------------------------------------------

    def begin(self, *, source: str | None = None, principal: str = "human",
              kind: str = "cell", reach: Reach | None = None,
              blocking: bool = True) -> Op:
        """Start an op.  Only one op runs at a time; the next one waits.

        Without ``blocking``, another op running is an error; the short work
        done between ops (values a background restore puts in place) is waited
        for, up to :data:`BETWEEN_OPS_WAIT` seconds.
        """
        if not self._busy.acquire(timeout=-1 if blocking else BETWEEN_OPS_WAIT):
            raise UsageError("another op is running on this image; wait for it to finish")
        try:
            if reach is None:
                reach = reach_of_source(source) if source is not None else Reach.all("no code")
            if self.unreset:
                reach = reach.union(Reach(frozenset(self.unreset)))
            self.last_op += 1
            forget_created()
            self.audit.note_inflight(self.last_op, principal, kind, None if source is None else
                                     hashlib.sha256(source.encode("utf-8", "surrogatepass"))
                                     .hexdigest())
            op = Op(self, op=self.last_op, principal=principal, source=source, kind=kind,
                    reach=reach)
            self._join_participants(op)
            self.current = op
            determinism.ensure_state(self.committed.get(determinism.STATE_NAME), self.identity)
            determinism.seed_op(self.identity, self.last_op, readings=self.current.clock,
                                clock=self.clock_replay, environ=self.current.environ)
            self.clock_replay = None
            return self.current
        except BaseException:
            self._busy.release()
            raise

    def _join_participants(self, op: Op) -> None:
        """Join the op the participants that move the image's own state with it."""
        generators = determinism.GeneratorParticipant(self)
        files = FilesParticipant(self.files)
        self._changes = ImageParticipant(self, op, generators, files)
        audit = AuditParticipant(op, self.audit)
        op.join(generators)
        op.join(files)
        op.join(self._changes)
        op.join(audit)
        op.on_commit.append(audit.published)

    def _release(self) -> None:
        determinism.end_op()
        self.current = None
        self._changes = None
        self._busy.release()

    def checkout(self, op: Op, ref: str, progress: Progress | None = None) -> CheckoutReport:
        """Make the namespace equal to snapshot ``ref``, as part of ``op`` (:meth:`Op.checkout`).

        History is not rewritten: committing the op records a new snapshot
        whose groups are the old snapshot's own trees.
        """
        changes = self._changes
        if changes is None or changes.op is not op:
            raise UsageError("a checkout is part of the op that is running on this image")
        workspace = self.workspace
        commit = workspace.resolve(ref)
        snapshot = read_snapshot(workspace, commit)
        groups = {key: read_group(workspace, key, tree)
                  for key, tree in snapshot.group_trees.items()}
        values, failed = self.load_groups(groups, progress)
        if failed:
            raise RestoreError(
                f"{ref} cannot be checked out: {', '.join(sorted(failed))} could not be "
                "loaded. Nothing was changed.", names=tuple(sorted(failed)))
        for name in self.persisted_names():
            if name not in values:
                self.unbind(name)
        for name, value in values.items():
            self.bind(name, value)
        # The cells after a checkout draw from the generators as the snapshot left them.
        determinism.apply_state(values.get(determinism.STATE_NAME), self.identity)
        self.files.check_out(snapshot.files_tree, commit)
        changes.adopted = {key: (stored, tuple(values[name] for name in stored.names))
                           for key, stored in groups.items()}
        changes.adopted_meta = {name: NameMeta.from_json(data)
                                for name, data in snapshot.manifest.get("names", {}).items()}
        op.kind = "checkout"
        op.note = f"checkout {commit.hex()[:12]}"
        return CheckoutReport(
            ref=ref, commit=commit.hex(), op=op_of(snapshot.data), names=len(values),
            bytes=sum(g.size for g in groups.values()))


def _lower_priority(restore_to: int | None = None) -> int | None:
    """Lower this thread's scheduling priority (Linux: per thread); put it back with the
    value returned.  Where the system does not allow it, nothing changes."""
    try:
        thread = threading.get_native_id()
        if restore_to is not None:
            os.setpriority(os.PRIO_PROCESS, thread, restore_to)
            return None
        before = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(before + 10, 19))
        return before
    except (AttributeError, OSError):
        return None


def _audited(workspace: Workspace, head: bytes) -> bool:
    try:
        facts = read_snapshot(workspace, head).manifest.get("facts") or {}
    except WorkspaceCorrupt:
        return False
    return isinstance(facts.get("audit"), dict)

