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
* **One model at a time.**  A vector of another model or size than the
  config's is ignored, and replaced when its entry is embedded again.
* **Same visibility.**  The candidates are filtered by the same
  :class:`~kernos.memory.index.Scope` as the words' ranking: a principal's
  own entries of the layers asked for, and the human's names its grants let
  it read (``Scope.admits`` decides, row by row, in rank order).
* **Never a subject's text.**  An entry that holds a data subject's sealed
  payload is not sent to the model (its recording would keep the text where
  an erasure does not reach); it is found by its words only.
* **Bounded cost.**  The cosine pass is one matrix product over the vectors
  of the model, kept in memory per index (refreshed by entry id when the index
  generation moves, never re-read whole).

Fusion: reciprocal rank fusion, ``sum(1 / (RRF_K + rank))`` over the two
rankings (rank 1 is best, each ranking cut at ``depth``).  numpy is imported
only here, when embeddings are on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernos.errors import UsageError
from kernos.memory.embeddings import EMBED_TEXT_CHARS, MAX_DIMENSIONS

if TYPE_CHECKING:
    from kernos.memory.index import MemoryIndex, Scope

__all__ = ["RRF_K", "Meaning", "VectorCache", "check_vectors", "count", "fuse", "missing",
           "nearest", "numpy", "store"]

RRF_K = 60


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


def missing(index: MemoryIndex, scope: Scope, model: str, dims: int,
            limit: int) -> list[tuple[int, str]]:
    """Up to ``limit`` (entry, text) that ``scope`` admits and that have no vector of
    ``model`` and ``dims``, newest first (the most recently indexed); never an entry that
    holds a data subject's text."""
    where, params = scope.candidates_sql()
    rows = index.db.execute(
        "SELECT e.id, e.kind, e.principal, e.name FROM entries e "
        f"WHERE ({where}) AND e.id NOT IN "
        "(SELECT entry FROM vectors WHERE model = ? AND dims = ?) "
        "AND NOT EXISTS (SELECT 1 FROM subjects s WHERE s.entry = e.id) "
        "ORDER BY e.id DESC", (*params, model, dims))
    found: list[tuple[int, str]] = []
    for entry, kind, owner, name in rows:
        if len(found) >= limit:
            break
        if not scope.admits(kind, owner, name):
            continue
        (body,) = index.db.execute("SELECT body FROM text WHERE rowid = ?", (entry,)).fetchone()
        text = str(body)[:EMBED_TEXT_CHARS]
        if text.strip():  # a blank text has no meaning
            found.append((entry, text))
    return found


def store(index: MemoryIndex, model: str, dims: int,
          vectors: Sequence[tuple[int, Sequence[float]]]) -> None:
    """Store (entry, vector) pairs of ``model``, replacing an entry's vector of another."""
    np = numpy()
    if not vectors:
        return
    index.generation += 1
    with index._writing():
        index.db.executemany(
            "INSERT OR REPLACE INTO vectors(entry, model, dims, vector) "
            "SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM entries WHERE id = ?)",
            [(entry, model, dims, np.asarray(vector, dtype="<f4").tobytes(), entry)
             for entry, vector in vectors])


def count(index: MemoryIndex, model: str, dims: int | None) -> int:
    """How many entries have a vector of ``model`` (of ``dims``, when given)."""
    if dims is None:
        row = index.db.execute("SELECT count(*) FROM vectors WHERE model = ?",
                               (model,)).fetchone()
    else:
        row = index.db.execute("SELECT count(*) FROM vectors WHERE model = ? AND dims = ?",
                               (model, dims)).fetchone()
    return int(row[0])


@dataclass(kw_only=True)
class VectorCache:
    """The vectors of one model and size, normalized, as one matrix (see the contract)."""

    model: str
    """The model they were made with."""
    dims: int
    """Their size."""
    generation: int = -1
    """The index generation they reflect."""
    ids: Any = None
    """Entry ids (int64), one per row."""
    matrix: Any = None
    """The normalized vectors (float32), one per row."""
    owners: Any = None
    """Each row's principal (a str array: compared in C)."""
    kinds: Any = None
    """Each row's layer (a str array)."""
    names: list[str | None] = field(default_factory=list)
    """Each row's variable name (working entries)."""

    def refresh(self, index: MemoryIndex) -> None:
        """Catch up with the index: drop rows whose vector is gone, load the new ones."""
        if self.generation == index.generation and self.ids is not None:
            return
        np = numpy()
        current = [row[0] for row in index.db.execute(
            "SELECT entry FROM vectors WHERE model = ? AND dims = ? ORDER BY entry",
            (self.model, self.dims))]
        if self.ids is None:
            self.ids = np.zeros(0, dtype=np.int64)
            self.matrix = np.zeros((0, self.dims), dtype=np.float32)
            self.owners = np.zeros(0, dtype=str)
            self.kinds = np.zeros(0, dtype=str)
        wanted = np.asarray(current, dtype=np.int64)
        keep = np.isin(self.ids, wanted)
        new = sorted(set(current) - set(self.ids[keep].tolist()))
        ids, rows, owners, kinds, names = [], [], [], [], []
        for start in range(0, len(new), 500):
            chunk = new[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for entry, kind, owner, name, blob in index.db.execute(
                    "SELECT v.entry, e.kind, e.principal, e.name, v.vector FROM vectors v "
                    f"JOIN entries e ON e.id = v.entry WHERE v.entry IN ({marks})", chunk):
                ids.append(entry)
                rows.append(np.frombuffer(blob, dtype="<f4"))
                owners.append(owner)
                kinds.append(kind)
                names.append(name)
        added = (np.vstack(rows).astype(np.float32) if rows
                 else np.zeros((0, self.dims), dtype=np.float32))
        norms = np.linalg.norm(added, axis=1, keepdims=True)
        added = np.divide(added, norms, out=np.zeros_like(added), where=norms > 0)
        kept_names = [name for name, kept in zip(self.names, keep.tolist(), strict=True) if kept]
        self.ids = np.concatenate([self.ids[keep], np.asarray(ids, dtype=np.int64)])
        self.matrix = np.vstack([self.matrix[keep], added])
        self.owners = np.concatenate([self.owners[keep], np.asarray(owners, dtype=str)])
        self.kinds = np.concatenate([self.kinds[keep], np.asarray(kinds, dtype=str)])
        self.names = kept_names + names
        self.generation = index.generation


def nearest(index: MemoryIndex, scope: Scope, meaning: Meaning,
            depth: int) -> list[tuple[int, float]]:
    """The ``depth`` entries ``scope`` admits whose vectors are nearest the query (cosine,
    best first, only those above 0)."""
    np = numpy()
    cache = index.vector_cache
    if not isinstance(cache, VectorCache) or (cache.model, cache.dims) != (meaning.model,
                                                                          meaning.dims):
        cache = index.vector_cache = VectorCache(model=meaning.model, dims=meaning.dims)
    cache.refresh(index)
    if not len(cache.ids):
        return []
    query = np.asarray(meaning.vector, dtype=np.float32)
    norm = float(np.linalg.norm(query))
    if norm == 0.0:
        return []
    # Candidates by owner and layer (vectorized); the name-level rule is Scope.admits's,
    # row by row below, in rank order, exactly as the words' ranking applies it.
    layers = np.zeros(len(cache.ids), dtype=bool)
    for kind in scope.kinds:
        layers |= cache.kinds == kind
    candidates = (cache.owners == scope.principal) & layers
    if scope.reads_human_names():
        candidates |= (cache.owners == "human") & (cache.kinds == "working")
    rows = np.flatnonzero(candidates)
    if not len(rows):
        return []
    scores = (cache.matrix @ (query / norm))[rows]  # one product; no copy of the rows
    found: list[tuple[int, float]] = []
    for position in np.argsort(-scores, kind="stable").tolist():
        score = float(scores[position])
        if score <= 0.0 or len(found) >= depth:
            break
        row = int(rows[position])
        if scope.admits(str(cache.kinds[row]), str(cache.owners[row]), cache.names[row]):
            found.append((int(cache.ids[row]), score))
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
