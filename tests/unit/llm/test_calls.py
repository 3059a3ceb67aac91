"""One call through the core: modes, streams, bad answers, provider errors, credentials."""

from __future__ import annotations

import decimal
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernos.errors import (
    LLMBudgetExceeded,
    LLMProviderError,
    LLMReplayMiss,
    LLMResponseInvalid,
    LLMToolCallInvalid,
    UsageError,
)
from kernos.llm import (
    Budget,
    LlmClient,
    LlmStore,
    Mode,
    _provider,
    build_request,
    current_mode,
    set_mode,
)
from llm_support import SECRET, metered, user

PROMPT = user("Tell me something true about the sea, in one short sentence please.")
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                                     "required": ["word"]}}}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[LlmClient]:
    set_mode(None)
    yield LlmClient(LlmStore(tmp_path))
    set_mode(None)


def ask(client: LlmClient, mode: Mode | None = None, journal: list[object] | None = None,
        **params: object):  # type: ignore[no-untyped-def]
    request = build_request(params.pop("model", "gpt-4o-mini"), params.pop("messages", PROMPT),
                            params)
    return client.complete(request, principal="human", op=1, mode=mode,
                           journal=journal)  # type: ignore[arg-type]


def test_a_call_returns_plain_data_and_is_recorded(client: LlmClient) -> None:
    journal: list[object] = []
    answer = ask(client, journal=journal, mock_response="The sea is salty.")
    assert answer.content == "The sea is salty."
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (10, 20)
    assert answer.cost == decimal.Decimal("0.0000135")  # litellm's price, exactly
    assert not answer.cached
    stored = client.store.get(answer.response)
    assert stored["answer"]["content"] == "The sea is salty."
    assert client.store.get(answer.request)["model"] == "gpt-4o-mini"
    assert client.store.recorded(answer.request) == answer.response
    [entry] = journal
    assert entry == {"request": answer.request, "response": answer.response,
                     "model": "gpt-4o-mini", "principal": "human", "mode": "record",
                     "cached": False, "call": 1, "latency_ms": answer.latency_ms,
                     "tokens": {"prompt_tokens": 10, "completion_tokens": 20,
                                "total_tokens": 30}, "cost": "0.0000135"}


def test_record_mode_answers_an_equal_request_from_its_recording(client: LlmClient) -> None:
    with metered() as meter:
        first = ask(client, model="meter/m", max_tokens=50)
        again = ask(client, model="meter/m", max_tokens=50)
        assert meter.calls == 1
        assert again.cached and again.content == first.content
        assert again.usage == first.usage  # a recorded answer is charged what it used
        fresh = ask(client, Mode.OFF, model="meter/m", max_tokens=50)
        assert meter.calls == 2 and not fresh.cached
    # off mode stores its answer, but the first recording stays the one replayed
    assert client.store.recorded(first.request) == first.response


def test_replay_mode_never_calls_and_a_miss_says_how_to_record(client: LlmClient) -> None:
    recorded = ask(client, mock_response="recorded")
    with metered() as meter:
        replayed = ask(client, Mode.REPLAY, mock_response="recorded")
        assert replayed.cached and replayed.content == "recorded"
        journal: list[object] = []
        with pytest.raises(LLMReplayMiss) as missed:
            ask(client, Mode.REPLAY, journal=journal, model="meter/m")
        assert meter.calls == 0
    message = str(missed.value)
    assert missed.value.request in message and len(missed.value.request) == 64
    assert "'meter/m'" in message and "KERNOS_LLM_MODE=record" in message
    assert journal == [{"request": missed.value.request, "model": "meter/m",
                        "principal": "human", "mode": "replay", "error": "LLMReplayMiss"}]
    assert recorded.request != missed.value.request


def test_the_mode_comes_from_the_environment_unless_set(monkeypatch: pytest.MonkeyPatch,
                                                        client: LlmClient) -> None:
    monkeypatch.delenv("KERNOS_LLM_MODE", raising=False)
    assert current_mode() is Mode.RECORD
    monkeypatch.setenv("KERNOS_LLM_MODE", "replay")
    assert current_mode() is Mode.REPLAY
    with pytest.raises(LLMReplayMiss):
        ask(client, mock_response="never called")
    assert set_mode("off") is Mode.OFF and current_mode() is Mode.OFF
    assert set_mode(None) is None and current_mode() is Mode.REPLAY
    monkeypatch.setenv("KERNOS_LLM_MODE", "sometimes")
    with pytest.raises(UsageError, match="off, record, replay"):
        current_mode()


def test_a_stream_is_consumed_and_recorded_whole(client: LlmClient) -> None:
    text = "The sea covers most of the planet and it is deep and old."
    streamed = ask(client, stream=True, mock_response=text)
    assert streamed.content == text
    assert client.store.get(streamed.response)["answer"]["content"] == text
    # no usage came with the stream: litellm's counts stand in, and say so
    assert streamed.usage.estimated and streamed.usage.completion_tokens > 5
    assert client.store.ledger.spent("op:1").tokens == 0  # op keys are the runtime's
    plain = ask(client, mock_response=text)
    assert plain.cached and plain.content == text  # one recording for both


def test_no_choices_is_a_malformed_answer(client: LlmClient) -> None:
    journal: list[object] = []
    with pytest.raises(LLMResponseInvalid, match="no choices") as raised:
        ask(client, journal=journal, mock_response={"choices": [], "model": "gpt-4o-mini"})
    [entry] = journal
    assert entry["error"] == "LLMResponseInvalid"  # type: ignore[index]
    assert client.store.get(entry["response"])["raw"]["choices"] == []  # type: ignore[index]
    assert client.store.recorded(raised.value.request) is None  # never replayed


@pytest.mark.parametrize(("arguments", "match"), [
    ('{"word": "sea"', "not JSON"),
    ('["sea"]', "not an object"),
    ('{"word": 3}', "word must be a string"),
    ('{}', "needs word"),
    ('{"word": "sea", "limit": 3}', "no argument 'limit'"),
])
def test_tool_calls_that_fail_their_schema_are_refused(client: LlmClient, arguments: str,
                                                       match: str) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup",
                                                         "arguments": arguments}}
    with pytest.raises(LLMToolCallInvalid, match=match) as raised:
        ask(client, tools=[LOOKUP], mock_response="", mock_tool_calls=[call])
    assert raised.value.tool == "lookup"


def test_a_call_to_a_tool_not_offered_is_refused_and_a_good_one_is_parsed(
        client: LlmClient) -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "delete_everything", "arguments": "{}"}}
    with pytest.raises(LLMToolCallInvalid, match="not one of the tools offered"):
        ask(client, tools=[LOOKUP], mock_response="", mock_tool_calls=[call])
    good = {"id": "c2", "type": "function",
            "function": {"name": "lookup", "arguments": '{"word": "sea"}'}}
    answer = ask(client, tools=[LOOKUP], mock_response="", mock_tool_calls=[good])
    assert [(c.id, c.name, c.arguments) for c in answer.tool_calls] == [
        ("c2", "lookup", {"word": "sea"})]


@pytest.mark.parametrize(("mock", "kind", "retryable"), [
    ("litellm.RateLimitError", "RateLimitError", True),
    ("litellm.ContextWindowExceededError", "ContextWindowExceededError", False),
    ("litellm.InternalServerError", "InternalServerError", True),
])
def test_provider_errors_are_mapped(client: LlmClient, mock: str, kind: str,
                                    retryable: bool) -> None:
    with pytest.raises(LLMProviderError) as raised:
        ask(client, mock_response=mock)
    assert (raised.value.kind, raised.value.retryable) == (kind, retryable)
    assert raised.value.model == "gpt-4o-mini" and raised.value.request[:16] in str(raised.value)
    assert client.store.recorded(raised.value.request) is None
    # a refused call is charged nothing
    assert client.store.ledger.entries()[-1]["tokens"] == 0


def test_budgets_are_checked_before_and_after(client: LlmClient) -> None:
    budget = Budget(key="op:1", label="op 1", tokens=100)
    with pytest.raises(LLMBudgetExceeded, match="may use up to") as before:
        ask_budget(client, [budget], max_tokens=200)
    assert before.value.phase == "before"
    # mock answers report 30 tokens whatever max_tokens says: the provider overshoots
    # the estimate (prompt + 1), what it used stays charged, and the call fails
    tight = Budget(key="op:2", label="op 2", tokens=20)
    with pytest.raises(LLMBudgetExceeded, match="used more than estimated") as after:
        ask_budget(client, [tight], max_tokens=1, messages=user("hi"), keys=["op:2"])
    assert after.value.phase == "after"
    assert client.store.ledger.spent("op:2").tokens == 30
    with pytest.raises(LLMBudgetExceeded, match="Nothing was called") as refused:
        ask_budget(client, [tight], max_tokens=1, messages=user("hi"), keys=["op:2"])
    assert refused.value.phase == "before"
    assert client.store.ledger.spent("op:2").tokens == 30


def ask_budget(client: LlmClient, budgets: list[Budget], *, keys: tuple[str, ...] | list[str]
               = (), messages: object = PROMPT, **params: object):  # type: ignore[no-untyped-def]
    request = build_request("gpt-4o-mini", messages, {"mock_response": "x", **params})
    return client.complete(request, principal="alice", op=1, budgets=budgets, charge=keys,
                           mode=Mode.OFF)


def test_a_cost_budget_is_checked_at_the_models_price(client: LlmClient) -> None:
    cheap = Budget(key="cost:g1@1", label="grant g1", cost=decimal.Decimal("0.0001"))
    ask_budget(client, [cheap], max_tokens=100)
    assert client.store.ledger.spent("cost:g1@1").cost == decimal.Decimal("0.0000135")
    with pytest.raises(LLMBudgetExceeded, match="USD"):
        ask_budget(client, [cheap], max_tokens=1000)


def test_no_credential_from_the_environment_is_ever_recorded(
        client: LlmClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with metered() as meter:
        meter.leak_key = True  # the provider puts the key in fields of its answer
        answer = ask(client, model="meter/m", stream=False)
        assert answer.content
        meter.fail = "AuthenticationError"  # and in its error message
        with pytest.raises(LLMProviderError) as raised:
            ask(client, Mode.OFF, model="meter/m")
    assert SECRET not in str(raised.value) and "[redacted]" in str(raised.value)
    found = [path for path in tmp_path.rglob("*") if path.is_file()
             and SECRET.encode() in path.read_bytes()]
    assert found == []
    assert len(list(tmp_path.rglob("*.json"))) >= 2  # there was something to search


def test_objects_are_written_atomically_once_and_read_back(tmp_path: Path) -> None:
    store = LlmStore(tmp_path)
    name = store.put({"b": 1, "a": [1, 2]})
    path = store.objects / f"{name}.json"
    assert path.read_bytes() == b'{"a":[1,2],"b":1}'
    before = path.stat().st_mtime_ns
    assert store.put({"a": [1, 2], "b": 1}) == name  # content-addressed: not rewritten
    assert path.stat().st_mtime_ns == before
    store.record("r" * 64, name)
    store.record("r" * 64, "0" * 64)  # first one wins
    assert store.recorded("r" * 64) == name
    assert list(store.scratch.iterdir()) == []  # no temporary file left behind


def test_the_ledger_survives_a_torn_line_and_charges_calls_in_doubt(tmp_path: Path) -> None:
    store = LlmStore(tmp_path)
    ledger = store.ledger
    number = ledger.reserve(budgets=[], keys=["grant:g1@1"], tokens=100, cost=None, facts={},
                            request="r", model="m")
    ledger.settle(number, tokens=40, cost=None, facts={})
    ledger.reserve(budgets=[], keys=["grant:g1@1"], tokens=70, cost=None, facts={},
                   request="r", model="m")  # the process dies during this call
    with open(ledger.path, "ab") as file:
        file.write(b'{"type": "settle", "call": 2, "tok')  # and while writing this
    reopened = LlmStore(tmp_path).ledger
    assert reopened.spent("grant:g1@1").tokens == 40 + 70  # in doubt: the worst case
    assert reopened.in_doubt == 1
    assert ledger.path.read_bytes().endswith(b"\n")
    assert [json.loads(line)["call"] for line in ledger.path.read_bytes().splitlines()] \
        == [1, 1, 2]
    assert reopened.next_call == 3


def test_the_package_sets_an_offline_price_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LITELLM_LOCAL_MODEL_COST_MAP")
    monkeypatch.setattr(_provider, "_module", None)
    _provider.litellm()
    assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == "True"
