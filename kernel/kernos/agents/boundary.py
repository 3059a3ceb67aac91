"""What crosses between agent code and the host, and how.

Only *plain data* crosses: ``None``, ``bool``, ``int``, ``float``, ``str``,
``bytes``, ``decimal.Decimal``, ``datetime`` values, and ``list`` / ``tuple``
/ ``dict`` / ``set`` / ``frozenset`` of plain data.  Types are checked
exactly (``type(x) is str``), so a subclass with its own ``__eq__``,
``__hash__`` or ``startswith`` is refused, and every container is copied,
so neither side keeps a reference into the other's objects.  Sizes and
depths are bounded.

Host objects reach agents only as :class:`ObjectView` capability proxies.
A view holds a *name* and a *path*, never the object: every access looks the
object up again and checks the grant again, so a revocation takes effect on
the next access, and a view stored in an agent's namespace persists as a
name and a path, not as a copy of (or a reference into) the host's data.
Views are read-only unless the principal holds ``write:NAME``, and then
change the object only through their mutators.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterator
from typing import Any

from kernos.agents import context
from kernos.errors import BoundaryError

__all__ = ["ATOMIC", "ObjectView", "check_bounded", "to_agent", "to_host"]

ATOMIC = frozenset({type(None), bool, int, float, str, bytes, decimal.Decimal,
                    datetime.datetime, datetime.date, datetime.time, datetime.timedelta})
MAX_ITEMS = 1_000_000
MAX_DEPTH = 64
_CONTAINERS = (list, tuple, dict, set, frozenset)


def _copy(value: Any, *, direction: str, budget: list[int], depth: int,
          views: bool) -> object:
    kind = type(value)
    if kind in ATOMIC:
        if kind is int and value.bit_length() > 100_000:
            raise BoundaryError(f"an int of {value.bit_length():,} bits cannot pass "
                                f"{direction}")
        return value
    if views and kind is ObjectView:
        return value
    if kind not in _CONTAINERS:
        raise BoundaryError(
            f"a {kind.__name__} cannot pass {direction}: only plain data can (None, bool, "
            "int, float, str, bytes, Decimal, datetime values, and lists, tuples, dicts and "
            "sets of them)")
    if depth >= MAX_DEPTH:
        raise BoundaryError(f"the value is nested over {MAX_DEPTH} levels deep to pass "
                            f"{direction}")
    items = value
    budget[0] -= len(items)
    if budget[0] < 0:
        raise BoundaryError(f"the value has over {MAX_ITEMS:,} items to pass {direction}")

    def copy(item: object) -> object:
        return _copy(item, direction=direction, budget=budget, depth=depth + 1, views=views)

    if kind is dict:
        result = {}
        for key, item in value.items():
            result[copy(key)] = copy(item)
        return result
    copied = [copy(item) for item in items]
    return kind(copied)


def to_host(value: object, *, views: bool = False) -> Any:
    """A copy of a value from agent code that host code may keep and compare safely."""
    return _copy(value, direction="from agent code to the host", budget=[MAX_ITEMS],
                 depth=0, views=views)


def check_bounded(roots: dict[str, object], *, what: str) -> None:
    """BoundaryError unless what agent code keeps in system state is bounded.

    ``roots`` are the values agent code is about to leave inside the runtime's
    own state (a tool's module names, a subscriber's defaults and closure).
    They are walked without recursion and without running agent code (only
    exact container types, plain ``__dict__``s, functions' defaults and
    closures), and refused if nested deeper than :data:`MAX_DEPTH` or holding
    over :data:`MAX_ITEMS` items: such state could not be stored reliably, and
    with it the principals, grants, tools and subscribers beside it.
    """
    import types

    seen: set[int] = set()
    stack: list[tuple[str, object, int]] = [(name, value, 0) for name, value in roots.items()]
    count = 0
    while stack:
        where, value, depth = stack.pop()
        kind = type(value)
        if kind in ATOMIC or id(value) in seen:
            continue
        seen.add(id(value))
        count += 1
        if depth > MAX_DEPTH:
            raise BoundaryError(f"{what}: {where} is nested over {MAX_DEPTH} levels deep; "
                                "state kept in the runtime must stay shallower")
        if count > MAX_ITEMS:
            raise BoundaryError(f"{what}: over {MAX_ITEMS:,} objects are kept; state kept in "
                                "the runtime must stay smaller")
        children: list[object] = []
        if isinstance(value, dict):
            for key, item in dict.items(value):
                children += (key, item)
        elif isinstance(value, (list, tuple, set, frozenset)):
            # The base class's iteration, never an override a subclass defined.
            base: Any = next(base for base in _CONTAINERS if isinstance(value, base))
            children = list(base.__iter__(value))
        elif kind is types.FunctionType:
            function: Any = value
            children = [*(function.__defaults__ or ()),
                        *(function.__kwdefaults__ or {}).values(),
                        *(_cell_contents(cell) for cell in function.__closure__ or ())]
        elif kind is types.MethodType:
            children = [value.__self__, value.__func__]  # type: ignore[attr-defined]
        elif isinstance(value, type):
            children = list(type.__getattribute__(value, "__dict__").values())
        if not isinstance(value, (dict, types.FunctionType, types.MethodType, type)):
            try:
                own = object.__getattribute__(value, "__dict__")
            except AttributeError:
                own = None
            if type(own) is dict:
                children.append(own)
        stack.extend((where, child, depth + 1) for child in children)


def _cell_contents(cell: Any) -> object:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def to_agent(value: object) -> Any:
    """A copy of a host value for agent code (plain data only)."""
    return _copy(value, direction="from the host to agent code", budget=[MAX_ITEMS], depth=0,
                 views=False)


class ObjectView:
    """A capability proxy on a name in the human namespace (or a part of it)."""

    __slots__ = ("_name", "_path")
    _agent_attributes = frozenset({
        "name", "path", "type", "get", "keys", "values", "items", "copy", "field",
        "set", "append", "extend", "pop", "update", "setfield", "length",
    })

    def __init__(self, name: str, path: tuple[tuple[str, object], ...] = ()) -> None:
        self._name = name
        self._path = path

    # -- reading ---------------------------------------------------------------

    def _resolve(self, *, write: bool = False) -> Any:
        ctx = context.current()
        return ctx.runtime.resolve_view(ctx, self._name, self._path, write=write)

    def _child(self, step: tuple[str, object]) -> object:
        value = self._resolve()
        try:
            inner = value[step[1]] if step[0] == "item" else _public_field(value, step[1])
        except (KeyError, IndexError, TypeError, AttributeError) as error:
            raise type(error)(*error.args) from None  # no host frames attached
        if type(inner) in ATOMIC:
            return inner
        return ObjectView(self._name, (*self._path, step))

    def __getitem__(self, key: object) -> object:
        return self._child(("item", to_host(key)))

    def get(self, key: object, default: object = None) -> object:
        try:
            return self[key]
        except (KeyError, IndexError):
            return default

    def field(self, attribute: Any) -> object:
        """A public data attribute of the object (not a method)."""
        if type(attribute) is not str or attribute.startswith("_"):
            raise AttributeError("field() takes the name of a public attribute")
        return self._child(("field", attribute))

    def __len__(self) -> int:
        return len(self._resolve())

    def length(self) -> int:
        return len(self)

    def __contains__(self, key: object) -> bool:
        return to_host(key) in self._resolve()

    def __iter__(self) -> Iterator[object]:
        value = self._resolve()
        if type(value) is dict:
            keys: list[object] = list(value)
            return iter([to_agent(key) for key in keys])
        if type(value) in (list, tuple):
            return iter([self[index] for index in range(len(value))])
        if type(value) in (set, frozenset):
            return iter([to_agent(item) for item in value])
        raise TypeError(f"a view of a {type(value).__name__} is not iterable")

    def keys(self) -> list[object]:
        value = self._resolve()
        if type(value) is not dict:
            raise TypeError(f"keys() needs a dict, not a {type(value).__name__}")
        return [to_agent(key) for key in value]

    def values(self) -> list[object]:
        return [self[key] for key in self.keys()]

    def items(self) -> list[tuple[object, object]]:
        return [(key, self[key]) for key in self.keys()]

    def copy(self) -> object:
        """The viewed value as plain data (a copy the agent owns)."""
        return to_agent(self._resolve())

    @property
    def name(self) -> str:
        return self._name

    @property
    def path(self) -> str:
        return self._name + "".join(f"[{step[1]!r}]" if step[0] == "item" else f".{step[1]}"
                                    for step in self._path)

    @property
    def type(self) -> str:
        return type(self._resolve()).__name__

    def __repr__(self) -> str:
        return f"<view of {self.path}>"

    def __bool__(self) -> bool:
        return bool(self._resolve())

    # -- granted mutators ----------------------------------------------------------

    def __setitem__(self, key: object, value: object) -> None:
        target = self._resolve(write=True)
        if type(target) not in (dict, list):
            raise TypeError(f"items of a {type(target).__name__} cannot be set")
        target[to_host(key)] = to_host(value)

    def set(self, key: object, value: object) -> None:
        self[key] = value

    def __delitem__(self, key: object) -> None:
        target = self._resolve(write=True)
        if type(target) not in (dict, list):
            raise TypeError(f"items of a {type(target).__name__} cannot be deleted")
        del target[to_host(key)]

    def append(self, value: object) -> None:
        target = self._resolve(write=True)
        if type(target) is not list:
            raise TypeError(f"append() needs a list, not a {type(target).__name__}")
        target.append(to_host(value))

    def extend(self, values: object) -> None:
        target = self._resolve(write=True)
        if type(target) is not list:
            raise TypeError(f"extend() needs a list, not a {type(target).__name__}")
        target.extend(to_host(values))

    def pop(self, key: object = -1) -> object:
        target = self._resolve(write=True)
        if type(target) not in (dict, list):
            raise TypeError(f"pop() needs a dict or list, not a {type(target).__name__}")
        return to_agent(target.pop(to_host(key)))

    def update(self, values: object) -> None:
        target = self._resolve(write=True)
        if type(target) is not dict:
            raise TypeError(f"update() needs a dict, not a {type(target).__name__}")
        target.update(to_host(values))

    def setfield(self, attribute: Any, value: object) -> None:
        target = self._resolve(write=True)
        _public_field(target, attribute)  # only an existing public data field
        setattr(target, attribute, to_host(value))

    def __reduce__(self) -> tuple[object, ...]:
        return (ObjectView, (self._name, self._path))


def _public_field(value: Any, attribute: Any) -> Any:
    """A public, non-callable attribute stored in the object's own ``__dict__``."""
    if type(attribute) is not str or attribute.startswith("_"):
        raise AttributeError("only public attributes")
    fields = getattr(value, "__dict__", None)
    if type(fields) is not dict or attribute not in fields or callable(fields[attribute]):
        raise AttributeError(f"a {type(value).__name__} has no public data field "
                             f"{attribute!r}")
    return fields[attribute]
