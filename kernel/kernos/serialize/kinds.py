"""The kinds of objects the image pickler treats specially, and how.

``pickler.py`` decides *when* an object needs special treatment; this module
holds *what* to do for each kind: the reducers of objects the C pickler cannot
store (or would store wrongly), the live resources that are never pickled, the
sentinels that must come back as themselves, and the objects whose identity
does not matter when looking for sharing between variables.
"""

from __future__ import annotations

import _thread
import contextlib
import copyreg
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import io
import itertools
import pathlib
import re
import sys
import types
import typing
import uuid
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import dill

from kernos.serialize import rebuild
from kernos.serialize.iterators import ITERATOR_REDUCERS
from kernos.serialize.resources import RESOURCE_REDUCERS, register_late_resources

PROTOCOL = 5


class ReducingPickler(Protocol):
    """What the reducers here need from the pickler that calls them."""

    cells_filled_by_function: set[int]
    home_module: str
    """The name of the namespace's module: what is defined there is the user's."""

    def needs_value(self, obj: Any) -> bool: ...

    def note_shared(self, obj: object) -> None:
        """Count ``obj`` as reached, for the sharing between variables (recording mode)."""

    def memory_token(self, owner: object, reduce: Callable[[], Any]) -> object:
        """One object per memory owner and pickle, which reduces as ``reduce()`` says."""

    def where(self, obj: object) -> tuple[str, str]:
        """The variable and path of ``obj`` (searched within bounds), for a placeholder."""

    def unpersisted(self, obj: object, reason: str, *, lossless: bool = False) -> Any:
        """A placeholder for ``obj``, reported with ``reason`` (see Transient)."""

    def transient_reason(self, obj: object) -> str:
        """Why a live resource like ``obj`` cannot persist."""


# Objects of these types carry no identity worth preserving across variables:
# two variables holding the same one need not be stored together.
IMMUTABLE = frozenset(
    {str, bytes, int, float, complex, bool, type(None), tuple, frozenset, range, slice,
     types.CodeType, type(Ellipsis), type(NotImplemented)}
)
_VALUE_TYPES: tuple[type, ...] = (
    datetime.date, datetime.time, datetime.timedelta, datetime.tzinfo, decimal.Decimal,
    fractions.Fraction, uuid.UUID, pathlib.PurePath, enum.Enum, re.Pattern,
)
_identity_free: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def identity_free_kind(kind: type, by_value: Callable[[type], bool]) -> bool:
    """Whether sharing an object of ``kind`` between variables is unobservable.

    True for immutable values: dates, decimals, UUIDs, paths, enum members
    (which a load looks up by value), compiled patterns, and numpy's dtypes and
    scalars, as long as the class is imported by name.  An instance of a class
    stored by value (defined in a cell) carries that class, whose identity does
    matter.  A wrong "no" only makes groups bigger; a wrong "yes" would lose
    sharing, so only immutable types are listed.
    """
    known = _identity_free.get(kind)
    if known is None:
        numpy = sys.modules.get("numpy")
        numpy_values: tuple[type, ...] = (numpy.dtype, numpy.generic) if numpy else ()
        known = issubclass(kind, _VALUE_TYPES + numpy_values) and not by_value(kind)
        _identity_free[kind] = known
    return known


def carries_no_identity(obj: object, by_value: Callable[[type], bool]) -> bool:
    """:func:`identity_free_kind` for one object."""
    return identity_free_kind(type(obj), by_value)


class Ref:
    """Stands in an argument list for a call made at load time."""

    __slots__ = ("args", "func")

    def __init__(self, func: Callable[..., Any], args: tuple[Any, ...] = ()) -> None:
        self.func = func
        self.args = args


def transient_types() -> tuple[tuple[type, ...], dict[type, str]]:
    """Types whose instances are live resources: never pickled, even if a pickler could."""
    loaded = tuple(name in sys.modules for name in ("sqlite3", "subprocess", "asyncio"))
    return _transient_types_for(loaded)


@functools.lru_cache(maxsize=8)
def _transient_types_for(loaded: tuple[bool, ...]) -> tuple[tuple[type, ...], dict[type, str]]:
    import socket
    import threading

    reasons: dict[type, str] = {
        io.IOBase: "open files and streams cannot be persisted; open the file again after "
                   "a restore",
        socket.socket: "network connections cannot be persisted; reconnect after a restore",
        threading.Thread: "running threads cannot be persisted; start the thread again "
                          "after a restore",
        types.GeneratorType: "a generator holds a paused frame, which cannot be persisted; "
                             "call its generator function again",
        types.CoroutineType: "a coroutine holds a paused frame, which cannot be persisted",
        types.AsyncGeneratorType: "an async generator holds a paused frame, which cannot be "
                                  "persisted",
        types.FrameType: "stack frames cannot be persisted",
        types.TracebackType: "tracebacks cannot be persisted",
    }
    for module_name, names, reason in (
        ("sqlite3", ("Connection", "Cursor"),
         "database connections cannot be persisted; reconnect after a restore"),
        ("subprocess", ("Popen",), "running processes cannot be persisted"),
        ("asyncio", ("Future", "Task", "AbstractEventLoop"),
         "asyncio tasks, futures and loops cannot be persisted"),
    ):
        module = sys.modules.get(module_name)
        for name in names:
            klass = getattr(module, name, None) if module else None
            if isinstance(klass, type):
                reasons[klass] = reason
    return tuple(reasons), reasons


PICKLABLE_STREAMS = (io.BytesIO, io.StringIO)
TYPING_MODULES = frozenset({"typing", "typing_extensions"})


def _singletons() -> dict[int, tuple[str, str]]:
    """Module-level sentinels that must come back as themselves, not as copies."""
    found: dict[int, tuple[str, str]] = {}
    for name in ("MISSING", "KW_ONLY", "_FIELD", "_FIELD_CLASSVAR", "_FIELD_INITVAR",
                 "_HAS_DEFAULT_FACTORY", "_EMPTY_METADATA"):
        if hasattr(dataclasses, name):
            found[id(getattr(dataclasses, name))] = ("dataclasses", name)
    return found


SINGLETONS = _singletons()


@functools.lru_cache(maxsize=8192)
def dill_code(code: types.CodeType) -> bytes:
    # No memo (fast mode): the blob then depends on the code's values only, not on
    # which of its names happen to be one string object, which a restored code
    # object does not reproduce (code objects hold no cycles, so no memo is needed).
    out = io.BytesIO()
    pickler = dill.Pickler(out, protocol=PROTOCOL)
    pickler.fast = True
    pickler.dump(code)
    return out.getvalue()


@functools.lru_cache(maxsize=8192)
def code_names(code: types.CodeType) -> frozenset[str]:
    """Every name a code object (and the code nested in it) may read as a global."""
    names = set(code.co_names)
    for const in code.co_consts:
        if type(const) is types.CodeType:
            names |= code_names(const)
    return frozenset(names)


def lookup(module: types.ModuleType, qualname: str) -> object:
    obj: object = module
    for part in qualname.split("."):
        if part == "<locals>":
            return None
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def canonical(name: Any) -> Any:
    """The interned copy of a name, so that the stream does not depend on its identity.

    Pickle's memo follows identity: a function whose ``__name__`` and
    ``__qualname__`` are one object is written differently from one whose are
    two equal strings, and a restore does not reproduce the identities of the
    original.  The names the reducers write are interned, so that how they are
    written depends on their values only and a restored value pickles as it did.
    """
    return sys.intern(name) if type(name) is str else name


def canonical_names(container: Any) -> Any:
    """A name, or a copy of a dict keyed by names or of a sequence of names, interned.

    These hold the same names as the keys of instance and class dicts, which a
    restore interns while it leaves the strings inside containers alone.
    """
    kind = type(container)
    if kind is dict:
        return {canonical(key): value for key, value in container.items()}
    if kind is frozenset and all(type(item) is str for item in container):
        # In sorted order: a set of strings iterates in an order that changes with
        # the hash seed, that is, from one process to the next.
        return Ref(frozenset, (tuple(sorted(canonical(item) for item in container)),))
    if kind is tuple or kind is frozenset or kind is list:
        return kind(canonical(item) for item in container)
    return canonical(container)


# Class attributes that hold the names of fields, methods or attributes.
NAME_CONTAINERS = frozenset({
    "__annotations__", "__match_args__", "__abstractmethods__", "__dataclass_fields__",
    "__required_keys__", "__optional_keys__",
})


def qualified(klass: type) -> str:
    module = getattr(klass, "__module__", None)
    name = getattr(klass, "__qualname__", klass.__name__)
    return name if module in (None, "builtins") else f"{module}.{name}"


def _reduce_cell(pickler: ReducingPickler, cell: types.CellType) -> Any:
    if id(cell) in pickler.cells_filled_by_function:
        return (rebuild.make_cell, ())
    try:
        contents = cell.cell_contents
    except ValueError:
        return (rebuild.make_cell, ())
    return (rebuild.make_cell, (), contents, None, None, rebuild.set_cell_contents)


def _reduce_code(pickler: ReducingPickler, code: types.CodeType) -> Any:
    return (rebuild.code_from_dill, (dill_code(code),))


def _reduce_property(pickler: ReducingPickler, prop: property) -> Any:
    return (property, (prop.fget, prop.fset, prop.fdel, prop.__doc__))


def _reduce_staticmethod(pickler: ReducingPickler, method: staticmethod) -> Any:  # type: ignore[type-arg]
    return (staticmethod, (method.__func__,))


def _reduce_classmethod(pickler: ReducingPickler, method: classmethod) -> Any:  # type: ignore[type-arg]
    return (classmethod, (method.__func__,))


def _reduce_cached_property(pickler: ReducingPickler, prop: functools.cached_property) -> Any:  # type: ignore[type-arg]
    return (rebuild.make_cached_property, (prop.func, canonical(prop.attrname)))


def _reduce_dataclass_field(pickler: ReducingPickler, field_: Any) -> Any:
    # The field's name is the name of a class attribute and of instance attributes.
    reduced: Any = field_.__reduce_ex__(PROTOCOL)
    function, args, state, *rest = reduced
    if type(state) is not tuple or len(state) != 2 or type(state[1]) is not dict:
        return NotImplemented
    return (function, args, (state[0], {**state[1], "name": canonical(field_.name)}), *rest)


def _reduce_lock(pickler: ReducingPickler, lock: Any) -> Any:
    # A lock holds no data, and who holds it is a matter of threads, which a restore
    # does not bring back: it comes back new and released.  (dill would restore an
    # RLock held by a thread that is gone, so that its first use blocked forever.)
    return (_thread.allocate_lock, ()) if type(lock) is _thread.LockType else (_thread.RLock, ())


def _reduce_keeping_instance_dict(pickler: ReducingPickler, mapping: Any) -> Any:
    # A dict subclass whose class's __setstate__ throws the instance's own attributes
    # away (scikit-learn's Bunch keeps _deprecated_key_to_warnings there and ignores it
    # on load, for old pickles' sake): items and attributes are both set again here.
    return (rebuild.blank_instance, (type(mapping),), dict(vars(mapping)), None,
            iter(dict.items(mapping)), rebuild.update_instance_dict)


def _reduce_callback_registry(pickler: ReducingPickler, registry: Any) -> Any:
    """matplotlib's CallbackRegistry, whose ``__getstate__`` draws the next id from its
    counter: every figure, axes and artist holds one, so each pickle of a figure came
    out different and advanced the figure's state.  Its state is taken as
    ``__getstate__`` gives it and the counter is put back where it was, so pickling
    changes nothing and an unchanged figure pickles to the same bytes."""
    counter = getattr(registry, "_cid_gen", None)
    if type(counter) is not itertools.count:
        return NotImplemented
    state = registry.__getstate__()
    registry._cid_gen = itertools.count(state["_cid_gen"])
    return (_NEWOBJ, (type(registry),), state)


def _pandas_reducers(pandas: Any) -> dict[type, Callable[[ReducingPickler, Any], Any]]:
    """pandas' Arrow-backed arrays, with the keys of their state interned.

    Their ``__setstate__`` fills ``__dict__`` with the keys of the loaded state,
    which (unlike the keys a plain load sets) are not interned; pickle's memo
    follows string identity, so a restored array pickled differently from the
    original (a Series with a ``str`` index did).
    """
    def reduce_interned(pickler: ReducingPickler, obj: Any) -> Any:
        reduced = obj.__reduce_ex__(PROTOCOL)
        if type(reduced) is tuple and len(reduced) > 2 and type(reduced[2]) is dict:
            return (*reduced[:2], canonical_names(reduced[2]), *reduced[3:])
        return reduced

    base = getattr(getattr(pandas, "arrays", None), "ArrowExtensionArray", None)
    kinds: list[type] = [base] if isinstance(base, type) else []
    for kind in kinds:
        kinds.extend(kind.__subclasses__())
    return dict.fromkeys(kinds, reduce_interned)


_NEWOBJ = getattr(copyreg, "__newobj__")  # noqa: B009  (the reconstructor pickle itself uses)


def _reduce_mapping_proxy(pickler: ReducingPickler, proxy: types.MappingProxyType) -> Any:  # type: ignore[type-arg]
    return (rebuild.mapping_proxy, (dict(proxy),))


def _reduce_lru_cache(pickler: ReducingPickler, wrapper: Any) -> Any:
    if not pickler.needs_value(wrapper):
        return NotImplemented
    # An lru_cache wrapper pickles by name, and a name in the namespace does not exist
    # yet while a restore loads it: store the wrapped function and the cache's
    # parameters instead (its entries are a cache, and are rebuilt on demand).
    parameters = wrapper.cache_parameters()
    state = {key: canonical(value) if key in ("__module__", "__name__", "__qualname__")
             else value
             for key, value in wrapper.__dict__.items() if key != "cache_parameters"}
    return (rebuild.make_lru_cache,
            (wrapper.__wrapped__, parameters["maxsize"], parameters["typed"]), state)


def _reduce_type_var(pickler: ReducingPickler, var: Any) -> Any:
    if not pickler.needs_value(var):
        return NotImplemented
    # Pickled by name otherwise, which a restore cannot resolve (see _reduce_lru_cache).
    return (rebuild.make_type_var,
            (canonical(var.__name__), var.__constraints__, var.__bound__, var.__covariant__,
             var.__contravariant__, canonical(var.__module__)))


def _builtin_base(kind: type) -> type:
    return next(klass for klass in kind.__mro__ if klass.__module__ == "builtins")


def init_needs_more_than_args(kind: Any) -> bool:
    """Whether BaseException's pickling (``kind(*args)``) would fail to load."""
    base: Any = _builtin_base(kind)
    return (kind.__reduce__ is BaseException.__reduce__
            and kind.__reduce_ex__ is BaseException.__reduce_ex__
            and kind.__init__ is not base.__init__)


def reduce_exception(error: BaseException) -> Any:
    # An exception class whose __init__ takes other arguments than it passes on to
    # super().__init__ cannot be rebuilt by calling it with ``args``: make it
    # without calling that __init__, as pickle does for ordinary instances.
    kind = type(error)
    return (rebuild.make_exception, (kind, _builtin_base(kind), error.args),
            error.__dict__ or None)


def _reduce_bound_method(pickler: ReducingPickler, method: Any) -> Any:
    """A method bound to a library's module-level object, as a lookup of that object.

    ``from random import normalvariate`` and ``from numpy.random import randn`` are
    bound to the global generators (``random._inst``, ``numpy.random.mtrand._rand``).
    Pickled as usual, they would come back bound to a copy, so that seeding the
    global generator no longer governed them.  Only objects that are globals of an
    imported module (see ModuleGlobals) are looked up by name: anything else (a
    user's object, a generator the user made) is pickled with its method as before.
    """
    owner = method.__self__
    if owner is None or isinstance(owner, (types.ModuleType, type)):
        return NotImplemented  # a function, or a class's method: pickled by name already
    home = module_global(owner)
    if home is None:
        return NotImplemented
    return (getattr, (Ref(rebuild.singleton, home), canonical(method.__name__)))


class ModuleGlobals:
    """Which imported module holds an object as a global: an index by ``id``.

    The rule behind referencing rather than copying: an object a library keeps
    in a module's globals (numpy's global ``RandomState``, matplotlib's
    ``rcParams`` and colormap registry, IPython's wrapper installed as
    ``pyplot.draw_if_interactive``, ``os.environ``, ``logging.root``) is
    process-wide state the library goes on using, so a copy of it would be cut
    off from the library.  Such an object is pickled as a lookup of that global:
    a restore, or a rollback's reload of something that holds it, finds the live
    one.  The cell namespace's module is not indexed, and neither are classes,
    modules and plain values (pickled by name, or values in their own right).

    The index is brought up to date by :meth:`refresh` (a module imported or
    its globals added or removed since); a hit is checked at use, since a
    global may have been rebound since, so the index is never trusted.
    """

    def __init__(self) -> None:
        self._sizes: dict[str, int] = {}
        self._names: dict[str, dict[int, str]] = {}
        self._where: dict[int, str] = {}
        self._modules = 0
        self._searched: weakref.WeakKeyDictionary[object, tuple[str, str] | None] = (
            weakref.WeakKeyDictionary())

    def refresh(self, home: str) -> None:
        modules = sys.modules
        if len(modules) == self._modules:
            return
        self._modules = len(modules)
        seen = set()
        for module_name, module in list(modules.items()):
            if module_name == home or not isinstance(module, types.ModuleType):
                continue
            namespace = getattr(module, "__dict__", None)
            if type(namespace) is not dict:
                continue
            seen.add(module_name)
            if self._sizes.get(module_name) == len(namespace):
                continue
            self._sizes[module_name] = len(namespace)
            # type(), never isinstance(): a global may be a lazy proxy whose __class__
            # runs library code (openai's module client makes an HTTP client there).
            names = {id(value): key for key, value in list(namespace.items())
                     if type(value) not in _PLAIN
                     and not issubclass(type(value), (type, types.ModuleType))}
            self._names[module_name] = names
            for key in names:
                self._where.setdefault(key, module_name)
        for module_name in set(self._sizes) - seen:
            del self._sizes[module_name]
            del self._names[module_name]

    def find(self, obj: object) -> tuple[str, str] | None:
        module_name = self._where.get(id(obj))
        if module_name is None:
            return None
        module = sys.modules.get(module_name)
        name = self._names.get(module_name, {}).get(id(obj))
        if module is None or name is None or vars(module).get(name) is not obj:
            self._where.pop(id(obj), None)  # stale: found again at the next refresh
            return None
        return module_name, name


    def search(self, obj: object, home: str) -> tuple[str, str] | None:
        """Look through every module for ``obj`` (a rebinding leaves no trace in the
        index): for the rare objects that are worth it, a library's function that
        cannot be found by its own name (a wrapper installed over another module's
        global, as IPython's ``flag_calls`` over ``pyplot.draw_if_interactive``)."""
        try:
            known = self._searched.get(obj, _UNSEEN)
        except TypeError:
            known = _UNSEEN
        if known is None:
            return None
        if known is not _UNSEEN and _still(known, obj):  # type: ignore[arg-type]
            return known  # type: ignore[return-value]
        found = None
        for module_name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None)
            if module_name == home or type(namespace) is not dict:
                continue
            name = next((key for key, value in list(namespace.items()) if value is obj), None)
            if name is not None:
                found = (module_name, name)
                break
        with contextlib.suppress(TypeError):
            self._searched[obj] = found
        return found


_PLAIN = frozenset({str, int, float, bool, bytes, tuple, dict, list, set, frozenset,
                    type(None)})
"""Exact types the C pickler writes itself, never asking ``reducer_override``."""

_UNSEEN = object()


def _still(found: tuple[str, str], obj: object) -> bool:
    module_name, name = found
    module = sys.modules.get(module_name)
    return module is not None and vars(module).get(name) is obj


MODULE_GLOBALS = ModuleGlobals()


def module_global(owner: object) -> tuple[str, str] | None:
    """(module, name) if ``owner`` is a global of an imported module (see ModuleGlobals)."""
    return MODULE_GLOBALS.find(owner)


def library_global(obj: object, home: str) -> tuple[str, str] | None:
    """(module, name) if the serializer stores ``obj`` as a reference to a module global:
    an object of a library's type held as a global, or a library's function that cannot
    be found by its own name but is held as another module's global."""
    kind = type(obj)
    if issubclass(kind, (type, types.ModuleType)) or getattr(kind, "__module__", None) == home:
        return None
    if kind is types.FunctionType:
        module_name = getattr(obj, "__module__", None)
        if module_name in (home, None):
            return None
        module = sys.modules.get(module_name)
        if module is not None and lookup(module, obj.__qualname__) is obj:  # type: ignore[attr-defined]
            return None  # found by its own name: pickled by name
        return MODULE_GLOBALS.search(obj, home)
    return MODULE_GLOBALS.find(obj)


def register_late_types() -> None:
    """Add reducers for types of modules that may be imported after this one."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and numpy.ndarray not in SPECIAL:
        from kernos.serialize.arrays import reducers

        SPECIAL.update(reducers(numpy))
    pandas = sys.modules.get("pandas")
    if pandas is not None and "pandas" not in _registered:
        found = _pandas_reducers(pandas)  # none while pandas is still being imported
        if found:
            SPECIAL.update(found)
            _registered.add("pandas")
    etree = sys.modules.get("lxml.etree")
    objectify = sys.modules.get("lxml.objectify")
    lxml_key = "lxml.objectify" if objectify is not None else "lxml.etree"
    if etree is not None and lxml_key not in _registered:
        from kernos.serialize.xmltrees import lxml_reducers

        SPECIAL.update(lxml_reducers(etree, objectify))
        _registered.update({"lxml.etree", lxml_key})
    bunch = sys.modules.get("sklearn.utils._bunch")
    if bunch is not None and "sklearn" not in _registered and isinstance(
            getattr(bunch, "Bunch", None), type) and issubclass(bunch.Bunch, dict):
        SPECIAL[bunch.Bunch] = _reduce_keeping_instance_dict
        _registered.add("sklearn")
    cbook = sys.modules.get("matplotlib.cbook")
    registry = getattr(cbook, "CallbackRegistry", None) if cbook is not None else None
    if isinstance(registry, type) and "matplotlib" not in _registered:
        SPECIAL[registry] = _reduce_callback_registry
        _registered.add("matplotlib")
    register_late_resources(SPECIAL)


_registered: set[str] = set()


SPECIAL: dict[type, Callable[[ReducingPickler, Any], Any]] = {
    types.CellType: _reduce_cell,
    types.CodeType: _reduce_code,
    property: _reduce_property,
    staticmethod: _reduce_staticmethod,
    classmethod: _reduce_classmethod,
    functools.cached_property: _reduce_cached_property,
    types.MappingProxyType: _reduce_mapping_proxy,
    dataclasses.Field: _reduce_dataclass_field,
    functools._lru_cache_wrapper: _reduce_lru_cache,
    typing.TypeVar: _reduce_type_var,
    _thread.LockType: _reduce_lock,
    _thread.RLock: _reduce_lock,
    types.MethodType: _reduce_bound_method,
    types.BuiltinMethodType: _reduce_bound_method,
}
SPECIAL.update(ITERATOR_REDUCERS)
SPECIAL.update(RESOURCE_REDUCERS)
