"""Load-side constructors that stored snapshots call by name.

Snapshots refer to these functions as ``kernos.serialize.rebuild.<name>``, so
their names and signatures are part of the on-disk format: add new ones, never
rename or change existing ones.

Cycle safety follows one rule: an object that others may point back to
(functions, classes, cells) is created as an empty skeleton first, so the
pickle memo holds it, and is filled in by a state setter afterwards.
"""

from __future__ import annotations

import contextvars
import importlib
import sys
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dill

from kernos.serialize.unpersisted import Unpersisted


@dataclass(kw_only=True)
class LoadContext:
    """What a load needs from its surroundings."""

    namespace: MutableMapping[str, Any]
    """The dict that functions defined in cells use as their globals."""
    module: types.ModuleType | None = None
    """The module object whose ``__dict__`` is ``namespace``, if there is one."""
    live_transients: Sequence[object] = field(default_factory=tuple)
    """Objects that could not be persisted but are still alive (used on rollback)."""
    deferred: list[tuple[type, str, object]] = field(default_factory=list)
    """Class attributes to set once the whole stream is loaded (see set_class_state)."""
    keyring: Any = None
    """The workspace's :class:`~kernos.personal.Keyring`, to open sealed personal values."""

    def finish(self) -> None:
        """Set the deferred class attributes."""
        for cls, key, value in self.deferred:
            setattr(cls, key, value)
        self.deferred.clear()


_context: contextvars.ContextVar[LoadContext] = contextvars.ContextVar("kernos_load_context")


def use_context(context: LoadContext) -> contextvars.Token[LoadContext]:
    return _context.set(context)


def current_keyring() -> Any:
    """The keyring of the load in progress, if any."""
    context = _context.get(None)
    return None if context is None else context.keyring


def reset_context(token: contextvars.Token[LoadContext]) -> None:
    _context.reset(token)


def namespace() -> MutableMapping[str, Any]:
    """The namespace being loaded into: the globals of cell-defined functions."""
    return _context.get().namespace


def namespace_module() -> types.ModuleType:
    context = _context.get()
    if context.module is not None:
        return context.module
    module = types.ModuleType("__main__")
    module.__dict__.update(context.namespace)
    return module


def module_dict(name: str) -> dict[str, Any]:
    return importlib.import_module(name).__dict__


def code_from_dill(blob: bytes) -> types.CodeType:
    code = dill.loads(blob)
    if type(code) is not types.CodeType:
        raise TypeError(f"expected a code object, got {type(code).__name__}")
    return code


def from_dill(blob: bytes) -> object:
    return dill.loads(blob)


def member(value: Any) -> Any:
    """A group's value, from behind the marker of ``kernos.serialize.sharing.marked``."""
    return value


def make_cell() -> types.CellType:
    return types.CellType()


def set_cell_contents(cell: types.CellType, contents: object) -> types.CellType:
    cell.cell_contents = contents
    return cell


def make_function(
    code: types.CodeType,
    globals_: dict[str, Any],
    name: str,
    closure: tuple[types.CellType, ...] | None,
) -> types.FunctionType:
    # Interned like the name of a function made by `def`, so that a restored function
    # pickles exactly as the original did (pickle's memo follows string identity).
    return types.FunctionType(code, globals_, sys.intern(name), None, closure)


def set_function_state(func: types.FunctionType, state: Mapping[str, Any]) -> types.FunctionType:
    closure = func.__closure__ or ()
    for index, value in state.get("closure_values", ()):
        closure[index].cell_contents = value
    for attribute in ("__defaults__", "__kwdefaults__", "__annotations__", "__qualname__",
                      "__module__", "__doc__"):
        if attribute in state:
            setattr(func, attribute, state[attribute])
    func.__dict__.update(state.get("__dict__", {}))
    return func


#: Skeleton key naming a class already made by the same stream (see the pickler).
SAME_AS = "__kernos_same_as__"


def make_class(
    metaclass: type, name: str, bases: tuple[type, ...], skeleton: dict[str, Any]
) -> type:
    if SAME_AS in skeleton:
        return skeleton[SAME_AS]  # type: ignore[no-any-return]
    return metaclass(name, bases, _with_interned_slots(skeleton))  # type: ignore[no-any-return]


def _with_interned_slots(skeleton: dict[str, Any]) -> dict[str, Any]:
    # Interned as in a class statement: pickling an instance names its slots by the
    # strings in __slots__, and they must be the same objects as the other names.
    namespace = dict(skeleton)
    slots = namespace.get("__slots__")
    if isinstance(slots, str):
        namespace["__slots__"] = sys.intern(slots)
    elif isinstance(slots, (tuple, list)):
        interned = [sys.intern(slot) if type(slot) is str else slot for slot in slots]
        namespace["__slots__"] = tuple(interned) if isinstance(slots, tuple) else interned
    return namespace


def make_class_unchecked(
    metaclass: type, name: str, bases: tuple[type, ...], skeleton: dict[str, Any]
) -> type:
    """A class of ``metaclass`` made without its ``__new__`` (for TypedDict's metaclass)."""
    if SAME_AS in skeleton:
        return skeleton[SAME_AS]  # type: ignore[no-any-return]
    return type.__new__(metaclass, name, bases, _with_interned_slots(skeleton))


def make_enum(
    metaclass: type,
    name: str,
    bases: tuple[type, ...],
    skeleton: dict[str, Any],
    members: Sequence[tuple[str, Any]],
) -> type:
    if SAME_AS in skeleton:
        return skeleton[SAME_AS]  # type: ignore[no-any-return]
    classdict = metaclass.__prepare__(name, bases)
    for key, value in skeleton.items():
        classdict[key] = value
    for member, value in members:
        classdict[member] = value
    return metaclass(name, bases, classdict)  # type: ignore[no-any-return]


def set_class_state(cls: type, state: Mapping[str, Any]) -> type:
    context = _context.get(None)
    for key, value in state.items():
        if key == "__init_subclass__" and context is not None:
            # Subclasses are made again by this very load, and what the hook did
            # when they were first made is in the restored state already: running
            # it again would, say, register each subclass twice.
            context.deferred.append((cls, key, value))
        else:
            setattr(cls, key, value)
    return cls


def make_cached_property(func: Callable[..., Any], attrname: str | None) -> object:
    import functools

    prop = functools.cached_property(func)
    prop.attrname = attrname
    return prop


def mapping_proxy(content: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(content)


def unpersisted(index: int, info: Mapping[str, Any]) -> object:
    """The live object on rollback if it still exists, else a placeholder."""
    live = _context.get().live_transients
    if 0 <= index < len(live):
        return live[index]
    return Unpersisted(**info)


def singleton(module: str, name: str) -> object:
    return getattr(importlib.import_module(module), name)


def make_lru_cache(func: Callable[..., Any], maxsize: int | None, typed: bool) -> object:
    import functools

    return functools.lru_cache(maxsize=maxsize, typed=typed)(func)


def make_type_var(
    name: str,
    constraints: tuple[Any, ...],
    bound: Any,
    covariant: bool,
    contravariant: bool,
    module: str,
) -> object:
    import typing

    var = typing.TypeVar(name, *constraints, bound=bound, covariant=covariant,  # type: ignore[misc]
                         contravariant=contravariant)
    var.__module__ = module
    return var


def make_exception(kind: type[BaseException], base: type[BaseException],
                   args: tuple[Any, ...]) -> BaseException:
    error = base.__new__(kind, *args)
    base.__init__(error, *args)
    return error


class Memory(bytearray):
    """Memory that arrays are windows on, told apart from a user's own bytearray."""

    __slots__ = ()


def memory(buffer: Any) -> Any:
    """The buffer that arrays sharing one memory owner are windows on.

    Large buffers arrive as memory the restore mapped for them; small ones as a
    bytearray, which is copied into a :class:`Memory` so that pickling the
    restored arrays does not mistake it for a user's bytearray.
    """
    if type(buffer) is bytearray:
        return Memory(buffer)
    return buffer


def array_window(memory: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 dtype: Any, writeable: bool) -> Any:
    import numpy

    array = numpy.ndarray(shape=shape, dtype=dtype, buffer=memory, offset=offset,
                          strides=strides)
    if not writeable and array.flags.writeable:
        array.flags.writeable = False
    return array


# -- iterators and views (see kernos.serialize.iterators) ---------------------------

def container_iterator(kind: str, remaining: list[Any]) -> Any:
    """An iterator of a dict, set or OrderedDict over a fresh container of what is left."""
    import collections

    if kind == "keys":
        return iter(dict.fromkeys(remaining))
    if kind == "values":
        return iter(dict(enumerate(remaining)).values())
    if kind == "items":
        return iter(dict(remaining).items())
    if kind == "reversed keys":
        return reversed(dict.fromkeys(reversed(remaining)))
    if kind == "reversed values":
        return reversed(dict(enumerate(reversed(remaining))).values())
    if kind == "reversed items":
        return reversed(dict(reversed(remaining)).items())
    if kind == "set":
        return iter(set(remaining))
    if kind == "ordered":
        return iter(collections.OrderedDict(enumerate(remaining)).values())
    raise ValueError(f"unknown kind of container iterator: {kind!r}")


class _NoItems:
    """A sequence with nothing in it, for the sequence iterators below."""

    def __getitem__(self, index: int) -> Any:
        raise IndexError(index)

    def __len__(self) -> int:
        return 0


def _stale_group() -> Any:
    import itertools

    groups = itertools.groupby((0, 1))
    _, group = next(groups)
    next(groups)  # moving on makes the first group stale: it yields nothing more
    return group


def _exhausted_sources() -> dict[str, Callable[[], Any]]:
    import array
    import itertools

    return {
        "str_iterator": lambda: iter("\u00e9"),  # not ASCII: that is another type
        "bytes_iterator": lambda: iter(b""),
        "bytearray_iterator": lambda: iter(bytearray()),
        "list_reverseiterator": lambda: reversed([]),
        "arrayiterator": lambda: iter(array.array("b")),
        "callable_iterator": lambda: iter(int, 0),  # int() is 0: stops at once
        "iterator": lambda: iter(_NoItems()),
        type(next(itertools.groupby((0,)))[1]).__name__: _stale_group,
    }


EXHAUSTED = _exhausted_sources()


def exhausted_iterator(kind: str) -> Any:
    """An exhausted iterator of a builtin type, by name (nothing of its source is left)."""
    iterator = EXHAUSTED[kind]()
    for _ in iterator:
        pass
    return iterator


def pairwise(has_iterator: bool, has_last: bool, iterator: Any = None, last: Any = None) -> Any:
    """``itertools.pairwise`` again: over its iterator, after the last item it saw."""
    import itertools

    if not has_iterator:  # exhausted
        return itertools.pairwise(())
    if not has_last:  # not started
        return itertools.pairwise(iterator)
    return itertools.pairwise(itertools.chain((last,), iterator))


def dict_view(kind: str, mapping: Any) -> Any:
    """A view of a restored dict (or OrderedDict): the same live link as before."""
    import collections

    ordered = collections.OrderedDict
    views: dict[str, Callable[[Any], Any]] = {
        "keys": dict.keys, "values": dict.values, "items": dict.items,
        "ordered keys": ordered.keys, "ordered values": ordered.values,
        "ordered items": ordered.items,
    }
    return views[kind](mapping)


# -- values with nothing left to lose (see kernos.serialize.resources) ----------------

def closed_file(raw: tuple[Any, str, dict[str, Any]], buffered: tuple[type, dict[str, Any]] | None,
                wrapper: tuple[Any, ...] | None) -> Any:
    """A closed builtin file object, as it was: same types, name, mode and encoding.

    Made over ``os.devnull`` and closed at once: opening the user's file could
    create or truncate it.
    """
    import io
    import os

    name, mode, raw_extra = raw
    stream: Any = io.FileIO(os.open(os.devnull, os.O_RDWR), mode, closefd=True)
    stream.name = name
    layers = [(stream, raw_extra)]
    if buffered is not None:
        kind, extra = buffered
        stream = kind(stream)
        layers.append((stream, extra))
    if wrapper is not None:
        encoding, errors, line_buffering, write_through, text_mode, extra = wrapper
        stream = io.TextIOWrapper(stream, encoding=encoding, errors=errors,
                                  line_buffering=line_buffering, write_through=write_through)
        if text_mode is not None:
            stream.mode = text_mode
        layers.append((stream, extra))
    stream.close()
    for layer, extra in layers:
        layer.__dict__.update(extra)
    return stream


def closed_memory_stream(kind: type) -> Any:
    stream = kind()
    stream.close()
    return stream


def finished_generator(code: types.CodeType, name: str, qualname: str) -> Any:
    """A generator (or coroutine) of ``code`` that has run to its end.

    It is made by calling a function of that code with placeholder arguments
    and closed before it ever runs, so none of the code executes.
    """
    closure = tuple(types.CellType() for _ in code.co_freevars) or None
    function = types.FunctionType(code, {}, name, None, closure)
    positional = [None] * code.co_argcount
    keywords = dict.fromkeys(
        code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount])
    generator = function(*positional, **keywords)
    generator.close()
    generator.__name__ = name
    generator.__qualname__ = qualname
    return generator


def closed_sqlite(row_factory: Any, text_factory: Any) -> Any:
    import sqlite3

    connection = sqlite3.connect(":memory:")
    connection.row_factory = row_factory
    connection.text_factory = text_factory
    connection.close()
    return connection


# -- memory-mapped files (see kernos.serialize.arrays) --------------------------------

class MissingFile:
    """What a restore finds instead of a mapped file that is gone or changed size."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def mapped_file(path: str, start: int, length: int, size: int, mode: str) -> Any:
    """The file an array was mapped on, mapped again; a MissingFile if that cannot be."""
    import mmap
    import os

    try:
        now = os.stat(path).st_size
        if now != size:
            return MissingFile(f"its file {path} changed size ({size} bytes when stored, "
                               f"{now} now)")
        with open(path, "r+b" if mode == "r+" else "rb") as file:
            access = mmap.ACCESS_WRITE if mode == "r+" else mmap.ACCESS_READ
            return mmap.mmap(file.fileno(), length, access=access, offset=start)
    except FileNotFoundError:
        return MissingFile(f"its file {path} is gone")
    except (OSError, ValueError) as error:
        return MissingFile(f"its file {path} could not be mapped again ({error})")


def mapped_window(memory: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...],
                  dtype: Any, writeable: bool, fields: tuple[Any, Any, Any] | None,
                  where: tuple[str, str] | None) -> Any:
    """An array on a mapped file (or a np.memmap kept by value), or a placeholder."""
    import numpy

    if type(memory) is MissingFile:
        name, path = where or ("?", "?")
        return Unpersisted(
            name=name, path=path, type_name="numpy.memmap" if fields else "numpy.ndarray",
            reason=f"it was mapped on a file, and {memory.reason}; map the file again "
                   "with np.memmap")
    kind = numpy.ndarray if fields is None else numpy.memmap
    array: Any = numpy.ndarray.__new__(kind, shape=shape, dtype=dtype, buffer=memory,
                                       offset=offset, strides=strides)
    if fields is not None:  # as np.memmap.__new__ sets them
        filename, file_offset, mode = fields
        array._mmap = memory if filename is not None else None
        array.filename, array.offset, array.mode = filename, file_offset, mode
    if not writeable and array.flags.writeable:
        array.flags.writeable = False
    return array


# -- instances whose own __setstate__ would drop their attributes -------------------

def blank_instance(kind: Any) -> Any:
    """An instance of ``kind`` made without ``__init__`` (its items and attributes follow)."""
    return kind.__new__(kind)


def update_instance_dict(instance: Any, state: dict[str, Any]) -> Any:
    """Set ``instance``'s attributes from ``state``, not through its class's ``__setstate__``."""
    vars(instance).update(state)
    return instance


# -- lxml documents (see kernos.serialize.xmltrees) ---------------------------------

def lxml_document(family: str, data: bytes) -> Any:
    """An lxml ``_ElementTree`` parsed from ``data`` by a parser of ``family``."""
    from lxml import etree

    options = {"remove_blank_text": False, "resolve_entities": False, "no_network": True,
               "huge_tree": True, "strip_cdata": False}
    if family == "objectify":
        from lxml import objectify

        parser = objectify.makeparser(**options)
    else:
        parser = etree.XMLParser(**options)
    return etree.ElementTree(etree.fromstring(data, parser))


def lxml_node(tree: Any, path: tuple[int, ...]) -> Any:
    """The node of ``tree`` at ``path`` (child indices from its root)."""
    from lxml import etree

    child = etree._Element.__getitem__  # objectify's own [] picks siblings by tag
    node = tree.getroot()
    for index in path:
        node = child(node, index)
    return node


def lxml_tree(tree: Any) -> Any:
    return tree


def join_segments(kind: str, *segments: Any) -> Any:
    """A list or dict stored in segments (``kernos.serialize.segments``), joined again.

    Each segment is a pickle of ``(container,)`` written by the image's pickler;
    it loads under the context of the load that called this.
    """
    if kind == "list":
        joined: Any = []
        for segment in segments:
            joined.extend(_segment(segment))
        return joined
    if kind == "dict":
        joined = {}
        for segment in segments:
            joined.update(_segment(segment))
        return joined
    raise ValueError(f"a segmented value of unknown kind {kind!r}")


def _segment(data: Any) -> Any:
    import pickle

    values = pickle.loads(data)
    if type(values) is not tuple or len(values) != 1:
        raise ValueError("a segment does not hold one container")
    return values[0]
