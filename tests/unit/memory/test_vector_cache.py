"""The vector cache follows the index by the entries each change names, and agrees with a
cache loaded afresh; what still needs a vector is found without scanning what has one."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kernos.memory import MemoryIndex, WorkingItem
from kernos.memory.index import KINDS, Scope
from kernos.memory.vectors import HUMAN_SCAN, Meaning, VectorCache, missing, nearest, store

np = pytest.importorskip("numpy")

MODEL, DIMS = "m", 8


def _vector(rng: random.Random) -> list[float]:
    return [rng.uniform(-1, 1) for _ in range(DIMS)]


def _open(path: Path) -> MemoryIndex:
    path.mkdir()
    return MemoryIndex.open(path)


def _items(prefix: str, count: int, rng: random.Random) -> list[WorkingItem]:
    return [WorkingItem(name=f"{prefix}{n}", type="str", preview=f"word{rng.randrange(50)}")
            for n in range(count)]


def _fresh(index: MemoryIndex) -> VectorCache:
    cache = VectorCache(model=MODEL, dims=DIMS)
    cache.refresh(index)
    return cache


def _live(cache: VectorCache) -> dict[int, list[float]]:
    return {int(cache.ids[row]): [round(float(x), 5) for x in cache.matrix[row]]
            for row in range(cache.size) if cache.alive[row]}


def _unembedded(index: MemoryIndex, principal: str) -> list[int]:
    return [row[0] for row in index.db.execute(
        "SELECT e.id FROM entries e WHERE e.principal = ? AND NOT EXISTS "
        "(SELECT 1 FROM vectors v WHERE v.entry = e.id) ORDER BY e.id DESC", (principal,))]


@pytest.mark.parametrize("seed", range(6))
def test_a_cache_that_follows_the_changes_equals_one_loaded_afresh(
        tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    index = _open(tmp_path / f"ws{seed}")
    scope = Scope(principal="human", kinds=KINDS)
    kept = VectorCache(model=MODEL, dims=DIMS)
    index.vector_cache = kept
    for step in range(60):
        move = rng.random()
        if move < 0.3:  # a re-sync: every working entry of a principal deleted and re-added
            owner = rng.choice(("human", "alice"))
            index.sync_working(owner, _items(owner, rng.randrange(1, 80), rng))
        elif move < 0.8:  # recalls embed what has no vector yet
            for owner in ("human", "alice"):
                pending = missing(index, Scope(principal=owner, kinds=KINDS), MODEL, DIMS,
                                  rng.randrange(1, 40))
                store(index, MODEL, DIMS, [(entry, _vector(rng)) for entry, _ in pending])
        else:
            kept.refresh(index)
        if step % 7 == 0:
            query = Meaning(model=MODEL, dims=DIMS, vector=tuple(_vector(rng)))
            # The same entries in the same order; the scores equal up to float32 rounding
            # (a matrix laid out otherwise sums in another order).
            assert _rounded(nearest(index, scope, query, 10)) == _rounded(
                _nearest_fresh(index, scope, query))
    kept.refresh(index)
    assert _live(kept) == _live(_fresh(index))
    index.close()


def _rounded(found: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(entry, round(score, 5)) for entry, score in found]


def _nearest_fresh(index: MemoryIndex, scope: Scope, query: Meaning) -> list[tuple[int, float]]:
    held = index.vector_cache
    index.vector_cache = None
    try:
        return nearest(index, scope, query, 10)
    finally:
        index.vector_cache = held


def test_many_deletions_compact_the_cache_and_it_still_agrees(tmp_path: Path) -> None:
    rng = random.Random(7)
    index = _open(tmp_path / "ws")
    index.sync_working("human", _items("a", 3000, rng))
    store(index, MODEL, DIMS, [(entry, _vector(rng)) for entry in _unembedded(index, "human")])
    cache = _fresh(index)
    index.vector_cache = cache
    assert cache.size == 3000 and cache.dead == 0
    index.sync_working("human", _items("b", 500, rng))  # 3000 deleted, 500 new (no vector)
    cache.refresh(index)
    assert cache.dead == 0 and cache.size == 0, "3000 dead rows were not compacted"
    store(index, MODEL, DIMS, [(entry, _vector(rng)) for entry in _unembedded(index, "human")])
    cache.refresh(index)
    assert _live(cache) == _live(_fresh(index)) and len(_live(cache)) == 500
    index.close()


def test_missing_finds_the_newest_without_a_vector_among_many_with_one(tmp_path: Path) -> None:
    rng = random.Random(3)
    index = _open(tmp_path / "ws")
    index.sync_working("alice", _items("x", 2000, rng))
    ids = _unembedded(index, "alice")
    holes = set(rng.sample(ids, 5))
    store(index, MODEL, DIMS, [(entry, _vector(rng)) for entry in ids if entry not in holes])
    scope = Scope(principal="alice", kinds=KINDS)
    assert [entry for entry, _ in missing(index, scope, MODEL, DIMS, 3)] == sorted(
        holes, reverse=True)[:3]
    # The partial index serves the search: SQLite reads it, not the whole table.
    plan = " ".join(str(row) for row in index.db.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM entries INDEXED BY entries_unembedded "
        "WHERE vec = 0 AND principal = ? ORDER BY id DESC", ("alice",)))
    assert "entries_unembedded" in plan and "SCAN entries" not in plan.replace(
        "USING INDEX", ""), plan
    index.close()


def test_another_model_drops_the_vectors_and_they_are_missing_again(tmp_path: Path) -> None:
    rng = random.Random(4)
    index = _open(tmp_path / "ws")
    index.sync_working("alice", _items("x", 10, rng))
    scope = Scope(principal="alice", kinds=KINDS)
    store(index, MODEL, DIMS, [(entry, _vector(rng))
                               for entry, _ in missing(index, scope, MODEL, DIMS, 32)])
    assert missing(index, scope, MODEL, DIMS, 32) == []
    assert len(missing(index, scope, "other", DIMS, 32)) == 10
    assert index.db.execute("SELECT count(*) FROM vectors").fetchone()[0] == 0
    assert len(missing(index, scope, MODEL, DIMS, 32)) == 10
    index.close()


def test_an_agent_looks_at_a_bounded_number_of_the_humans_names(tmp_path: Path) -> None:
    """Most of the human's names may be ones the agent cannot read: the search for names
    still without a vector reads at most HUMAN_SCAN of them per recall, newest first."""
    rng = random.Random(5)
    index = _open(tmp_path / "ws")
    index.sync_working("human", _items("h", HUMAN_SCAN + 50, rng))
    oldest = f"h{0}"
    scope = Scope(principal="alice", kinds=KINDS, may_read=lambda name: name in (oldest, "h7"))
    assert missing(index, scope, MODEL, DIMS, 32) == []  # both beyond the newest HUMAN_SCAN
    near = Scope(principal="alice", kinds=KINDS,
                 may_read=lambda name: name == f"h{HUMAN_SCAN + 49}")
    assert len(missing(index, near, MODEL, DIMS, 32)) == 1
    index.close()
