"""What cannot persist: the careful pass, and where its placeholders go.

When the fast pickle fails, a careful pass reduces every object itself, so
that a failure is pinned on one object, which a placeholder then replaces
(see ``kernos.serialize.unpersisted``).  *Where* a placeholder goes decides
whether a restore makes sense, and what the user is told.

**The rule.**  A placeholder replaces the outermost object on the path from
the variable to the bad object that the user sees as one opaque thing.  The
path (found by ``kernos.serialize.paths``) is followed from the variable:

* Steps through the user's own structure pass: the items of dicts, lists,
  tuples, sets and deques (and of their subclasses), the cells of an
  object-dtype numpy array or of a pandas Series, DataFrame or Index (and its
  ``attrs``), the attributes of instances of classes defined in cells, the
  closures and defaults of functions defined in cells, the arguments of a
  ``functools.partial``, the attributes of a ``types.SimpleNamespace`` or of a
  builtin exception, the contents of cells and properties.  These are values
  the user put there and indexes by hand.
* The first step into the attributes or internal state of any other object
  (an instance of a class imported by name: an ``HDFStore``, a
  ``TextFileReader``, a bound method, an iterator) enters a library's private
  world.  That object is the user's unit: it is replaced whole, and the notice
  names it by its user-level path (``store``, ``data['conn']``), with a reason
  that says what it holds (``it holds an open file (tables.file.File at
  store._handle)``).

So a data container is never swallowed for one bad element (a DataFrame with
an open file in one cell keeps its other cells), and a library object never
comes back with a placeholder deep inside its internals, where its own code
would trip over it (an ``HDFStore`` whose restore recursed forever).

Replacing a whole library object takes a second careful dump that replaces
the chosen objects as the pickler meets them (``reducer_override`` sees
every non-builtin object before its contents).  That cost is on the failure
path only.  When no path to a bad object can be found, the notice says so
with the variable's name; if the variable itself is a library object, it is
replaced whole (it is on every path).
"""

from __future__ import annotations

import copyreg
import functools
import io
import socket
import sys
import threading
import types
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dill

from kernos.serialize import rebuild
from kernos.serialize.kinds import PROTOCOL, qualified
from kernos.serialize.paths import Chain, find_chain, find_first

__all__ = ["CarefulPickling", "Located", "Replacement", "Transient", "describe_failure",
           "enters_library", "locate"]


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
    lossless: bool = False
    """Nothing is lost by not persisting it (a closed file, a finished thread)."""

    def info(self) -> dict[str, Any]:
        """As stored with the snapshot; ``lossless`` only when true (readers default it)."""
        info: dict[str, Any] = {"name": self.name, "path": self.path,
                                "type_name": self.type_name, "reason": self.reason}
        if self.lossless:
            info["lossless"] = True
        return info


@dataclass(kw_only=True)
class Replacement:
    """A library object to replace whole by a placeholder in the next careful dump."""

    obj: object = field(repr=False)
    name: str
    path: str
    reason: str


@dataclass(kw_only=True)
class Located:
    """Where a bad object sits, and which library object (if any) must go with it."""

    name: str
    path: str
    note: str = ""
    """Said after the reason when the path could not be named."""
    holder: object = None
    """The outermost library object on the path, to be replaced whole (None: none)."""
    holder_path: str = ""
    chain: Chain | None = None
    holder_index: int = 0


def describe_failure(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return "it is nested too deeply to pickle (recursion limit reached)"
    return f"it cannot be pickled ({type(error).__name__}: {error})"


# -- locating --------------------------------------------------------------------

# Objects whose attributes are values the user put there (see the module docstring).
_OPEN_STRUCTURE: tuple[type, ...] = (types.SimpleNamespace, types.CellType, property,
                                     staticmethod, classmethod, functools.partial)
_CONTAINERS: tuple[type, ...] = (dict, list, tuple, set, frozenset, deque)


def _data_container(obj: object) -> bool:
    if isinstance(obj, _CONTAINERS):
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        return True
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(obj, (pandas.Series, pandas.DataFrame,
                                                   pandas.Index))


def enters_library(holder: object, element: bool, home: str) -> bool:
    """Whether a step out of ``holder`` enters a library's private state."""
    try:
        return _enters(holder, element, home)
    except Exception:  # an object that breaks isinstance: surely not the user's structure
        return True


def _enters(holder: object, element: bool, home: str) -> bool:
    if element and _data_container(holder):
        return False
    if isinstance(holder, _OPEN_STRUCTURE):
        return False
    defined_in = holder if isinstance(holder, (type, types.FunctionType)) else type(holder)
    if getattr(defined_in, "__module__", None) == home:
        return False  # defined in a cell: the user's
    return not (isinstance(holder, BaseException) and type(holder).__module__ == "builtins")


def _by_reference(by_value: Callable[[Any], bool]) -> Callable[[object], bool]:
    """Objects the pickler writes by name, never descending into them."""
    def skip(obj: object) -> bool:
        if isinstance(obj, (type, types.FunctionType)):
            return not by_value(obj)
        return isinstance(obj, types.BuiltinFunctionType) and (
            obj.__self__ is None or isinstance(obj.__self__, types.ModuleType))
    return skip


def locate(roots: Sequence[tuple[str, object]], obj: object, name: str | None, *,
           default_owner: str, by_value: Callable[[Any], bool], home: str,
           opaque: frozenset[int] = frozenset(), max_visits: int | None = None) -> Located:
    """The variable and path of ``obj``, and the library object that must go with it.

    ``home`` is the name of the namespace's module: what is defined there is the user's.
    """
    skip = _by_reference(by_value)
    candidates = [(root_name, value) for root_name, value in roots
                  if name is None or root_name == name]
    for root_name, root_value in candidates:
        chain = find_chain(root_value, obj, root_name, opaque=opaque, skip=skip,
                           max_visits=max_visits)
        if chain is None:
            continue
        for index, step in enumerate(chain.steps):
            if enters_library(step.holder, step.element, home):
                return Located(name=root_name, path=chain.path, holder=step.holder,
                               holder_path=chain.path_to(index), chain=chain,
                               holder_index=index)
        return Located(name=root_name, path=chain.path, chain=chain)
    owner = name or default_owner
    note = f" (it is somewhere inside {owner}, on no path that could be named)"
    if len(candidates) == 1 and candidates[0][1] is not obj and enters_library(
            candidates[0][1], False, home):
        # The variable is itself a library object: it is on every path to obj.
        return Located(name=owner, path=owner, note=note, holder=candidates[0][1],
                       holder_path=owner)
    return Located(name=owner, path=owner, note=note)


# -- reasons ---------------------------------------------------------------------

_PHRASES: tuple[tuple[type, str], ...] = (
    (io.IOBase, "an open file"), (socket.socket, "a network connection"),
    (threading.Thread, "a thread"), (types.GeneratorType, "a paused generator"),
    (types.CoroutineType, "a paused coroutine"),
    (types.AsyncGeneratorType, "a paused async generator"),
    (types.FrameType, "a stack frame"), (types.TracebackType, "a traceback"),
)
_LATE_PHRASES = (("sqlite3", "Connection", "a database connection"),
                 ("sqlite3", "Cursor", "a database cursor"),
                 ("subprocess", "Popen", "a running process"),
                 ("asyncio", "Future", "an asyncio future"), ("asyncio", "Task", "an asyncio task"),
                 ("asyncio", "AbstractEventLoop", "an asyncio event loop"))


def resource_phrase(obj: object) -> str | None:
    """What a live resource is, in words (``an open file``), or None if it is not one."""
    try:
        return _resource_phrase(obj)
    except Exception:  # an object that breaks isinstance (numpy's BagObj does)
        return None


def _resource_phrase(obj: object) -> str | None:
    for klass, phrase in _PHRASES:
        if isinstance(obj, klass):
            return phrase
    for module_name, class_name, phrase in _LATE_PHRASES:
        late = getattr(sys.modules.get(module_name), class_name, None)
        if isinstance(late, type) and isinstance(obj, late):
            return phrase
    close = _found(obj, "close")
    is_open = _found(obj, "closed") is False or _found(obj, "isopen") in (1, True)
    if callable(close) and is_open and not isinstance(obj, type):
        # A library's own handle (tables.File, zipfile's, h5py's): has close() and is open.
        return "an open file" if "file" in type(obj).__name__.lower() else "an open resource"
    return None


def _found(obj: object, name: str) -> object:
    """``obj``'s attribute ``name`` as its instance and class hold it, or None: never through
    a ``__getattr__`` hook, which may make what it is asked for (a mock makes a child mock
    for any name, so looking at a mock changed it, and a search through its children never
    ended)."""
    try:
        return object.__getattribute__(obj, name)
    except Exception:
        return None


def holder_reason(located: list[tuple[Located, Transient]]) -> str:
    """Why a library object is replaced whole: what it holds that cannot persist."""
    for where, transient in located:
        chain = where.chain
        inside: list[tuple[object, str]] = []
        if chain is not None:
            inside = [(step.holder, chain.path_to(index))
                      for index, step in enumerate(chain.steps) if index > where.holder_index]
        inside.append((transient.obj, transient.path))
        for obj, path in inside:
            phrase = resource_phrase(obj)
            if phrase is not None:
                return (f"it holds {phrase} ({qualified(type(obj))} at {path}); create it "
                        "again after a restore")
    where, first = located[0]
    at = f" at {first.path}" if where.chain is not None else ""
    more = f" and {len(located) - 1} more" if len(located) > 1 else ""
    return (f"part of it cannot be pickled ({first.type_name}{at}{more}); "
            "create it again after a restore")


def held_resource_reason(obj: object, path: str, failure: str) -> str:
    """A failure of a library object, explained by a resource it holds if one is found."""
    found = find_first(obj, lambda child: child is not obj and resource_phrase(child) is not None,
                       path, max_visits=5_000)
    if found is None:
        return failure
    resource, chain = found
    return (f"it holds {resource_phrase(resource)} ({qualified(type(resource))} at "
            f"{chain.path}); create it again after a restore")


# -- the careful pass -------------------------------------------------------------

class CarefulPickling:
    """Mixed into the image pickler for the careful pass (see the module docstring)."""

    replace: dict[int, Replacement]
    careful_transient: Callable[..., Any]

    def reducer_override(self, obj: Any) -> Any:
        found = self.replace.get(id(obj)) if self.replace else None
        if found is not None and found.obj is obj:
            return self.careful_transient(obj, found)
        try:
            return super().reducer_override(obj)  # type: ignore[misc]
        except Exception as error:  # even isinstance can raise (an ABC check on a proxy)
            return self._failed(obj, describe_failure(error))  # type: ignore[attr-defined]

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
            return self._failed(obj, describe_failure(error))  # type: ignore[attr-defined]
        return (rebuild.from_dill, (blob,))
