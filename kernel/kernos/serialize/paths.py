"""Name the path from a variable to an object inside it: ``data['conn']._sock``.

Used only on the slow path, when something cannot be persisted and the user
must be told where it is.  The search is breadth-first, so the path is the
shortest one, and bounded, so a huge value cannot stall a commit.

Each step of a path is either an *element* step (an item of a dict, list,
tuple, set or deque, an argument of a ``functools.partial``, a cell of an
object-dtype numpy array or of a pandas Series, DataFrame or Index) or a step
into an object's attributes or internal state.  The pickler's careful pass
uses that distinction to tell a user's value held in a container from a
library's private state (see ``kernos.serialize.careful``).  Pandas containers
are searched through their cells only, never through their internals, so the
path reads as the user would index them: ``frame.iloc[3, 1]``.
"""

from __future__ import annotations

import functools
import gc
import sys
import types
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

_MAX_VISITS = 200_000


@dataclass(frozen=True)
class Step:
    """One step of a path: from ``holder`` to what ``label`` names inside it."""

    holder: object
    """The object the step leaves."""
    label: str
    """How the step reads, e.g. ``['conn']`` or ``._sock``."""
    element: bool
    """Whether the step takes an element of a container rather than internal state."""


@dataclass(frozen=True)
class Chain:
    """A path from a variable to an object inside it."""

    root_label: str
    steps: tuple[Step, ...]

    @property
    def path(self) -> str:
        return self.root_label + "".join(step.label for step in self.steps)

    def path_to(self, index: int) -> str:
        """The path to the holder of step ``index`` (0 is the root itself)."""
        return self.root_label + "".join(step.label for step in self.steps[:index])


def find_path(root: object, target: object, root_label: str) -> str | None:
    """The shortest readable path from ``root`` to ``target``, or None if not found."""
    chain = find_chain(root, target, root_label)
    return None if chain is None else chain.path


def find_chain(root: object, target: object, root_label: str, *,
               opaque: frozenset[int] = frozenset(),
               skip: Callable[[object], bool] | None = None,
               max_visits: int | None = None) -> Chain | None:
    """The shortest path from ``root`` to ``target`` with the objects along it.

    Objects whose ids are in ``opaque`` are not searched (they are being
    replaced whole), nor those for which ``skip`` is true (the pickler writes
    them by name), and the search gives up after ``max_visits`` objects.
    """
    found = find_first(root, lambda obj: obj is target, root_label, opaque=opaque, skip=skip,
                       max_visits=max_visits)
    return None if found is None else found[1]


def find_first(root: object, wanted: Callable[[object], bool], root_label: str, *,
               opaque: frozenset[int] = frozenset(),
               skip: Callable[[object], bool] | None = None,
               max_visits: int | None = None) -> tuple[object, Chain] | None:
    """The object nearest to ``root`` for which ``wanted`` is true, and the path to it."""
    found, _ = search(root, wanted, root_label, opaque=opaque, skip=skip,
                      max_visits=max_visits)
    return found


def search(root: object, wanted: Callable[[object], bool], root_label: str, *,
           opaque: frozenset[int] = frozenset(),
           skip: Callable[[object], bool] | None = None,
           follow: Callable[[object, bool], bool] | None = None,
           max_visits: int | None = None) -> tuple[tuple[object, Chain] | None, bool]:
    """:func:`find_first`, and whether the search was complete (not cut off by the bound).

    With ``follow``, a step out of an object is taken only if ``follow(object,
    element)`` is true.
    """
    if wanted(root):
        return (root, Chain(root_label, ())), True
    limit = _MAX_VISITS if max_visits is None else max_visits
    seen = {id(root)} | opaque
    # Each entry: the object, and the index of its parent entry with the step from it.
    entries: list[tuple[object, int, str, bool]] = [(root, -1, "", False)]
    queue: deque[int] = deque([0])
    visits = 0
    while queue and visits < limit:
        index = queue.popleft()
        obj = entries[index][0]
        visits += 1
        allowed = (True, True) if follow is None else (follow(obj, False), follow(obj, True))
        if allowed == (False, False):
            continue
        for child, label, element in _safe_children(obj):
            if id(child) in seen or type(child) in _ATOMIC or not allowed[element]:
                continue
            seen.add(id(child))
            entries.append((child, index, label, element))
            if wanted(child):
                return (child, _chain(entries, len(entries) - 1, root_label)), True
            if type(child) is not types.ModuleType and (skip is None or not _safely(skip, child)):
                queue.append(len(entries) - 1)
    return None, not queue


def _chain(entries: list[tuple[object, int, str, bool]], index: int, root_label: str) -> Chain:
    steps: list[Step] = []
    while index > 0:
        _, parent, label, element = entries[index]
        steps.append(Step(entries[parent][0], label, element))
        index = parent
    return Chain(root_label, tuple(reversed(steps)))


_ATOMIC = frozenset({str, bytes, int, float, complex, bool, type(None)})


def _short(key: object) -> str:
    try:
        text = repr(key)
    except Exception:  # a key with a broken __repr__ must not lose the whole value
        text = f"<{type(key).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."


def _safely(test: Callable[[object], bool], obj: object) -> bool:
    try:
        return test(obj)
    except Exception:  # even isinstance can raise (a proxy's __class__)
        return True


def _safe_children(obj: object) -> Iterator[tuple[object, str, bool]]:
    """The children of ``obj``; an object whose attributes raise is searched no further."""
    try:
        yield from _children(obj)
    except Exception:  # a property, a proxy or a broken container: nothing more to see
        return


def _children(obj: object) -> Iterator[tuple[object, str, bool]]:
    if isinstance(obj, dict):
        for key, value in list(obj.items()):
            yield value, f"[{_short(key)}]", True
            yield key, f".<key {_short(key)}>", True
        if type(obj) is dict:
            return
    elif isinstance(obj, (list, tuple, deque)):
        for index, value in enumerate(list(obj)):
            yield value, f"[{index}]", True
        if type(obj) in (list, tuple):
            return
    elif isinstance(obj, (set, frozenset)):
        for value in list(obj):
            yield value, ".<set element>", True
        if type(obj) in (set, frozenset):
            return
    elif isinstance(obj, functools.partial):
        yield obj.func, ".func", False
        for index, value in enumerate(obj.args):
            yield value, f".args[{index}]", True
        for key, value in (obj.keywords or {}).items():
            yield value, f".keywords[{_short(key)}]", True
    data = _data_cells(obj)
    if data is not None:
        yield from data
        return
    if isinstance(obj, types.FunctionType):
        for index, cell in enumerate(obj.__closure__ or ()):
            try:
                yield cell.cell_contents, f".__closure__[{index}].cell_contents", False
            except ValueError:
                continue
        for index, value in enumerate(obj.__defaults__ or ()):
            yield value, f".__defaults__[{index}]", False
        yield obj.__dict__, ".__dict__", False
        return
    if isinstance(obj, (types.MethodType, types.BuiltinMethodType)):
        yield obj.__self__, ".__self__", False
        yield getattr(obj, "__func__", None), ".__func__", False
        return
    if isinstance(obj, types.CellType):
        try:
            contents = obj.cell_contents
        except ValueError:
            return  # an empty cell
        yield contents, ".cell_contents", False
        return
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, (dict, types.MappingProxyType)):
        for key, value in list(attributes.items()):
            yield value, f".{key}", False
    found_slots = False
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            try:
                value = getattr(obj, slot)
            except AttributeError:
                continue
            found_slots = True
            yield value, f".{slot}", False
    if attributes is None and not found_slots and not isinstance(
            obj, (dict, list, tuple, set, frozenset, deque, functools.partial)):
        for child in gc.get_referents(obj):
            yield child, ".<internal>", False


def _data_cells(obj: object) -> Iterator[tuple[object, str, bool]] | None:
    """The cells of a numpy array or pandas container that can hold objects, or None."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        return _array_cells(obj, numpy) if _holds_objects(obj.dtype) else iter(())
    pandas = sys.modules.get("pandas")
    if pandas is None:
        return None
    if isinstance(obj, pandas.DataFrame):
        return _frame_cells(obj)
    if isinstance(obj, pandas.Series):
        return _series_cells(obj)
    if isinstance(obj, pandas.Index):
        return _index_cells(obj, "")
    return None


def _holds_objects(dtype: Any) -> bool:
    """Whether a numpy or pandas dtype is numpy's object dtype (pandas' str dtype is not)."""
    return getattr(dtype, "kind", None) == "O" and getattr(dtype, "name", None) == "object"


def _array_cells(array: Any, numpy: types.ModuleType) -> Iterator[tuple[object, str, bool]]:
    shape = array.shape
    for flat, value in enumerate(array.flat):
        where = numpy.unravel_index(flat, shape)
        yield value, "[" + ", ".join(str(int(i)) for i in where) + "]", True


def _index_cells(index: Any, prefix: str) -> Iterator[tuple[object, str, bool]]:
    if _holds_objects(getattr(index, "dtype", None)):
        for position, value in enumerate(index):
            yield value, f"{prefix}[{position}]", True


def _series_cells(series: Any) -> Iterator[tuple[object, str, bool]]:
    if _holds_objects(series.dtype):
        for position, value in enumerate(series.array):
            yield value, f".iloc[{position}]", True
    yield from _index_cells(series.index, ".index")
    yield from _attrs(series)


def _frame_cells(frame: Any) -> Iterator[tuple[object, str, bool]]:
    for column, dtype in enumerate(frame.dtypes):
        if _holds_objects(dtype):
            values = frame.iloc[:, column].array
            for row, value in enumerate(values):
                yield value, f".iloc[{row}, {column}]", True
    yield from _index_cells(frame.index, ".index")
    yield from _index_cells(frame.columns, ".columns")
    yield from _attrs(frame)


def _attrs(container: Any) -> Iterator[tuple[object, str, bool]]:
    attrs = getattr(container, "attrs", None)
    if isinstance(attrs, dict):
        for key, value in attrs.items():
            yield value, f".attrs[{_short(key)}]", True
