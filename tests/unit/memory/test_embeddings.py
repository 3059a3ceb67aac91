"""Recall by meaning (kernos.memory.vectors): the config in the image, hybrid recall with a fake
embedding call, visibility, the per-recall bound, failures, rebuild, replay, hostile queries."""

from __future__ import annotations

import hashlib
import math
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from harness_support import Env
from kernos.errors import UsageError
from kernos.memory import MemoryIndex, WorkingItem
from kernos.memory.embeddings import CONFIG_NAME, EMBED_PER_RECALL, EmbeddingConfig
from kernos.memory.service import recorded_recalls
from kernos.memory.vectors import RRF_K, Meaning, fuse, store

MODEL = "test/embed"
DIMS = 32
CONCEPTS = {"car": 0, "sedan": 0, "automobile": 0, "truck": 0, "invoice": 1, "bill": 1,
            "payment": 1, "dog": 2, "puppy": 2}
"""Synonyms share a dimension; each word also has one of its own (so ranks are graded)."""


def vector_of(text: str, dims: int = DIMS) -> list[float]:
    found = [0.0] * dims
    for word in text.lower().replace("'", " ").split():
        if word in CONCEPTS:
            found[CONCEPTS[word]] += 1.0
            found[8 + int(hashlib.sha256(word.encode()).hexdigest(), 16) % (dims - 8)] += 0.5
    norm = math.sqrt(sum(x * x for x in found))
    return [x / norm for x in found] if norm else found


class FakeEmbed:
    """Deterministic embeddings (words of CONCEPTS only); counts calls; can be made to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str], dict[str, Any] | None]] = []
        self.fail_on: int | None = None
        """Raise on this call (1-based)."""

    def __call__(self, principal: str, model: str, texts: list[str], *,
                 params: dict[str, Any] | None = None) -> list[list[float]]:
        self.calls.append((principal, model, list(texts), params))
        if self.fail_on == len(self.calls):
            raise RuntimeError("the embedding provider is down")
        dims = (params or {}).get("dimensions", DIMS)
        return [vector_of(text, dims) for text in texts]

    def texts(self) -> list[str]:
        return [text for call in self.calls for text in call[2]]


def _env(tmp_path: Path, *, on: bool = True) -> tuple[Env, FakeEmbed]:
    env = Env(tmp_path / "ws")
    fake = FakeEmbed()
    env.runtime.memory.embed = fake
    if on:
        with env.op("agents.memory_embeddings(MODEL)"):
            env.agents.memory_embeddings(MODEL, dimensions=DIMS)
    return env, fake


def _names(env: Env, **names: str) -> None:
    with env.op("names"):
        env.ns.update(names)


def _vectors(env: Env) -> list[tuple[int, str, int]]:
    with sqlite3.connect(env.path / "memory" / "index.sqlite") as db:
        return db.execute("SELECT entry, model, dims FROM vectors ORDER BY entry").fetchall()


# -- the config ----------------------------------------------------------------------------

def test_the_config_commits_rolls_back_and_is_removed_with_its_op(tmp_path: Path) -> None:
    env, _ = _env(tmp_path, on=False)
    memory = env.runtime.memory
    assert memory.embeddings() is None and memory.stats()["embeddings"]["on"] is False
    with env.op("set"):
        shown = env.agents.memory_embeddings(MODEL, dimensions=DIMS)
    assert shown == {"model": MODEL, "dimensions": DIMS, "mock_response": None}
    env.reopen()  # persisted like any name
    memory = env.runtime.memory
    assert memory.embeddings() == EmbeddingConfig(model=MODEL, dimensions=DIMS)
    assert memory.stats()["embeddings"] == {"on": True, "model": MODEL, "dimensions": DIMS,
                                            "vectors": 0}
    op = env.image.begin(source="off, then rolled back")
    assert env.agents.memory_embeddings(None)["model"] is None
    assert memory.embeddings() is None
    op.abort()
    assert memory.embeddings() == EmbeddingConfig(model=MODEL, dimensions=DIMS)
    op = env.image.begin(source="another model, rolled back")
    env.agents.memory_embeddings("other/model", mock_response=[0.5, 1])
    assert memory.embeddings() == EmbeddingConfig(model="other/model", mock_response=(0.5, 1.0))
    assert memory.embeddings().params() == {"mock_response": [0.5, 1.0]}  # type: ignore[union-attr]
    op.abort()
    assert memory.embeddings() == EmbeddingConfig(model=MODEL, dimensions=DIMS)
    with env.op("off"):
        env.agents.memory_embeddings(None)
    env.reopen()
    assert env.runtime.memory.embeddings() is None and CONFIG_NAME not in env.image.system
    env.close()


@pytest.mark.parametrize(("arguments", "words"), [
    ({"model": "has space"}, "model name"),
    ({"model": 42}, "model name"),
    ({"model": "m", "dimensions": 0}, "dimensions must be"),
    ({"model": "m", "dimensions": True}, "dimensions must be"),
    ({"model": "m", "dimensions": 9000}, "dimensions must be"),
    ({"model": "m", "mock_response": [1.0, float("nan")]}, "finite"),
    ({"model": "m", "mock_response": "0.1"}, "mock_response must be"),
    ({"model": "m", "mock_response": [True]}, "mock_response must be"),
    ({"model": "m", "dimensions": 3, "mock_response": [1.0]}, "as many as"),
    ({"model": None, "dimensions": 3}, "takes no"),
])
def test_bad_config_is_refused_and_the_image_stays(tmp_path: Path, arguments: dict[str, Any],
                                                    words: str) -> None:
    env, _ = _env(tmp_path)
    model = arguments.pop("model")
    with env.op("bad"), pytest.raises(UsageError, match=words):
        env.agents.memory_embeddings(model, **arguments)
    assert env.runtime.memory.embeddings() == EmbeddingConfig(model=MODEL, dimensions=DIMS)
    env.close()


def test_only_a_human_op_sets_it_and_an_agent_cannot_bind_it(tmp_path: Path) -> None:
    env, _ = _env(tmp_path)
    with pytest.raises(UsageError, match="from a cell"):
        env.agents.memory_embeddings(None)  # no op
    with env.op("setup"):
        env.agents.add("alice")
        env.agents.grant("alice", "write:*")
    op = env.image.begin(source="alice")
    result = env.runtime.run("alice", "try:\n    write('kernos:embeddings', None)\n"
                                      "except BoundaryError:\n    print('refused')\n"
                                      "try:\n    agents.memory_embeddings(None)\n"
                                      "except Exception:\n    print('no agents')\n")
    assert result.output == "refused\nno agents\n"
    op.abort()
    assert env.runtime.memory.embeddings() == EmbeddingConfig(model=MODEL, dimensions=DIMS)
    env.close()


def test_an_agent_named_embeddings_keeps_its_facts_beside_the_config(tmp_path: Path) -> None:
    env, _ = _env(tmp_path)
    with env.op("setup"):
        env.agents.add("embeddings")
        env.agents.remember("a fact", as_="embeddings")
    assert env.runtime.memory.embeddings() == EmbeddingConfig(model=MODEL, dimensions=DIMS)
    with env.op("off"):
        env.agents.memory_embeddings(None)
    assert [m["text"] for m in env.agents.recall("fact", as_="embeddings")] == ["a fact"]
    env.close()


# -- recall by meaning ---------------------------------------------------------------------

def test_off_means_no_embedding_call_at_all(tmp_path: Path) -> None:
    env, fake = _env(tmp_path, on=False)
    _names(env, fleet="sedan parked outside", dues="car repairs")
    found = env.agents.recall("car")
    assert [m["name"] for m in found] == ["dues"] and found[0]["matched"] == "text"
    assert env.agents.context(200, "car")
    assert fake.calls == []
    env.close()


def test_a_match_by_meaning_alone_is_returned(tmp_path: Path) -> None:
    env, fake = _env(tmp_path)
    _names(env, fleet="sedan parked outside", weather="rain tomorrow")
    with env.op("recall"):
        found = env.agents.recall("car", kinds=["working"])
    assert [(m["name"], m["matched"]) for m in found] == [("fleet", "meaning")]
    assert fake.calls[0][:3] == ("human", MODEL, ["car"])
    assert fake.calls[0][3] == {"dimensions": DIMS}
    record = next(r for r in reversed(list(env.image.audit.records())) if r["type"] == "op"
                  and r.get("memory"))
    assert recorded_recalls(env.image.audit, record)[0]["answer"] == found  # replayable
    assert "sedan" in env.agents.context(200, "automobile")
    _names(env, lorry="a truck for sale")  # embedded by the next recall, seen by it too
    with env.op("recall"):
        again = env.agents.recall("car", kinds=["working"])
    assert {m["name"] for m in again} == {"fleet", "lorry"}
    env.close()


def test_a_data_subjects_text_is_never_sent_to_the_model(tmp_path: Path) -> None:
    from kernos.personal import personal

    env, fake = _env(tmp_path)
    with env.op("guest = personal('Brumbleweed the car dealer', subject='c-9')"):
        env.ns["guest"] = personal("Brumbleweed the car dealer", subject="c-9")
    with env.op("recall"):
        found = env.agents.recall("car", k=20)
    assert any("Brumbleweed" in m["text"] for m in found)  # found by its words
    assert fake.texts() and not any("Brumbleweed" in text for text in fake.texts())
    env.close()


def test_fusion_orders_by_reciprocal_rank_and_says_how_each_matched(tmp_path: Path) -> None:
    assert [entry for entry, _, _ in fuse([1, 2, 3], [3, 4])] == [3, 1, 2, 4]
    assert fuse([1], [1])[0] == (1, -2 / (RRF_K + 1), "both")
    env, _ = _env(tmp_path)
    _names(env, a="car repairs booked", b="repairs of the roof", c="sedan washed",
           d="truck car payment", e="repairs repairs car dog")
    query = "car repairs"
    with env.op("off"):
        env.agents.memory_embeddings(None)
    words = [m["name"] for m in env.agents.recall(query, k=20, kinds=["working"])]
    with env.op("on"):
        env.agents.memory_embeddings(MODEL, dimensions=DIMS)
    found = env.agents.recall(query, k=20, kinds=["working"])
    q = vector_of(query)
    texts = {name: f"{name} str {env.ns[name]!r}" for name in "abcde"}
    cosine = {name: sum(x * y for x, y in zip(q, vector_of(text), strict=True))
              for name, text in texts.items()}
    meaning = sorted((name for name in cosine if cosine[name] > 0),
                     key=lambda name: -cosine[name])
    expected: dict[str, float] = {}
    for ranking in (words, meaning):
        for rank, name in enumerate(ranking, 1):
            expected[name] = expected.get(name, 0.0) - 1 / (RRF_K + rank)
    assert len(set(expected.values())) == len(expected)  # no tie: one right order
    assert [m["name"] for m in found] == sorted(expected, key=expected.__getitem__)
    assert {m["name"]: m["score"] for m in found} == pytest.approx(expected)
    matched = {m["name"]: m["matched"] for m in found}
    assert matched == {"a": "both", "e": "both", "d": "both", "b": "text", "c": "meaning"}
    env.close()


def test_an_agent_never_gets_what_it_may_not_read_by_meaning(tmp_path: Path) -> None:
    env, fake = _env(tmp_path)
    _names(env, public_fleet="sedan for hire", secret_fleet="automobile of the boss")
    with env.op("agents"):
        env.agents.add("alice")
        env.agents.add("bob")
        env.agents.grant("alice", "read:public_fleet")
        env.runtime.run("bob", "garage = 'a truck and a sedan'")
        env.runtime.run("alice", "mine = 'my puppy'")
    with env.op("recall"):
        found = env.agents.recall("car", as_="alice", k=20)
    assert [(m["name"], m["principal"]) for m in found] == [("public_fleet", "human")]
    assert all(call[0] == "alice" for call in fake.calls)
    sent = " ".join(fake.texts())
    assert "boss" not in sent and "garage" not in sent  # never scored, so never embedded
    # the same entries, embedded now by their owners, still never reach alice
    with env.op("owners"):
        env.agents.recall("car", k=20)
        env.agents.recall("car", as_="bob", k=20)
    with env.op("again"):
        again = env.agents.recall("car truck automobile", as_="alice", k=20)
    assert [m["name"] for m in again] == ["public_fleet"]
    env.close()


def test_at_most_32_entries_are_embedded_per_recall_newest_first(tmp_path: Path) -> None:
    env, fake = _env(tmp_path)
    _names(env, **{f"v{n:02}": f"note {n}" for n in range(1, 40)}, v00="sedan note")
    with env.op("recall 1"):
        assert env.agents.recall("car", kinds=["working"]) == []
    assert [len(call[2]) for call in fake.calls] == [1, EMBED_PER_RECALL]
    with sqlite3.connect(env.path / "memory" / "index.sqlite") as db:
        visible = [row[0] for row in db.execute(
            "SELECT id FROM entries WHERE kind='working' AND principal='human' "
            "ORDER BY id DESC")]
    assert [entry for entry, _, _ in _vectors(env)] == sorted(visible[:EMBED_PER_RECALL])
    with env.op("recall 2"):  # v00, the oldest, is embedded now, and found at once
        assert [m["name"] for m in env.agents.recall("car", kinds=["working"])] == ["v00"]
    assert [len(call[2]) for call in fake.calls] == [1, 32, 1, len(visible) - 32]
    with env.op("recall 3"):
        env.agents.recall("car", kinds=["working"])
    assert [len(call[2]) for call in fake.calls][4:] == [1]  # only the query: all paid once
    _names(env, v99="a new note")  # a re-sync keeps the vectors of unchanged texts
    with env.op("recall 4"):
        env.agents.recall("car", kinds=["working"])
    assert fake.calls[-1][2] == ["v99 str 'a new note'"]
    assert env.runtime.memory.stats()["embeddings"]["vectors"] == len(visible) + 1
    env.close()


def test_vectors_of_another_model_or_size_are_ignored_and_replaced(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    index = MemoryIndex.open(tmp_path / "bare")
    index.sync_working("human", [WorkingItem(name="x", type="str", preview="nothing here")])
    (entry,) = [row[0] for row in index.db.execute("SELECT id FROM entries")]
    car = tuple(vector_of("car"))
    store(index, "other/model", DIMS, [(entry, car)])
    assert index.recall("car", principal="human",
                        meaning=Meaning(model=MODEL, dims=DIMS, vector=car)) == []
    store(index, MODEL, 8, [(entry, car[:8])])
    assert index.recall("car", principal="human",
                        meaning=Meaning(model=MODEL, dims=DIMS, vector=car)) == []
    found = index.recall("car", principal="human",
                         meaning=Meaning(model=MODEL, dims=8, vector=car[:8]))
    assert [(m.name, m.matched) for m in found] == [("x", "meaning")]
    index.close()


def test_an_entry_of_another_model_is_re_embedded_in_place(tmp_path: Path) -> None:
    env, fake = _env(tmp_path)
    _names(env, fleet="sedan parked outside")
    index = env.runtime.memory.index()
    env.runtime.memory._fresh("human")
    (entry,) = [row[0] for row in index.db.execute(
        "SELECT id FROM entries WHERE name='fleet'")]
    store(index, "other/model", DIMS, [(entry, tuple(vector_of("dog")))])
    with env.op("recall"):
        found = env.agents.recall("car", kinds=["working"])
    assert [m["name"] for m in found] == ["fleet"]
    assert (entry, MODEL, DIMS) in _vectors(env)
    assert "fleet str 'sedan parked outside'" in fake.texts()
    env.close()


@pytest.mark.parametrize("failing_call", [1, 2])
def test_a_failing_embedding_call_raises_and_writes_nothing(tmp_path: Path,
                                                            failing_call: int) -> None:
    env, fake = _env(tmp_path)
    _names(env, fleet="sedan parked outside")
    fake.fail_on = failing_call
    op = env.image.begin(source="recall")
    with pytest.raises(RuntimeError, match="provider is down"):
        env.agents.recall("car")
    op.abort()
    assert _vectors(env) == []
    fake.fail_on = None
    with env.op("recall"):
        assert [m["name"] for m in env.agents.recall("car")] == ["fleet"]
    env.close()


def test_a_malformed_answer_of_the_model_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    env, _ = _env(tmp_path)
    _names(env, fleet="sedan parked outside")

    def short(principal: str, model: str, texts: list[str], *,
              params: dict[str, Any] | None = None) -> list[list[float]]:
        return [vector_of(text, 12 if len(texts) > 1 else DIMS) for text in texts]

    env.runtime.memory.embed = short
    with env.op("recall"), pytest.raises(UsageError, match="not 32"):
        env.agents.recall("car")
    assert _vectors(env) == []
    env.close()


def test_without_a_model_call_or_numpy_a_clear_error(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    env, fake = _env(tmp_path)
    env.runtime.memory.embed = None
    with env.op("recall"), pytest.raises(UsageError, match=r"install kernos\[llm\]"):
        env.agents.recall("car")
    env.runtime.memory.embed = fake
    monkeypatch.setitem(sys.modules, "numpy", None)
    with env.op("recall"), pytest.raises(UsageError, match=r"numpy: install kernos\[llm\]"):
        env.agents.recall("car")
    assert fake.calls == []  # refused before anything was paid for
    env.close()


def test_a_rebuild_starts_without_vectors(tmp_path: Path) -> None:
    env, fake = _env(tmp_path)
    _names(env, fleet="sedan parked outside")
    with env.op("recall"):
        env.agents.recall("car")
    assert _vectors(env)
    env.runtime.memory.rebuild()
    assert _vectors(env) == [] and env.runtime.memory.stats()["embeddings"]["vectors"] == 0
    before = len(fake.texts())
    with env.op("recall"):
        assert [m["name"] for m in env.agents.recall("car")] == ["fleet"]
    assert "fleet str 'sedan parked outside'" in fake.texts()[before:]
    env.close()


def test_a_replay_answers_from_the_record_without_calling_the_model(tmp_path: Path) -> None:
    env, fake = _env(tmp_path)
    memory = env.runtime.memory
    memory.replaying = [{"request": {"what": "recall", "principal": "human", "query": "car",
                                     "k": 5, "kinds": None},
                         "answer": [{"kind": "working", "text": "as recorded"}]}]
    op = env.image.begin(source="replayed")
    assert env.agents.recall("car") == [{"kind": "working", "text": "as recorded"}]
    op.abort()
    assert fake.calls == []
    env.close()


@pytest.mark.parametrize("query", [
    '"', "NEAR(a b)", "a AND car", "*", "body:car", "x) OR (car", "a\x00b", "🔥 émoji",
    "car" * 1300, "\ud800 car", "' OR 1=1 --",
])
def test_hostile_queries_with_embeddings_on(tmp_path: Path, query: str) -> None:
    env, fake = _env(tmp_path)
    _names(env, fleet="sedan parked outside")
    with env.op("recall"):
        found = env.agents.recall(query)
    assert fake.calls[0][2] == [query]  # the text as given, to the model only
    assert all(m["matched"] in ("text", "meaning", "both") for m in found)
    with env.op("recall"), pytest.raises(UsageError, match="at most"):
        env.agents.recall("car " * 2000)
    calls = len(fake.calls)
    with env.op("blank"):
        assert env.agents.recall("   ") == []
    assert len(fake.calls) == calls  # nothing to embed
    env.close()
