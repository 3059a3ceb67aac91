"""Big lists and dicts stored in segments, so an op re-pickles only the entries it touched.

An agent's memory list that gains a record at every op, or a table of 100,000
small dicts of which an op edits one, would otherwise be pickled whole by every
op that names it: the cost of an op would follow the age of the workspace, not
the size of its change.

**The layout.**  A variable whose value is an exact ``list`` or ``dict`` of at
least :data:`SEGMENTED_FROM` entries is stored as segments of
:data:`SEGMENT_ENTRIES` consecutive entries (by position, in the container's
order), each pickled on its own, plus a short stream that joins them on load
(``rebuild.join_segments``).  Each segment is stored as a tree of its own in
the group's tree (``kernos.store.snapshots``), its stream cut by content, so
an unchanged segment keeps its tree and the history shares it.  The layout
is a function of the value alone (the same list is cut the same way whether
it was written whole or piece by piece), so a replay writes the same snapshot
hashes.

**When a segment is written again.**  Only where the op's own code can have
changed it: the op's reach says how the code uses the name (:class:`EntryUse`,
answered by ``kernos.analysis.Use``: appends, constant keys, ``len``), and
then only the segments of those keys and the tail (where appends and new keys
land) are pickled again; the others keep their bytes, and the stored chunks
they were written as.  Without such a use (the code passed the value somewhere,
iterated it, deleted from it; the name is new or rebound; a full scan), every
segment is pickled again, which costs what pickling the whole value costs.

**What must hold for segments to be exact**, checked at every write, or the
value is stored whole (which is always correct):

* each segment pickles as plain data: no out-of-band buffer, nothing that
  cannot persist, no code stored by value (whose global names would have to
  widen the reach);
* no object is reached from two segments, and no segment reaches the
  container itself: each segment has its own pickle memo, so sharing across
  segments would come back as copies.  The objects each segment reached are
  kept (so their ids stay theirs) and indexed by id; a rewritten segment is
  checked against the others' in time proportional to its own size;
* the container is the same object as at the last commit, no shorter, and
  (for a list) still holds the same last entry of that commit where the code
  only appended; a dict gained entries only at its end, under the keys the
  code named.

Sharing with *other* variables is found as for any value: the segments'
objects and the container join the op's sharing record (``SharingRecord.add``
with the ids they are indexed by), and a value that shares is grouped with its
sharers and stored whole.

The cache of segments (:class:`Segmented`) lives as long as the image's
session; a restart, a rollback or a checkout drops it, and the next op that
names the value writes every segment once.
"""

from __future__ import annotations

import builtins
import itertools
import operator
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernos.serialize import rebuild
from kernos.serialize.sharing import SharingRecord

__all__ = ["SEGMENTED_FROM", "SEGMENT_ENTRIES", "EntryUse", "Segment", "Segmented", "segment"]

class EntryUse(Protocol):
    """Every way the op's code uses the container, when all touch known entries only.

    The op's reach answers it (``kernos.analysis.Use``): ``appends`` (``append``
    or ``extend``), ``keys`` (the constant keys or indices it reads or writes),
    ``calls_len`` (``len(N)``, which holds only while ``len`` is the builtin).
    """

    @property
    def appends(self) -> bool: ...

    @property
    def keys(self) -> frozenset[object]: ...

    @property
    def calls_len(self) -> bool: ...


SEGMENT_ENTRIES = 2048
"""Entries per segment: about 100-200 KB of small records, a fraction of a millisecond to pickle."""
SEGMENTED_FROM = 2 * SEGMENT_ENTRIES
"""Containers with fewer entries are pickled whole (in well under a millisecond)."""

_LEN = builtins.len


@dataclass(eq=False)
class Segment:
    """One run of entries as pickled, with what its pickle reached."""

    data: bytes
    objects: list[object]
    """The shareable objects its pickle reached (held, so that their ids stay theirs)."""
    keys: list[Any] | None = None
    """A dict segment's keys, in order."""
    part: Any = None
    """How the store holds ``data`` (a ``StoredPart``), once a commit wrote it."""


@dataclass(eq=False)
class Segmented:
    """A big container as its last write cut it."""

    value: list[Any] | dict[Any, Any]
    length: int
    segments: list[Segment]
    owner: dict[int, int] = field(default_factory=dict)
    """id of every object a segment reached -> that segment."""
    objects: dict[int, object] = field(default_factory=dict)
    """The same objects, by id, and the container itself."""
    position: dict[Any, int] | None = None
    """A dict's keys -> their position."""
    last: object = None
    """A list's last entry."""

    @property
    def streams(self) -> list[bytes]:
        return [piece.data for piece in self.segments]


Dump = Callable[[object], tuple[bytes, list[object]] | None]
"""Pickles one segment's container; ``(stream, objects reached)``, or None if not plain data."""


def candidate(value: object) -> bool:
    """Whether ``value`` is big enough, and of a kind, to be stored in segments."""
    kind = type(value)
    return (kind is list or kind is dict) and _LEN(value) >= SEGMENTED_FROM  # type: ignore[arg-type]


def segment(value: list[Any] | dict[Any, Any], dump: Dump, *, use: EntryUse | None,
            previous: Segmented | None) -> Segmented | None:
    """Cut ``value`` into segments, pickling again only those ``use`` may have changed.

    ``previous`` is how the last commit cut the same name.  Returns None if
    the value cannot be stored in segments (see the module docstring).
    """
    if previous is not None and (previous.value is not value or use is None
                                 or (use.calls_len and builtins.len is not _LEN)):
        previous = None
    if previous is not None and use is not None:
        dirty = (_dirty_list(value, previous, use) if type(value) is list
                 else _dirty_dict(value, previous, use))  # type: ignore[arg-type]
        if dirty is None:
            previous = None
    count = _segment_count(_LEN(value))
    if previous is None:
        dirty = set(range(count))
        segments: list[Segment | None] = [None] * count
        state = Segmented(value=value, length=_LEN(value), segments=[])
    else:
        assert dirty is not None
        segments = [*previous.segments[:count]] + [None] * (count - len(previous.segments))
        # Taken over, not copied (a copy would cost as much as the value is big): a
        # commit that does not finish drops the whole cache (``Image.segmented``).
        state = Segmented(value=value, length=_LEN(value), segments=[],
                          owner=previous.owner, objects=previous.objects,
                          position=previous.position)
    if type(value) is dict:
        keys = _dict_keys(value, state, previous, dirty, count)
    for index in sorted(dirty):
        if type(value) is list:
            piece: Any = value[index * SEGMENT_ENTRIES : (index + 1) * SEGMENT_ENTRIES]
            piece_keys = None
        else:
            piece_keys = keys[index]
            piece = {key: value[key] for key in piece_keys}
        dumped = dump(piece)
        if dumped is None:
            return None
        data, objects = dumped
        kept = [obj for obj in objects if obj is not piece]
        old = segments[index]
        fresh = kept
        if old is not None:
            known = _LEN(old.objects)
            if known <= _LEN(kept) and all(map(operator.is_, kept[:known], old.objects)):
                fresh = kept[known:]  # entries appended after the same ones: only theirs are new
            else:
                _forget(state, old, index)
        for obj in fresh:
            key = id(obj)
            if obj is value or state.owner.get(key, index) != index:
                return None  # shared across segments, or a cycle through the container
            state.owner[key] = index
            state.objects[key] = obj
        segments[index] = Segment(data=data, objects=kept, keys=piece_keys)
    state.segments = [piece for piece in segments if piece is not None]
    if _LEN(state.segments) != count:
        return None
    # The container itself, for the op's sharing record (``alias = memory``), not a segment's.
    state.objects[id(value)] = value
    if type(value) is list and value:
        state.last = value[-1]
    return state


def _segment_count(length: int) -> int:
    return max(1, -(-length // SEGMENT_ENTRIES))


def _dirty_list(value: list[Any], previous: Segmented, use: EntryUse) -> set[int] | None:
    old = previous.length
    new = _LEN(value)
    if new < old or (new > old and not use.appends):
        return None  # shortened, or grown by something the code did not say
    if old and (new == 0 or value[old - 1] is not previous.last):
        return None
    dirty: set[int] = set()
    if new > old:
        dirty.update(range(old // SEGMENT_ENTRIES, _segment_count(new)))
    for key in use.keys:
        if type(key) is not int:
            continue  # not an index of a list: the op raised, and changed nothing there
        for position in ((key,) if key >= 0 else (old + key, new + key)):
            if 0 <= position < new:
                dirty.add(position // SEGMENT_ENTRIES)
    return dirty


def _dirty_dict(value: dict[Any, Any], previous: Segmented, use: EntryUse) -> set[int] | None:
    position = previous.position
    assert position is not None
    old = previous.length
    new = _LEN(value)
    if new < old:
        return None
    dirty: set[int] = set()
    added = []
    for key in use.keys:
        try:
            where = position.get(key)
        except TypeError:
            continue  # unhashable: the op raised
        if where is not None:
            dirty.add(where // SEGMENT_ENTRIES)
        elif key in value:
            added.append(key)
    if _LEN(added) != new - old:
        return None  # entries came or went other than under the keys the code named
    if added:
        if set(_last_keys(value, new - old)) != set(added):
            return None
        dirty.update(range(old // SEGMENT_ENTRIES, _segment_count(new)))
    return dirty


def _dict_keys(value: dict[Any, Any], state: Segmented, previous: Segmented | None,
               dirty: set[int], count: int) -> dict[int, list[Any]]:
    """The keys of each dirty segment; keeps ``state.position`` current."""
    if previous is None:
        order = list(value)
        state.position = {key: index for index, key in enumerate(order)}
        return {index: order[index * SEGMENT_ENTRIES : (index + 1) * SEGMENT_ENTRIES]
                for index in dirty}
    position = state.position = previous.position if previous.position is not None else {}
    old = previous.length
    new_keys = _last_keys(value, _LEN(value) - old)
    for offset, key in enumerate(new_keys):
        position[key] = old + offset
    keys: dict[int, list[Any]] = {}
    tail_start = old // SEGMENT_ENTRIES
    for index in dirty:
        if index < tail_start and index < _LEN(previous.segments):
            keys[index] = list(previous.segments[index].keys or ())
    if any(index >= tail_start for index in dirty):
        kept = (list(previous.segments[tail_start].keys or ())
                if tail_start < _LEN(previous.segments) else [])
        run = kept + new_keys
        for index in range(tail_start, count):
            start = (index - tail_start) * SEGMENT_ENTRIES
            keys[index] = run[start : start + SEGMENT_ENTRIES]
    return keys


def _last_keys(value: dict[Any, Any], count: int) -> list[Any]:
    """The last ``count`` keys of ``value``, in order (without walking the rest)."""
    found = list(itertools.islice(reversed(value), count))
    found.reverse()
    return found


def _forget(state: Segmented, piece: Segment, index: int) -> None:
    owner = state.owner
    for key in map(id, piece.objects):
        if owner.get(key) == index:
            del owner[key]
            state.objects.pop(key, None)


def dump_with(dump_one: Callable[[object, SharingRecord], Any]) -> Dump:
    """A :data:`Dump` over the serializer: ``dump_one(container, record)`` returns a Pickled."""

    def dump(piece: object) -> tuple[bytes, list[object]] | None:
        record = SharingRecord()
        pickled = dump_one(piece, record)
        if pickled.buffers or pickled.transients or pickled.code_refs:
            return None
        return pickled.stream, record.reached_objects()

    return dump


class _Joined:
    """Pickles as the call that joins the segments back into one container."""

    def __init__(self, kind: str, streams: Sequence[bytes]) -> None:
        self.kind = kind
        self.streams = streams

    def __reduce__(self) -> Any:
        return (rebuild.join_segments,
                (self.kind, *[pickle.PickleBuffer(data) for data in self.streams]))


def joined_stream(state: Segmented) -> tuple[bytes, list[memoryview]]:
    """The group stream of a value stored in segments, and its buffers (the segments)."""
    buffers: list[memoryview] = []

    def take(buffer: pickle.PickleBuffer) -> bool:
        buffers.append(buffer.raw())
        return False

    kind = "list" if type(state.value) is list else "dict"
    stream = pickle.dumps((_Joined(kind, state.streams),), protocol=5, buffer_callback=take)
    return stream, buffers
