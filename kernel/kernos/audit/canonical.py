"""The canonical encoding that the audit chain hashes.

A record is plain JSON data: ``dict`` with ``str`` keys, ``list``, ``str``,
``int``, finite ``float``, ``bool`` and ``None``, checked by exact type (no
subclasses, no tuples, no NaN).  Its canonical form is UTF-8 JSON with keys
sorted, no whitespace, and non-ASCII characters escaped, so that two
processes, two Python versions or two machines produce the same bytes for the
same record.  A record's hash is SHA-256 over that form; ``repr`` is never
used.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from kernos.errors import EventError

__all__ = ["MAX_DEPTH", "canonical", "check_json", "digest"]

MAX_DEPTH = 32
"""How deeply JSON data may nest."""


def canonical(value: Any) -> bytes:
    """The canonical bytes of already-checked JSON data."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_json(value: object, *, what: str = "payload", max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`EventError` naming the first part of ``value`` that is not plain JSON."""
    _check(value, what, 0, max_depth)


def _check(value: object, path: str, depth: int, max_depth: int) -> None:
    kind = type(value)
    if kind in (str, bool, type(None)):
        return
    if kind is int:
        return
    if kind is float:
        assert isinstance(value, float)
        if not math.isfinite(value):
            raise EventError(f"{path} is {value}, which JSON cannot hold; use a finite number "
                             "or null")
        return
    if depth >= max_depth:
        raise EventError(f"{path} nests deeper than {max_depth} levels; flatten it")
    if kind is list:
        assert isinstance(value, list)
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]", depth + 1, max_depth)
        return
    if kind is dict:
        assert isinstance(value, dict)
        for key, item in value.items():
            if type(key) is not str:
                raise EventError(f"{path} has the key {_shown(key)} of type "
                                 f"{type(key).__name__}; JSON object keys are strings")
            _check(item, f"{path}[{key[:40]!r}]", depth + 1, max_depth)
        return
    hint = " (use a list)" if kind in (tuple, set, frozenset) else ""
    article = "an" if kind.__name__[:1].lower() in "aeiou" else "a"
    raise EventError(f"{path} is {article} {kind.__name__}, which is not JSON{hint}. A payload "
                     "holds only dicts with str keys, lists, str, int, finite float, bool and "
                     "None.")


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        text = "?"
    return text[:40]
