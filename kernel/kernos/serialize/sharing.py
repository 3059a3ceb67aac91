"""Which variables share objects, so that they are stored together.

An op that affects several names pickles them one by one into one
:class:`SharingRecord`; two names whose pickles reached a common object are
stored as one group, so that the object is one object again after a restore.

Only sharing that the user's values really have may join two names.  Grouping
too much is not wrong, but it is costly for ever after: a trivial edit of one
name re-pickles its whole group.  (Two pandas Series made in one cell reached
the same list ``Series._metadata`` and the same Cython reconstructors, so a
31 MB group was re-saved after every cell that changed a two-element Series.)
So these never join two names:

* objects the pickler writes by name, which a load gives back as the very same
  object anyway: classes, functions and builtins imported by name, Cython's
  functions among them (checked once per type);
* objects that a class imported by name holds as a class attribute (pandas
  puts ``_metadata`` in every instance's state), the globals of imported
  modules other than the namespace's own (and of the packages above them),
  the values of those globals that are dicts (every matplotlib artist holds
  the list ``rcParams["path.effects"]``), and what any of these hold in
  turn (the cached paths of matplotlib's marker styles), when the names reach
  them only through a library object's private state.  A restore gives copies of these,
  never the library's own object, so which copy a library object's internals
  hold is not the user's concern.  These are looked for only among the
  objects two names do share (rare, and few), and re-checked when judged
  (``vars(cls)[key] is obj``), so a reused id cannot mislead.

A wrong "not shared" would lose identity, so everything else counts: two
lists holding one dict, an object that is a global of the namespace itself,
any value a variable holds directly, and a library's class attribute or
global that a variable reaches through its own structure (the items of its
containers, the attributes of its cell-defined objects: see
``kernos.serialize.unpersistable`` for where a library's state begins).  If
that search is cut off by its bound, the object counts.
"""

from __future__ import annotations

import gc
import itertools
import sys
import types
from collections.abc import Collection
from collections.abc import Set as AbstractSet
from typing import Any

from kernos.serialize import rebuild
from kernos.serialize.kinds import IMMUTABLE, Ref, identity_free_kind, lookup
from kernos.serialize.paths import search
from kernos.serialize.unpersistable import enters_library

__all__ = ["RecordingPickling", "SharingRecord", "marked"]


class SharingRecord:
    """Which objects the dumps of one batch reached, by variable.

    The objects are kept alive until the record goes, so their ids stay theirs.
    """

    def __init__(self) -> None:
        self._owners: list[tuple[str, AbstractSet[int], Collection[object]]] = []
        self._roots: set[int] = set()
        self._root_values: dict[str, tuple[object, ...]] = {}
        self._library: dict[int, bool] = {}
        self._indexed_kinds: set[type] = set()
        self._class_attributes: dict[int, tuple[type, str]] = {}
        self._module_globals: dict[int, tuple[types.ModuleType, str]] = {}
        self._global_items: dict[int, tuple[dict[Any, object], object]] = {}
        self._indexed_modules: set[int] = set()

    def add(self, owner: str, objects: Collection[object], *, roots: tuple[object, ...] = (),
            home: str | None = None, ids: AbstractSet[int] | None = None) -> set[str]:
        """Record what ``owner`` reached; return the earlier owners it shares objects with.

        ``roots`` are the values of the dumped variables themselves; ``home``
        is the name of the namespace's module.  With ``home``, objects that
        belong to libraries (see the module docstring) do not count.  ``ids``
        are the ids of ``objects`` when the caller keeps them indexed already
        (a value stored in segments, most of which were not pickled again).
        """
        if ids is None:
            ids = set(map(id, objects))
        self._roots.update(map(id, roots))
        self._root_values[owner] = roots
        earlier = [(name, other) for name, other, _ in self._owners if name != owner]
        self._owners.append((owner, ids, objects))
        met = set()
        judged: set[int] = set()
        for name, other in earlier:
            if ids.isdisjoint(other):
                continue
            common = set(ids & other)
            if home is not None:
                common = self._users(common, objects, home, owner, judged)
            if common:
                met.add(name)
        return met

    def reached_objects(self) -> list[object]:
        """Every object recorded so far, whoever reached it."""
        return [obj for _, _, objects in self._owners for obj in objects]

    def owner_of(self, obj: object) -> str | None:
        """The first variable whose pickle reached ``obj``."""
        key = id(obj)
        return next((name for name, ids, _ in self._owners if key in ids), None)

    # -- library objects -------------------------------------------------------

    def _users(self, common: set[int], objects: Collection[object], home: str, owner: str,
               judged: set[int]) -> set[int]:
        """The objects of ``common`` that are the user's (not a library's).

        A verdict "the library's" holds only for the owners seen so far: each new
        owner that reaches the object is searched again (``judged`` are the ones
        done for this owner already).
        """
        fresh = common - judged
        if fresh:
            by_id = {id(obj): obj for obj in objects if id(obj) in fresh}
            if any(key not in self._roots and key not in self._library for key in by_id):
                self._index(home)  # only a verdict still to make needs it
            for key, obj in by_id.items():
                verdict = self._library.get(key)
                if verdict is None:
                    verdict = key not in self._roots and self._belongs_to_library(obj, home)
                elif verdict:
                    verdict = not self._reached_by_user(obj, home, owners=(owner,))
                self._library[key] = verdict
            self._spread([obj for key, obj in by_id.items() if self._library[key]],
                         {id(obj): obj for obj in objects if id(obj) in common}, home)
            judged |= fresh
        return {key for key in common if not self._library[key]}

    def _spread(self, library: list[object], common: dict[int, object], home: str) -> None:
        """Mark what the library's objects hold (their ``__dict__``, arrays, lists) as theirs.

        Only objects both names reached are followed (what a shared object holds
        is reached by both), and each is still the user's if a name holds it in
        its own structure.
        """
        queue = list(library)
        while queue:
            for child in gc.get_referents(queue.pop()):
                key = id(child)
                if (key not in common or self._library.get(key) or key in self._roots
                        or self._reached_by_user(child, home)):
                    continue
                self._library[key] = True
                queue.append(child)

    def _index(self, home: str) -> None:
        """Index the class attributes and module globals around the kinds reached so far."""
        kinds = set(itertools.chain.from_iterable(
            map(type, objects) for _, _, objects in self._owners)) - self._indexed_kinds
        for kind in kinds:
            self._indexed_kinds.add(kind)
            for klass in kind.__mro__:
                module_name = getattr(klass, "__module__", None)
                if not isinstance(module_name, str) or module_name in (home, "builtins"):
                    continue
                for key, value in vars(klass).items():
                    self._class_attributes.setdefault(id(value), (klass, key))
                for module in _module_and_packages(module_name, home):
                    self._index_module(module)

    def _index_module(self, module: types.ModuleType) -> None:
        if id(module) in self._indexed_modules:
            return
        self._indexed_modules.add(id(module))
        for key, value in vars(module).items():
            self._module_globals.setdefault(id(value), (module, key))
            if isinstance(value, dict):  # a registry, or settings such as rcParams
                for item_key, item in dict.items(value):
                    self._global_items.setdefault(id(item), (value, item_key))

    def _belongs_to_library(self, obj: object, home: str) -> bool:
        if _named_global(obj, home):
            return True  # written by name: a load gives back the very object, shared anyway
        key = id(obj)
        attribute = self._class_attributes.get(key)
        global_ = self._module_globals.get(key)
        item = self._global_items.get(key)
        held = ((attribute is not None and vars(attribute[0]).get(attribute[1]) is obj)
                or (global_ is not None and vars(global_[0]).get(global_[1]) is obj)
                or (item is not None and dict.get(item[0], item[1]) is obj))
        return held and not self._reached_by_user(obj, home)

    def _reached_by_user(self, obj: object, home: str,
                         owners: tuple[str, ...] | None = None) -> bool:
        """Whether a variable that reached ``obj`` (of ``owners``) holds it in its own
        structure."""
        def follow(holder: object, element: bool) -> bool:
            return not enters_library(holder, element, home)

        key = id(obj)
        for name, ids, _ in self._owners:
            if key not in ids or (owners is not None and name not in owners):
                continue
            for root in self._root_values.get(name, ()):
                found, complete = search(root, lambda child: child is obj, name, follow=follow,
                                         max_visits=_SEARCH_VISITS)
                if found is not None or not complete:
                    return True
        return False


def _module_and_packages(module_name: str, home: str) -> list[types.ModuleType]:
    """The module named ``module_name`` and the packages above it, as imported."""
    parts = module_name.split(".")
    names = (".".join(parts[:count]) for count in range(len(parts), 0, -1))
    return [module for name in names if name != home
            and (module := sys.modules.get(name)) is not None]


def _named_global(obj: object, home: str) -> bool:
    """Whether ``obj`` is what its own ``__module__`` and ``__qualname__`` name."""
    try:
        module_name = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
    except Exception:  # an object whose __getattr__ raises something else
        return False
    if type(module_name) is not str or type(qualname) is not str or module_name == home:
        return False
    module = sys.modules.get(module_name)
    return module is not None and lookup(module, qualname) is obj


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
        self.markers: tuple[object, ...] = ()
        """With :func:`marked`, each root's marker (the values pickled): the dump is split
        at them, and each root recorded as its own owner."""
        self.owners_by_root: dict[str, frozenset[str]] = {}
        # An instance attribute: the C pickler looks persistent_id up when it is made.
        self.persistent_id = self.reached.append
        super().__init__(file, serializer, **kwargs)  # type: ignore[call-arg]

    def note_shared(self, obj: object) -> None:
        self.always.append(obj)  # counted whatever its type (a class stored by value)

    def settle(self) -> None:
        """Add what this dump reached to the record; note whose objects it met."""
        if self.markers:
            return self._settle_each()
        record = self.record
        assert record is not None
        kept = self._shareable(self.reached) + self.always
        self.touched_owners.update(record.add(
            self.owner, kept, roots=tuple(value for _, value in self.roots),
            home=self.serializer.module_name))
        return None

    def _settle_each(self) -> None:
        """Record each root of a marked dump as its own owner (see :func:`marked`).

        A root's part of the dump runs from its marker to the next one: what an
        earlier root reached first is that root's, and where a later root meets
        it again (the pickler notes every meeting, a memo hit too) the two share.
        If the markers are not all where they were put (a value was replaced
        whole), nothing is recorded and ``owners_by_root`` stays empty.
        """
        record = self.record
        assert record is not None
        reached = self.reached
        markers = set(map(id, self.markers))
        always = set(map(id, self.always))
        # One pass at C speed finds the markers and where the always-counted objects are.
        hits = list(itertools.compress(itertools.count(), map(
            (markers | always).__contains__, map(id, reached))))
        bounds = [at for at in hits if id(reached[at]) in markers]
        if len(bounds) != len(self.roots) or any(
                reached[at] is not marker
                for at, marker in zip(bounds, self.markers, strict=True)):
            return
        bounds.append(len(reached))
        for index, (name, value) in enumerate(self.roots):
            start, end = bounds[index] + 1, bounds[index + 1]
            kept = self._shareable(reached[start:end])
            kept += [reached[at] for at in hits
                     if start <= at < end and id(reached[at]) in always]
            self.owners_by_root[name] = frozenset(record.add(
                name, kept, roots=(value,), home=self.serializer.module_name))

    def _shareable(self, reached: list[object]) -> list[object]:
        """The objects of ``reached`` of kinds that can be shared."""
        flags = list(map(_shareable_kinds.get, map(type, reached)))
        if None in flags:  # kinds not met before: sort them out once
            for kind in set(map(type, reached)) - _shareable_kinds.keys():
                _shareable_kinds[kind] = self._shareable_kind(kind)
            if len(_shareable_kinds) > 50_000:  # redefined classes pile up in a long session
                _shareable_kinds.clear()
                return self._shareable(reached)
            flags = list(map(_shareable_kinds.__getitem__, map(type, reached)))
        return list(itertools.compress(reached, flags))

    def _shareable_kind(self, kind: type) -> bool:
        if kind in IMMUTABLE or issubclass(kind, _NEVER_SHARED):
            return False  # classes and functions stored by value are noted explicitly
        if kind.__name__ in _CYTHON_FUNCTIONS and kind.__module__.startswith("_cython"):
            return False  # pickled by name, or not at all
        return not identity_free_kind(kind, self.serializer.is_by_value)


def marked(values: tuple[object, ...]) -> tuple[Ref, ...]:
    """``values`` to pickle as one group, each behind a marker where its part begins.

    A recording dump of these records each root as its own owner, so that one
    dump of a group both stores it and shows whether its roots still share
    objects (``RecordingPickling.owners_by_root``).  A marker pickles as a call
    of :func:`kernos.serialize.rebuild.member`, which gives the value back.
    """
    return tuple(Ref(rebuild.member, (value,)) for value in values)


# Objects of these kinds are written by reference (classes, functions and modules
# that are imported by name), so a load brings back the very same object anyway.
_NEVER_SHARED = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
                 types.MethodDescriptorType, types.WrapperDescriptorType,
                 types.MethodWrapperType, types.ClassMethodDescriptorType)
_SEARCH_VISITS = 50_000
_CYTHON_FUNCTIONS = frozenset({"cython_function_or_method", "fused_cython_function"})
_shareable_kinds: dict[type, bool] = {}
