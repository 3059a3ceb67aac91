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
  re-imported.  Anything else the C pickler cannot reduce is handed to dill as
  a last resort before it is declared unpersistable.
* **Loud about what cannot persist.**  Open files, sockets, threads,
  generators, database connections and whatever neither pickler can handle are
  replaced in the stream by a record of the variable, the object path, the
  type and the reason.  A restore puts an :class:`Unpersisted` placeholder
  there; a rollback in the same session puts back the live object.

The first attempt runs fast: unknown objects go to the C pickler's default
reduction.  Only if that raises does a careful pass reduce each object itself
so that a failure can be pinned to one object and replaced.
"""

from __future__ import annotations

import copyreg
import enum
import importlib
import io
import itertools
import mmap
import pickle
import sys
import types
import warnings
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dill

from kernos.personal import Personal
from kernos.serialize import rebuild
from kernos.serialize.kinds import (
    IMMUTABLE,
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
    identity_free_kind,
    init_needs_more_than_args,
    lookup,
    qualified,
    reduce_exception,
    reduce_memory,
    register_late_types,
    transient_types,
)
from kernos.serialize.paths import find_path
from kernos.serialize.unpersisted import Unpersisted

__all__ = ["Pickled", "Serializer", "SharingRecord", "Transient", "code_names"]

#: Buffers below this size stay in the stream: a blob per tiny array costs more than it saves.
OUT_OF_BAND_MIN_BYTES = 64 * 1024


@dataclass(kw_only=True)
class Transient:
    """A value inside a variable that could not be persisted."""

    name: str
    """The variable that holds it."""
    path: str
    """Where it sits inside the variable, e.g. ``data['conn']``."""
    type_name: str
    """Its type, qualified by module."""
    reason: str
    """Why it could not be persisted, and what to do."""
    obj: object = field(repr=False, compare=False)
    """The live object (kept so that a rollback can put it back)."""

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "type_name": self.type_name,
                "reason": self.reason}


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


class SharingRecord:
    """Which objects the dumps of one batch reached, by variable.

    An op that affects several names pickles them one by one into one record;
    two names whose pickles reached a common object must be stored together.
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
        to the (single) root's name, and the names of other roots whose
        objects this one reaches are returned in ``touched_owners``.
        """
        values = tuple(self.namespace_ref(value) for _, value in roots)
        register_late_types()
        try:
            return self._dump(values, roots, op=op, record=record, careful=False)
        except Exception:
            pass
        try:
            return self._dump(values, roots, op=op, record=record, careful=True)
        except Exception as error:
            failure = error
        # The careful pass could not pin the failure on one object: give up on
        # whole variables, one at a time, and keep the rest.
        replaced = []
        for index, (name, value) in enumerate(roots):
            try:
                self._dump((values[index],), [(name, value)], op=op, record=None, careful=True)
                replaced.append(values[index])
            except Exception as error:
                reason = _describe_failure(error if len(roots) > 1 else failure)
                replaced.append(_WholeValue(name, value, reason))
        return self._dump(tuple(replaced), roots, op=op, record=record, careful=True)

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
    ) -> Pickled:
        out = io.BytesIO()
        klass = _RecordingPickler if record is not None else _ImagePickler
        pickler = klass(out, self, roots=roots, op=op, careful=careful, record=record)
        pickler.dump(values)
        if isinstance(pickler, _RecordingPickler):
            pickler.settle()
        return Pickled(
            stream=out.getvalue(),
            buffers=pickler.buffers,
            transients=pickler.transients,
            code_refs=frozenset(pickler.code_refs),
            touched_owners=frozenset(pickler.touched_owners),
        )

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


def _describe_failure(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return "it is nested too deeply to pickle (recursion limit reached)"
    return f"it cannot be pickled ({type(error).__name__}: {error})"


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
        self.serializer = serializer
        self.roots = roots
        self.op = op
        self.careful = careful
        self.record = record
        self.owner = roots[0][0] if roots else ""
        self.buffers: list[memoryview] = []
        self.transients: list[Transient] = []
        self.code_refs: set[str] = set()
        self.touched_owners: set[str] = set()
        self.cells_filled_by_function: set[int] = set()
        self._by_value: dict[int, bool] = {}
        self._class_skeletons: dict[int, dict[str, Any]] = {}
        self._memory_tokens: dict[int, Ref] = {}
        self._memory_owners: list[object] = []

    def note_shared(self, obj: object) -> None:
        """Sharing is looked for only when recording (see _RecordingPickler)."""

    def memory_token(self, owner: object, memory: Any) -> object:
        if type(owner) in (bytearray, bytes):
            return owner  # a value in its own right: pickled (and memoized) as itself
        token = self._memory_tokens.get(id(owner))
        if token is None:
            token = self._memory_tokens[id(owner)] = Ref(*reduce_memory(memory))
            self._memory_owners.append(owner)  # keeps its id from being reused
        return token

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
        if kind is Personal:
            keyring = self.serializer.keyring
            if keyring is None:
                raise TypeError("personal values can be persisted only in a workspace "
                                "(it holds the subjects' keys)")
            return obj._sealed(keyring)
        if kind is types.FunctionType:
            return self._reduce_function(obj)
        if isinstance(obj, type):
            return self._reduce_class(obj)
        if kind is Ref:
            return (obj.func, obj.args)
        if kind is types.ModuleType:
            return self._reduce_module(obj)
        special = SPECIAL.get(kind)
        if special is not None:
            return special(self, obj)
        if isinstance(obj, BaseException) and init_needs_more_than_args(kind):
            return reduce_exception(obj)
        if id(obj) in SINGLETONS:
            return (rebuild.singleton, SINGLETONS[id(obj)])
        if kind is _WholeValue:
            return self._unpersisted(obj.value, obj.reason, name=obj.name)
        if kind is Unpersisted:
            return self._placeholder(obj)
        if isinstance(obj, self.serializer.transient_classes) and not isinstance(
            obj, PICKLABLE_STREAMS
        ):
            return self._unpersisted(obj, self._transient_reason(obj))
        if self.careful:
            return self._reduce_carefully(obj)
        return NotImplemented

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

    # -- the careful pass --------------------------------------------------

    def _reduce_carefully(self, obj: Any) -> Any:
        try:
            reducer = copyreg.dispatch_table.get(type(obj))
            reduced = reducer(obj) if reducer is not None else obj.__reduce_ex__(PROTOCOL)
        except Exception as error:
            return self._reduce_with_dill(obj, error)
        if isinstance(reduced, str):
            return NotImplemented  # "pickle me as a global by this name"
        return reduced

    def _reduce_with_dill(self, obj: Any, error: Exception) -> Any:
        try:
            with warnings.catch_warnings():
                # dill warns about what it cannot do; the failure is reported below.
                warnings.simplefilter("ignore")
                blob = dill.dumps(obj, protocol=PROTOCOL)
        except Exception:
            return self._unpersisted(obj, _describe_failure(error))
        return (rebuild.from_dill, (blob,))

    # -- what cannot persist --------------------------------------------------

    def _transient_reason(self, obj: object) -> str:
        for klass, reason in self.serializer.transient_reasons.items():
            if isinstance(obj, klass):
                return reason
        return "it is a live resource that cannot be persisted"

    def _unpersisted(self, obj: object, reason: str, *, name: str | None = None) -> Any:
        owner, path = self._locate(obj, name)
        transient = Transient(
            name=owner, path=path, type_name=qualified(type(obj)), reason=reason, obj=obj
        )
        index = len(self.transients)
        self.transients.append(transient)
        return (rebuild.unpersisted, (index, transient.info()))

    def _placeholder(self, placeholder: Unpersisted) -> Any:
        """A placeholder from an earlier restore pickles exactly as the value it stands for."""
        transient = Transient(name=placeholder.name, path=placeholder.path,
                              type_name=placeholder.type_name, reason=placeholder.reason,
                              obj=placeholder)
        index = len(self.transients)
        self.transients.append(transient)
        return (rebuild.unpersisted, (index, transient.info()))

    def _locate(self, obj: object, name: str | None) -> tuple[str, str]:
        for root_name, root_value in self.roots:
            if name is not None and root_name != name:
                continue
            path = find_path(root_value, obj, root_name)
            if path is not None:
                return root_name, path
        owner = name or self.owner
        return owner, f"{owner}.<somewhere inside>"


class _RecordingPickler(_ImagePickler):
    """Also notes which objects each variable reaches, to find sharing between variables.

    The C pickler calls ``persistent_id`` with every object it writes.  A Python
    method there costs a call per object (it made pickling a dict of 100k small
    dicts four times slower); a list's ``append`` costs almost nothing, and the
    objects are sorted out after the dump with C-level iterators.
    """

    def __init__(self, file: io.BytesIO, serializer: Serializer, **kwargs: Any) -> None:
        self.reached: list[object] = []
        self.always: list[object] = []
        # An instance attribute: the C pickler looks persistent_id up when it is made.
        self.persistent_id = self.reached.append  # type: ignore[method-assign]
        super().__init__(file, serializer, **kwargs)

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
