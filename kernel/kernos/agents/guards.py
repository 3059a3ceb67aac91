"""The guards RestrictedPython routes agent code through, and the agent builtins.

Everything here is an allowlist:

* attribute reads (``_getattr_``) are allowed per *exact* type from
  :data:`ATTRIBUTES`; an instance of an agent-defined class exposes its own
  fields and the methods its agent classes define; a module is reachable only
  as a :class:`ModuleView` with its own short list (so ``datetime.sys``,
  ``re.enum`` or ``json.codecs`` do not exist);
* item reads and iteration are allowed on plain data, views and agent
  generators;
* writes (``_write_``) are allowed on the agent's own lists, dicts, sets and
  instances of its own classes, and on views (whose mutators check
  ``write:NAME`` grants);
* :data:`AGENT_BUILTINS` is built from scratch: no ``type``, ``object``,
  ``getattr`` of the host, ``open``, ``__import__``, ``BaseException`` or any
  exception outside :data:`EXCEPTIONS`.

``str.format`` and ``format_map`` are not allowed (they walk attributes
named in the string), nor is ``format``.  The functions that take agent
strings (``read``, ``call``, ``spend``...) check their types exactly.
"""

from __future__ import annotations

import builtins
import datetime
import decimal
import json
import math
import operator
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

from RestrictedPython.Guards import guarded_iter_unpack_sequence, guarded_unpack_sequence

from kernos.agents import context
from kernos.agents.boundary import ObjectView
from kernos.agents.context import BoundedOutput
from kernos.errors import BoundaryError, CapabilityDenied

__all__ = ["AGENT_BUILTINS", "EXCEPTIONS", "ModuleView", "is_agent_class"]

_MISSING = object()
MAX_SEQUENCE = 10_000_000
MAX_INT_BITS = 1_000_000

_STR = frozenset({
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find",
    "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier",
    "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust",
    "lower", "lstrip", "partition", "removeprefix", "removesuffix", "replace", "rfind",
    "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith",
    "strip", "swapcase", "title", "upper", "zfill",
})
_BYTES = frozenset({
    "count", "decode", "endswith", "find", "hex", "index", "isalnum", "isalpha", "isdigit",
    "join", "lower", "lstrip", "replace", "rstrip", "split", "startswith", "strip", "upper",
})
_NUMBER = frozenset({"real", "imag", "conjugate"})
_INT = _NUMBER | {"bit_length", "bit_count", "numerator", "denominator", "to_bytes"}
_FLOAT = _NUMBER | {"is_integer", "as_integer_ratio", "hex"}
_DECIMAL = frozenset({
    "adjusted", "as_integer_ratio", "as_tuple", "compare", "copy_abs", "copy_negate",
    "exp", "is_finite", "is_infinite", "is_nan", "is_signed", "is_zero", "ln", "log10",
    "max", "min", "normalize", "quantize", "sqrt", "to_integral_value",
})
_LIST = frozenset({"append", "clear", "copy", "count", "extend", "index", "insert", "pop",
                   "remove", "reverse", "sort"})
_DICT = frozenset({"clear", "copy", "get", "items", "keys", "pop", "popitem", "setdefault",
                   "update", "values"})
_SET_READ = frozenset({"copy", "difference", "intersection", "isdisjoint", "issubset",
                       "issuperset", "symmetric_difference", "union"})
_SET = _SET_READ | {"add", "clear", "discard", "pop", "remove", "update",
                    "difference_update", "intersection_update"}
_DATE = frozenset({"year", "month", "day", "weekday", "isoweekday", "isoformat",
                   "toordinal", "replace", "strftime", "isocalendar"})
_TIME = frozenset({"hour", "minute", "second", "microsecond", "isoformat", "replace",
                   "strftime"})
_DATETIME = _DATE | _TIME | {"date", "time", "timestamp"}
_TIMEDELTA = frozenset({"days", "seconds", "microseconds", "total_seconds"})
_PATTERN = frozenset({"search", "match", "fullmatch", "findall", "finditer", "split", "sub",
                      "subn", "pattern", "flags", "groups"})
_MATCH = frozenset({"group", "groups", "groupdict", "start", "end", "span", "string"})

ATTRIBUTES: dict[type, frozenset[str]] = {
    str: _STR, bytes: _BYTES, int: _INT, bool: _INT, float: _FLOAT, decimal.Decimal: _DECIMAL,
    list: _LIST, dict: _DICT, set: _SET, frozenset: _SET_READ,
    tuple: frozenset({"count", "index"}), range: frozenset({"start", "stop", "step"}),
    datetime.date: _DATE, datetime.time: _TIME, datetime.datetime: _DATETIME,
    datetime.timedelta: _TIMEDELTA, re.Pattern: _PATTERN, re.Match: _MATCH,
    slice: frozenset({"start", "stop", "step"}),
}
"""The attributes agent code may read, by exact type of the object."""

CLASS_ATTRIBUTES: dict[type, frozenset[str]] = {
    datetime.datetime: frozenset({"fromisoformat", "fromtimestamp", "combine",
                                  "strptime"}),
    datetime.date: frozenset({"fromisoformat", "fromordinal"}),
    decimal.Decimal: frozenset(),
}
"""The attributes agent code may read on (allowlisted) classes themselves."""

EXCEPTIONS: dict[str, type[BaseException]] = {
    cls.__name__: cls for cls in (
        Exception, ArithmeticError, AssertionError, AttributeError, IndexError, KeyError,
        LookupError, NotImplementedError, OverflowError, RuntimeError, StopIteration,
        TypeError, ValueError, ZeroDivisionError, BoundaryError, CapabilityDenied,
        FileNotFoundError,
    )
}
"""Exceptions agent code may raise and catch (all are ``Exception`` subclasses)."""
_EXCEPTION_ATTRIBUTES = frozenset({"args"})

_ITERABLE = frozenset({
    str, bytes, list, tuple, dict, set, frozenset, range, types.GeneratorType,
    type({}.keys()), type({}.values()), type({}.items()), enumerate, zip, map, filter,
    reversed, type(iter([])), type(iter(())), type(iter("")), type(iter(range(0))),
    type(iter({})), type(iter(set())), ObjectView, re.Match,
})
_MUTABLE = frozenset({list, dict, set, bytearray})
_SEQUENCES = (str, bytes, list, tuple)


class ModuleView:
    """An allowlisted slice of a module (``json.loads`` yes, ``json.codecs`` no)."""

    __slots__ = ("_members", "_name")

    def __init__(self, name: str, members: dict[str, object]) -> None:
        self._name = name
        self._members = members

    def __repr__(self) -> str:
        return f"<module view {self._name}: {', '.join(sorted(self._members))}>"

    def __reduce__(self) -> tuple[object, ...]:
        return (_module_view, (self._name,))


def is_agent_class(cls: object) -> bool:
    return isinstance(cls, type) and "__kernos_owner__" in vars(cls)


def _agent_class_of(obj: object) -> type | None:
    cls = type(obj)
    return cls if any(is_agent_class(base) for base in cls.__mro__) else None


def guarded_getattr(obj: object, name: object, default: object = _MISSING) -> object:
    """``obj.name`` for agent code: allowed only from the allowlists."""
    if type(name) is not str or name.startswith("_"):
        raise AttributeError("attribute names must be plain strings not starting with '_'")
    assert isinstance(name, str)
    kind = type(obj)
    allowed: bool
    if kind is ModuleView:
        members = obj._members  # type: ignore[attr-defined]
        if name in members:
            return members[name]
        allowed = False
    elif kind is ObjectView:
        allowed = name in ObjectView._agent_attributes
    elif kind in ATTRIBUTES:
        allowed = name in ATTRIBUTES[kind]
    elif isinstance(obj, type) and obj in CLASS_ATTRIBUTES:
        allowed = name in CLASS_ATTRIBUTES[obj]
    elif is_agent_class(obj):
        allowed = _defined_by_agent_class(obj, name)  # type: ignore[arg-type]
    elif _agent_class_of(obj) is not None:
        allowed = (name in getattr(obj, "__dict__", {})
                   or _defined_by_agent_class(kind, name)
                   or (isinstance(obj, BaseException) and name in _EXCEPTION_ATTRIBUTES))
    elif isinstance(obj, BaseException) and kind in EXCEPTIONS.values():
        allowed = name in _EXCEPTION_ATTRIBUTES
    else:
        allowed = False
    if not allowed:
        if default is not _MISSING:
            return default
        raise AttributeError(f"agent code cannot read {kind.__name__}.{name}")
    return getattr(obj, name)


def _defined_by_agent_class(cls: type, name: str) -> bool:
    for base in cls.__mro__:
        if name in vars(base):
            return is_agent_class(base)
    return False


def guarded_hasattr(obj: object, name: object) -> bool:
    try:
        guarded_getattr(obj, name)
    except (AttributeError, TypeError):
        return False
    return True


def guarded_getitem(obj: object, key: object) -> object:
    kind = type(obj)
    if kind in (list, tuple, str, bytes, dict, range, ObjectView, re.Match) or (
            _agent_class_of(obj) is None and kind in (set, frozenset)):
        return obj[key]  # type: ignore[index]
    raise TypeError(f"agent code cannot index a {kind.__name__}")


def guarded_getiter(obj: object) -> Iterator[object]:
    if type(obj) in _ITERABLE:
        return iter(obj)  # type: ignore[call-overload,no-any-return]
    raise TypeError(f"agent code cannot iterate over a {type(obj).__name__}")


def guarded_write(obj: object) -> object:
    """The object agent code may assign into: its own containers and instances, or a view."""
    kind = type(obj)
    if kind in _MUTABLE or kind is ObjectView:
        return obj
    owner_class = _agent_class_of(obj)
    if owner_class is not None and not isinstance(obj, type):
        ctx = context.current()
        owners = {vars(base)["__kernos_owner__"] for base in owner_class.__mro__
                  if is_agent_class(base)}
        if ctx.principal in owners or ctx.depth > 0:
            return obj
    raise TypeError(f"agent code cannot change a {kind.__name__}")


def _check_size(symbol: str, left: Any, right: Any) -> None:
    if symbol == "**" and type(left) in (int, bool) and type(right) in (int, bool):
        base, exponent = abs(left), right
        if base > 1 and exponent > 0 and base.bit_length() * exponent > MAX_INT_BITS:
            raise OverflowError(f"{symbol}: the result would have over {MAX_INT_BITS:,} bits")
    elif symbol == "<<" and type(left) in (int, bool) and type(right) in (int, bool):
        if left and right > MAX_INT_BITS:
            raise OverflowError(f"<<: the result would have over {MAX_INT_BITS:,} bits")
    elif symbol == "*":
        for sequence, count in ((left, right), (right, left)):
            if (isinstance(sequence, _SEQUENCES) and type(count) in (int, bool)
                    and len(sequence) * count > MAX_SEQUENCE):
                raise OverflowError(f"*: the result would have over {MAX_SEQUENCE:,} items")
        if type(left) is int and type(right) is int and (
                left.bit_length() + right.bit_length() > MAX_INT_BITS):
            raise OverflowError(f"*: the result would have over {MAX_INT_BITS:,} bits")


_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "**": operator.pow, "*": operator.mul, "<<": operator.lshift,
}
_INPLACE: dict[str, Callable[[Any, Any], Any]] = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow,
    "<<=": operator.ilshift, ">>=": operator.irshift, "&=": operator.iand,
    "|=": operator.ior, "^=": operator.ixor, "@=": operator.imatmul,
}


def guarded_binop(symbol: str, left: object, right: object) -> object:
    _check_size(symbol, left, right)
    return _OPERATORS[symbol](left, right)


def guarded_inplacevar(symbol: str, left: object, right: object) -> object:
    _check_size(symbol[:-1], left, right)
    if (symbol == "+=" and isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES)
            and len(left) + len(right) > MAX_SEQUENCE):
        raise OverflowError(f"+=: the result would have over {MAX_SEQUENCE:,} items")
    return _INPLACE[symbol](left, right)


def guarded_apply(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


def guarded_pow(base: object, exponent: object, modulo: object = None) -> object:
    if modulo is None:
        _check_size("**", base, exponent)
        return pow(base, exponent)  # type: ignore[call-overload]
    return pow(base, exponent, modulo)  # type: ignore[call-overload]


class _Printer:
    """RestrictedPython's print target: bounded, into the running op's output."""

    def __init__(self, _getattr_: object = None) -> None:
        self.kept = BoundedOutput(4096)  # for RestrictedPython's ``printed``

    def write(self, text: str) -> None:
        self.kept.write(text)
        context.current().output.write(text)

    def __call__(self) -> str:
        return self.kept.text()

    def _call_print(self, *objects: object, sep: object = " ", end: object = "\n",
                    **ignored: object) -> None:
        if ignored:
            raise TypeError("print() in agent code takes only sep= and end=")
        if (sep is not None and type(sep) is not str) or (
                end is not None and type(end) is not str):
            raise TypeError("sep and end must be strings")
        self.write((" " if sep is None else str(sep)).join(map(str, objects))
                   + ("\n" if end is None else str(end)))


def agent_class(name: str, bases: tuple[type, ...], namespace: dict[str, object]) -> type:
    """The metaclass of every class agent code defines."""
    ctx = context.current()
    allowed_bases = set(EXCEPTIONS.values()) | {object}
    for base in bases:
        if base not in allowed_bases and not is_agent_class(base):
            raise TypeError(f"agent classes can derive only from agent classes and the "
                            f"allowed exceptions, not {getattr(base, '__name__', base)!r}")
    for key in namespace:
        if key.startswith("__") and key not in ("__module__", "__qualname__", "__init__",
                                                "__doc__"):
            raise TypeError(f"agent classes cannot define {key!r}")
    namespace["__kernos_owner__"] = ctx.principal
    return type(name, bases, namespace)


_C_IMPORTS = frozenset({"time", "_strptime"})


def _internal_import(name: str, *args: object, **kwargs: object) -> types.ModuleType:
    """For C code only (``strftime`` imports ``time`` through the caller's builtins).

    Agent code cannot name it (it starts with ``_``); it imports only what
    datetime's C code needs.
    """
    if name not in _C_IMPORTS:
        raise ImportError(f"agent code cannot import {name!r}")
    return builtins.__import__(name, *args, **kwargs)  # type: ignore[arg-type]


def _module_view(name: str) -> ModuleView:
    return MODULES[name]


MODULES: dict[str, ModuleView] = {
    "math": ModuleView("math", {name: getattr(math, name) for name in (
        "ceil", "floor", "trunc", "sqrt", "exp", "log", "log2", "log10", "sin", "cos",
        "tan", "atan2", "hypot", "fabs", "isclose", "isfinite", "isnan", "isinf", "gcd",
        "comb", "perm", "fsum", "prod", "pi", "e", "inf", "nan", "tau", "factorial")}),
    "json": ModuleView("json", {"loads": json.loads, "dumps": json.dumps}),
    "re": ModuleView("re", {name: getattr(re, name) for name in (
        "compile", "search", "match", "fullmatch", "findall", "finditer", "split", "sub",
        "subn", "escape", "IGNORECASE", "MULTILINE", "DOTALL", "VERBOSE", "ASCII")}),
    "datetime": ModuleView("datetime", {"datetime": datetime.datetime, "date": datetime.date,
                                        "time": datetime.time,
                                        "timedelta": datetime.timedelta}),
    "decimal": ModuleView("decimal", {"Decimal": decimal.Decimal}),
}


def _build_builtins() -> dict[str, object]:
    builtins_: dict[str, object] = {
        "None": None, "True": True, "False": False,
        "abs": abs, "all": all, "any": any, "bool": bool, "chr": chr, "dict": dict,
        "divmod": divmod, "enumerate": enumerate, "filter": filter, "float": float,
        "frozenset": frozenset, "int": int, "isinstance": isinstance, "len": len,
        "list": list, "map": map, "max": max, "min": min, "next": next, "ord": ord,
        "range": range, "repr": repr, "reversed": reversed, "round": round, "set": set,
        "slice": slice, "sorted": sorted, "str": str, "sum": sum, "tuple": tuple, "zip": zip,
        "callable": callable, "Decimal": decimal.Decimal,
        "pow": guarded_pow, "getattr": guarded_getattr, "hasattr": guarded_hasattr,
        "iter": guarded_getiter,
        "_getattr_": guarded_getattr, "_getitem_": guarded_getitem,
        "_getiter_": guarded_getiter, "_write_": guarded_write,
        "_inplacevar_": guarded_inplacevar, "_binop_": guarded_binop,
        "_apply_": guarded_apply, "_print_": _Printer,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "__metaclass__": agent_class, "__build_class__": builtins.__build_class__,
        "__import__": _internal_import,
        **EXCEPTIONS, **MODULES,
    }
    return builtins_


AGENT_BUILTINS: dict[str, object] = _build_builtins()
"""Filled in further by ``kernos.agents.api`` with the Kernos calls (read, call, ...)."""
