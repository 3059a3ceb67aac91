"""numpy arrays as windows on the memory that owns their data, and memory-mapped files.

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

**Memory-mapped files** (``np.memmap``, ``np.load(..., mmap_mode=...)``, and
any view of one) are stored by reference to their file: its path, where the
mapping starts in it and how long it is, the file's size, and the mode.  A
restore maps the file again, so the array is backed by it (later writes reach
the file) and pickling costs nothing however large the file is.  Mode
``'w+'`` maps again as ``'r+'`` (``'w+'`` would truncate the file).  The data
are the file's: writes to a memmap are effects on the file, which a rollback
does not undo.  If the file is gone or its size changed at a restore, the
array becomes a placeholder that says so; the rest of its group loads.

A copy-on-write map (mode ``'c'``) cannot be kept by reference: its changes
live only in memory, never in the file.  It is stored by value, like any array
of that size, and comes back as a ``np.memmap`` of mode ``'c'`` with the same
filename and offset over its own memory, with the same content; it never
writes to the file, as before.  That costs what an in-memory array of its size
costs, which is the price of keeping changes that exist nowhere else.
"""

from __future__ import annotations

import mmap
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

from kernos.serialize import rebuild

__all__ = ["memory_owner", "reduce_array", "reduce_memory"]

#: Modes whose memory is the file's (np.memmap normalises its mode to one of these or 'c').
_FILE_MODES = frozenset({"r", "r+", "w+"})


def reduce_array(pickler: Any, array: Any) -> Any:
    """An ndarray or np.memmap as a window on its memory (see the module docstring)."""
    numpy = sys.modules["numpy"]
    if array.dtype.hasobject:
        return NotImplemented  # its memory holds pointers: only numpy can pickle it
    owner, innermost = memory_owner(array, numpy)
    memory = owner if isinstance(owner, numpy.ndarray) else numpy.frombuffer(
        owner, dtype=numpy.uint8)
    if not (memory.flags.c_contiguous or memory.flags.f_contiguous):
        return NotImplemented
    offset = _address(array) - _address(memory)
    if not 0 <= offset <= memory.nbytes:
        return NotImplemented
    mapped = _mapped_file(owner, innermost, memory, numpy)
    pickler.note_shared(owner)
    if mapped is not None:
        token = pickler.memory_token(owner, lambda: (rebuild.mapped_file, mapped))
    else:
        token = pickler.memory_token(owner, lambda: reduce_memory(memory))
    window = (token, offset, array.shape, array.strides, array.dtype,
              bool(array.flags.writeable))
    is_memmap = isinstance(array, numpy.memmap)
    if mapped is None and not is_memmap:
        return (rebuild.array_window, window)
    fields = (array.filename, array.offset, array.mode) if is_memmap else None
    where = pickler.where(array) if mapped is not None else None
    return (rebuild.mapped_window, (*window, fields, where))


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


def _mapped_file(owner: object, innermost: Any, memory: Any,
                 numpy: Any) -> tuple[str, int, int, int, str] | None:
    """(path, start, length, file size, mode) if ``owner`` maps a file by reference."""
    if type(owner) is not mmap.mmap or not isinstance(innermost, numpy.memmap):
        return None
    if innermost._mmap is not owner or innermost.mode not in _FILE_MODES:
        return None
    try:
        path = os.fspath(innermost.filename)  # a str or a Path, as the user gave it
    except TypeError:
        return None
    if not isinstance(path, str):
        return None
    try:
        size = os.stat(path).st_size
    except OSError:
        return None  # the file is gone already: keep what is in memory
    start = innermost.offset - (_address(innermost) - _address(memory))
    mode = "r" if innermost.mode == "r" else "r+"
    return path, start, len(owner), size, mode


def reduce_memory(memory: Any) -> Any:
    """The bytes of a memory owner, out of band if large; writable unless they were not."""
    # As bytes: the buffer protocol refuses some dtypes (datetime64, for one).
    flat = memory.reshape(-1, order="A").view(sys.modules["numpy"].uint8)
    return (rebuild.memory, (pickle.PickleBuffer(flat),))


def reducers(numpy: Any) -> dict[type, Callable[[Any, Any], Any]]:
    return {numpy.ndarray: reduce_array, numpy.memmap: reduce_array}
