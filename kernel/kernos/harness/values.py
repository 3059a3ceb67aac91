"""Values leaving the image for a harness: a bounded repr, and JSON when it is plain data.

Both are computed without trusting the value: the JSON form is built by an
allowlist walk over exact builtin types (a ``dict`` subclass or an object
that pretends to be a list is not JSON here), bounded in depth, items and
size; the repr is bounded and survives a ``__repr__`` that raises.
"""

from __future__ import annotations

import json
import math
from typing import Any

from kernos.harness.results import Value
from kernos.serialize.summary import InstanceRepr, type_name

__all__ = ["DEFAULT_PREVIEW_BYTES", "safe_repr", "to_json_value", "value_of"]

DEFAULT_PREVIEW_BYTES = 2_000
MAX_DEPTH = 32
MAX_ITEMS = 10_000
_NOT_JSON = object()


class _Repr(InstanceRepr):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.maxlevel = 4
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = 30
        self.maxfrozenset = self.maxdeque = self.maxarray = 30
        self.maxstring = self.maxother = self.maxlong = max(40, size)


def safe_repr(value: object, limit: int = DEFAULT_PREVIEW_BYTES) -> str:
    """A repr of at most ``limit`` characters that never raises."""
    try:
        text = _Repr(limit).repr(value)
    except Exception as error:  # a broken __repr__ must not break the reply
        text = f"<{type_name(value)}: repr failed with {type(error).__name__}>"
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def to_json_value(value: object, limit: int = DEFAULT_PREVIEW_BYTES) -> object:
    """``value`` as JSON data if it is plain data within the bounds, else ``_NOT_JSON``."""
    budget = [MAX_ITEMS]
    converted = _walk(value, 0, budget)
    if converted is _NOT_JSON:
        return _NOT_JSON
    if len(json.dumps(converted, ensure_ascii=False)) > limit:
        return _NOT_JSON
    return converted


def _walk(value: object, depth: int, budget: list[int]) -> object:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        return _NOT_JSON
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if abs(value) < 2 ** 63 else _NOT_JSON  # type: ignore[arg-type]
    if kind is float:
        return value if math.isfinite(value) else _NOT_JSON  # type: ignore[arg-type]
    if kind is list or kind is tuple:
        items = []
        for item in value:  # type: ignore[attr-defined]
            converted = _walk(item, depth + 1, budget)
            if converted is _NOT_JSON:
                return _NOT_JSON
            items.append(converted)
        return items
    if kind is dict:
        out: dict[str, Any] = {}
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                return _NOT_JSON
            converted = _walk(item, depth + 1, budget)
            if converted is _NOT_JSON:
                return _NOT_JSON
            out[key] = converted
        return out
    return _NOT_JSON


def value_of(value: object, limit: int = DEFAULT_PREVIEW_BYTES) -> Value:
    """The :class:`Value` a reply carries for ``value``."""
    converted = to_json_value(value, limit)
    if converted is _NOT_JSON:
        return Value(repr=safe_repr(value, limit))
    return Value(repr=safe_repr(value, limit), json=converted, has_json=True)
