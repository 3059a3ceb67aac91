"""The image's state: what it holds in memory, mirroring its head snapshot, and how it loads.

:class:`ImageState` is the part of :class:`kernos.image.Image` that an op's
participants read and move (``kernos.image.changes``, ``kernos.image.rollback``):

* ``groups``: every stored group of variables (names that share objects are
  stored together so that ``b['ref'] is a`` survives a restore);
* ``meta``: per-name facts (:class:`NameMeta`: type, summary, size, content
  hash, version, the op and principal that last changed it);
* ``committed``: the exact objects the head snapshot holds, so a rebinding or
  a deletion is found by identity and undone without any unpickling;
* the persisted names (the namespace's, and the runtime's own ``kernos:``
  names in ``system``), and how stored groups are loaded, pickled and hashed.

:class:`~kernos.image.Image` sets every attribute declared here (its
``__init__`` says what each holds), restores, and runs the ops.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from kernos.analysis import DYNAMIC_NAMES, Reach
from kernos.audit.log import AuditLog
from kernos.errors import RestoreError
from kernos.personal import Keyring
from kernos.serialize import segments
from kernos.serialize.pickler import Pickled, Serializer, Transient
from kernos.serialize.segments import Segmented
from kernos.serialize.unpersisted import Unpersisted
from kernos.store.encoding import manifest_member
from kernos.store.snapshots import ChunkCache, StoredGroup, chunk_ids, read_part
from kernos.store.workspace import Workspace

__all__ = ["EAGER_BASELINE_BYTES", "SYSTEM_PREFIX", "GroupState", "ImageState", "NameMeta",
           "Progress", "RestoreReport", "default_is_persistent"]

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


EAGER_BASELINE_BYTES = 1 << 20
"""A loaded group up to this size (stream and buffers) is pickled again at restore (see
:meth:`Image._note_baseline`); a longer one when an op first needs it."""


class ImageState:
    """What an image holds in memory, and how it loads, pickles and hashes stored groups."""

    workspace: Workspace
    namespace: MutableMapping[str, Any]
    is_persistent: Callable[[str], bool]
    is_alias: Callable[[str], bool]
    keyring: Keyring
    audit: AuditLog
    serializer: Serializer
    cache: ChunkCache
    head: bytes | None
    head_op: int
    groups: dict[str, GroupState]
    group_of: dict[str, str]
    meta: dict[str, NameMeta]
    committed: dict[str, object]
    segmented: dict[str, Segmented]
    system: dict[str, object]
    pending_names: frozenset[str]
    baselines: dict[bytes, str]
    name_baselines: dict[tuple[bytes, str], str]
    unbaselined: set[bytes]
    unreset: set[str]
    identity_override: str | None
    _loading_behind: bool
    _history_bytes: int | None
    _meta_json: dict[str, tuple[NameMeta, bytes]]

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

    def manifest_names(self, meta: dict[str, NameMeta]) -> list[bytes]:
        """The manifest's member for each name, in order, encoded: one whose facts are
        the same object as at the last commit is not encoded again."""
        cache = self._meta_json
        if len(cache) > 2 * len(meta) + 64:
            cache = self._meta_json = {name: cache[name] for name in meta if name in cache}
        entries = []
        for name in sorted(meta):
            facts = meta[name]
            cached = cache.get(name)
            if cached is None or cached[0] is not facts:
                cached = cache[name] = (facts, manifest_member(name, facts.to_json()))
            entries.append(cached[1])
        return entries

    def history_grew(self, written: int) -> int:
        """Count ``written`` new bytes in the history; returns its new size."""
        self._history_bytes = self.history_bytes() + written
        return self._history_bytes


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


def live_transients(transients: list[Transient]) -> list[object]:
    return [transient.obj for transient in transients]
