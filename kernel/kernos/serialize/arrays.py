"""numpy arrays as windows on the memory that owns their data.

numpy pickles every array as an independent copy, so a view and its base, or
an array made with ``np.frombuffer`` over a ``bytearray``, would come back
sharing nothing.  Here every array names its memory owner (memoized, so all
arrays on one owner share one buffer after a load, and the pickler sees them
as sharing an object) plus where in it the array lives (offset, shape,
strides).  A restored array is such a window too, so it pickles as the
original did.

The owner is found by following ``.base``: to the ndarray that owns its
memory, or to a buffer (``bytes``, ``bytearray``, ``mmap``, a pyarrow buffer).
A chain can also end in an object that exports no buffer (a ``PyCapsule`` from
DLPack or Arrow, which pandas 3 uses for a boolean Series made by comparing
strings); the last ndarray of the chain is then the owner.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from typing import Any

from kernos.serialize import rebuild

__all__ = ["memory_owner", "reduce_array", "reduce_memory"]


def reduce_array(pickler: Any, array: Any) -> Any:
    """An ndarray as a window on its memory (see the module docstring)."""
    numpy = sys.modules["numpy"]
    if array.dtype.hasobject:
        return NotImplemented  # its memory holds pointers: only numpy can pickle it
    owner, _ = memory_owner(array, numpy)
    memory = owner if isinstance(owner, numpy.ndarray) else numpy.frombuffer(
        owner, dtype=numpy.uint8)
    if not (memory.flags.c_contiguous or memory.flags.f_contiguous):
        return NotImplemented
    offset = _address(array) - _address(memory)
    if not 0 <= offset <= memory.nbytes:
        return NotImplemented
    pickler.note_shared(owner)
    token = pickler.memory_token(owner, lambda: reduce_memory(memory))
    return (rebuild.array_window,
            (token, offset, array.shape, array.strides, array.dtype,
             bool(array.flags.writeable)))


def _address(array: Any) -> int:
    return int(array.__array_interface__["data"][0])


def memory_owner(array: Any, numpy: Any) -> tuple[object, Any]:
    """The object whose memory ``array`` lives in, and the last ndarray on the way there."""
    innermost = array
    while isinstance(innermost.base, numpy.ndarray):
        innermost = innermost.base
    base = innermost.base
    while isinstance(base, memoryview):
        base = base.obj
    if base is None or not _exports_buffer(base):
        return innermost, innermost
    return base, innermost


def _exports_buffer(obj: object) -> bool:
    try:
        memoryview(obj).release()  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def reduce_memory(memory: Any) -> Any:
    """The bytes of a memory owner, out of band if large; writable unless they were not."""
    # As bytes: the buffer protocol refuses some dtypes (datetime64, for one).
    flat = memory.reshape(-1, order="A").view(sys.modules["numpy"].uint8)
    return (rebuild.memory, (pickle.PickleBuffer(flat),))


def reducers(numpy: Any) -> dict[type, Callable[[Any, Any], Any]]:
    return {numpy.ndarray: reduce_array}
