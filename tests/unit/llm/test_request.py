"""The canonical request: an allowlist of parameters, and a hash that ignores key order."""

from __future__ import annotations

import pytest

from kernos.errors import LLMRequestInvalid
from kernos.llm import DEFAULT_MAX_TOKENS, PARAMS, build_request

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {
    "name": "lookup", "description": "Look a word up",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                   "required": ["word"]}}}


def test_the_hash_does_not_depend_on_key_order() -> None:
    one = build_request("gpt-4o-mini", MESSAGES, {"temperature": 0, "seed": 7,
                                                  "tools": [TOOL]})
    reordered = [dict(reversed(list(message.items()))) for message in MESSAGES]
    tool = {"function": dict(reversed(list(TOOL["function"].items()))), "type": "function"}
    two = build_request("gpt-4o-mini", reordered, {"tools": [tool], "seed": 7,
                                                   "temperature": 0.0})
    assert one.hash == two.hash
    assert len(one.hash) == 64


def test_anything_that_changes_the_answer_changes_the_hash() -> None:
    base = build_request("gpt-4o-mini", MESSAGES, {})
    variants = [
        build_request("gpt-4o", MESSAGES, {}),
        build_request("gpt-4o-mini", MESSAGES[1:], {}),
        build_request("gpt-4o-mini", MESSAGES, {"temperature": 0.5}),
        build_request("gpt-4o-mini", MESSAGES, {"max_tokens": 10}),
        build_request("gpt-4o-mini", MESSAGES, {"mock_response": "x"}),
        build_request("gpt-4o-mini", MESSAGES, {"tools": [TOOL]}),
    ]
    assert len({base.hash, *(variant.hash for variant in variants)}) == 1 + len(variants)


def test_streaming_shares_the_recording_of_the_same_request() -> None:
    plain = build_request("gpt-4o-mini", MESSAGES, {})
    streamed = build_request("gpt-4o-mini", MESSAGES, {"stream": True})
    assert streamed.stream and not plain.stream
    assert streamed.hash == plain.hash


def test_max_tokens_is_always_bounded() -> None:
    assert build_request("m", MESSAGES, {}).max_tokens == DEFAULT_MAX_TOKENS
    assert build_request("m", MESSAGES, {"max_tokens": 5}).max_tokens == 5
    for bad in (0, -1, 10**7, 1.5, True, "10"):
        with pytest.raises(LLMRequestInvalid, match="max_tokens"):
            build_request("m", MESSAGES, {"max_tokens": bad})


@pytest.mark.parametrize("name", ["api_key", "api_base", "base_url", "headers", "callbacks",
                                  "extra_headers", "n", "custom_llm_provider", "timeout"])
def test_parameters_outside_the_allowlist_are_refused_by_name(name: str) -> None:
    with pytest.raises(LLMRequestInvalid) as raised:
        build_request("gpt-4o-mini", MESSAGES, {name: "https://evil.example"})
    message = str(raised.value)
    assert name in message
    for allowed in PARAMS:
        assert allowed in message


@pytest.mark.parametrize(("params", "match"), [
    ({"temperature": 3}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": "1"}, "top_p"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stream": 1}, "stream"),
    ({"tool_choice": "auto"}, "tool_choice needs tools"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": []}}]},
     "schema"),
    ({"tools": [TOOL, TOOL]}, "twice"),
    ({"mock_response": 3}, "mock_response"),
])
def test_bad_values_get_a_clear_error(params: dict[str, object], match: str) -> None:
    with pytest.raises(LLMRequestInvalid, match=match):
        build_request("gpt-4o-mini", MESSAGES, params)


@pytest.mark.parametrize(("model", "messages", "match"), [
    ("", MESSAGES, "model"),
    ("gpt 4", MESSAGES, "model"),
    (b"gpt", MESSAGES, "model"),
    ("gpt-4o-mini", [], "non-empty list"),
    ("gpt-4o-mini", "hello", "non-empty list"),
    ("gpt-4o-mini", [{"role": "wizard", "content": "x"}], "role"),
    ("gpt-4o-mini", [{"role": "user", "content": "x", "api_key": "k"}], "unknown keys"),
    ("gpt-4o-mini", [{"role": "user", "content": 3}], "content"),
    ("gpt-4o-mini", [{"role": "user", "content": float("inf")}], "JSON"),
])
def test_bad_models_and_messages_are_refused(model: object, messages: object,
                                             match: str) -> None:
    with pytest.raises(LLMRequestInvalid, match=match):
        build_request(model, messages, {})


def test_provider_prefixed_models_are_accepted() -> None:
    request = build_request("anthropic/claude-3-5-haiku", MESSAGES, {})
    assert request.litellm_arguments()["model"] == "anthropic/claude-3-5-haiku"
    assert "api_key" not in request.litellm_arguments()


def test_tuples_become_lists_and_tool_schemas_are_kept_for_checking() -> None:
    request = build_request("m", ({"role": "user", "content": "x"},),
                            {"stop": ("a", "b"), "tools": (TOOL,)})
    assert request.messages == [{"role": "user", "content": "x"}]
    assert request.params["stop"] == ["a", "b"]
    assert request.tools == {"lookup": TOOL["function"]["parameters"]}


def test_the_llm_exports_are_the_intended_ones() -> None:
    import kernos.llm

    assert set(kernos.llm.__all__) == {
        "DEFAULT_MAX_TOKENS", "ENVIRONMENT", "LEDGER_FILE", "PARAMS", "Budget", "Completion",
        "Ledger", "LlmClient", "LlmStore", "Mode", "Request", "Spent", "ToolCall", "Usage",
        "build_request", "current_mode", "set_mode", "EMBEDDING_PARAMS", "MAX_DIMENSIONS",
        "MAX_INPUT_CHARS", "Embedding", "EmbeddingRequest", "build_embedding_request"}
    for name in kernos.llm.__all__:
        assert hasattr(kernos.llm, name), name
