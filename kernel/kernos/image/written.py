"""Where an op can have written a big array: the pieces of its buffer to read again.

An op that writes a few elements of a 200 MB array (``arr[123] = -1.0``)
changes one 1 MiB piece of its buffer, but finding out which by hashing reads
all 200 MB.  When the analysis (``kernos.analysis.Use``) says that the op's
code used the name only through constant integer subscripts, the pieces
holding those elements are the only ones that can differ from the last
commit, and a commit reads only them (``SnapshotWriter.part``'s ``known``).

It holds only where nothing else can reach the array's memory:

* the value is an exact one-dimensional numpy array of a numeric dtype,
  C-contiguous: ``arr[k]`` is then a scalar copy, never a view through which
  code could reach the rest (a row of a 2-D array could; a structured or
  object array's item could too), and a key is one element;
* the keys are plain ints (a bool is a mask, a tuple can be ``()``, which is
  the whole array), and each is inside the array;
* the name is alone in its group, at the last commit and now, with one
  buffer, which is the array's own memory, as long as it was: no other
  persisted name shares that memory, and the array was not resized;
* the name was neither added nor rebound, and no stored code uses it (the
  analysis then gives no ``Use``).

The same known limit as for every reach applies: memory reachable from
outside the namespace (a view kept in a module) can change unseen; ``%kernos
scan`` checks everything.
"""

from __future__ import annotations

import sys

from kernos.analysis import Use
from kernos.image.state import ImageState
from kernos.readonly import numeric_array
from kernos.serialize.pickler import Pickled
from kernos.store.snapshots import CHUNK_BYTES, StoredPart

__all__ = ["known_pieces"]


def known_pieces(image: ImageState, name: str, value: object, use: Use | None,
                 pickled: Pickled) -> tuple[tuple[StoredPart, frozenset[int]], ...]:
    """For ``name``'s buffer, the part stored last and the pieces the op can have
    written; empty if that cannot be told (the whole buffer is then read)."""
    if use is None or use.appends or not use.keys or not numeric_array(value):
        return ()
    numpy = sys.modules["numpy"]
    array = value
    assert isinstance(array, numpy.ndarray)
    key = image.group_of.get(name)
    state = image.groups.get(key) if key is not None else None
    if (array.ndim != 1 or not array.flags.c_contiguous or state is None
            or state.stored.names != (name,) or len(state.stored.buffers) != 1
            or len(pickled.buffers) != 1):
        return ()
    view = pickled.buffers[0]
    last = state.stored.buffers[0]
    if (view.nbytes != array.nbytes or last.size != array.nbytes
            or numpy.frombuffer(view, numpy.uint8).ctypes.data != array.ctypes.data):
        return ()
    length, itemsize = len(array), array.itemsize
    pieces = set()
    for index in use.keys:
        if not isinstance(index, int) or isinstance(index, bool) or not -length <= index < length:
            return ()  # a bool is a mask, a tuple may be (), the whole array
        start = (index % length) * itemsize
        pieces.update({start // CHUNK_BYTES, (start + itemsize - 1) // CHUNK_BYTES})
    return ((last, frozenset(pieces)),)
