"""The records after an anchor, read from the end of the chain backwards.

``verify --since INDEX:HASH`` must not cost the whole log: it reads
``chain.jsonl`` from its last byte backwards, one line at a time, until it
meets the line that claims to be record ``INDEX``.  No offset index is kept
or trusted: which line is the anchor is only a claim, and the chain settles
it (the line must hash to ``HASH``, and every later line must name the hash
of the one before it).

A record's line holds no newline of its own (canonical JSON escapes them),
so splitting on ``\\n`` from the end finds the same lines as reading from the
start does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = ["Line", "Suffix", "read_suffix"]

CHUNK = 1 << 16
"""Bytes read per step backwards."""


@dataclass(frozen=True, kw_only=True)
class Line:
    """One line of the chain, as found."""

    raw: bytes
    """Its bytes, without the newline."""
    record: dict[str, Any] | None
    """Its JSON object, or None if it is not one."""

    @property
    def claimed_index(self) -> int | None:
        """The ``index`` it claims (only a claim until the chain is checked)."""
        index = None if self.record is None else self.record.get("index")
        return index if type(index) is int else None


@dataclass(kw_only=True)
class Suffix:
    """What the backward read found: the anchor's line and the lines after it."""

    index: int
    """The anchor's index, as asked."""
    anchor: Line | None
    """The line that claims ``index``, or None if the read met no such line."""
    after: list[Line]
    """The lines after the anchor (or after the line where the read stopped), oldest first."""
    tail: bytes
    """Bytes after the last newline: empty unless the last line is torn."""
    stopped_at: int | None
    """Without an anchor: the index claimed by the line where the read stopped, if any."""
    _pieces: Iterator[bytes] = field(repr=False)
    _before: dict[int, Line] = field(default_factory=dict, repr=False)
    _lowest: int | None = field(default=None, repr=False)

    def before(self, index: int) -> Line | None:
        """The line that claims ``index`` (below the anchor), reading further back as needed.

        Verify reads a record before the anchor only when a void record in
        the range names it; what such a line says is a claim, not verified.
        """
        if index in self._before:
            return self._before[index]
        if self._lowest is not None and self._lowest < index:
            return None  # the read went past where it would be
        for raw in self._pieces:
            line = _line(raw)
            claimed = line.claimed_index
            if claimed is None:
                continue
            self._before.setdefault(claimed, line)
            self._lowest = claimed if self._lowest is None else min(self._lowest, claimed)
            if claimed <= index:
                break
        return self._before.get(index)


def read_suffix(handle: IO[bytes], size: int, index: int) -> Suffix:
    """Read backwards from byte ``size`` of ``handle`` to the line that claims ``index``.

    The read stops early at a line that claims a lower index (the anchor is
    not where the chain would put it), so a wrong anchor costs little more
    than a right one.
    """
    pieces = _pieces_backwards(handle, size)
    tail = next(pieces)
    after: list[Line] = []
    anchor: Line | None = None
    stopped_at: int | None = None
    for raw in pieces:
        line = _line(raw)
        claimed = line.claimed_index
        if claimed is not None and claimed <= index:
            if claimed == index:
                anchor = line
            else:
                stopped_at = claimed
            break
        after.append(line)
    after.reverse()
    suffix = Suffix(index=index, anchor=anchor, after=after, tail=tail, stopped_at=stopped_at,
                    _pieces=pieces)
    if stopped_at is not None:
        suffix._lowest = stopped_at
        suffix._before[stopped_at] = line
    elif anchor is not None:
        suffix._lowest = index
    return suffix


def _line(raw: bytes) -> Line:
    try:
        record = json.loads(raw)
    except ValueError:
        return Line(raw=raw, record=None)
    return Line(raw=raw, record=record if type(record) is dict else None)


def _pieces_backwards(handle: IO[bytes], size: int) -> Iterator[bytes]:
    """The pieces of ``data.split(b"\\n")`` for the file's first ``size`` bytes, last first.

    The first piece is what follows the last newline (empty for a whole
    log).  Only as much of the file is read as the pieces taken need.
    """
    position = size
    buffer = b""
    stop = 0  # buffer[:stop] is what is not yielded yet
    while True:
        cut = buffer.rfind(b"\n", 0, stop)
        if cut < 0 and position > 0:
            step = min(CHUNK, position)
            position -= step
            handle.seek(position)
            buffer = handle.read(step) + buffer[:stop]
            stop = len(buffer)
            continue
        if cut < 0:
            yield buffer[:stop]
            return
        yield buffer[cut + 1:stop]
        stop = cut
