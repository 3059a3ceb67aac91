"""Turn namespace values into bytes and back.

Three promises, and how they are kept:

* **C-pickle speed for data.**  Values are written by a subclass of the C
  ``pickle.Pickler``.  Plain data (dicts, lists, strings, numbers) never leaves
  C; only objects the C pickler would hand to ``reducer_override`` anyway
  (instances, functions, classes, modules, ...) cost a Python call.  Large
  contiguous buffers (numpy arrays, pandas blocks) travel out of band
  (protocol 5), so they are hashed and stored in chunks, never copied into the
  stream.
* **Everything dill handles.**  Functions, lambdas, closures and classes that
  were defined in cells (or cannot be found by name) are stored by value as
  skeleton + state, so cycles through them work and one memo keeps identity;
  their code objects go through dill.  Modules are stored by name and
  re-imported, and so is any object an imported module holds as a global
  (numpy's global generator, matplotlib's ``rcParams`` and ``colormaps``; see
  ``kinds.ModuleGlobals``): it comes back as the live one, not a copy cut off
  from the library that uses it.  Anything else the C pickler cannot reduce is handed to dill as
  a last resort before it is declared unpersistable.
* **Loud about what cannot persist.**  Open files, sockets, threads,
  generators, database connections and whatever neither pickler can handle are
  replaced in the stream by a record of the variable, the object path, the
  type and the reason.  A restore puts an :class:`Unpersisted` placeholder
  there; a rollback in the same session puts back the live object.

The first attempt runs fast: unknown objects go to the C pickler's default
reduction.  Only if that raises does a careful pass reduce each object itself
so that a failure can be pinned to one object and replaced; where the
placeholder goes (the bad object itself, or the library object that holds it
in its private state) is decided in ``kernos.serialize.unpersistable``.
Which variables share objects is found in ``kernos.serialize.sharing``.
"""

from __future__ import annotations

import enum
import importlib
import io
import mmap
import pickle
import sys
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernos.serialize import rebuild
from kernos.serialize.kinds import (
    MODULE_GLOBALS,
    NAME_CONTAINERS,
    PICKLABLE_STREAMS,
    PROTOCOL,
    SINGLETONS,
    SPECIAL,
    TYPING_MODULES,
    Ref,
    canonical,
    canonical_names,
    code_names,
    init_needs_more_than_args,
    lookup,
    module_global,
    qualified,
    reduce_exception,
    register_late_types,
    transient_types,
)
from kernos.serialize.resources import transient_verdict
from kernos.serialize.sealing import SEALERS
from kernos.serialize.sharing import RecordingPickling, SharingRecord, marked
from kernos.serialize.trial import Trials
from kernos.serialize.unpersistable import (
    CarefulPickling,
    Replacement,
    Transient,
    describe_failure,
    held_resource_reason,
    holder_reason,
    locate,
)
from kernos.serialize.unpersisted import Unpersisted

__all__ = ["Pickled", "Serializer", "SharingRecord", "Transient"]

#: Buffers below this size stay in the stream: a blob per tiny array costs more than it saves.
OUT_OF_BAND_MIN_BYTES = 64 * 1024


@dataclass(kw_only=True)
class Pickled:
    """One pickled tuple of values: the stream, its out-of-band buffers and what it met."""

    stream: bytes
    buffers: list[memoryview]
    transients: list[Transient]
    code_refs: frozenset[str]
    """Global names read by code that was stored by value (see ``kernos.analysis``)."""
    touched_owners: frozenset[str] = frozenset()
    """Other variables whose objects this pickle also reached (recording mode only)."""
    segmented: Any = None
    """For a value stored in segments (``kernos.serialize.segments.Segmented``): the
    segments, which are the buffers, in order."""
    kinds: frozenset[type] = frozenset()
    """Types of the objects that pickled by their own reduction (not by a reducer of
    Kernos's, by name or as a reference): what a restore would call back into."""
    owners_by_root: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Several roots and a record: for each root, the other variables it met."""
    joint: tuple[str, ...] = ()
    """The names pickled together in this stream, when it stands for one of them."""


class Serializer:
    """Pickles tuples of namespace values and loads them back.

    One serializer belongs to one namespace: functions and classes defined in
    that namespace (whose ``__module__`` is ``module_name``) are stored by
    value, and functions whose globals are the namespace get it back on load.
    """

    def __init__(
        self,
        namespace: MutableMapping[str, Any],
        *,
        module_name: str = "__main__",
        module: types.ModuleType | None = None,
    ) -> None:
        self.namespace = namespace
        self.module_name = module_name
        self.module = module
        self.keyring: Any = None
        """Seals personal values (see kernos.personal); set by the image."""
        self.trials = Trials()
        """Which types' loading has been tried (see kernos.serialize.trial)."""

    @property
    def transient_reasons(self) -> dict[type, str]:
        return transient_types()[1]

    @property
    def transient_classes(self) -> tuple[type, ...]:
        return transient_types()[0]

    def dump(
        self,
        roots: Sequence[tuple[str, object]],
        *,
        op: int | None = None,
        record: SharingRecord | None = None,
    ) -> Pickled:
        """Pickle the values of ``roots`` (``(name, value)`` pairs) as one tuple.

        With ``record``, every object that can be shared is noted as belonging
        to the root's name, and the names of other roots whose objects this one
        reaches are returned in ``touched_owners``.  Several roots are a group:
        each is pickled behind a marker (``sharing.marked``), and with
        ``record`` each is its own owner, ``owners_by_root`` saying whom each
        met (empty if that could not be told).
        """
        values = tuple(self.namespace_ref(value) for _, value in roots)
        if len(values) > 1:
            values = marked(values)
        register_late_types()
        MODULE_GLOBALS.refresh(self.module_name)
        try:
            outcome = self._dump(values, roots, op=op, record=record, careful=False)
        except Exception:
            outcome = None
        if outcome is None:
            try:
                outcome = self._dump(values, roots, op=op, record=record, careful=True)
            except Exception as error:
                outcome = self._dump_whole_values(values, roots, op=op, record=record,
                                                  failure=error)
        pickler = self._replace_holders(outcome, roots, op=op, record=record)
        if isinstance(pickler, RecordingPickling):
            pickler.settle()  # the final dump only: objects of a replaced holder do not count
        return Pickled(
            stream=pickler.out.getvalue(),
            buffers=pickler.buffers,
            transients=pickler.transients,
            code_refs=frozenset(pickler.code_refs),
            touched_owners=frozenset(pickler.touched_owners),
            kinds=frozenset(pickler.kinds),
            owners_by_root=getattr(pickler, "owners_by_root", {}),
        )

    def _dump_whole_values(self, values: tuple[object, ...],
                           roots: Sequence[tuple[str, object]], *, op: int | None,
                           record: SharingRecord | None, failure: Exception) -> _ImagePickler:
        """The careful pass could not pin the failure on one object: give up on
        whole variables, one at a time, and keep the rest."""
        replaced = []
        for index, (name, value) in enumerate(roots):
            try:
                self._dump((values[index],), [(name, value)], op=op, record=None, careful=True)
                replaced.append(values[index])
            except Exception as error:
                reason = describe_failure(error if len(roots) > 1 else failure)
                replaced.append(_WholeValue(name, value, reason))
        return self._dump(tuple(replaced), roots, op=op, record=record, careful=True)

    def _replace_holders(self, outcome: _ImagePickler, roots: Sequence[tuple[str, object]],
                         *, op: int | None,
                         record: SharingRecord | None) -> _ImagePickler:
        """Dump again, replacing whole the library objects that hold what cannot persist."""
        replace: dict[int, Replacement] = {}
        for _ in range(4):  # each round can only find holders the last one did not reach
            if not outcome.holders.keys() - replace.keys():
                break
            for key, (holder, located) in outcome.holders.items():
                if key in replace:
                    continue
                where = located[0][0]
                replace[key] = Replacement(obj=holder, name=where.name,
                                           path=where.holder_path,
                                           reason=holder_reason(located))
            try:
                outcome = self._dump(outcome.values, roots, op=op, record=record,
                                     careful=True, replace=replace)
            except Exception:
                break  # keep the placeholders where they were: still never silent
        return outcome

    def namespace_ref(self, value: object) -> object:
        if value is self.namespace:
            return Ref(rebuild.namespace)
        return value

    def _dump(
        self,
        values: tuple[object, ...],
        roots: Sequence[tuple[str, object]],
        *,
        op: int | None,
        record: SharingRecord | None,
        careful: bool,
        replace: dict[int, Replacement] | None = None,
    ) -> _ImagePickler:
        """One pickling pass; the pickler holds the stream and what it met."""
        klass = _PICKLERS[careful, record is not None]
        pickler = klass(io.BytesIO(), self, roots=roots, op=op, careful=careful, record=record)
        pickler.replace = replace or {}
        pickler.values = values
        if isinstance(pickler, RecordingPickling) and len(roots) > 1:
            pickler.markers = values
        pickler.dump(values)
        return pickler

    def load(
        self,
        stream: bytes | bytearray | memoryview | mmap.mmap,
        buffers: Sequence[Any] = (),
        *,
        live_transients: Sequence[object] = (),
    ) -> tuple[object, ...]:
        """Load a tuple written by :meth:`dump` into this serializer's namespace."""
        context = rebuild.LoadContext(
            namespace=self.namespace, module=self.module, live_transients=live_transients,
            keyring=self.keyring,
        )
        token = rebuild.use_context(context)
        try:
            values = pickle.loads(stream, buffers=buffers)
            context.finish()
        finally:
            rebuild.reset_context(token)
        if type(values) is not tuple:
            raise TypeError(f"a snapshot stream holds {type(values).__name__}, not a tuple")
        return values

    def would_not_load(self, pickled: Pickled) -> str | None:
        """Why ``pickled`` would not load back, tried once per new type (see trial), or None."""
        return self.trials.check(pickled.kinds, lambda: self.load(
            pickled.stream, list(pickled.buffers),
            live_transients=[t.obj for t in pickled.transients]))

    def is_by_value(self, obj: type | types.FunctionType) -> bool:
        """Whether a function or class must be stored by value rather than by name."""
        module_name = getattr(obj, "__module__", None)
        if module_name is None or module_name == self.module_name:
            return True
        module = sys.modules.get(module_name)
        if module is None:
            return True
        return lookup(module, getattr(obj, "__qualname__", obj.__name__)) is not obj


class _WholeValue:
    """A variable that could not be pickled at all, even one object at a time."""

    __slots__ = ("name", "reason", "value")

    def __init__(self, name: str, value: object, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason


class _ImagePickler(pickle.Pickler):
    def __init__(
        self,
        file: io.BytesIO,
        serializer: Serializer,
        *,
        roots: Sequence[tuple[str, object]],
        op: int | None,
        careful: bool,
        record: SharingRecord | None,
    ) -> None:
        super().__init__(file, protocol=PROTOCOL, buffer_callback=self._take_buffer)
        self.out = file
        self.serializer = serializer
        self.home_module = serializer.module_name
        self.roots = roots
        self.op = op
        self.careful = careful
        self.record = record
        self.transient_classes = serializer.transient_classes  # once per dump, not per object
        self.owner = roots[0][0] if roots else ""
        self.buffers: list[memoryview] = []
        self.transients: list[Transient] = []
        self.code_refs: set[str] = set()
        self.kinds: set[type] = set()
        self.touched_owners: set[str] = set()
        self.cells_filled_by_function: set[int] = set()
        self._by_value: dict[int, bool] = {}
        self._class_skeletons: dict[int, dict[str, Any]] = {}
        self._memory_tokens: dict[int, Ref] = {}
        self._memory_owners: list[object] = []
        self.values: tuple[object, ...] = ()
        self.replace: dict[int, Replacement] = {}
        """Library objects to replace whole (careful pass only)."""
        self.holders: dict[int, tuple[object, list[tuple[Any, Transient]]]] = {}
        """Library objects found holding what cannot persist (see unpersistable)."""

    def note_shared(self, obj: object) -> None:
        """Sharing is looked for only when recording (see _RecordingPickler)."""

    def memory_token(self, owner: object, reduce: Callable[[], Any]) -> object:
        if type(owner) in (bytearray, bytes):
            return owner  # a value in its own right: pickled (and memoized) as itself
        token = self._memory_tokens.get(id(owner))
        if token is None:
            token = self._memory_tokens[id(owner)] = Ref(*reduce())
            self._memory_owners.append(owner)  # keeps its id from being reused
        return token

    def where(self, obj: object) -> tuple[str, str]:
        found = locate(self.roots, obj, None, default_owner=self.owner,
                       by_value=self.serializer.is_by_value, home=self.serializer.module_name,
                       max_visits=10_000)
        return found.name, found.path

    def _take_buffer(self, buffer: pickle.PickleBuffer) -> bool:
        try:
            view = buffer.raw()
        except BufferError:
            return True  # not contiguous: numpy falls back to an in-band copy
        if view.nbytes < OUT_OF_BAND_MIN_BYTES:
            return True
        self.buffers.append(view)
        return False

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        seal = SEALERS.get(kind)
        if seal is not None:  # a personal value (see kernos.serialize.sealing)
            keyring = self.serializer.keyring
            if keyring is None:
                raise TypeError("personal values can be persisted only in a workspace "
                                "(it holds the subjects' keys)")
            return seal(obj, keyring)
        if kind is types.FunctionType:
            return self._reduce_function(obj)
        if isinstance(obj, type):
            return self._reduce_class(obj)
        if kind is Ref:
            return (obj.func, obj.args)
        if kind is types.ModuleType:
            return self._reduce_module(obj)
        if id(obj) in SINGLETONS:
            return (rebuild.singleton, SINGLETONS[id(obj)])
        home = module_global(obj) if kind.__module__ != self.home_module else None
        if home is not None:  # a library's process-wide object: referenced, never copied
            return (rebuild.singleton, home)
        special = SPECIAL.get(kind)
        if special is not None:
            return special(self, obj)
        if isinstance(obj, BaseException) and init_needs_more_than_args(kind):
            return reduce_exception(obj)
        if kind is _WholeValue:
            return self._unpersisted(obj.value, obj.reason, name=obj.name, failure=True)
        if kind is Unpersisted:
            return self._placeholder(obj)
        if isinstance(obj, self.transient_classes) and not isinstance(
            obj, PICKLABLE_STREAMS
        ):
            reason, lossless = transient_verdict(obj, self.transient_reason(obj))
            return self._unpersisted(obj, reason, lossless=lossless)
        self.kinds.add(kind)
        if self.careful:
            return self._reduce_carefully(obj)
        return NotImplemented

    def _reduce_carefully(self, obj: Any) -> Any:
        return NotImplemented  # see CarefulPickling
    # -- functions, classes, modules --------------------------------------

    def needs_value(self, obj: Any) -> bool:
        key = id(obj)
        known = self._by_value.get(key)
        if known is None:
            known = self._by_value[key] = self.serializer.is_by_value(obj)
        return known

    def _reduce_function(self, func: types.FunctionType) -> Any:
        if not self.needs_value(func):
            return NotImplemented
        if func.__module__ not in (self.home_module, None):
            home = MODULE_GLOBALS.search(func, self.home_module)
            if home is not None:  # a library's function kept as another module's global
                return (rebuild.singleton, home)
        self.note_shared(func)
        code = func.__code__
        self.code_refs |= code_names(code)
        closure = func.__closure__
        closure_values = []
        for index, cell in enumerate(closure or ()):
            self.cells_filled_by_function.add(id(cell))
            try:
                closure_values.append((index, cell.cell_contents))
            except ValueError:
                continue  # an empty cell stays empty
        state: dict[str, Any] = {
            "__qualname__": canonical(func.__qualname__),
            "__module__": canonical(func.__module__),
            "__doc__": func.__doc__,
            "closure_values": closure_values,
        }
        if func.__defaults__ is not None:
            state["__defaults__"] = func.__defaults__
        if func.__kwdefaults__ is not None:
            state["__kwdefaults__"] = func.__kwdefaults__
        if func.__annotations__:
            state["__annotations__"] = canonical_names(func.__annotations__)
        if func.__dict__:
            state["__dict__"] = func.__dict__
        return (
            rebuild.make_function,
            (code, self._globals_ref(func), canonical(func.__name__), closure),
            state,
            None,
            None,
            rebuild.set_function_state,
        )

    def _globals_ref(self, func: types.FunctionType) -> object:
        globals_ = func.__globals__
        if globals_ is self.serializer.namespace:
            return Ref(rebuild.namespace)
        module = sys.modules.get(globals_.get("__name__", ""))
        if module is not None and getattr(module, "__dict__", None) is globals_:
            return Ref(rebuild.module_dict, (module.__name__,))
        return globals_

    def _reduce_class(self, cls: type) -> Any:
        if not self.needs_value(cls):
            return NotImplemented
        self.note_shared(cls)
        namespace = cls.__dict__
        skeleton: dict[str, Any] = {
            "__module__": canonical(namespace.get("__module__", cls.__module__)),
            "__qualname__": canonical(cls.__qualname__),
        }
        outer = self._class_skeletons.setdefault(id(cls), skeleton)
        if outer is not skeleton:
            # Reached again while its own bases were being pickled (a base's state
            # refers to it, say a registry): this inner copy is complete, and the
            # outer call, whose skeleton is not written yet, must return it rather
            # than make the class twice (and run __init_subclass__ once more).
            outer[rebuild.SAME_AS] = cls
        if "__orig_bases__" in namespace:
            # typing.Generic checks it when the class is created, not later.
            skeleton["__orig_bases__"] = namespace["__orig_bases__"]
        slots = namespace.get("__slots__")
        # __slotnames__ is a cache that copyreg adds the first time an instance is
        # pickled: keeping it would make the class pickle differently from then on.
        skip = {"__dict__", "__weakref__", "__module__", "__qualname__", "_abc_impl",
                "__slotnames__", "__orig_bases__"}
        if slots is not None:
            skeleton["__slots__"] = canonical_names(slots)
            skip.add("__slots__")
            skip.update((slots,) if isinstance(slots, str) else slots)
        if isinstance(cls, enum.EnumMeta) and issubclass(cls, enum.Enum):
            members = [(member, cls[member]._value_) for member in cls._member_names_]
            state = {
                key: namespace[key] for key in sorted(namespace)
                if key not in skip and key not in cls._member_names_
                and isinstance(namespace[key], (types.FunctionType, staticmethod, classmethod,
                                                property))
                and key not in ("__new__", "__reduce_ex__", "_generate_next_value_")
            }
            return (
                rebuild.make_enum,
                (type(cls), canonical(cls.__name__), cls.__bases__, skeleton, members),
                state, None, None, rebuild.set_class_state,
            )
        # Sorted, so that a class pickles the same before and after a restore
        # (the restored class's __dict__ lists the skeleton's keys first).
        state = {key: canonical_names(namespace[key]) if key in NAME_CONTAINERS
                 else namespace[key] for key in sorted(namespace) if key not in skip}
        metaclass = type(cls)
        make = rebuild.make_class
        if metaclass.__name__ == "_TypedDictMeta" and metaclass.__module__ in TYPING_MODULES:
            # Its __new__ refuses the bases (dict,) that it gives the classes it makes.
            make = rebuild.make_class_unchecked
        return (
            make,
            (metaclass, canonical(cls.__name__), cls.__bases__, skeleton),
            state,
            None,
            None,
            rebuild.set_class_state,
        )

    def _reduce_module(self, module: types.ModuleType) -> Any:
        namespace_module = self.serializer.module
        if module is namespace_module or module.__dict__ is self.serializer.namespace:
            return (rebuild.namespace_module, ())
        if sys.modules.get(module.__name__) is module:
            return (importlib.import_module, (module.__name__,))
        return self._unpersisted(
            module, f"the module {module.__name__!r} was not imported from a file, so it "
                    "cannot be re-imported by name; create it again after a restore"
        )

    # -- what cannot persist --------------------------------------------------

    def transient_reason(self, obj: object) -> str:
        for klass, reason in self.serializer.transient_reasons.items():
            if isinstance(obj, klass):
                return reason
        return "it is a live resource that cannot be persisted"

    def unpersisted(self, obj: object, reason: str, *, lossless: bool = False) -> Any:
        """A placeholder record for ``obj`` (for the reducers in kinds and friends)."""
        return self._unpersisted(obj, reason, lossless=lossless)

    def _failed(self, obj: object, reason: str) -> Any:
        return self._unpersisted(obj, reason, failure=True)

    def _unpersisted(self, obj: object, reason: str, *, name: str | None = None,
                     lossless: bool = False, failure: bool = False) -> Any:
        where = locate(self.roots, obj, name, default_owner=self.owner,
                       by_value=self.serializer.is_by_value, home=self.serializer.module_name,
                       opaque=frozenset(self.replace))
        if failure and where.holder is None and type(obj).__module__ != self.serializer.module_name:
            reason = held_resource_reason(obj, where.path, reason)
        transient = Transient(name=where.name, path=where.path, type_name=qualified(type(obj)),
                              reason=reason + where.note, obj=obj, lossless=lossless)
        if where.holder is not None:
            key = id(where.holder)
            self.holders.setdefault(key, (where.holder, []))[1].append((where, transient))
        return self._record(transient)

    def careful_transient(self, obj: object, replacement: Replacement) -> Any:
        return self._record(Transient(name=replacement.name, path=replacement.path,
                                      type_name=qualified(type(obj)), reason=replacement.reason,
                                      obj=obj))

    def _placeholder(self, placeholder: Unpersisted) -> Any:
        """A placeholder from an earlier restore pickles exactly as the value it stands for."""
        return self._record(Transient(name=placeholder.name, path=placeholder.path,
                                      type_name=placeholder.type_name,
                                      reason=placeholder.reason, obj=placeholder,
                                      lossless=placeholder.lossless))

    def _record(self, transient: Transient) -> Any:
        index = len(self.transients)
        self.transients.append(transient)
        return (rebuild.unpersisted, (index, transient.info()))


class _CarefulPickler(CarefulPickling, _ImagePickler):
    pass


class _RecordingPickler(RecordingPickling, _ImagePickler):
    pass


class _CarefulRecordingPickler(CarefulPickling, RecordingPickling, _ImagePickler):
    pass


_PICKLERS: dict[tuple[bool, bool], type[_ImagePickler]] = {
    (False, False): _ImagePickler, (False, True): _RecordingPickler,
    (True, False): _CarefulPickler, (True, True): _CarefulRecordingPickler,
}
