"""Live resources, and those with nothing left to lose.

An open file, a socket, a running thread or a paused generator cannot
persist: a restore puts a placeholder there and the op reports it.  But many
such values are *done*: ``with open(path) as f: ...`` leaves ``f`` closed, a
generator that ran to its end holds no frame.  Reporting those after every
cell would be noise, and losing them loses nothing.  So:

* a closed builtin file (``FileIO``, ``BufferedReader``, ``BufferedWriter``,
  ``BufferedRandom``, ``TextIOWrapper`` over them, ``BytesIO``, ``StringIO``)
  comes back closed, of the same type, with the same ``name``, ``mode`` and
  encoding (rebuilt over ``os.devnull``, never over its file: opening that
  could create or truncate it).  What is not kept: ``closefd``, and the
  buffer size, which nothing reads from a closed file;
* an exhausted generator or coroutine comes back exhausted, with the same
  code, ``__name__`` and ``__qualname__`` (so the same repr); it is made by
  calling a function of that code and closing it before it ever runs;
* a closed ``sqlite3.Connection`` comes back as a closed connection with the
  same row and text factories (a closed connection holds nothing else);
* what cannot be rebuilt but has nothing left (a closed file of another type,
  a closed socket, an exhausted async generator, a cursor of a closed
  connection, a finished thread) becomes a placeholder marked *lossless*, whose reason says that
  nothing was lost.  A finished ``threading.Thread`` is not rebuilt: a thread
  object can be made finished only by running it, or by setting private
  fields that change between Python versions (3.13 replaced them), and a
  rebuilt one could lie about ``join`` or ``is_alive``.  It is lossless only
  if it holds no attributes of its own; a thread that kept a result
  (``worker.result``) loses it, and is reported as usual.
"""

from __future__ import annotations

import io
import socket
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from kernos.serialize import rebuild

__all__ = ["RESOURCE_REDUCERS", "register_late_resources", "transient_verdict"]

NOTHING_LOST = "it was closed, so nothing was lost by not keeping it"
_BUFFERED = (io.BufferedReader, io.BufferedWriter, io.BufferedRandom)
_OWN_ATTRIBUTES = {"name", "mode", "__IOBase_closed"}


def _extra(layer: object) -> dict[str, Any]:
    """Attributes a user set on a file object (its own name and mode are rebuilt anyway)."""
    attributes = getattr(layer, "__dict__", {})
    return {key: value for key, value in attributes.items() if key not in _OWN_ATTRIBUTES}


def _closed_layers(stream: Any) -> tuple[Any, ...] | None:
    """How to rebuild a closed builtin file, or None if it is open or not one of those."""
    if not stream.closed:
        return None
    text = buffered = None
    if type(stream) is io.TextIOWrapper:
        text, stream = stream, stream.buffer
    if type(stream) in _BUFFERED:
        buffered, stream = stream, stream.raw
    if type(stream) is not io.FileIO or (text is not None and buffered is None):
        return None
    raw = (stream.name, stream.mode, _extra(stream))
    layer = None if buffered is None else (type(buffered), _extra(buffered))
    wrapper = None if text is None else (
        text.encoding, text.errors, text.line_buffering, text.write_through,
        text.__dict__.get("mode"), _extra(text))
    return raw, layer, wrapper


def _reduce_file(pickler: Any, stream: Any) -> Any:
    try:
        layers = _closed_layers(stream)
    except ValueError:  # detached: every use raises already
        return pickler.unpersisted(stream, NOTHING_LOST + " (it was detached)", lossless=True)
    if layers is not None:
        return (rebuild.closed_file, layers)
    if stream.closed:
        return pickler.unpersisted(stream, NOTHING_LOST, lossless=True)
    return pickler.unpersisted(stream, _OPEN_FILE)


_OPEN_FILE = "open files and streams cannot be persisted; open the file again after a restore"


def _reduce_memory_stream(pickler: Any, stream: Any) -> Any:
    if stream.closed:
        return (rebuild.closed_memory_stream, (type(stream),), _extra(stream) or None)
    return stream.__reduce_ex__(5)


def _reduce_generator(pickler: Any, generator: Any) -> Any:
    frame = generator.gi_frame if type(generator) is types.GeneratorType else generator.cr_frame
    if frame is not None:
        return pickler.unpersisted(generator, pickler.transient_reason(generator))
    code = generator.gi_code if type(generator) is types.GeneratorType else generator.cr_code
    return (rebuild.finished_generator, (code, generator.__name__, generator.__qualname__))


RESOURCE_REDUCERS: dict[type, Callable[[Any, Any], Any]] = {
    io.FileIO: _reduce_file, io.TextIOWrapper: _reduce_file,
    **dict.fromkeys(_BUFFERED, _reduce_file),
    io.BytesIO: _reduce_memory_stream, io.StringIO: _reduce_memory_stream,
    types.GeneratorType: _reduce_generator, types.CoroutineType: _reduce_generator,
}


def _sqlite_closed(connection: Any) -> bool:
    try:
        connection.total_changes  # noqa: B018 (it raises on a closed connection)
    except sys.modules["sqlite3"].ProgrammingError:
        return True
    return False


def _reduce_sqlite(pickler: Any, connection: Any) -> Any:
    if _sqlite_closed(connection):  # all that is left are its factories
        return (rebuild.closed_sqlite, (connection.row_factory, connection.text_factory))
    return pickler.unpersisted(connection, pickler.transient_reason(connection))


def register_late_resources(special: dict[type, Callable[[Any, Any], Any]]) -> None:
    """Add reducers for resources of modules that may be imported later (sqlite3)."""
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and sqlite3.Connection not in special:
        special[sqlite3.Connection] = _reduce_sqlite


def transient_verdict(obj: Any, reason: str) -> tuple[str, bool]:
    """The reason a live resource cannot persist, and whether nothing is lost by that."""
    try:
        if isinstance(obj, io.IOBase) and obj.closed:
            return NOTHING_LOST, True
    except ValueError:  # a detached wrapper
        return NOTHING_LOST + " (it was detached)", True
    if isinstance(obj, threading.Thread) and obj.ident is not None and not obj.is_alive():
        own = sorted(key for key in vars(obj) if not key.startswith("_"))
        if not own:
            return ("it had finished: a finished thread cannot be started again and holds "
                    "nothing else, so nothing was lost; start a new thread after a restore",
                    True)
        return (f"it is a finished thread, which cannot be persisted; its attributes "
                f"({', '.join(own)}) are lost with it: keep them in a variable", False)
    if isinstance(obj, socket.socket) and obj.fileno() == -1:
        return NOTHING_LOST, True
    if isinstance(obj, types.AsyncGeneratorType) and obj.ag_frame is None:
        return "it had run to its end, so nothing was lost by not keeping it", True
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(obj, (sqlite3.Connection, sqlite3.Cursor)):
        connection = obj.connection if isinstance(obj, sqlite3.Cursor) else obj
        if _sqlite_closed(connection):
            return "its database connection was closed, so nothing was lost", True
    return reason, False
