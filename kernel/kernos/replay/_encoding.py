"""Which node each object is written as in the digest's stream (:func:`node_of`).

The rules the module docstring of :mod:`kernos.replay.digest` sets out, kind
by kind: containers, functions and their code, closure cells, classes by name
or by value, descriptors, caches, live resources, library globals, numpy
arrays, pandas frames, series and indexes, matplotlib's callback registries,
and any other object by its ``__reduce_ex__(4)`` (or, when that refuses, its
attributes).  A rule only describes one object (its tag, fields and
children); it never walks the children and never calls ``repr()``.
"""

from __future__ import annotations

import _thread
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import itertools
import pathlib
import re
import sys
import types
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kernos.replay._stream import (
    ABSENT,
    SEP,
    Namespace,
    Node,
    big_text_digest,
    blob_digest,
    dict_node,
    fixed_labels,
    flat_pairs,
    index_labels,
    int_bytes,
    key_labels,
    length_prefixed,
    show,
    utf8,
)
from kernos.serialize.kinds import (
    PICKLABLE_STREAMS,
    library_global,
    lookup,
    qualified,
    transient_types,
)

#: Arrays that are not contiguous are hashed in blocks of about this many bytes.
_CHUNK = 16 * 1024 * 1024
_HEAPTYPE = 1 << 9


def _importable(obj: Any) -> bool:
    module_name = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if type(module_name) is not str or module_name == "__main__" or type(qualname) is not str:
        return False
    module = sys.modules.get(module_name)
    return module is not None and lookup(module, qualname) is obj


def _by_name(tag: bytes, obj: Any) -> Node:
    return Node(tag=tag, memo=False, fields=(
        ("module", utf8(str(getattr(obj, "__module__", None)))),
        ("qualname", utf8(str(getattr(obj, "__qualname__", None))))))


def _function(function: types.FunctionType) -> Node:
    if _importable(function):
        return _by_name(b"g", function)
    return Node(
        tag=b"u",
        fields=(("module", utf8(str(function.__module__))),
                ("qualname", utf8(function.__qualname__)), ("name", utf8(function.__name__))),
        children=(function.__code__, function.__defaults__, function.__kwdefaults__,
                  function.__closure__, function.__dict__,
                  # Walked as a mapping, not as a labelled dict: functools.wraps shares
                  # the wrapped function's, and a restore does not keep that.
                  types.MappingProxyType(function.__annotations__), function.__doc__),
        labels=fixed_labels(".__code__", ".__defaults__", ".__kwdefaults__", ".__closure__",
                      ".__dict__", ".__annotations__", ".__doc__"))


def _names(names: tuple[str, ...]) -> bytes:
    return b"".join(length_prefixed(utf8(name)) for name in names)


def _code(code: types.CodeType) -> Node:
    return Node(
        tag=b"k", memo=False, sub=True,
        fields=(("argument counts", int_bytes(code.co_argcount) + b","
                 + int_bytes(code.co_posonlyargcount) + b"," + int_bytes(code.co_kwonlyargcount)),
                ("locals", int_bytes(code.co_nlocals)),
                ("stack size", int_bytes(code.co_stacksize)),
                ("flags", int_bytes(code.co_flags)), ("bytecode", code.co_code),
                ("exception table", getattr(code, "co_exceptiontable", b"")),
                ("names", _names(code.co_names)), ("variable names", _names(code.co_varnames)),
                ("free variables", _names(code.co_freevars)),
                ("cell variables", _names(code.co_cellvars)), ("name", utf8(code.co_name)),
                ("qualname", utf8(getattr(code, "co_qualname", code.co_name)))),
        children=code.co_consts, labels=lambda: (f".co_consts[{index}]"
                                                 for index in itertools.count()))


def _cell(cell: types.CellType) -> Node:
    try:
        contents = cell.cell_contents
    except ValueError:
        return Node(tag=b"x")
    return Node(tag=b"C", children=(contents,), labels=fixed_labels(".cell_contents"))


def _builtin(function: Any) -> Node:
    owner = getattr(function, "__self__", None)
    if owner is None or isinstance(owner, types.ModuleType):
        return _by_name(b"B", function)
    return Node(tag=b"b", memo=False, fields=(("name", utf8(function.__name__)),),
                 children=(owner,), labels=fixed_labels(".__self__"))


def _descriptor(descriptor: Any) -> Node:
    return Node(tag=b"d", memo=False, fields=(("name", utf8(descriptor.__name__)),),
                 children=(descriptor.__objclass__,), labels=fixed_labels(".__objclass__"))


# Added to class dicts by Python or by pickling, not by the class's code.
_CLASS_CACHES = frozenset({"__dict__", "__weakref__", "__module__", "__slotnames__",
                           "_abc_impl", "__firstlineno__"})


def _class(klass: type) -> Node:
    if not klass.__flags__ & _HEAPTYPE or _importable(klass):
        return _by_name(b"K", klass)
    items = sorted(((name, value) for name, value in vars(klass).items()
                    if name not in _CLASS_CACHES
                    and not (name == "__annotations__" and value == {})),
                   key=lambda item: item[0])
    return Node(
        tag=b"Q",
        fields=(("module", utf8(str(klass.__module__))), ("qualname", utf8(klass.__qualname__)),
                ("name", utf8(klass.__name__))),
        children=itertools.chain((type(klass), klass.__bases__, SEP), flat_pairs(items)),
        labels=lambda: itertools.chain((".<metaclass>", ".__bases__", ""),
                                       key_labels((name for name, _ in items), attribute=True)))


def _lru_cache(wrapper: Any) -> Node:
    if _importable(wrapper):
        return _by_name(b"g", wrapper)
    parameters = wrapper.cache_parameters()
    return Node(tag=b"l", fields=(("parameters", utf8(str(parameters))),),
                 children=(wrapper.__wrapped__,), labels=fixed_labels(".__wrapped__"))


def _transient(obj: object) -> Node:
    return Node(tag=b"X", fields=(("type", utf8(qualified(type(obj)))),
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


_BY_TYPE: dict[type, Callable[[Any], Node]] = {
    list: lambda value: Node(tag=b"L", children=value, labels=index_labels),
    tuple: lambda value: Node(tag=b"t", children=value, labels=index_labels, memo=False,
                               sub=True),
    dict: dict_node,
    set: lambda value: Node(tag=b"Z", children=value, unordered=True),
    frozenset: lambda value: Node(tag=b"z", children=value, unordered=True, memo=False,
                                   sub=True),
    bytearray: lambda value: Node(tag=b"y", fields=(("contents", blob_digest(value)),)),
    str: lambda value: Node(tag=b"S", fields=(("contents", big_text_digest(value)),), memo=False,
                             sub=True),
    bytes: lambda value: Node(tag=b"Y", fields=(("contents", blob_digest(value)),),
                               memo=False, sub=True),
    memoryview: lambda value: Node(tag=b"v", fields=(
        ("format", utf8(value.format)), ("shape", utf8(str(value.shape))),
        ("contents", blob_digest(value)))),
    range: lambda value: Node(tag=b"r", memo=False, fields=(
        ("start", int_bytes(value.start)), ("stop", int_bytes(value.stop)),
        ("step", int_bytes(value.step)))),
    slice: lambda value: Node(tag=b"_", memo=False, children=(value.start, value.stop,
                                                                value.step),
                               labels=fixed_labels(".start", ".stop", ".step")),
    types.FunctionType: _function,
    types.CodeType: _code,
    types.CellType: _cell,
    types.BuiltinFunctionType: _builtin,
    types.MethodWrapperType: _builtin,
    types.MethodType: lambda value: Node(tag=b"m", children=(value.__func__, value.__self__),
                                          labels=fixed_labels(".__func__", ".__self__")),
    types.ModuleType: lambda value: Node(tag=b"M", memo=False,
                                          fields=(("name", utf8(value.__name__)),)),
    types.MappingProxyType: lambda value: dict_node(value, tag=b"p", memo=False),
    property: lambda value: Node(tag=b"P", children=(value.fget, value.fset, value.fdel,
                                                       value.__doc__),
                                  labels=fixed_labels(".fget", ".fset", ".fdel", ".__doc__")),
    staticmethod: lambda value: Node(tag=b"%", children=(value.__func__,),
                                      labels=fixed_labels(".__func__")),
    classmethod: lambda value: Node(tag=b"&", children=(value.__func__,),
                                     labels=fixed_labels(".__func__")),
    functools.cached_property: lambda value: Node(tag=b"=", children=(value.func,
                                                                       value.attrname),
                                                   labels=fixed_labels(".func", ".attrname")),
    functools._lru_cache_wrapper: _lru_cache,
    _thread.LockType: _transient,
    _thread.RLock: _transient,
    Namespace: lambda value: Node(
        tag=b"W", memo=False, children=flat_pairs(value.items),
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


def _array(array: Any, numpy: Any) -> Node:
    dtype = array.dtype
    fields = (("dtype", utf8(dtype.str if dtype.fields is None else repr(dtype.descr))),
              ("shape", utf8(repr(array.shape))))
    if dtype.hasobject:
        return Node(tag=b"O", fields=fields, children=array.flat,
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
    return Node(tag=b"A", fields=(*fields, ("contents", hasher.digest())))


def _index(index: Any) -> Node:
    return Node(tag=b"I", fields=(("dtype", utf8(str(index.dtype))),),
                 children=(type(index), list(index.names), index.to_numpy()),
                 labels=fixed_labels(".__class__", ".names", ".values"))


def _series(series: Any) -> Node:
    return Node(tag=b"R", fields=(("dtype", utf8(str(series.dtype))),),
                 children=(type(series), series.name, series.index, series.to_numpy(),
                           dict(series.attrs)),
                 labels=fixed_labels(".__class__", ".name", ".index", ".values", ".attrs"))


def _callback_registry(registry: Any) -> Node:
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
    return Node(tag=b"K", children=itertools.chain(
        (type(registry),), flat_pairs(attributes), (SEP,), flat_pairs(callbacks)),
        labels=lambda: itertools.chain(
            (".__class__",), key_labels((name for name, _ in attributes), attribute=True),
            ("",), (f".callbacks[{show(signal)}]" for signal, _ in callbacks)))


def _frame_columns(frame: Any) -> Iterator[object]:
    for position in range(frame.shape[1]):
        column = frame.iloc[:, position]
        yield str(column.dtype)
        yield column.to_numpy()


def _frame(frame: Any) -> Node:
    def labels() -> Iterator[str]:
        yield from (".__class__", ".columns", ".index", "")
        for name in frame.columns:
            yield f"[{show(name)}].dtype"
            yield f"[{show(name)}]"
        yield from ("", ".attrs", ".flags.allows_duplicate_labels")

    return Node(tag=b"F", children=itertools.chain(
        (type(frame), frame.columns, frame.index, SEP), _frame_columns(frame),
        (SEP, dict(frame.attrs), frame.flags.allows_duplicate_labels)), labels=labels)


def _reduced(obj: object, memo: bool) -> Node:
    try:
        reduced = obj.__reduce_ex__(4)
    except Exception:  # a reducer that refuses: fall back to the object's attributes
        reduced = None
    kind = type(obj)
    if isinstance(reduced, str):
        return Node(tag=b"G", memo=memo, fields=(("global", utf8(reduced)),),
                     children=(kind,), labels=fixed_labels(".__class__"))
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
    return Node(
        tag=b"R", memo=memo, fields=(("state", shape),),
        children=itertools.chain(
            (kind, function), arguments, (SEP,), state_children, (SEP,), items, (SEP,),
            flat_pairs(pairs)),
        labels=lambda: itertools.chain(
            (".__class__", ".<reconstructor>"),
            (f".<argument {index}>" for index in range(len(arguments))), ("",),
            state_labels(), ("",), (f"[{index}]" for index in range(len(items))), ("",),
            key_labels(key for key, _ in pairs)))


def _state(state: object) -> tuple[bytes, Iterable[object], Callable[[], Iterator[str]]]:
    """A reduce state, with a dict (or a dict and a slots dict) flattened to attributes."""
    if type(state) is dict:
        return b"d", flat_pairs(state.items()), lambda: key_labels(list(state), attribute=True)
    if (type(state) is tuple and len(state) == 2 and type(state[1]) is dict
            and (state[0] is None or type(state[0]) is dict)):
        first: dict[Any, Any] = state[0] or {}
        second: dict[Any, Any] = state[1]
        return (b"2", itertools.chain(flat_pairs(first.items()), (SEP,),
                                      flat_pairs(second.items())),
                lambda: itertools.chain(key_labels(list(first), attribute=True), ("",),
                                        key_labels(list(second), attribute=True)))
    if state is None:
        return b"-", (), lambda: iter(())
    return b"v", (state,), fixed_labels(".<state>")


def _slot_names(klass: type) -> tuple[str, ...]:
    slots = vars(klass).get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


def _attributes(obj: object, memo: bool) -> Node:
    """An object whose reducer failed: its ``__dict__`` and slots, or its type name only."""
    kind = type(obj)
    attributes = getattr(obj, "__dict__", None)
    names = [name for klass in kind.__mro__ for name in _slot_names(klass)
             if name not in ("__dict__", "__weakref__")]
    if type(attributes) is not dict and not names:
        return Node(tag=b"o", memo=memo, fields=(("type", utf8(qualified(kind))),))
    slots = [(name, getattr(obj, name, ABSENT)) for name in names]
    items = list((attributes or {}).items())
    return Node(tag=b"a", memo=memo, children=itertools.chain(
        (kind,), flat_pairs(items), (SEP,), flat_pairs(slots)),
        labels=lambda: itertools.chain((".__class__",), key_labels(
            (name for name, _ in items), attribute=True), ("",),
            key_labels(names, attribute=True)))


def node_of(obj: object) -> Node:
    """How ``obj`` is written (not for atoms)."""
    kind = type(obj)
    home = library_global(obj, "__main__")
    if home is not None:  # stored as a reference to the library's own object: so written,
        # as an importable function is (a global of that name, whatever it holds now)
        return Node(tag=b"g", memo=False, fields=(("module", utf8(home[0])),
                                                   ("qualname", utf8(home[1]))))
    make = _BY_TYPE.get(kind)
    if make is not None:
        return make(obj)
    if isinstance(obj, type):
        return _class(obj)
    if isinstance(obj, enum.Enum):
        return Node(tag=b"e", memo=False, fields=(("name", utf8(obj.name)),),
                     children=(kind,), labels=fixed_labels(".__class__"))
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

