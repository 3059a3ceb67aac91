"""One-line descriptions of values, for history, diff and status.

A summary must be cheap and must never fail: it is computed for every
changed name at every commit.  Arrays and frames are described by shape and
dtype without calling their (possibly slow) ``repr``; containers by length;
an instance of a class that keeps ``object``'s repr (which says only its
address, the same before and after a change) by its attributes, as a
dataclass prints itself (``Account(balance=70)``: a diff can show which one
changed); everything else by a truncated ``repr`` guarded against exceptions.
"""

from __future__ import annotations

import itertools
import reprlib

__all__ = ["InstanceRepr", "describe", "type_name"]

_MAX = 80
_ATTRIBUTES = 6
"""How many attributes an instance's summary shows."""
_BRACKETS = {dict: ("{", "}"), list: ("[", "]"), set: ("{", "}"), tuple: ("(", ")"),
             frozenset: ("{", "}")}
class InstanceRepr(reprlib.Repr):
    """reprlib, but an instance whose class keeps Python's default repr inside a container
    reads as ``Account(balance=70)``, not ``<__main__.Account object at 0x...>`` (whose
    address differs at every restore)."""

    def repr_instance(self, x: object, level: int) -> str:
        attributes = getattr(x, "__dict__", None)
        if type(x).__repr__ is object.__repr__ and isinstance(attributes, dict):
            text = _instance(type(x), attributes)
            return text if len(text) <= self.maxother else text[:self.maxother - 3] + "..."
        return super().repr_instance(x, level)


_repr = InstanceRepr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxdict = 6
_repr.maxlevel = 2


def type_name(value: object) -> str:
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    name = getattr(kind, "__qualname__", kind.__name__)
    return name if module in ("builtins", "__main__") else f"{module}.{name}"


def describe(value: object) -> str:
    """A bounded, exception-safe one-line summary of ``value``."""
    try:
        text = _describe(value)
    except Exception as error:  # a broken __repr__ must not break a commit
        text = f"<{type_name(value)}: repr failed with {type(error).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= _MAX else text[: _MAX - 3] + "..."


def _describe(value: object) -> str:
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    if module.startswith("pandas"):
        shape = getattr(value, "shape", None)
        if shape is not None:
            dims = "x".join(str(n) for n in shape)
            return f"{kind.__name__} {dims}"
    if module.startswith("numpy") and hasattr(value, "shape") and hasattr(value, "dtype"):
        dims = "x".join(str(n) for n in value.shape) or "scalar"
        if getattr(value, "size", 2) == 1:
            return f"{value.dtype} {value!r}"
        return f"ndarray {value.dtype}[{dims}]"
    if kind in (dict, list, set, tuple, frozenset) and len(value) > 6:  # type: ignore[arg-type]
        # reprlib sorts a dict's keys (and sets) before cutting: O(n log n) on a
        # 100k-entry dict at every commit.  Take the first few items instead.
        if kind is dict:
            head = ", ".join(f"{_repr.repr(k)}: {_repr.repr(v)}"
                             for k, v in itertools.islice(value.items(), 3))  # type: ignore[attr-defined]
        else:
            head = ", ".join(_repr.repr(item) for item in itertools.islice(value, 3))  # type: ignore[call-overload]
        opening, closing = _BRACKETS[kind]
        return f"{kind.__name__} of {len(value)}: {opening}{head}, ...{closing}"  # type: ignore[arg-type]
    if callable(value) and hasattr(value, "__qualname__"):
        kind_word = "class" if isinstance(value, type) else "function"
        return f"{kind_word} {value.__qualname__}"
    if kind.__repr__ is object.__repr__:
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            return _instance(kind, attributes)
    return _repr.repr(value)


def _instance(kind: type, attributes: dict[str, object]) -> str:
    """``Account(balance=70, owner='ann')``: the public attributes (all, if none is),
    the first few, each bounded; an attribute that is itself such an instance by its
    type alone (its address would differ at every restore)."""
    named = [(key, item) for key, item in attributes.items() if isinstance(key, str)]
    shown = [(key, item) for key, item in named if not key.startswith("_")] or named
    parts = []
    for key, item in shown[:_ATTRIBUTES]:
        if type(item).__repr__ is object.__repr__:
            text = f"<{type_name(item)}>"
        else:
            text = " ".join(_describe(item).split())
            text = text if len(text) <= 30 else text[:27] + "..."
        parts.append(f"{key}={text}")
    more = ", ..." if len(shown) > _ATTRIBUTES else ""
    return f"{kind.__qualname__}({', '.join(parts)}{more})"
