"""Canonical digests of namespace values: equal states digest equally in any process.

Replay re-runs recorded ops in a fresh process and checks each state against
the original.  Pickle bytes cannot be compared: a cell's functions carry a file
name with the kernel's PID, sets of strings iterate in hash-seed order, and a
restore changes which equal strings are one object.  A digest is a sha256 over
a canonical stream that the walk here writes; the stream is prefix-free (every
token starts with a tag and is length-prefixed, every container ends with
``)``), so equal streams mean equal walks.

What the stream holds, and what it leaves out on purpose:

* **Atoms** by value: ints (two's complement bytes), floats by their IEEE bits
  (so ``-0.0`` differs from ``0.0``; every NaN is one NaN), complex, str
  (UTF-8), bytes, bool, None, Ellipsis.  Exact types only: ``numpy.float64``
  and ``IntEnum`` members are not floats and ints here.
* **Order is state**: lists, tuples and dicts (insertion order, which code can
  observe) keep theirs, and so do instance ``__dict__`` items.  Sets and
  frozensets are sorted by the digests of their elements.  Class dicts are
  sorted by name, since a class body's order is source layout, not state.
* **Identity is state.**  Mutable objects (lists, dicts, sets, bytearrays,
  instances, functions, cells, classes defined by value, arrays) are labelled
  in walk order: the first visit writes the object, a later one ``@n``.  So
  ``b['ref'] is a`` digests differently from an equal copy, and cycles end.
  Immutable values (str, bytes, numbers, tuples, frozensets, code, dates,
  decimals, enum members, numpy scalars) carry no label: a restore does not
  keep which equal strings were one object.  Their digests are cached per
  object when their walk met no labelled object, so a DAG of shared tuples
  costs one walk per tuple, and a large string or bytes is hashed once.
* **Functions** imported from a module by qualified name are written by name;
  any other (cells, ``__main__``, ``<locals>``) by value: module, qualname,
  name, doc, the code object, defaults, keyword defaults, closure cells (walked;
  a cell is labelled, so closures sharing a cell are seen to share it),
  ``__dict__`` and annotations.  Code keeps bytecode (``co_code``, which Python
  3.11 returns without its specialisations), the exception table, constants
  (walked), names, variable names, free and cell variables, argument counts,
  stack size and flags, and leaves out ``co_filename``, ``co_firstlineno`` and
  the line table: where a function was defined is not state.  Globals are not
  walked (they are the namespace); the names a function uses are in
  ``co_names``.
* **Classes** implemented in C or importable by qualified name (outside
  ``__main__``) by name; any other by value: module, qualname, name,
  metaclass, bases, and its own ``__dict__`` sorted by name, without
  ``__dict__``, ``__weakref__``, ``__module__`` (written already), and caches
  that Python or pickling add behind the code's back: ``__slotnames__``,
  ``_abc_impl``, an empty ``__annotations__``, ``__firstlineno__``.
* **Other objects**: their type, then the parts of ``__reduce_ex__(4)``
  (reconstructor, arguments, state, list items, dict items), state dicts
  flattened into ``.attribute`` items (``iter(seq)`` without an index counts
  as index 0: an exhausted iterator reduces without one, and the iterator its
  reduce rebuilds with one).  A reducer that raises falls back to
  ``__dict__`` and ``__slots__``; an object with none of these is written as
  its type name only: ``repr()`` is never called, for digests or messages.
* **Library globals**: an object an imported module holds as a global (numpy's
  global generator, ``rcParams``, a function a library installed over another
  module's global) is written as ``module.name``, as the serializer stores it
  (``kinds.ModuleGlobals``): its state is the library's, not the namespace's,
  and digests of library internals need not agree across processes.
* **Live resources** Kernos does not persist (files, sockets, threads, locks,
  generators, frames, ... see ``kinds.transient_types``) are their type and a
  marker; the resource is never touched.
* **numpy** (only when already imported): dtype (``dtype.str``, or the
  ``descr`` of a structured dtype), shape and the C-order bytes, streamed into
  sha256 in place or in bounded chunks; object arrays walk their elements.
  Views are digested by content: that two arrays share memory is not seen.
* **pandas** (only when already imported): a DataFrame is its type, columns,
  index, each column's dtype name and ``to_numpy()`` values, ``attrs`` and
  ``allows_duplicate_labels``; a Series and an Index likewise.  Not its
  reduce, whose block layout depends on how the frame was built: two equal
  frames, one of them consolidated, would differ.

Known limits: elements of a set with equal digests, also equal in the context
of what the walk has labelled so far, are in an arbitrary order, so an object
labelled inside them and referred to after the set may get either label;
nested frozensets recurse in Python, one level per nesting level.
"""

from __future__ import annotations

import _thread
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import itertools
import pathlib
import re
import struct
import sys
import types
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from kernos.serialize.kinds import (
    MODULE_GLOBALS,
    PICKLABLE_STREAMS,
    library_global,
    lookup,
    qualified,
    transient_types,
)

__all__ = ["describe_difference", "describe_state_difference", "digest", "state_digest"]

#: Written first: a change of the stream's format changes every digest.
FORMAT = b"kernos-digest/1\n"
#: Strings, bytes and array chunks from this size on are hashed apart and cached per object.
_BIG = 64 * 1024
_CHUNK = 16 * 1024 * 1024
#: How much of a value a difference message shows, and how long a message can get.
_SHOW = 60
_MESSAGE = 300
_HEAPTYPE = 1 << 9


class _Marker:
    """A token with no value: a section break inside a node's children, an absent slot."""

    def __init__(self, token: bytes, text: str) -> None:
        self.token = token
        self.text = text


_SEP = _Marker(b"|", "(no more items)")
_ABSENT = _Marker(b"a", "(unset)")
_END = _Marker(b"", "(nothing)")


def _int(value: int) -> bytes:
    return value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)


def _lp(data: bytes) -> bytes:
    return len(data).to_bytes(8, "little") + data


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


def _float(value: float) -> bytes:
    return b"\x7f\xf8\0\0\0\0\0\0" if value != value else struct.pack("<d", value)


def _small(kind: bytes, encode: Callable[[Any], bytes]) -> Callable[[Any], bytes | None]:
    return lambda value: kind + _lp(encode(value)) if len(value) < _BIG else None


_ATOMS: dict[type, Callable[[Any], bytes | None]] = {
    type(None): lambda value: b"N",
    bool: lambda value: b"T" if value else b"F",
    int: lambda value: b"i" + _lp(_int(value)),
    float: lambda value: b"f" + _float(value),
    complex: lambda value: b"c" + _float(value.real) + _float(value.imag),
    str: _small(b"s", _text),
    bytes: _small(b"b", bytes),
    type(Ellipsis): lambda value: b"E",
    type(NotImplemented): lambda value: b"n",
    _Marker: lambda value: value.token,
}


def _atom(value: object) -> bytes | None:
    """The whole encoding of ``value`` if it is an atom (no children, no identity)."""
    encode = _ATOMS.get(type(value))
    return encode(value) if encode is not None else None


@dataclasses.dataclass(slots=True, kw_only=True)
class _Node:
    """What one object writes: a tag, fixed fields, then its children and ``)``."""

    tag: bytes
    """One byte per kind of node; it fixes what the fields and children mean."""
    fields: tuple[tuple[str, bytes], ...] = ()
    """Named byte strings; the names are for difference messages only."""
    children: Iterable[object] = ()
    """Walked in order (sorted by digest first if ``unordered``)."""
    labels: Callable[[], Iterator[str]] | None = None
    """Path suffixes of the children, for difference messages; made only when asked."""
    memo: bool = True
    """Whether the object's identity is state (it gets a label)."""
    sub: bool = False
    """Hashed apart and cached per object when its walk met no labelled object."""
    unordered: bool = False


class _Namespace:
    """A namespace's names in sorted order, walked as one value so names can share objects."""

    def __init__(self, names: Mapping[str, object]) -> None:
        self.items = [(name, names[name]) for name in sorted(names)]


def _index_labels() -> Iterator[str]:
    return (f"[{index}]" for index in itertools.count())


def _fixed(*labels: str) -> Callable[[], Iterator[str]]:
    return lambda: iter(labels)


def _show(value: object) -> str:
    """A short text for a message: the repr of an atom, else only the type's name."""
    if isinstance(value, _Marker):
        return value.text
    if type(value) in _ATOMS:
        text = repr(value)
        return text if len(text) <= _SHOW else text[: _SHOW - 3] + "..."
    return f"<{qualified(type(value))}>"


def _pairs(items: Iterable[tuple[object, object]]) -> Iterator[object]:
    for key, value in items:
        yield key
        yield value


def _key_labels(keys: Iterable[object], attribute: bool = False) -> Iterator[str]:
    for key in keys:
        shown = key if attribute and type(key) is str else None
        yield f"<key {_show(key)}>"
        yield f".{shown}" if shown is not None else f"[{_show(key)}]"


def _dict_node(mapping: Mapping[Any, Any], tag: bytes = b"D", memo: bool = True) -> _Node:
    return _Node(tag=tag, children=_pairs(mapping.items()), memo=memo,
                 labels=lambda: _key_labels(list(mapping)))


def _blob_digest(data: Any) -> bytes:
    hasher = hashlib.sha256()
    view = memoryview(data)
    if view.contiguous:
        hasher.update(view.cast("B"))
    else:
        hasher.update(view.tobytes())
    return hasher.digest()


def _big_text(value: str) -> bytes:
    hasher = hashlib.sha256()
    for start in range(0, len(value), _BIG):
        hasher.update(_text(value[start:start + _BIG]))
    return hasher.digest()


def _importable(obj: Any) -> bool:
    module_name = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if type(module_name) is not str or module_name == "__main__" or type(qualname) is not str:
        return False
    module = sys.modules.get(module_name)
    return module is not None and lookup(module, qualname) is obj


def _by_name(tag: bytes, obj: Any) -> _Node:
    return _Node(tag=tag, memo=False, fields=(
        ("module", _text(str(getattr(obj, "__module__", None)))),
        ("qualname", _text(str(getattr(obj, "__qualname__", None))))))


def _function(function: types.FunctionType) -> _Node:
    if _importable(function):
        return _by_name(b"g", function)
    return _Node(
        tag=b"u",
        fields=(("module", _text(str(function.__module__))),
                ("qualname", _text(function.__qualname__)), ("name", _text(function.__name__))),
        children=(function.__code__, function.__defaults__, function.__kwdefaults__,
                  function.__closure__, function.__dict__,
                  # Walked as a mapping, not as a labelled dict: functools.wraps shares
                  # the wrapped function's, and a restore does not keep that.
                  types.MappingProxyType(function.__annotations__), function.__doc__),
        labels=_fixed(".__code__", ".__defaults__", ".__kwdefaults__", ".__closure__",
                      ".__dict__", ".__annotations__", ".__doc__"))


def _names(names: tuple[str, ...]) -> bytes:
    return b"".join(_lp(_text(name)) for name in names)


def _code(code: types.CodeType) -> _Node:
    return _Node(
        tag=b"k", memo=False, sub=True,
        fields=(("argument counts", _int(code.co_argcount) + b"," + _int(code.co_posonlyargcount)
                 + b"," + _int(code.co_kwonlyargcount)),
                ("locals", _int(code.co_nlocals)), ("stack size", _int(code.co_stacksize)),
                ("flags", _int(code.co_flags)), ("bytecode", code.co_code),
                ("exception table", getattr(code, "co_exceptiontable", b"")),
                ("names", _names(code.co_names)), ("variable names", _names(code.co_varnames)),
                ("free variables", _names(code.co_freevars)),
                ("cell variables", _names(code.co_cellvars)), ("name", _text(code.co_name)),
                ("qualname", _text(getattr(code, "co_qualname", code.co_name)))),
        children=code.co_consts, labels=lambda: (f".co_consts[{index}]"
                                                 for index in itertools.count()))


def _cell(cell: types.CellType) -> _Node:
    try:
        contents = cell.cell_contents
    except ValueError:
        return _Node(tag=b"x")
    return _Node(tag=b"C", children=(contents,), labels=_fixed(".cell_contents"))


def _builtin(function: Any) -> _Node:
    owner = getattr(function, "__self__", None)
    if owner is None or isinstance(owner, types.ModuleType):
        return _by_name(b"B", function)
    return _Node(tag=b"b", memo=False, fields=(("name", _text(function.__name__)),),
                 children=(owner,), labels=_fixed(".__self__"))


def _descriptor(descriptor: Any) -> _Node:
    return _Node(tag=b"d", memo=False, fields=(("name", _text(descriptor.__name__)),),
                 children=(descriptor.__objclass__,), labels=_fixed(".__objclass__"))


# Added to class dicts by Python or by pickling, not by the class's code.
_CLASS_CACHES = frozenset({"__dict__", "__weakref__", "__module__", "__slotnames__",
                           "_abc_impl", "__firstlineno__"})


def _class(klass: type) -> _Node:
    if not klass.__flags__ & _HEAPTYPE or _importable(klass):
        return _by_name(b"K", klass)
    items = sorted(((name, value) for name, value in vars(klass).items()
                    if name not in _CLASS_CACHES
                    and not (name == "__annotations__" and value == {})),
                   key=lambda item: item[0])
    return _Node(
        tag=b"Q",
        fields=(("module", _text(str(klass.__module__))), ("qualname", _text(klass.__qualname__)),
                ("name", _text(klass.__name__))),
        children=itertools.chain((type(klass), klass.__bases__, _SEP), _pairs(items)),
        labels=lambda: itertools.chain((".<metaclass>", ".__bases__", ""),
                                       _key_labels((name for name, _ in items), attribute=True)))


def _lru_cache(wrapper: Any) -> _Node:
    if _importable(wrapper):
        return _by_name(b"g", wrapper)
    parameters = wrapper.cache_parameters()
    return _Node(tag=b"l", fields=(("parameters", _text(str(parameters))),),
                 children=(wrapper.__wrapped__,), labels=_fixed(".__wrapped__"))


def _transient(obj: object) -> _Node:
    return _Node(tag=b"X", fields=(("type", _text(qualified(type(obj)))),
                                   ("marker", b"not persisted")))


def _canonical_state(obj: object, state: object) -> object:
    """A reduce state without what a library's pickle keeps but does not mean.

    * matplotlib's transforms keep their parents as weak references in a dict
      keyed by ``id(parent)`` (ids of the pickling process; the edges are the
      inverse of the parents' references to their children, which the walk
      follows anyway), and ``_invalid``, whether a cached matrix must be
      recomputed on its next use: both left out.
    * A numpy masked array whose fill value was never asked for pickles None,
      and comes back holding the default it stands for: None is written as
      that default.
    """
    transforms = sys.modules.get("matplotlib.transforms")
    if (transforms is not None and isinstance(obj, transforms.TransformNode)
            and type(state) is dict):
        return {key: value for key, value in state.items()
                if key not in ("_parents", "_invalid")}
    masked = sys.modules.get("numpy.ma.core")
    if (masked is not None and isinstance(obj, masked.MaskedArray)
            and type(state) is tuple and len(state) == 7 and state[6] is None):
        return (*state[:6], masked._check_fill_value(None, obj.dtype))
    return state


_BY_TYPE: dict[type, Callable[[Any], _Node]] = {
    list: lambda value: _Node(tag=b"L", children=value, labels=_index_labels),
    tuple: lambda value: _Node(tag=b"t", children=value, labels=_index_labels, memo=False,
                               sub=True),
    dict: _dict_node,
    set: lambda value: _Node(tag=b"Z", children=value, unordered=True),
    frozenset: lambda value: _Node(tag=b"z", children=value, unordered=True, memo=False,
                                   sub=True),
    bytearray: lambda value: _Node(tag=b"y", fields=(("contents", _blob_digest(value)),)),
    str: lambda value: _Node(tag=b"S", fields=(("contents", _big_text(value)),), memo=False,
                             sub=True),
    bytes: lambda value: _Node(tag=b"Y", fields=(("contents", _blob_digest(value)),),
                               memo=False, sub=True),
    memoryview: lambda value: _Node(tag=b"v", fields=(
        ("format", _text(value.format)), ("shape", _text(str(value.shape))),
        ("contents", _blob_digest(value)))),
    range: lambda value: _Node(tag=b"r", memo=False, fields=(
        ("start", _int(value.start)), ("stop", _int(value.stop)), ("step", _int(value.step)))),
    slice: lambda value: _Node(tag=b"_", memo=False, children=(value.start, value.stop,
                                                                value.step),
                               labels=_fixed(".start", ".stop", ".step")),
    types.FunctionType: _function,
    types.CodeType: _code,
    types.CellType: _cell,
    types.BuiltinFunctionType: _builtin,
    types.MethodWrapperType: _builtin,
    types.MethodType: lambda value: _Node(tag=b"m", children=(value.__func__, value.__self__),
                                          labels=_fixed(".__func__", ".__self__")),
    types.ModuleType: lambda value: _Node(tag=b"M", memo=False,
                                          fields=(("name", _text(value.__name__)),)),
    types.MappingProxyType: lambda value: _dict_node(value, tag=b"p", memo=False),
    property: lambda value: _Node(tag=b"P", children=(value.fget, value.fset, value.fdel,
                                                       value.__doc__),
                                  labels=_fixed(".fget", ".fset", ".fdel", ".__doc__")),
    staticmethod: lambda value: _Node(tag=b"%", children=(value.__func__,),
                                      labels=_fixed(".__func__")),
    classmethod: lambda value: _Node(tag=b"&", children=(value.__func__,),
                                     labels=_fixed(".__func__")),
    functools.cached_property: lambda value: _Node(tag=b"=", children=(value.func,
                                                                       value.attrname),
                                                   labels=_fixed(".func", ".attrname")),
    functools._lru_cache_wrapper: _lru_cache,
    _thread.LockType: _transient,
    _thread.RLock: _transient,
    _Namespace: lambda value: _Node(
        tag=b"W", memo=False, children=_pairs(value.items),
        labels=lambda: itertools.chain.from_iterable((f"<name {name}>", name)
                                                     for name, _ in value.items)),
}
for _kind in (types.WrapperDescriptorType, types.MethodDescriptorType,
              types.ClassMethodDescriptorType, types.GetSetDescriptorType,
              types.MemberDescriptorType):
    _BY_TYPE[_kind] = _descriptor

# Immutable values: their identity is not state (a load may share them or not).
_VALUE_TYPES: tuple[type, ...] = (
    datetime.date, datetime.time, datetime.timedelta, datetime.tzinfo, decimal.Decimal,
    fractions.Fraction, uuid.UUID, pathlib.PurePath, re.Pattern,
)


def _array(array: Any, numpy: Any) -> _Node:
    dtype = array.dtype
    fields = (("dtype", _text(dtype.str if dtype.fields is None else repr(dtype.descr))),
              ("shape", _text(repr(array.shape))))
    if dtype.hasobject:
        return _Node(tag=b"O", fields=fields, children=array.flat,
                     labels=lambda: (f"[{', '.join(map(str, index))}]"
                                     for index in numpy.ndindex(array.shape)))
    hasher = hashlib.sha256()
    if array.flags.c_contiguous:
        hasher.update(memoryview(array.reshape(-1).view(numpy.uint8)))
    else:
        rows = max(1, _CHUNK // max(1, array[0].nbytes if array.shape[0] else 1))
        for start in range(0, array.shape[0], rows):
            block = numpy.ascontiguousarray(array[start:start + rows])
            hasher.update(memoryview(block.reshape(-1).view(numpy.uint8)))
    return _Node(tag=b"A", fields=(*fields, ("contents", hasher.digest())))


def _index(index: Any) -> _Node:
    return _Node(tag=b"I", fields=(("dtype", _text(str(index.dtype))),),
                 children=(type(index), list(index.names), index.to_numpy()),
                 labels=_fixed(".__class__", ".names", ".values"))


def _series(series: Any) -> _Node:
    return _Node(tag=b"R", fields=(("dtype", _text(str(series.dtype))),),
                 children=(type(series), series.name, series.index, series.to_numpy(),
                           dict(series.attrs)),
                 labels=_fixed(".__class__", ".name", ".index", ".values", ".attrs"))


def _callback_registry(registry: Any) -> _Node:
    """A matplotlib ``CallbackRegistry`` as its pickle keeps it, read without pickling.

    Its ``__getstate__`` draws the next id from a counter (so asking twice
    changes it) and keeps only the callbacks in ``_pickled_cids``: here its
    other attributes, then those callbacks, signal by signal, in id order.
    """
    kept = registry._pickled_cids
    attributes = sorted((name, value) for name, value in vars(registry).items()
                        if name not in ("callbacks", "_func_cid_map", "_cid_gen"))
    callbacks = [(signal, [(cid, proxy()) for cid, proxy in sorted(table.items())
                           if cid in kept])
                 for signal, table in registry.callbacks.items()]
    callbacks = sorted((pair for pair in callbacks if pair[1]), key=lambda pair: repr(pair[0]))
    return _Node(tag=b"K", children=itertools.chain(
        (type(registry),), _pairs(attributes), (_SEP,), _pairs(callbacks)),
        labels=lambda: itertools.chain(
            (".__class__",), _key_labels((name for name, _ in attributes), attribute=True),
            ("",), (f".callbacks[{_show(signal)}]" for signal, _ in callbacks)))


def _frame_columns(frame: Any) -> Iterator[object]:
    for position in range(frame.shape[1]):
        column = frame.iloc[:, position]
        yield str(column.dtype)
        yield column.to_numpy()


def _frame(frame: Any) -> _Node:
    def labels() -> Iterator[str]:
        yield from (".__class__", ".columns", ".index", "")
        for name in frame.columns:
            yield f"[{_show(name)}].dtype"
            yield f"[{_show(name)}]"
        yield from ("", ".attrs", ".flags.allows_duplicate_labels")

    return _Node(tag=b"F", children=itertools.chain(
        (type(frame), frame.columns, frame.index, _SEP), _frame_columns(frame),
        (_SEP, dict(frame.attrs), frame.flags.allows_duplicate_labels)), labels=labels)


def _reduced(obj: object, memo: bool) -> _Node:
    try:
        reduced = obj.__reduce_ex__(4)
    except Exception:  # a reducer that refuses: fall back to the object's attributes
        reduced = None
    kind = type(obj)
    if isinstance(reduced, str):
        return _Node(tag=b"G", memo=memo, fields=(("global", _text(reduced)),),
                     children=(kind,), labels=_fixed(".__class__"))
    if not isinstance(reduced, tuple) or not 2 <= len(reduced) <= 6:
        return _attributes(obj, memo)
    function, arguments, state, list_items, dict_items = (*reduced, None, None, None)[:5]
    arguments = arguments if isinstance(arguments, tuple) else (arguments,)
    if function is iter and state is None and len(arguments) == 1:
        # An exhausted sequence iterator reduces to iter(empty) with no index; the
        # iterator that reduce rebuilds says index 0.  One state, written one way.
        state = 0
    state = _canonical_state(obj, state)
    items = list(list_items or ())
    pairs = list(dict_items or ())
    shape, state_children, state_labels = _state(state)
    return _Node(
        tag=b"R", memo=memo, fields=(("state", shape),),
        children=itertools.chain(
            (kind, function), arguments, (_SEP,), state_children, (_SEP,), items, (_SEP,),
            _pairs(pairs)),
        labels=lambda: itertools.chain(
            (".__class__", ".<reconstructor>"),
            (f".<argument {index}>" for index in range(len(arguments))), ("",),
            state_labels(), ("",), (f"[{index}]" for index in range(len(items))), ("",),
            _key_labels(key for key, _ in pairs)))


def _state(state: object) -> tuple[bytes, Iterable[object], Callable[[], Iterator[str]]]:
    """A reduce state, with a dict (or a dict and a slots dict) flattened to attributes."""
    if type(state) is dict:
        return b"d", _pairs(state.items()), lambda: _key_labels(list(state), attribute=True)
    if (type(state) is tuple and len(state) == 2 and type(state[1]) is dict
            and (state[0] is None or type(state[0]) is dict)):
        first: dict[Any, Any] = state[0] or {}
        second: dict[Any, Any] = state[1]
        return (b"2", itertools.chain(_pairs(first.items()), (_SEP,), _pairs(second.items())),
                lambda: itertools.chain(_key_labels(list(first), attribute=True), ("",),
                                        _key_labels(list(second), attribute=True)))
    if state is None:
        return b"-", (), lambda: iter(())
    return b"v", (state,), _fixed(".<state>")


def _slot_names(klass: type) -> tuple[str, ...]:
    slots = vars(klass).get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


def _attributes(obj: object, memo: bool) -> _Node:
    """An object whose reducer failed: its ``__dict__`` and slots, or its type name only."""
    kind = type(obj)
    attributes = getattr(obj, "__dict__", None)
    names = [name for klass in kind.__mro__ for name in _slot_names(klass)
             if name not in ("__dict__", "__weakref__")]
    if type(attributes) is not dict and not names:
        return _Node(tag=b"o", memo=memo, fields=(("type", _text(qualified(kind))),))
    slots = [(name, getattr(obj, name, _ABSENT)) for name in names]
    items = list((attributes or {}).items())
    return _Node(tag=b"a", memo=memo, children=itertools.chain(
        (kind,), _pairs(items), (_SEP,), _pairs(slots)),
        labels=lambda: itertools.chain((".__class__",), _key_labels(
            (name for name, _ in items), attribute=True), ("",),
            _key_labels(names, attribute=True)))


def _node(obj: object) -> _Node:
    """How ``obj`` is written (not for atoms)."""
    kind = type(obj)
    home = library_global(obj, "__main__")
    if home is not None:  # stored as a reference to the library's own object: so written,
        # as an importable function is (a global of that name, whatever it holds now)
        return _Node(tag=b"g", memo=False, fields=(("module", _text(home[0])),
                                                   ("qualname", _text(home[1]))))
    make = _BY_TYPE.get(kind)
    if make is not None:
        return make(obj)
    if isinstance(obj, type):
        return _class(obj)
    if isinstance(obj, enum.Enum):
        return _Node(tag=b"e", memo=False, fields=(("name", _text(obj.name)),),
                     children=(kind,), labels=_fixed(".__class__"))
    transient, _ = transient_types()
    if isinstance(obj, transient) and not isinstance(obj, PICKLABLE_STREAMS):
        return _transient(obj)
    numpy = sys.modules.get("numpy")
    if numpy is not None and kind is numpy.ndarray:
        return _array(obj, numpy)
    pandas = sys.modules.get("pandas")
    if pandas is not None:
        if isinstance(obj, pandas.DataFrame):
            return _frame(obj)
        if isinstance(obj, pandas.Series):
            return _series(obj)
        if isinstance(obj, pandas.Index):
            return _index(obj)
    cbook = sys.modules.get("matplotlib.cbook")
    if cbook is not None and isinstance(obj, cbook.CallbackRegistry):
        return _callback_registry(obj)
    value_types = _VALUE_TYPES + ((numpy.generic, numpy.dtype) if numpy is not None else ())
    return _reduced(obj, memo=not (isinstance(obj, value_types) and _importable(kind)))


class _Frame:
    __slots__ = ("children", "obj", "sub", "touches")

    def __init__(self, children: Iterator[object], obj: object, sub: bool, touches: int) -> None:
        self.children = children
        self.obj = obj
        self.sub = sub
        self.touches = touches


class _Shared:
    """What the walks of one call share: per-object digests valid in any context."""

    def __init__(self) -> None:
        # Objects are kept alive next to their digests, so that no id is reused meanwhile.
        self.cache: dict[int, tuple[object, bytes]] = {}
        self.keys: dict[int, tuple[object, bytes]] = {}

    def key(self, obj: object) -> tuple[int, bytes]:
        """The sort key of a set element: its digest on its own."""
        atom = _atom(obj)
        if atom is not None:
            return 0, atom
        known = self.keys.get(id(obj))
        if known is None:
            known = self.keys[id(obj)] = (obj, _Walker(self).run(obj))
        return 1, known[1]


class _Walker:
    """One walk with its own labels; ``parent`` lends its labels to a set's tie-break."""

    def __init__(self, shared: _Shared, parent: _Walker | None = None) -> None:
        self.shared = shared
        self.parent = parent
        self.memo: dict[int, tuple[int, object]] = {}
        self.touches = 0
        self.hashers = [hashlib.sha256(FORMAT)]

    def run(self, root: object) -> bytes:
        MODULE_GLOBALS.refresh("__main__")
        # An explicit stack: a 100,000-deep list must not exhaust the C stack.
        stack: list[_Frame] = []
        self.visit(root, stack)
        while stack:
            frame = stack[-1]
            for child in frame.children:
                if self.visit(child, stack):
                    break
            else:
                stack.pop()
                self.close(frame)
        return self.hashers[0].digest()

    def visit(self, obj: object, stack: list[_Frame]) -> bool:
        """Write ``obj``; True if it pushed a frame for its children."""
        encode = _ATOMS.get(type(obj))
        if encode is not None:
            atom = encode(obj)
            if atom is not None:
                self.hashers[-1].update(atom)
                return False
        key = id(obj)
        seen = self.memo.get(key)
        if seen is not None:
            self.touches += 1
            self.hashers[-1].update(b"@" + _lp(_int(seen[0])))
            return False
        depth, lender = 1, self.parent
        while lender is not None:
            lent = lender.memo.get(key)
            if lent is not None:
                self.touches += 1
                self.hashers[-1].update(b"^" + _lp(_int(depth)) + _lp(_int(lent[0])))
                return False
            depth, lender = depth + 1, lender.parent
        cached = self.shared.cache.get(key)
        if cached is not None:
            self.hashers[-1].update(b"H" + cached[1])
            return False
        node = _node(obj)
        if node.memo:
            self.memo[key] = (len(self.memo), obj)
            self.touches += 1
        if node.sub:
            self.hashers.append(hashlib.sha256())
        self.hashers[-1].update(node.tag + _int(len(node.fields))
                                + b"".join(_lp(value) for _, value in node.fields))
        children = self.ordered(node.children) if node.unordered else node.children
        stack.append(_Frame(iter(children), obj, node.sub, self.touches))
        return True

    def close(self, frame: _Frame) -> None:
        self.hashers[-1].update(b")")
        if frame.sub:
            sub_digest = self.hashers.pop().digest()
            self.hashers[-1].update(b"H" + sub_digest)
            if frame.touches == self.touches:
                self.shared.cache[id(frame.obj)] = (frame.obj, sub_digest)

    def ordered(self, elements: Iterable[object]) -> list[object]:
        """A set's elements sorted by digest; equal digests by their digest in context."""
        keyed = sorted(((self.shared.key(element), element) for element in elements),
                       key=lambda pair: pair[0])
        result: list[object] = []
        for key, group in itertools.groupby(keyed, key=lambda pair: pair[0]):
            members = [element for _, element in group]
            if len(members) > 1 and key[0] == 1:
                members.sort(key=lambda element: _Walker(self.shared, parent=self).run(element))
            result.extend(members)
        return result


def digest(value: object) -> str:
    """The hex sha256 of ``value``'s canonical stream (see the module docstring)."""
    return _Walker(_Shared()).run(value).hex()


def state_digest(names: Mapping[str, object]) -> tuple[str, dict[str, str]]:
    """The digest of a whole namespace and of each name, in sorted order of names.

    The whole is one walk over the sorted names, so that two names holding one
    object differ from two names holding equal copies; each name's digest is a
    walk of its own, to tell which names diverged.
    """
    shared = _Shared()
    each = {name: _Walker(shared).run(names[name]).hex() for name in sorted(names)}
    return _Walker(shared).run(_Namespace(names)).hex(), each


def describe_difference(first: object, second: object, *, root: str = "value") -> str | None:
    """A short path to the first place where two values' digests part, or None if equal.

    For example ``value['bob'].balance: 5 != 7``.  Messages show atoms' reprs,
    cut short, and only the type name of anything else.
    """
    if digest(first) == digest(second):
        return None
    found = _Differ().run(root, first, second)
    return _bounded(found or f"{root}: differs")


def describe_state_difference(first: Mapping[str, object],
                              second: Mapping[str, object]) -> str | None:
    """Like :func:`describe_difference` for two namespaces; paths start at the name."""
    if state_digest(first)[0] == state_digest(second)[0]:
        return None
    if set(first) != set(second):
        only_first = sorted(set(first) - set(second))
        only_second = sorted(set(second) - set(first))
        return _bounded(f"names differ: only in the first {only_first}, "
                        f"only in the second {only_second}")
    found = _Differ().run("", _Namespace(first), _Namespace(second))
    return _bounded(found or "the namespaces differ")


def _bounded(message: str) -> str:
    return message if len(message) <= _MESSAGE else message[: _MESSAGE - 3] + "..."


class _Differ:
    """Walks two values side by side, as :class:`_Walker` would, to the first difference."""

    def __init__(self) -> None:
        self.shared = _Shared()
        self.memos: tuple[dict[int, tuple[int, str, object]], ...] = ({}, {})

    def run(self, root: str, first: object, second: object) -> str | None:
        stack: list[Iterator[tuple[str, object, object]]] = [iter([(root, first, second)])]
        while stack:
            for path, left, right in stack[-1]:
                found, pushed = self.visit(path, left, right, stack)
                if found is not None:
                    return found
                if pushed:
                    break
            else:
                stack.pop()
        return None

    def visit(self, path: str, left: object, right: object,
              stack: list[Iterator[tuple[str, object, object]]]) -> tuple[str | None, bool]:
        """The message if ``left`` and ``right`` differ here; whether it pushed their children."""
        message = self.compare(path, left, right)
        if message is not None or self.children is None:
            return message, False
        stack.append(self.children)
        return None, True

    def compare(self, path: str, left: object, right: object) -> str | None:
        self.children: Iterator[tuple[str, object, object]] | None = None
        atoms = _atom(left), _atom(right)
        if atoms[0] is not None or atoms[1] is not None:
            return None if atoms[0] == atoms[1] else f"{path}: {_show(left)} != {_show(right)}"
        seen = self.memos[0].get(id(left)), self.memos[1].get(id(right))
        if seen[0] is not None or seen[1] is not None:
            if seen[0] is not None and seen[1] is not None:
                if seen[0][0] == seen[1][0]:
                    return None
                return (f"{path}: is the object at {seen[0][1]} in the first, "
                        f"the object at {seen[1][1]} in the second")
            which, other = ("first", "second") if seen[0] is not None else ("second", "first")
            earlier = (seen[0] or seen[1] or (0, "", None))[1]
            return (f"{path}: is the same object as {earlier} in the {which}, "
                    f"a separate object in the {other}")
        nodes = _node(left), _node(right)
        if qualified(type(left)) != qualified(type(right)):
            return f"{path}: {qualified(type(left))} != {qualified(type(right))}"
        if nodes[0].tag != nodes[1].tag or len(nodes[0].fields) != len(nodes[1].fields):
            return f"{path}: {qualified(type(left))} objects differ in kind"
        for (name, one), (_, two) in zip(nodes[0].fields, nodes[1].fields, strict=True):
            if one != two:
                return f"{path}: {qualified(type(left))} {name} differs"
        for side, obj, node in ((0, left, nodes[0]), (1, right, nodes[1])):
            if node.memo:
                self.memos[side][id(obj)] = (len(self.memos[side]), path, obj)
        children = [list(node.children) for node in nodes]
        if nodes[0].unordered:
            keyed = [sorted(((self.shared.key(element), element) for element in elements),
                            key=lambda pair: pair[0]) for elements in children]
            keys = [[key for key, _ in pairs] for pairs in keyed]
            if keys[0] != keys[1]:
                only = [[element for key, element in keyed[side] if key not in keys[1 - side]]
                        for side in (0, 1)]
                shown = [", ".join(_show(element) for element in elements[:3]) or "nothing"
                         for elements in only]
                return (f"{path}: set elements differ: only in the first {shown[0]}; "
                        f"only in the second {shown[1]}")
            children = [[element for _, element in pairs] for pairs in keyed]
            labels: Iterator[str] = (f"<element {index}>" for index in itertools.count())
        else:
            made = nodes[0].labels() if nodes[0].labels is not None else iter(())
            labels = itertools.chain(made, (f"<{index}>" for index in itertools.count()))
        self.children = self.pairs(path, children[0], children[1], labels)
        return None

    @staticmethod
    def pairs(path: str, first: list[object], second: list[object],
              labels: Iterator[str]) -> Iterator[tuple[str, object, object]]:
        for index, label in enumerate(labels):
            left = first[index] if index < len(first) else _END
            right = second[index] if index < len(second) else _END
            if left is _END and right is _END:
                return
            yield path + label, left, right
