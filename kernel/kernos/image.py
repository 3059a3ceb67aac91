"""The image: a live namespace bound to its snapshot history.

An :class:`Image` owns one namespace dict and one open, locked workspace.
It restores the namespace from the head snapshot, and runs *ops* against it:
``image.begin(...)`` returns an :class:`~kernos.op.Op` whose ``commit()``
writes a new snapshot and whose ``abort()`` puts the namespace back exactly
as the last snapshot had it.  One op runs at a time.

What the image keeps in memory mirrors the head snapshot:

* ``groups``: every stored group of variables (names that share objects are
  stored together so that ``b['ref'] is a`` survives a restore);
* ``meta``: per-name facts (type, summary, size, content hash, version, the op
  and principal that last changed it);
* ``committed``: the exact objects the head snapshot holds, so a rebinding or
  a deletion is found by identity and undone without any unpickling.

The persisted names are the namespace's plus the runtime's own entries in
``system``: names that start with ``kernos:`` (the agents' registry and each
agent's namespace; see ``kernos.agents``).  They are not identifiers, so no
cell can name them; they commit, roll back, and show in history like any
other name.  ``bind`` / ``unbind`` / ``lookup`` route a name to its mapping.

Nothing here imports Jupyter; the kernel is a thin adapter over this class.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import sys
import threading
import time
import types
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernos import _faults, determinism
from kernos.analysis import DYNAMIC_NAMES, Reach, reach_of_source
from kernos.audit.erasure import finish_erasures
from kernos.audit.log import AuditLog
from kernos.errors import AuditError, RestoreError, UsageError, WorkspaceCorrupt
from kernos.personal import Keyring, forget_created
from kernos.serialize import segments
from kernos.serialize.pickler import Pickled, Serializer, Transient
from kernos.serialize.segments import Segmented
from kernos.serialize.unpersisted import Unpersisted
from kernos.store.snapshots import (
    ChunkCache,
    Snapshot,
    StoredGroup,
    chunk_ids,
    read_group,
    read_part,
    read_snapshot,
    trim_buffer_cache,
)
from kernos.store.trust import require_trusted
from kernos.store.workspace import Workspace

if TYPE_CHECKING:
    from kernos.op import Op

__all__ = ["SYSTEM_PREFIX", "GroupState", "Image", "NameMeta", "RestoreReport"]

SYSTEM_PREFIX = "kernos:"

Progress = Callable[[int, int], None]
Buffer = bytes | bytearray | memoryview | mmap.mmap


def default_is_persistent(name: str) -> bool:
    return not (name.startswith("__") and name.endswith("__"))


@dataclass(kw_only=True)
class NameMeta:
    """What the history knows about one name."""

    group: str
    type: str
    summary: str
    size: int
    hash: str
    version: int
    op: int
    principal: str
    changed_at: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NameMeta:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__})


@dataclass(kw_only=True)
class GroupState:
    """A stored group plus the live objects it could not persist (for rollback)."""

    stored: StoredGroup
    live_transients: list[object] = field(default_factory=list)
    load_error: str | None = None
    """Set when a restore could not load this group; its names hold placeholders."""


@dataclass(kw_only=True)
class RestoreReport:
    commit: str | None
    op: int
    names: int
    bytes: int
    seconds: float
    failed: dict[str, str] = field(default_factory=dict)
    recovery: str | None = None


EARLY_BYTES = 1 << 20
"""A background restore loads groups up to this size before any op runs (and the rest after)."""

EAGER_BASELINE_BYTES = 1 << 20
"""A loaded group up to this size (stream and buffers) is pickled again at restore (see
:meth:`Image._note_baseline`); a longer one when an op first needs it."""

BETWEEN_OPS_WAIT = 1.0
"""How long a non-blocking :meth:`Image.begin` waits for work done between ops (values a
background restore puts in place hold the op lock for a moment)."""


class Image:
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

    def history_bytes(self) -> int:
        """The history's size on disk: its objects when first asked, plus what ops wrote since
        (as stored: compressed)."""
        if self._history_bytes is None:
            total = 0
            for folder, _dirs, files in os.walk(self.workspace.path / "history.git" / "objects"):
                for name in files:
                    with contextlib.suppress(OSError):  # a pack being replaced under us
                        total += os.lstat(os.path.join(folder, name)).st_size
            self._history_bytes = total
        return self._history_bytes

    def history_grew(self, written: int) -> int:
        """Count ``written`` new bytes in the history; returns its new size."""
        self._history_bytes = self.history_bytes() + written
        return self._history_bytes

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
                else:
                    report = self._restore(read_snapshot(self.workspace, head), progress,
                                           background=background)
                # The generators continue from the snapshot's state (numpy's once imported).
                determinism.apply_state(self.committed.get(determinism.STATE_NAME),
                                        self.identity)
                notes = self.audit.recover(None if head is None else head.hex(), self._exists)
                notes += finish_erasures(self)
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
        trim_buffer_cache(self.workspace, groups.values())
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

    def load_groups(
        self,
        groups: dict[str, StoredGroup],
        progress: Progress | None = None,
        *,
        live: dict[str, list[object]] | None = None,
    ) -> tuple[dict[str, object], set[str]]:
        """Unpickle stored groups; a group that fails gets placeholders, never an exception."""
        total = sum(group.size for group in groups.values())
        done = 0

        def advance(size: int) -> None:
            nonlocal done
            done += size
            if progress is not None:
                progress(done, total)

        values: dict[str, object] = {}
        failed: set[str] = set()
        for key, group in groups.items():
            try:
                loaded = self._load_group(group, advance, (live or {}).get(key, []))
            except Exception as error:
                failed.update(group.names)
                reason = _load_failure(group, error)
                for name in group.names:
                    values[name] = Unpersisted(
                        name=name, path=name,
                        type_name=self.meta[name].type if name in self.meta else "?",
                        reason=reason,
                    )
                continue
            values.update(zip(group.names, loaded, strict=True))
        return values, failed

    def _load_group(self, group: StoredGroup, advance: Callable[[int], None],
                    live_transients: list[object], *,
                    baseline: bool = False) -> tuple[object, ...]:
        populate = not self._loading_behind  # see read_part
        stream = read_part(self.workspace, group.stream, on_chunk=advance, populate=populate)
        self._remember_chunks(group.stream.chunks, stream, group.stream.sizes)
        buffers = []
        for part in group.buffers:
            data = read_part(self.workspace, part, writable=not part.readonly, on_chunk=advance,
                             populate=populate)
            self._remember_chunks(part.chunks, data, part.sizes)
            buffers.append(data)
        values = self.serializer.load(stream, buffers, live_transients=live_transients)
        if len(values) != len(group.names):
            raise RestoreError(f"group {group.key} holds {len(values)} values for "
                               f"{len(group.names)} names", names=group.names)
        self._note_baseline(group, values, now=baseline)
        return values

    def _note_baseline(self, group: StoredGroup, values: tuple[object, ...], *,
                       now: bool = False) -> None:
        """Remember what the values just loaded pickle to.

        A restore does not rebuild everything pickle's output depends on: which
        equal strings are one object (the memo follows identity), a set's
        iteration order (its hash table's history).  So loaded values can pickle
        to other bytes than they were stored as while holding the same state.
        The digest of those bytes (:meth:`content_hash` of :meth:`pickle_group`),
        taken before any op can touch them, is what "unchanged" looks like for
        this group from now on: a rollback then leaves it live, and a commit
        keeps its stored snapshot.

        Pickling costs a fraction of loading, but not nothing: a group stored in
        more than :data:`EAGER_BASELINE_BYTES` is only marked (``unbaselined``)
        at restore, and the first rollback that finds its bytes changed asks
        :meth:`ensure_baseline`, which loads the stored copy and pickles that
        instead (a copy loaded now pickles as the loaded values did).
        """
        if not now and group.size > EAGER_BASELINE_BYTES:
            self.unbaselined.add(group.tree)
            return
        try:
            self.baselines[group.tree] = self.content_hash(self.pickle_group(group.names, values))
        except Exception:
            return  # it loaded, but does not pickle now: compared with what is stored
        if len(group.names) > 1:  # a commit hashes each name alone (NameMeta.hash)
            for name, value in zip(group.names, values, strict=True):
                with contextlib.suppress(Exception):
                    self.name_baselines[group.tree, name] = self.content_hash(
                        self.serializer.dump([(name, value)]))

    def ensure_baseline(self, group: StoredGroup) -> None:
        """Take the baseline of a loaded group that the restore left for later."""
        if group.tree not in self.unbaselined:
            return
        self.unbaselined.discard(group.tree)
        with contextlib.suppress(Exception):  # unloadable now: compared with what is stored
            self._load_group(group, lambda size: None, [], baseline=True)

    def pickle_group(self, names: tuple[str, ...] | list[str],
                     values: tuple[object, ...] | list[object]) -> Pickled:
        """Values pickled as a commit stores them: a big list or dict alone in segments."""
        if (len(names) == 1 and segments.candidate(values[0])
                and not names[0].startswith(SYSTEM_PREFIX)):
            name = names[0]
            state = segments.segment(
                values[0],  # type: ignore[arg-type]
                segments.dump_with(lambda piece, own: self.serializer.dump(
                    [(name, piece)], record=own)),
                use=None, previous=None)
            if state is not None:
                stream, buffers = segments.joined_stream(state)
                return Pickled(stream=stream, buffers=buffers, transients=[],
                               code_refs=frozenset())
        return self.serializer.dump(list(zip(names, values, strict=True)))

    def content_hash(self, pickled: Pickled) -> str:
        """A name's content hash (``NameMeta.hash``): its stream and its buffers' chunk ids."""
        digest = hashlib.blake2b(pickled.stream, digest_size=16)
        for view in pickled.buffers:
            for sha in chunk_ids(view, self.cache):
                digest.update(sha)
        return digest.hexdigest()

    def _remember_chunks(self, chunks: tuple[bytes, ...], data: Buffer,
                         sizes: tuple[int, ...]) -> None:
        view = memoryview(data)
        position = 0
        entries = []
        for sha, size in zip(chunks, sizes, strict=True):
            if size >= 4096:
                entries.append((self.cache.digest(view[position : position + size]), sha))
            position += size
        self.cache.update(entries)

    # -- ops -------------------------------------------------------------------

    def begin(self, *, source: str | None = None, principal: str = "human",
              kind: str = "cell", reach: Reach | None = None,
              blocking: bool = True) -> Op:
        """Start an op.  Only one op runs at a time; the next one waits.

        Without ``blocking``, another op running is an error; the short work
        done between ops (values a background restore puts in place) is waited
        for, up to :data:`BETWEEN_OPS_WAIT` seconds.
        """
        from kernos.op import Op  # op.py builds on this module

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
            self.current = Op(self, op=self.last_op, principal=principal, source=source,
                              kind=kind, reach=reach)
            determinism.ensure_state(self.committed.get(determinism.STATE_NAME), self.identity)
            determinism.seed_op(self.identity, self.last_op, readings=self.current.clock,
                                clock=self.clock_replay, environ=self.current.environ)
            self.clock_replay = None
            return self.current
        except BaseException:
            self._busy.release()
            raise

    def _release(self) -> None:
        determinism.end_op()
        self.current = None
        self._busy.release()

    @property
    def identity(self) -> str:
        """A short, stable identity of the workspace: its audit genesis record's hash.

        It seeds ops' randomness (``kernos.determinism``) and prefixes effect keys.
        """
        if self.identity_override is not None:
            return self.identity_override
        entries = self.audit.entries
        return entries[0].hash[:12] if entries else "local"

    def persisted_names(self) -> dict[str, object]:
        found = {name: value for name, value in list(self.namespace.items())
                 if self.is_persistent(name) and not name.startswith(SYSTEM_PREFIX)}
        found.update(self.system)
        return found

    def bind(self, name: str, value: object) -> None:
        """Set a persisted name, in the namespace or (``kernos:...``) in ``system``."""
        if name.startswith(SYSTEM_PREFIX):
            self.system[name] = value
        else:
            self.namespace[name] = value

    def unbind(self, name: str) -> None:
        if name.startswith(SYSTEM_PREFIX):
            del self.system[name]
        else:
            del self.namespace[name]

    def lookup(self, name: str, default: object = None) -> object:
        mapping: MutableMapping[str, Any] = (
            self.system if name.startswith(SYSTEM_PREFIX) else self.namespace)
        return mapping.get(name, default)

    def expand(self, reach: Reach, current: dict[str, object]) -> Reach:
        """Widen a reach through the code stored by value in the groups it touches."""
        if reach.everything:
            return reach
        names = set(reach.names)
        if any(self.is_alias(name) for name in names):
            return Reach.all("the code uses IPython's output cache, which aliases values")
        frontier = [name for name in names if name in current]
        seen_groups: set[str] = set()
        referenced: set[str] = set()
        while frontier:
            name = frontier.pop()
            key = self.group_of.get(name)
            if key is None or key in seen_groups:
                continue
            seen_groups.add(key)
            refs = self.groups[key].stored.code_refs
            dynamic = refs & DYNAMIC_NAMES
            if dynamic:
                return Reach.all(f"code stored with {name!r} uses {', '.join(sorted(dynamic))}")
            referenced |= refs
            for ref in refs - names:
                names.add(ref)
                if ref in current:
                    frontier.append(ref)
        # Stored code may use a name in any way: only the op's own uses are known.
        uses = {name: use for name, use in reach.uses.items() if name not in referenced}
        reads = {name: found for name, found in reach.reads.items() if name not in referenced}
        return Reach(frozenset(names), uses=uses, reads=reads)

    def transients(self) -> list[dict[str, Any]]:
        """Every value a restore would (or did) replace by a placeholder.

        ``live`` says whether this session still holds the real object, or only
        the placeholder a restore put there.
        """
        found = []
        for state in self.groups.values():
            for index, info in enumerate(state.stored.unpersisted):
                live = (index < len(state.live_transients)
                        and not isinstance(state.live_transients[index], Unpersisted))
                found.append({**info, "live": live})
        return found


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


def _load_failure(group: StoredGroup, error: Exception) -> str:
    """Why a stored group could not be loaded, and advice that can work."""
    what = f"{type(error).__name__}: {str(error)[:300]}"
    if isinstance(error, ImportError):
        return (f"it could not be restored ({what}); it is still in the history: install "
                "the missing module, then run `%kernos checkout HEAD` to load it")
    if group.unpersisted:
        parts = ", ".join(sorted({str(info.get("path")) for info in group.unpersisted})[:3])
        return (f"it could not be rebuilt without the parts that could not be persisted "
                f"({parts}): {what}. Create it again (for example, open the file again)")
    return (f"it could not be restored ({what}). It is still in the history (`kernos show`); "
            "if a library it needs was upgraded, reinstall the version that wrote it and run "
            "`%kernos checkout HEAD`")


def _audited(workspace: Workspace, head: bytes) -> bool:
    try:
        facts = read_snapshot(workspace, head).manifest.get("facts") or {}
    except WorkspaceCorrupt:
        return False
    return isinstance(facts.get("audit"), dict)


def live_transients(transients: list[Transient]) -> list[object]:
    return [transient.obj for transient in transients]
