"""Whether an op that only read a value can have changed it: the type half of the answer.

The analysis (``kernos.analysis.Read``) finds the names an op's code only
reads, through chains of attribute reads, subscripts and a few method calls,
each ending in a sink that keeps no reference (a comparison with a constant,
``print``, ``len``, an f-string, ...) or bound to a name when the last call
gives a fresh value (``head = arr[:10].copy()``, ``total = df.sum()``).
Whether such a chain changes nothing depends on the type it runs on: ``x[0]``
on a dict is a lookup, on a user's class it is any code at all.
:func:`unchanged_by` answers for the value the name holds at commit (the same
object it held before the op: the image checks identity first), and only for
types whose every step is known:

* immutable builtins (``int``, ``float``, ``str``, ...): nothing changes them,
  whatever the code did;
* a numpy array of a numeric dtype (no objects, no structured fields), and a
  pandas ``DataFrame`` or ``Series`` whose columns all have such dtypes: every
  attribute, subscript and method the analysis allows returns a new value or
  a view, and the sinks read it;
* an exact ``dict``, ``list`` or ``tuple`` read through constant subscripts (never
  a method: ``d.copy()`` would share the values it holds):
  the chain is followed now, and each container on the way must be an exact
  builtin container and the value it ends on plain data (builtin containers
  and immutable builtins, at most :data:`PLAIN_BUDGET` objects); ``len`` of
  the container itself needs nothing more.

A sink that calls a builtin by name holds only while that name is the
builtin: a namespace that binds ``print`` (or a patched ``builtins``)
disqualifies it.  Anything else answers "may have changed", and the image
checks the value as before (re-pickling or re-hashing it), which is always
correct.  The same known limit as for the reach applies: an object reachable
from outside the namespace can change without the op naming it.

So a cell such as ``print(arr.shape, d['k5']['v'], df.iat[3, 1])`` costs no
re-hash of a 200 MB array, no re-pickle of a 100,000-entry dict and no hash
of a million-row frame, before or after a restart.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from kernos.analysis import NONCONSTANT, SINK_CALLS, Read

__all__ = ["PLAIN_BUDGET", "numeric_array", "unchanged_by"]

PLAIN_BUDGET = 10_000
"""The most objects a chain's end value may hold to be checked as plain data."""

IMMUTABLE = frozenset({int, float, complex, str, bytes, bool, type(None), range})
_CONTAINERS = (dict, list, tuple)
_NUMERIC_KINDS = frozenset("biufcmM")
_BUILTINS = {name: getattr(builtins, name) for name in SINK_CALLS}


def unchanged_by(value: object, reads: Iterable[Read], namespace: Mapping[str, object]) -> bool:
    """Whether ``reads`` (all that an op's code did with a name) cannot have changed ``value``."""
    kind = type(value)
    if kind in IMMUTABLE:
        return True
    reads = tuple(reads)
    for read in reads:
        if read.sink.startswith("call:"):
            function = read.sink[5:]
            if function in namespace or getattr(builtins, function, None) is not _BUILTINS.get(
                    function):
                return False
    if _numeric(value):
        return True
    if kind in _CONTAINERS:
        return all(_plain_read(value, read) for read in reads)
    return False


def numeric_array(value: object) -> bool:
    """Whether ``value`` is an exact numpy array of a numeric dtype (no objects, no fields)."""
    numpy = sys.modules.get("numpy")
    return (numpy is not None and type(value) is numpy.ndarray
            and _numeric_dtype(value.dtype, numpy))  # type: ignore[attr-defined]


def _numeric(value: object) -> bool:
    if numeric_array(value):
        return True
    kind = type(value)
    numpy = sys.modules.get("numpy")
    pandas = sys.modules.get("pandas")
    if pandas is None or numpy is None:
        return False
    if kind is pandas.Series:
        return _numeric_dtype(value.dtype, numpy)  # type: ignore[attr-defined]
    if kind is pandas.DataFrame:
        return all(_numeric_dtype(dtype, numpy)
                   for dtype in value.dtypes)  # type: ignore[attr-defined]
    return False


def _numeric_dtype(dtype: Any, numpy: Any) -> bool:
    return (isinstance(dtype, numpy.dtype) and dtype.kind in _NUMERIC_KINDS
            and not dtype.hasobject and dtype.names is None)


def _plain_read(value: object, read: Read) -> bool:
    if not read.steps:
        return read.sink == "call:len"  # len(d): anything else would read every entry
    current = value
    for step, key in read.steps:
        if step != "item" or key is NONCONSTANT or type(current) not in _CONTAINERS:
            return False
        try:
            current = current[key]  # type: ignore[index]
        except (LookupError, TypeError):
            return False
    return _plain(current)


def _plain(value: object) -> bool:
    """Builtin containers and immutable builtins only, at most PLAIN_BUDGET objects."""
    stack = [value]
    budget = PLAIN_BUDGET
    while stack:
        budget -= 1
        if budget < 0:
            return False
        item = stack.pop()
        kind = type(item)
        if kind in IMMUTABLE:
            continue
        if isinstance(item, dict) and kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple) and (kind is list or kind is tuple):
            stack.extend(item)
        else:
            return False
    return True
