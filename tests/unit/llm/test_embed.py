"""Embedding calls through the core: requests, recordings, batches, answers, budgets, ledger."""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernos.errors import (
    LLMBudgetExceeded,
    LLMProviderError,
    LLMReplayMiss,
    LLMRequestInvalid,
    LLMResponseInvalid,
)
from kernos.llm import (
    EMBEDDING_PARAMS,
    Budget,
    EmbeddingRequest,
    LlmClient,
    LlmStore,
    Mode,
    _provider,
    build_embedding_request,
    build_request,
    set_mode,
)
from kernos.llm._store import read_calls

litellm = _provider.litellm()  # imported with the offline price list, as Kernos does
MODEL = "text-embedding-3-small"  # priced in litellm's table: 0.02 USD per 1M tokens


def vector_of(text: str) -> list[float]:
    return [float(len(text)), float(sum(map(ord, text)) % 97), 0.5]


class Provider:
    """Stands in for ``litellm.embedding``: answers honestly, counts every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.params: list[dict[str, Any]] = []
        self.usage: Callable[[list[str]], object] = lambda texts: {
            "prompt_tokens": 7 * len(texts)}
        self.answer: Callable[[list[str]], object] | None = None
        self.fail: Exception | None = None

    def __call__(self, *, model: str, input: list[str], **params: Any) -> object:
        self.calls.append(list(input))
        self.params.append(params)
        if self.fail is not None:
            raise self.fail
        if self.answer is not None:
            return self.answer(input)
        return {"model": model, "object": "list", "usage": self.usage(input),
                "data": [{"index": index, "object": "embedding", "embedding": vector_of(text)}
                         for index, text in enumerate(input)]}


@pytest.fixture
def provider() -> Provider:
    return Provider()


@pytest.fixture
def client(tmp_path: Path, provider: Provider) -> Iterator[LlmClient]:
    set_mode(None)
    yield LlmClient(LlmStore(tmp_path), embedding=provider)
    set_mode(None)


def requests(*texts: str, model: str = MODEL, **params: object) -> list[EmbeddingRequest]:
    return [build_embedding_request(model, text, dict(params)) for text in texts]


def embed(client: LlmClient, *texts: str, journal: list[dict[str, Any]] | None = None,
          mode: Mode | None = None, budgets: list[Budget] | None = None,
          **params: object):  # type: ignore[no-untyped-def]
    return client.embed(requests(*texts, **params), principal="alice", op=7,
                        budgets=budgets or [], charge=["principal:alice", "op:7"],
                        journal=journal, mode=mode)


# -- the request ----------------------------------------------------------------------------


class Text(str):
    pass


@pytest.mark.parametrize(("model", "text", "params", "message"), [
    (42, "x", {}, "the embedding model must be a str"),
    ("bad model name", "x", {}, "the embedding model must be a str"),
    ("m" * 200, "x", {}, "the embedding model must be a str"),
    (MODEL, b"x", {}, "must be a str, not a bytes"),
    (MODEL, Text("x"), {}, "must be a str, not a Text"),
    (MODEL, None, {}, "must be a str, not a NoneType"),
    (MODEL, "", {}, "must not be empty"),
    (MODEL, "x" * 32_769, {}, "32,769 characters, over 32,768"),
    (MODEL, "x", [("dimensions", 3)], "parameters must be a dict"),
    (MODEL, "x", {"api_key": "sk-1"}, "unknown embedding parameter api_key; the allowed "
                                      "ones are dimensions, mock_response"),
    (MODEL, "x", {"api_base": "http://evil", "user": "u"}, "unknown embedding parameters"),
    (MODEL, "x", {"encoding_format": "base64"}, "encoding_format"),
    (MODEL, "x", {"input": ["other"]}, "unknown embedding parameter input"),
    (MODEL, "x", {"dimensions": 0}, "dimensions must be an int from 1 to 8,192"),
    (MODEL, "x", {"dimensions": 8193}, "dimensions must be"),
    (MODEL, "x", {"dimensions": True}, "not a bool"),
    (MODEL, "x", {"dimensions": 3.0}, "not a float"),
    (MODEL, "x", {"dimensions": "3"}, "dimensions must be"),
    (MODEL, "x", {"mock_response": []}, "not 0 of them"),
    (MODEL, "x", {"mock_response": [0.0] * 8193}, "not 8,193 of them"),
    (MODEL, "x", {"mock_response": "0.1, 0.2"}, "mock_response must be a list"),
    (MODEL, "x", {"mock_response": {"0": 1.0}}, "mock_response must be a list"),
    (MODEL, "x", {"mock_response": [0.1, math.nan]}, "mock_response[1] must be a finite"),
    (MODEL, "x", {"mock_response": [math.inf]}, "mock_response[0] must be a finite"),
    (MODEL, "x", {"mock_response": [-math.inf]}, "must be a finite number, not -inf"),
    (MODEL, "x", {"mock_response": [True]}, "not a bool"),
    (MODEL, "x", {"mock_response": ["1"]}, "not '1'"),
    (MODEL, "x", {"mock_response": [[1.0]]}, "not a list"),
    (MODEL, "x", {"mock_response": [10**400]}, "not an int of"),
])
def test_a_bad_request_is_refused_naming_what_is_wrong(model: object, text: object,
                                                       params: Any, message: str) -> None:
    with pytest.raises(LLMRequestInvalid) as caught:
        build_embedding_request(model, text, params)
    assert message in str(caught.value)


def test_a_good_request_is_normalized() -> None:
    request = build_embedding_request(MODEL, "x" * 32_768, {"dimensions": 8192,
                                                             "mock_response": (1, 2.5)})
    assert request.params == {"dimensions": 8192, "mock_response": [1.0, 2.5]}
    assert type(request.params["mock_response"][0]) is float
    assert request.canonical() == {"kind": "embedding", "model": MODEL, "input": "x" * 32_768,
                                   "params": {"dimensions": 8192, "mock_response": [1.0, 2.5]}}
    assert set(EMBEDDING_PARAMS) == {"dimensions", "mock_response"}


def test_the_hash_is_stable_and_names_exactly_one_request() -> None:
    one = build_embedding_request(MODEL, "sea", {"dimensions": 3, "mock_response": [1, 2, 3]})
    same = build_embedding_request(MODEL, "sea", {"mock_response": (1.0, 2.0, 3.0),
                                                  "dimensions": 3})
    assert one.hash == same.hash and len(one.hash) == 64
    others = {build_embedding_request(MODEL, "sea ", {}).hash,
              build_embedding_request(MODEL, "sea", {}).hash,
              build_embedding_request("text-embedding-3-large", "sea", {}).hash,
              build_embedding_request(MODEL, "sea", {"dimensions": 4}).hash, one.hash}
    assert len(others) == 5


@pytest.mark.parametrize("text", ["sea", "", '{"kind": "embedding"}', "x" * 1000])
def test_no_embedding_request_hashes_like_a_completion_request(text: str) -> None:
    completions = {build_request(MODEL, [{"role": "user", "content": text}], {}).hash,
                   build_request(MODEL, [{"role": "user", "content": text}],
                                 {"mock_response": text or "x"}).hash}
    if text:
        embedding = build_embedding_request(MODEL, text, {})
        assert embedding.hash not in completions
        assert embedding.canonical()["kind"] == "embedding"
    completion = build_request(MODEL, [{"role": "user", "content": text}], {})
    assert "kind" not in completion.canonical()  # the key sets differ: no JSON is both


# -- recordings, batches -----------------------------------------------------------------------


def test_a_call_is_recorded_per_text_and_a_recorded_text_costs_nothing(
        client: LlmClient, provider: Provider) -> None:
    first = embed(client, "sea", "salt")
    assert provider.calls == [["sea", "salt"]]
    assert [e.vector for e in first] == [tuple(vector_of("sea")), tuple(vector_of("salt"))]
    assert [e.cached for e in first] == [False, False] and first[0].call == first[1].call == 1
    assert sum(e.tokens for e in first) == 14  # what the provider reported, split
    ledger_before = client.store.ledger.entries()
    spent = client.store.ledger.spent("principal:alice")
    # Recorded per text: a batch of other texts finds "salt" again, free.
    again = embed(client, "salt", "wind")
    assert provider.calls == [["sea", "salt"], ["wind"]]
    assert again[0].cached and again[0].call is None
    assert again[0].vector == first[1].vector and again[0].tokens == first[1].tokens
    assert not again[1].cached and again[1].call == 2
    assert len(client.store.ledger.entries()) == len(ledger_before) + 2  # "wind" only
    assert client.store.ledger.spent("principal:alice").tokens == spent.tokens + 7
    everything = embed(client, "wind", "sea", "salt", mode=Mode.REPLAY)
    assert [e.cached for e in everything] == [True, True, True]
    assert len(provider.calls) == 2 and client.store.ledger.spent("principal:alice").tokens \
        == spent.tokens + 7
    fresh = embed(client, "sea", mode=Mode.OFF)  # off: always asked, and charged
    assert len(provider.calls) == 3 and not fresh[0].cached


def test_the_same_text_twice_is_embedded_once(client: LlmClient, provider: Provider) -> None:
    journal: list[dict[str, Any]] = []
    found = embed(client, "sea", "sea", "salt", journal=journal)
    assert provider.calls == [["sea", "salt"]]
    assert found[0] == found[1] and len(journal) == 3


def test_65_texts_are_two_calls_and_a_mock_is_one_call_per_text(
        client: LlmClient, provider: Provider) -> None:
    texts = [f"text number {n}" for n in range(65)]
    found = embed(client, *texts)
    assert [len(call) for call in provider.calls] == [64, 1]
    assert [e.vector for e in found] == [tuple(vector_of(text)) for text in texts]
    assert [call["kind"] for call in read_calls(client.store.ledger.path)] == ["embedding"] * 2
    provider.calls.clear()
    mocked = embed(client, "a", "b", "c", mock_response=[0.25, 0.5])
    assert provider.calls == [["a"], ["b"], ["c"]]
    assert provider.params[-1] == {"mock_response": [0.25, 0.5]} and len(mocked) == 3
    provider.calls.clear()
    two_models = client.embed(requests("x", "y") + requests("z", model="text-embedding-3-large"),
                              principal="alice", op=None)
    assert provider.calls == [["x", "y"], ["z"]] and len(two_models) == 3


def test_litellms_own_mock_answers_offline(tmp_path: Path) -> None:
    client = LlmClient(LlmStore(tmp_path))  # no stand-in: litellm.embedding itself
    found = client.embed(requests("one", "two", mock_response=[0.1, 0.2, 0.3]),
                         principal="human", op=None)
    assert [e.vector for e in found] == [(0.1, 0.2, 0.3)] * 2
    assert [e.call for e in found] == [1, 2]


# -- the answer ----------------------------------------------------------------------------


def answer_with(data: object, **extra: object) -> Callable[[list[str]], object]:
    return lambda texts: {"model": MODEL, "data": data, "usage": {"prompt_tokens": 3}, **extra}


def item(vector: object, index: int | None = None) -> dict[str, object]:
    found: dict[str, object] = {"object": "embedding", "embedding": vector}
    if index is not None:
        found["index"] = index
    return found


@pytest.mark.parametrize(("data", "params", "message"), [
    ([item([1.0, 2.0], 0)], {}, "it has 1 vectors for 2 texts"),
    ([item([1.0], 0), item([1.0], 1), item([1.0], 2)], {}, "it has 3 vectors for 2 texts"),
    ([item([1.0, 2.0], 0), item([1.0], 1)], {}, "ragged: vector 1 has 1 dimensions, vector 0 "
                                                "has 2"),
    ([item([1.0, math.nan], 0), item([1.0, 2.0], 1)], {}, "vector 0 holds nan"),
    ([item([1.0, 2.0], 0), item([math.inf, 2.0], 1)], {}, "vector 1 holds inf"),
    ([item("AAAAPwAAAEA=", 0), item([1.0], 1)], {}, "vector 0 is a str, not a list"),
    ([item({"0": 1.0}, 0), item([1.0], 1)], {}, "vector 0 is a dict"),
    ([item(None, 0), item([1.0], 1)], {}, "vector 0 is missing"),
    ([item([], 0), item([], 1)], {}, "vector 0 has 0 dimensions"),
    ([item([True], 0), item([1.0], 1)], {}, "vector 0 holds a bool"),
    ([item(["1"], 0), item([1.0], 1)], {}, "vector 0 holds a str"),
    ([item([1.0], 0), item([2.0], 0)], {}, "names the index 0"),
    ([item([1.0], 0), item([2.0], 5)], {}, "names the index 5"),
    ([item([1.0], 0), item([2.0], "1")], {}, "names the index 1"),  # a str index
    (["not a dict", item([2.0], 1)], {}, "data[0] is a str"),
    ("not a list", {}, "its data is a str, not a list"),
    (None, {}, "its data is missing"),
    ([item([1.0, 2.0], 0), item([1.0, 2.0], 1)], {"dimensions": 3},
     "2 dimensions, but dimensions=3 was asked"),
])
def test_a_malformed_answer_is_refused_charged_and_not_recorded(
        client: LlmClient, provider: Provider, data: object, params: dict[str, object],
        message: str) -> None:
    provider.answer = answer_with(data)
    journal: list[dict[str, Any]] = []
    with pytest.raises(LLMResponseInvalid) as caught:
        embed(client, "sea", "salt", journal=journal, **params)
    assert message in str(caught.value)
    for request in requests("sea", "salt", **params):
        assert client.store.recorded(request.hash) is None
    assert [entry["error"] for entry in journal] == ["LLMResponseInvalid"] * 2
    [call] = read_calls(client.store.ledger.path)
    assert call["settled"] and call["tokens"] > 0  # the answer was produced: charged
    settle = client.store.ledger.entries()[-1]
    kept = client.store.get(settle["response"])["raw"]["data"]  # kept to inspect
    assert kept == data or "nan" in str(kept) or "inf" in str(kept)


def test_a_malformed_completion_holding_nan_is_kept_too(tmp_path: Path) -> None:
    client = LlmClient(LlmStore(tmp_path), completion=lambda **arguments: {
        "choices": [], "logprobs": [math.nan, -math.inf]})
    request = build_request("gpt-4o-mini", [{"role": "user", "content": "hi"}], {})
    journal: list[dict[str, Any]] = []
    with pytest.raises(LLMResponseInvalid, match="no choices"):
        client.complete(request, principal="alice", op=1, journal=journal)
    assert client.store.get(journal[0]["response"])["raw"]["logprobs"] == ["nan", "-inf"]


def test_an_answer_in_another_order_is_put_in_text_order(client: LlmClient,
                                                         provider: Provider) -> None:
    provider.answer = answer_with([item([2.0], 1), item([1.0], 0)])
    assert [e.vector for e in embed(client, "sea", "salt")] == [(1.0,), (2.0,)]


def test_an_answer_without_usage_is_charged_litellms_count(client: LlmClient,
                                                           provider: Provider) -> None:
    provider.usage = lambda texts: None
    found = embed(client, "the sea is salty", "wind")
    counted = [litellm.token_counter(model=MODEL, text=text)
               for text in ("the sea is salty", "wind")]
    assert [e.tokens for e in found] == counted
    assert client.store.get(client.store.recorded(found[0].request) or "")["estimated"]
    assert read_calls(client.store.ledger.path)[0]["tokens"] == sum(counted)


def test_the_reported_tokens_are_split_over_the_batch_exactly(client: LlmClient,
                                                              provider: Provider) -> None:
    provider.usage = lambda texts: {"prompt_tokens": 10}
    found = embed(client, "a", "bb bb", "c")
    assert sum(e.tokens for e in found) == 10 and all(e.tokens >= 1 for e in found)
    assert found[1].tokens > found[0].tokens  # in proportion to each text's own count


# -- budgets, errors, modes ------------------------------------------------------------------


def test_a_budget_refuses_the_worst_case_before_any_call(client: LlmClient,
                                                         provider: Provider) -> None:
    journal: list[dict[str, Any]] = []
    budget = Budget(key="grant:g1@1", label="grant g1", tokens=10)
    embed(client, "a", budgets=[budget])  # 1 token as counted, 7 reported: now 7 used
    provider.calls.clear()
    with pytest.raises(LLMBudgetExceeded) as caught:
        embed(client, "the sea", budgets=[Budget(key="grant:g1@1", label="grant g1",
                                                 tokens=8)], journal=journal)
    assert caught.value.phase == "before" and provider.calls == []
    assert journal[0]["error"] == "LLMBudgetExceeded"
    # The worst case of all the texts is checked before the first batch is called: the
    # first 64 would fit, all 70 do not.
    texts = [f"word {n}" for n in range(70)]
    first_batch = sum(litellm.token_counter(model=MODEL, text=text) for text in texts[:64])
    provider.usage = lambda texts: None  # so a call made would not fail after, either
    with pytest.raises(LLMBudgetExceeded) as caught:
        embed(client, *texts, budgets=[Budget(key="k", label="k", tokens=first_batch + 1)])
    assert caught.value.phase == "before" and provider.calls == []
    # A recorded text needs no budget at all.
    assert embed(client, "a", budgets=[Budget(key="k2", label="k2", tokens=0)])[0].cached


def test_a_cost_budget_is_checked_at_the_models_price(client: LlmClient,
                                                      provider: Provider) -> None:
    with pytest.raises(LLMBudgetExceeded) as caught:
        embed(client, "sea", budgets=[Budget(key="cost:g2@1", label="g2",
                                             cost=decimal.Decimal(0))])
    assert caught.value.unit == "USD" and provider.calls == []


def test_a_provider_that_reports_more_than_the_budget_fails_after(
        client: LlmClient, provider: Provider) -> None:
    provider.usage = lambda texts: {"prompt_tokens": 500}
    journal: list[dict[str, Any]] = []
    with pytest.raises(LLMBudgetExceeded) as caught:
        embed(client, "sea", journal=journal, budgets=[Budget(key="b", label="b", tokens=100)])
    assert caught.value.phase == "after" and len(provider.calls) == 1
    assert client.store.ledger.spent("b").tokens == 500  # what it used stays charged
    assert journal[0]["error"] == "LLMBudgetExceeded" and journal[0]["call"] == 1


@pytest.mark.parametrize(("error", "charged"), [
    (litellm.RateLimitError(message="slow down", llm_provider="openai", model=MODEL), False),
    (litellm.AuthenticationError(message="bad key", llm_provider="openai", model=MODEL), False),
    (litellm.Timeout(message="took too long", llm_provider="openai", model=MODEL), True),
])
def test_provider_errors_are_charged_as_for_completions(client: LlmClient, provider: Provider,
                                                        error: Exception,
                                                        charged: bool) -> None:
    provider.fail = error
    journal: list[dict[str, Any]] = []
    with pytest.raises(LLMProviderError) as caught:
        embed(client, "sea", "salt", journal=journal)
    assert caught.value.kind == type(error).__name__
    [call] = read_calls(client.store.ledger.path)
    assert call["settled"] and (call["tokens"] > 0) is charged
    assert [entry["error"] for entry in journal] == ["LLMProviderError"] * 2
    assert client.store.recorded(requests("sea")[0].hash) is None


def test_replay_mode_answers_recordings_and_a_miss_is_loud(client: LlmClient,
                                                           provider: Provider) -> None:
    embed(client, "sea")
    journal: list[dict[str, Any]] = []
    with pytest.raises(LLMReplayMiss) as caught:
        embed(client, "sea", "salt", mode=Mode.REPLAY, journal=journal)
    assert caught.value.request == requests("salt")[0].hash
    assert len(provider.calls) == 1
    assert [entry.get("error") for entry in journal] == [None, "LLMReplayMiss"]
    # The budgets first: what the original refused is refused again, not missing.
    with pytest.raises(LLMBudgetExceeded):
        embed(client, "salt", mode=Mode.REPLAY, budgets=[Budget(key="z", label="z", tokens=0)])


# -- the journal and the ledger ------------------------------------------------------------


def test_one_journal_entry_per_text_and_ledger_calls_of_kind_embedding(
        client: LlmClient, provider: Provider) -> None:
    embed(client, "sea")
    journal: list[dict[str, Any]] = []
    embed(client, "salt", "sea", "wind", journal=journal)
    salt, sea, wind = requests("salt", "sea", "wind")
    assert journal == [
        {"kind": "embedding", "request": salt.hash, "model": MODEL, "principal": "alice",
         "mode": "record", "call": 2, "cached": False, "tokens": 7},
        {"kind": "embedding", "request": sea.hash, "model": MODEL, "principal": "alice",
         "mode": "record", "call": None, "cached": True, "tokens": 7},
        {"kind": "embedding", "request": wind.hash, "model": MODEL, "principal": "alice",
         "mode": "record", "call": 2, "cached": False, "tokens": 7}]
    reserve, settle = client.store.ledger.entries()[2:]
    assert reserve["kind"] == settle["kind"] == "embedding"
    assert (reserve["op"], reserve["principal"], reserve["texts"]) == (7, "alice", 2)
    assert reserve["keys"] == ["principal:alice", "op:7"]
    assert (settle["tokens"], settle["cost"]) == (14, "2.8E-7")  # 14 tokens at 0.02 USD / 1M
    assert [call["kind"] for call in read_calls(client.store.ledger.path)] == ["embedding"] * 2


def test_completion_entries_are_unchanged(client: LlmClient) -> None:
    journal: list[dict[str, Any]] = []
    request = build_request("gpt-4o-mini", [{"role": "user", "content": "hi"}],
                            {"mock_response": "yo"})
    client.complete(request, principal="alice", op=7, journal=journal)
    assert "kind" not in journal[0]
    assert all("kind" not in line for line in client.store.ledger.entries())
    assert read_calls(client.store.ledger.path)[0]["kind"] == "completion"
