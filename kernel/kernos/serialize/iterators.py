"""Iterators and views that pickle as another type, kept as their own type.

Several builtin iterators reduce to ``iter(list_of_what_is_left)``, so that a
restore silently changed their type: a dict's key iterator came back as a
``list_iterator``, a stale ``itertools.groupby`` group as a
``tuple_iterator``, an exhausted ``bytes`` iterator as a ``tuple_iterator``.
Here each such type (registered by exact type in ``kinds.SPECIAL``, so other
objects pay nothing) comes back as the same type yielding the same remaining
items:

* dict, set and OrderedDict iterators iterate a fresh container that holds
  what is left.  Their link to the original container cannot be kept: a
  position inside a live dict cannot be set again, and the dict may still be
  half built while a load runs (a dict that holds its own iterator).  So the
  restored iterator no longer notices later changes to that dict.  A set's
  remaining items may come in another order (a new table hashes them anew,
  as any set rebuilt after a restart does).
* Exhausted iterators (of str, bytes, bytearray, array, reversed lists,
  ``iter(callable, sentinel)``, ``iter(sequence)``) and stale groupby groups
  come back exhausted, of the same type: nothing was left to keep.
* ``itertools.pairwise`` cannot pickle at all; it is rebuilt from what it
  holds (the underlying iterator and the last item seen).
* Dict views (``d.keys()``, ``od.items()``, ...) come back as views of the
  restored dict itself: the link is kept, since a view only names its dict.

Python 3.12 deprecates pickling the ``itertools`` objects and 3.14 removes it:
there, ``groupby``, ``tee``, ``islice`` and the others become unpersistable
(reported, like any other value that cannot persist) unless reducers are
added for them here.
"""

from __future__ import annotations

import collections
import gc
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from kernos.serialize import rebuild

__all__ = ["ITERATOR_REDUCERS"]


def _remaining(iterator: Any) -> list[Any]:
    """What ``iterator`` has left, without consuming it (its reduce copies it)."""
    reduced = iterator.__reduce__()
    return list(reduced[1][0])


def _container_iterator(kind: str) -> Callable[[Any, Any], Any]:
    def reduce(pickler: Any, iterator: Any) -> Any:
        return (rebuild.container_iterator, (kind, _remaining(iterator)))
    return reduce


def _reduce_exhaustible(pickler: Any, iterator: Any) -> Any:
    """As the type's own reduce, unless that would rebuild an exhausted one as another type."""
    reduced = iterator.__reduce__()
    if len(reduced) == 2 and reduced[0] is iter and len(reduced[1]) == 1:
        return (rebuild.exhausted_iterator, (type(iterator).__name__,))
    return reduced


def _reduce_pairwise(pickler: Any, pairs: Any) -> Any:
    # What it holds, in the order its traverse visits them: the iterator, then the
    # last item seen (once started); neither once exhausted.
    held = gc.get_referents(pairs)[:2]
    if held and not isinstance(held[0], Iterator):
        held = []  # 3.12+ also keeps a result tuple, which may outlive the iterator
    return (rebuild.pairwise, (len(held) > 0, len(held) > 1, *held))


def _view(kind: str) -> Callable[[Any, Any], Any]:
    def reduce(pickler: Any, view: Any) -> Any:
        [mapping] = gc.get_referents(view)
        return (rebuild.dict_view, (kind, mapping))
    return reduce


def _reducers() -> dict[type, Callable[[Any, Any], Any]]:
    empty: dict[Any, Any] = {}
    ordered: collections.OrderedDict[Any, Any] = collections.OrderedDict()
    reducers: dict[type, Callable[[Any, Any], Any]] = {
        type(iter(empty)): _container_iterator("keys"),
        type(iter(empty.values())): _container_iterator("values"),
        type(iter(empty.items())): _container_iterator("items"),
        type(reversed(empty)): _container_iterator("reversed keys"),
        type(reversed(empty.values())): _container_iterator("reversed values"),
        type(reversed(empty.items())): _container_iterator("reversed items"),
        type(iter(set())): _container_iterator("set"),
        # Keys, values, items and their reverses are all one type: rebuilt as values,
        # which yields exactly what is left whatever the kind was.
        type(iter(ordered)): _container_iterator("ordered"),
        type(empty.keys()): _view("keys"),
        type(empty.values()): _view("values"),
        type(empty.items()): _view("items"),
        type(ordered.keys()): _view("ordered keys"),
        type(ordered.values()): _view("ordered values"),
        type(ordered.items()): _view("ordered items"),
        itertools.pairwise: _reduce_pairwise,
    }
    for kind in rebuild.EXHAUSTED:
        reducers[type(rebuild.exhausted_iterator(kind))] = _reduce_exhaustible
    return reducers


ITERATOR_REDUCERS = _reducers()
