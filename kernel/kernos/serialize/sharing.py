"""Which variables share objects, so that they are stored together.

An op that affects several names pickles them one by one into one
:class:`SharingRecord`; two names whose pickles reached a common object are
stored as one group, so that the object is one object again after a restore.
"""

from __future__ import annotations

import itertools
import types
from typing import Any

from kernos.serialize.kinds import IMMUTABLE, identity_free_kind

__all__ = ["RecordingPickling", "SharingRecord"]


class SharingRecord:
    """Which objects the dumps of one batch reached, by variable.

    The objects are kept alive until the record goes, so their ids stay theirs.
    """

    def __init__(self) -> None:
        self._owners: list[tuple[str, set[int], list[object]]] = []

    def add(self, owner: str, objects: list[object]) -> set[str]:
        """Record what ``owner`` reached; return the earlier owners it shares objects with."""
        ids = set(map(id, objects))
        met = {name for name, other, _ in self._owners if name != owner
               and not ids.isdisjoint(other)}
        self._owners.append((owner, ids, objects))
        return met

    def owner_of(self, obj: object) -> str | None:
        """The first variable whose pickle reached ``obj``."""
        key = id(obj)
        return next((name for name, ids, _ in self._owners if key in ids), None)


class RecordingPickling:
    """Mixed into the image pickler: notes what each variable reaches.

    The C pickler calls ``persistent_id`` with every object it writes.  A Python
    method there costs a call per object (it made pickling a dict of 100k small
    dicts four times slower); a list's ``append`` costs almost nothing, and the
    objects are sorted out after the dump with C-level iterators.
    """

    record: SharingRecord | None
    owner: str
    roots: Any
    serializer: Any
    touched_owners: set[str]

    def __init__(self, file: Any, serializer: Any, **kwargs: Any) -> None:
        self.reached: list[object] = []
        self.always: list[object] = []
        # An instance attribute: the C pickler looks persistent_id up when it is made.
        self.persistent_id = self.reached.append
        super().__init__(file, serializer, **kwargs)  # type: ignore[call-arg]

    def note_shared(self, obj: object) -> None:
        self.always.append(obj)  # counted whatever its type (a class stored by value)

    def settle(self) -> None:
        """Add what this dump reached to the record; note whose objects it met."""
        record = self.record
        assert record is not None
        reached = self.reached
        flags = list(map(_shareable_kinds.get, map(type, reached)))
        if None in flags:  # kinds not met before: sort them out once
            for kind in set(map(type, reached)) - _shareable_kinds.keys():
                _shareable_kinds[kind] = self._shareable_kind(kind)
            if len(_shareable_kinds) > 50_000:  # redefined classes pile up in a long session
                _shareable_kinds.clear()
                return self.settle()
            flags = list(map(_shareable_kinds.__getitem__, map(type, reached)))
        kept = list(itertools.compress(reached, flags))
        kept += self.always
        self.touched_owners.update(record.add(self.owner, kept))
        return None

    def _shareable_kind(self, kind: type) -> bool:
        if kind in IMMUTABLE or issubclass(kind, _NEVER_SHARED):
            return False  # classes and functions stored by value are noted explicitly
        return not identity_free_kind(kind, self.serializer.is_by_value)


# Objects of these kinds are written by reference (classes, functions and modules
# that are imported by name), so a load brings back the very same object anyway.
_NEVER_SHARED = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
                 types.MethodDescriptorType, types.WrapperDescriptorType,
                 types.MethodWrapperType, types.ClassMethodDescriptorType)
_shareable_kinds: dict[type, bool] = {}
