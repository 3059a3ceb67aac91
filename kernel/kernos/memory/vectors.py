"""Vectors in the memory index, and recall by meaning fused with recall by words.

Table (in ``<workspace>/memory/index.sqlite``, see :mod:`kernos.memory.index`)::

    vectors(entry, model, dims, vector)   one per entry at most; float32 little-endian

Contract:

* **A cache, like the rest of the index.**  A rebuild starts without vectors:
  they come back as recalls embed the entries again (the recorded calls answer
  a text already embedded without charging).  An entry deleted (a working or
  semantic re-sync, an erasure) loses its vector in the same transaction; a
  re-sync carries the vector of an unchanged text over to its new entry.
  Erasure's ``secure_delete`` and ``VACUUM`` cover the table like the others.
* **One model at a time.**  The index records the model and size of its
  vectors (``meta``: ``vectors_of``); the first recall with another config
  drops them all (a switch back finds them again in the recordings, free).
* **What still needs a vector is found without a scan.**  ``entries.vec``
  is 0 until a vector is stored (1), -1 for a data subject's text; a partial
  index on the entries with ``vec = 0`` lets :func:`missing` read the newest
  few of them, however many entries already have one.
* **Same visibility.**  The candidates are filtered by the same
  :class:`~kernos.memory.index.Scope` as the words' ranking: a principal's
  own entries of the layers asked for, and the human's names its grants let
  it read (``Scope.admits`` decides, row by row, in rank order).
* **Never a subject's text.**  An entry that holds a data subject's sealed
  payload is not sent to the model (its recording would keep the text where
  an erasure does not reach); it is found by its words only.
* **Bounded cost.**  The cosine pass is one matrix product over the vectors
  of the model, kept in memory per index; when the index generation moves, the
  cache reloads only the entries :attr:`MemoryIndex.vector_changes` names
  (everything only after a rebuild, a model switch, or more changes than it
  remembers).  The ranking takes the best rows by a partial sort.

Fusion: reciprocal rank fusion, ``sum(1 / (RRF_K + rank))`` over the two
rankings (rank 1 is best, each ranking cut at ``depth``).  numpy is imported
only here, when embeddings are on.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from kernos.errors import UsageError
from kernos.memory.embeddings import EMBED_TEXT_CHARS, MAX_DIMENSIONS
from kernos.memory.records import Scope

__all__ = ["RRF_K", "Meaning", "VectorCache", "VectorTables", "check_vectors", "count", "fuse",
           "missing", "nearest", "numpy", "store"]

RRF_K = 60


class VectorTables(Protocol):
    """What this module needs of the index (a :class:`kernos.memory.index.MemoryIndex` is
    one): its connection, its write bracket and ``meta`` table, and the generation and
    change list the vector cache follows.  The index imports this module for recall by
    meaning, so this module names the index only through this protocol."""

    db: sqlite3.Connection
    """The index's SQLite connection (tables ``entries``, ``vectors``, ``subjects``, ``text``)."""
    generation: int
    """Moves whenever the vectors table may have changed."""
    vector_changes: list[tuple[int, frozenset[int] | None]]
    """(generation, entries changed then; None: all of them), the newest few."""
    vector_cache: object
    """Where :func:`nearest` keeps its :class:`VectorCache` (None until the first)."""

    def vectors_changed(self, entries: Iterable[int] | None) -> None:
        """Move the generation; ``entries`` changed (None: all may have)."""

    def _writing(self) -> AbstractContextManager[None]:
        """A write transaction, marked dirty while it runs."""

    def _get(self, key: str) -> str:
        """A value of the ``meta`` table ("" when absent)."""

    def _set(self, key: str, value: str) -> None:
        """Set a value of the ``meta`` table."""


@dataclass(frozen=True, kw_only=True)
class Meaning:
    """The query's vector and the model and size it was made with."""

    model: str
    """The embedding model."""
    dims: int
    """Its vectors' size."""
    vector: tuple[float, ...]
    """The query, embedded."""


def numpy() -> Any:
    """numpy, imported now; a clear error when it is missing."""
    try:
        import numpy as np
    except ImportError:
        raise UsageError("recall by meaning needs numpy: install kernos[llm]") from None
    return np


def check_vectors(found: object, texts: int, dims: int | None) -> list[tuple[float, ...]]:
    """What an embedding call returned, checked: ``texts`` vectors of equal size (``dims``
    when given) of finite numbers."""
    if type(found) is not list or len(found) != texts:
        raise UsageError(f"the embedding call returned {type(found).__name__} of "
                         f"{len(found) if isinstance(found, list) else '?'} items for "
                         f"{texts} texts")
    size = dims
    checked = []
    for vector in found:
        if (type(vector) is not list or not 1 <= len(vector) <= MAX_DIMENSIONS
                or not all(type(x) in (int, float) and math.isfinite(x) for x in vector)):
            raise UsageError("the embedding call returned something that is not a vector of "
                             "finite numbers")
        if size is None:
            size = len(vector)
        if len(vector) != size:
            raise UsageError(f"the embedding call returned a vector of {len(vector)} numbers, "
                             f"not {size}")
        checked.append(tuple(float(x) for x in vector))
    return checked


HUMAN_SCAN = 4000
"""The human's names without a vector looked at per recall by an agent (most of them may
be names it cannot read)."""


def missing(index: VectorTables, scope: Scope, model: str, dims: int,
            limit: int) -> list[tuple[int, str]]:
    """Up to ``limit`` (entry, text) that ``scope`` admits and that have no vector of
    ``model`` and ``dims``, newest first (the most recently indexed); never an entry that
    holds a data subject's text."""
    _one_model(index, model, dims)
    owners = [scope.principal]
    if scope.reads_human_names():
        owners.append("human")
    rows: list[tuple[int, str, str, str | None]] = []
    for owner in owners:  # the partial index, newest first, read only as far as needed
        taken = 0
        for read, (entry, kind, principal, name) in enumerate(index.db.execute(
                "SELECT id, kind, principal, name FROM entries INDEXED BY entries_unembedded "
                "WHERE vec = 0 AND principal = ? ORDER BY id DESC", (owner,)), start=1):
            if scope.admits(kind, principal, name):
                rows.append((entry, kind, principal, name))
                taken += 1
            if taken >= limit or (owner != scope.principal and read >= HUMAN_SCAN):
                break
    rows.sort(reverse=True)
    found: list[tuple[int, str]] = []
    for entry, _, _, _ in rows:
        if len(found) >= limit:
            break
        if index.db.execute("SELECT 1 FROM subjects WHERE entry = ?", (entry,)).fetchone():
            continue  # vec is -1 for these; a second look costs one indexed read
        (body,) = index.db.execute("SELECT body FROM text WHERE rowid = ?", (entry,)).fetchone()
        text = str(body)[:EMBED_TEXT_CHARS]
        if text.strip():  # a blank text has no meaning
            found.append((entry, text))
    return found


def store(index: VectorTables, model: str, dims: int,
          vectors: Sequence[tuple[int, Sequence[float]]]) -> None:
    """Store (entry, vector) pairs of ``model``, replacing an entry's vector of another."""
    np = numpy()
    if not vectors:
        return
    _one_model(index, model, dims)
    index.vectors_changed(entry for entry, _ in vectors)
    with index._writing():
        index.db.executemany(
            "INSERT OR REPLACE INTO vectors(entry, model, dims, vector) "
            "SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM entries WHERE id = ?)",
            [(entry, model, dims, np.asarray(vector, dtype="<f4").tobytes(), entry)
             for entry, vector in vectors])
        index.db.executemany("UPDATE entries SET vec = 1 WHERE id = ? AND vec = 0",
                             [(entry,) for entry, _ in vectors])


def _one_model(index: VectorTables, model: str, dims: int) -> None:
    """The index holds vectors of one model and size: drop the others' (see the contract)."""
    key = f"{dims}/{model}"
    if index._get("vectors_of") == key:
        return
    with index._writing():
        index.db.execute("DELETE FROM vectors")
        index.db.execute("UPDATE entries SET vec = 0 WHERE vec = 1")
        index._set("vectors_of", key)
    index.vectors_changed(None)


def count(index: VectorTables, model: str, dims: int | None) -> int:
    """How many entries have a vector of ``model`` (of ``dims``, when given)."""
    if dims is None:
        row = index.db.execute("SELECT count(*) FROM vectors WHERE model = ?",
                               (model,)).fetchone()
    else:
        row = index.db.execute("SELECT count(*) FROM vectors WHERE model = ? AND dims = ?",
                               (model, dims)).fetchone()
    return int(row[0])


class VectorCache:
    """The vectors of one model and size, normalized, as rows of one matrix (see the contract).

    Rows are appended into spare capacity and a deleted entry's row is only marked dead, so
    following a few changes copies nothing; the dead rows are dropped when they are a
    quarter of the matrix.
    """

    def __init__(self, *, model: str, dims: int) -> None:
        self.model = model
        self.dims = dims
        self._empty()

    def _empty(self) -> None:
        """No rows (what a full reload starts from)."""
        self.generation = -1
        """The index generation the rows reflect (-1: nothing loaded)."""
        self.size = 0
        """Rows in use (alive or dead)."""
        self.dead = 0
        self.row_of: dict[int, int] = {}
        """Entry id -> its live row."""
        self.codes: dict[str, int] = {}
        """Principal -> the small int the owners column holds (compared in C)."""
        self.names: list[str | None] = []
        """Each row's variable name (working entries)."""
        np = numpy()
        self.ids = np.zeros(0, dtype=np.int64)
        self.matrix = np.zeros((0, self.dims), dtype=np.float32)
        self.owners = np.zeros(0, dtype=np.int32)
        self.kinds = np.zeros(0, dtype=np.int8)
        self.alive = np.zeros(0, dtype=bool)

    def code(self, principal: str) -> int:
        return self.codes.setdefault(principal, len(self.codes))

    def refresh(self, index: VectorTables) -> None:
        """Catch up with the index: reload the entries changed since, or everything."""
        if self.generation == index.generation:
            return
        changes = [entries for generation, entries in index.vector_changes
                   if generation > self.generation]
        known = (self.generation >= 0 and index.vector_changes
                 and index.vector_changes[0][0] <= self.generation + 1)
        if not known or any(entries is None for entries in changes):
            self._empty()
            self._load(index, None)
        else:
            touched = sorted(set().union(*[entries for entries in changes if entries]))
            for entry in touched:
                row = self.row_of.pop(entry, None)
                if row is not None:
                    self.alive[row] = False
                    self.dead += 1
            self._load(index, touched)
            if self.dead > max(1000, self.size // 4):
                self._compact()
        self.generation = index.generation

    def _load(self, index: VectorTables, entries: list[int] | None) -> None:
        """Append the vectors of ``entries`` (None: all) that the index holds."""
        np = numpy()
        query = ("SELECT v.entry, e.kind, e.principal, e.name, v.vector FROM vectors v "
                 "JOIN entries e ON e.id = v.entry WHERE v.model = ? AND v.dims = ?")
        chunks: list[list[int] | None] = (
            [None] if entries is None else
            [entries[start:start + 500] for start in range(0, len(entries), 500)])
        for chunk in chunks:
            params: list[Any] = [self.model, self.dims]
            sql = query
            if chunk is not None:
                sql += f" AND v.entry IN ({','.join('?' * len(chunk))})"
                params += chunk
            rows = index.db.execute(sql, params).fetchall()
            if not rows:
                continue
            added = np.vstack([np.frombuffer(blob, dtype="<f4") for *_, blob in rows])
            norms = np.linalg.norm(added, axis=1, keepdims=True)
            added = np.divide(added, norms, out=np.zeros_like(added), where=norms > 0)
            start = self._reserve(len(rows))
            end = start + len(rows)
            self.matrix[start:end] = added
            self.ids[start:end] = [row[0] for row in rows]
            self.kinds[start:end] = [_KIND_CODES.get(row[1], -1) for row in rows]
            self.owners[start:end] = [self.code(row[2]) for row in rows]
            self.alive[start:end] = True
            self.names[start:end] = [row[3] for row in rows]
            for offset, row in enumerate(rows):
                self.row_of[row[0]] = start + offset
            self.size = end

    def _reserve(self, count: int) -> int:
        """Room for ``count`` more rows (capacity grows by half); the first free row."""
        np = numpy()
        if self.size + count > len(self.ids):
            capacity = max(self.size + count, len(self.ids) * 3 // 2, 1024)
            for name, shape in (("ids", (capacity,)), ("owners", (capacity,)),
                                ("kinds", (capacity,)), ("alive", (capacity,)),
                                ("matrix", (capacity, self.dims))):
                old = getattr(self, name)
                grown = np.zeros(shape, dtype=old.dtype)
                grown[:self.size] = old[:self.size]
                setattr(self, name, grown)
            self.names.extend([None] * (capacity - len(self.names)))
        return self.size

    def _compact(self) -> None:
        live = self.alive[:self.size].nonzero()[0]
        for name in ("ids", "owners", "kinds", "alive", "matrix"):
            column = getattr(self, name)
            column[:len(live)] = column[live]
        self.names[:len(live)] = [self.names[row] for row in live.tolist()]
        self.size, self.dead = len(live), 0
        self.alive[self.size:] = False
        self.row_of = {int(entry): row for row, entry in enumerate(self.ids[:self.size].tolist())}


_KIND_CODES = {"working": 0, "episodic": 1, "semantic": 2}


def nearest(index: VectorTables, scope: Scope, meaning: Meaning,
            depth: int) -> list[tuple[int, float]]:
    """The ``depth`` entries ``scope`` admits whose vectors are nearest the query (cosine,
    best first, only those above 0)."""
    np = numpy()
    cache = index.vector_cache
    if not isinstance(cache, VectorCache) or (cache.model, cache.dims) != (meaning.model,
                                                                          meaning.dims):
        cache = index.vector_cache = VectorCache(model=meaning.model, dims=meaning.dims)
    cache.refresh(index)
    if not cache.size:
        return []
    query = np.asarray(meaning.vector, dtype=np.float32)
    norm = float(np.linalg.norm(query))
    if norm == 0.0:
        return []
    # Candidates by owner and layer (vectorized); the name-level rule is Scope.admits's,
    # row by row below, in rank order, exactly as the words' ranking applies it.
    size = cache.size
    kinds, owners = cache.kinds[:size], cache.owners[:size]
    layers = np.zeros(size, dtype=bool)
    for kind in scope.kinds:
        layers |= kinds == _KIND_CODES[kind]
    mine = cache.codes.get(scope.principal, -1)
    candidates = cache.alive[:size] & (owners == mine) & layers
    if scope.reads_human_names():
        candidates |= (cache.alive[:size] & (owners == cache.codes.get("human", -1))
                       & (kinds == _KIND_CODES["working"]))
    rows = np.flatnonzero(candidates)
    if not len(rows):
        return []
    scores = (cache.matrix[:size] @ (query / norm))[rows]  # no copy of the rows
    names = {code: principal for principal, code in cache.codes.items()}
    kind_names = {code: kind for kind, code in _KIND_CODES.items()}
    found: list[tuple[int, float]] = []
    # The best rows by a partial sort (with every row tied with the last of them), best
    # first and, among equals, the newest entry first; all rows only if too few pass admits.
    for take in (min(len(rows), depth * 4), len(rows)):
        if take < len(rows):
            bar = np.partition(-scores, take - 1)[take - 1]
            best = np.flatnonzero(-scores <= bar)
        else:
            best = np.arange(len(rows))
        order = best[np.lexsort((-cache.ids[rows[best]], -scores[best]))]
        found = []
        for position in order.tolist():
            score = float(scores[position])
            if score <= 0.0 or len(found) >= depth:
                break
            row = int(rows[position])
            if scope.admits(kind_names[int(kinds[row])], names[int(owners[row])],
                            cache.names[row]):
                found.append((int(cache.ids[row]), score))
        if len(found) >= depth or take == len(rows):
            break
    return found


def fuse(by_words: Sequence[int], by_meaning: Sequence[int]) -> list[tuple[int, float, str]]:
    """(entry, fused score, matched) best first: reciprocal rank fusion of two rankings.

    The score is ``-sum(1 / (RRF_K + rank))`` (rank from 1), so that lower is better as
    with bm25; ``matched`` is ``text``, ``meaning`` or ``both``: which rankings hold it."""
    words = {entry: rank for rank, entry in enumerate(by_words, 1)}
    meaning = {entry: rank for rank, entry in enumerate(by_meaning, 1)}
    fused = []
    for entry in dict.fromkeys([*by_words, *by_meaning]):
        score = sum(1.0 / (RRF_K + ranks[entry]) for ranks in (words, meaning)
                    if entry in ranks)
        matched = ("both" if entry in words and entry in meaning
                   else "text" if entry in words else "meaning")
        best = min(words.get(entry, 1 << 30), meaning.get(entry, 1 << 30))
        fused.append((-score, best, entry, matched))
    fused.sort()
    return [(entry, score, matched) for score, _, entry, matched in fused]
