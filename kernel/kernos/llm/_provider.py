"""The one place that talks to litellm: calls, streams, usage, prices, errors.

litellm is imported on the first call, not with Kernos (it takes seconds to
import), with ``LITELLM_LOCAL_MODEL_COST_MAP`` defaulted to ``True`` so that
it never fetches its price list from the network.  Credentials are
litellm's usual environment variables (``OPENAI_API_KEY``,
``ANTHROPIC_API_KEY`` ...): nothing here passes a key, an endpoint or a
header, and nothing recorded is taken from litellm's objects except the
allowlisted fields of :func:`normalize`.  Provider messages are stripped of
every credential-looking environment value before they are shown or kept.
"""

from __future__ import annotations

import decimal
import json
import math
import os
import re
from collections.abc import Callable
from typing import Any

from kernos import amounts
from kernos.determinism import generators_untouched
from kernos.errors import LLMProviderError, LLMResponseInvalid, UsageError
from kernos.llm._request import Request

__all__ = ["call", "call_embedding", "count_text_tokens", "estimate_cost",
           "estimate_prompt_tokens", "litellm", "normalize", "redact", "warm"]

IN_DOUBT = frozenset({"Timeout", "APIConnectionError"})
"""Provider errors after which the provider may have done the work: charged the worst case
(as is a malformed answer); other provider errors (refusals) are charged nothing."""

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
_module: Any = None


def litellm() -> Any:
    """The litellm module, imported once (offline price list, quiet)."""
    global _module
    if _module is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            with generators_untouched():  # some of what it imports draws from `random`
                import litellm as module
        except ImportError:
            raise UsageError("LLM calls need litellm: pip install 'kernos[llm]'") from None
        module.suppress_debug_info = True  # it prints provider lists to stdout otherwise
        _module = module
    return _module


def warm() -> None:
    """Import litellm and load what its first call loads (a tokenizer), with no network."""
    module = litellm()
    messages = [{"role": "user", "content": "warm"}]
    with generators_untouched():
        module.token_counter(model="gpt-4o-mini", messages=messages)
        module.completion(model="gpt-4o-mini", messages=messages, mock_response="warm")


def redact(text: str, environ: dict[str, str] | None = None) -> str:
    """``text`` with the value of every credential-looking environment variable removed."""
    environ = dict(os.environ) if environ is None else environ
    for name, value in environ.items():
        if len(value) >= 8 and _SECRET_NAME.search(name) and value in text:
            text = text.replace(value, "[redacted]")
    return text


Completion = Callable[..., Any]


def call(request: Request, *, timeout: float | None,
         completion: Completion | None = None) -> dict[str, Any]:
    """Make the call; the provider's whole answer as a dict (a stream is consumed whole).

    Provider failures become :class:`LLMProviderError`.
    """
    module = litellm()
    completion = completion or module.completion
    arguments = request.litellm_arguments()
    if timeout is not None:
        arguments["timeout"] = timeout
    try:
        with generators_untouched():  # a provider's retries may jitter with `random`
            answer = completion(**arguments)
            if request.stream:
                chunks = list(answer)
                answer = module.stream_chunk_builder(chunks, messages=request.messages)
                if answer is not None and not any(_reports_usage(chunk) for chunk in chunks):
                    # The builder counts tokens itself when no chunk reported usage
                    # (litellm >= 1.110): an estimate, so the caller must see it as one.
                    answer = _without_usage(answer)
        if request.stream and answer is None:
            raise LLMResponseInvalid("the stream ended without a chunk",
                                     request=request.hash, model=request.model)
    except LLMResponseInvalid:
        raise
    except Exception as error:
        raise LLMProviderError.from_exception(error, request=request.hash,
                                              model=request.model,
                                              text=redact(str(error))) from None
    dump = getattr(answer, "model_dump", None)
    raw = dump() if callable(dump) else answer
    if type(raw) is not dict:
        raise LLMResponseInvalid(f"the answer is a {type(raw).__name__}, not a completion",
                                 request=request.hash, model=request.model)
    return raw


def call_embedding(model: str, inputs: list[str], params: dict[str, Any], *,
                   timeout: float | None, embedding: Completion | None, request: str
                   ) -> dict[str, Any]:
    """``litellm.embedding`` of ``inputs`` (``request``: a hash that errors name); the whole
    answer as a dict.  Provider failures become :class:`LLMProviderError`."""
    module = litellm()
    embedding = embedding or module.embedding
    arguments: dict[str, Any] = {"model": model, "input": list(inputs), **params}
    if timeout is not None:
        arguments["timeout"] = timeout
    try:
        with generators_untouched():  # a provider's retries may jitter with `random`
            answer = embedding(**arguments)
    except Exception as error:
        raise LLMProviderError.from_exception(error, request=request, model=model,
                                              text=redact(str(error))) from None
    dump = getattr(answer, "model_dump", None)
    raw = dump() if callable(dump) else answer
    if type(raw) is not dict:
        raise LLMResponseInvalid(f"the answer is a {type(raw).__name__}, not an embedding "
                                 "response", request=request, model=model)
    return raw


def count_text_tokens(model: str, text: str) -> int:
    """The tokens of ``text`` as litellm counts them for the model (its UTF-8 bytes, an upper
    bound, if it cannot); at least 1."""
    try:
        counted = litellm().token_counter(model=model, text=text)
        if type(counted) is int and counted > 0:
            return counted
    except Exception:  # an unknown tokenizer: fall back to an upper bound
        pass
    return max(1, len(text.encode("utf-8", "surrogatepass")))


def _reports_usage(chunk: object) -> bool:
    usage = getattr(chunk, "usage", None)
    if usage is None and type(chunk) is dict:
        usage = chunk.get("usage")
    return usage is not None


def _without_usage(answer: Any) -> Any:
    dump = getattr(answer, "model_dump", None)
    raw = dump() if callable(dump) else answer
    return {**raw, "usage": None} if type(raw) is dict else raw


def normalize(raw: dict[str, Any], request: Request) -> dict[str, Any]:
    """The allowlisted, plain-JSON part of an answer: what is recorded and returned.

    Raises :class:`LLMResponseInvalid` for an answer without a usable choice.
    """
    def bad(problem: str) -> LLMResponseInvalid:
        return LLMResponseInvalid(problem, request=request.hash, model=request.model)

    choices = raw.get("choices")
    if type(choices) is not list or not choices:
        raise bad("it has no choices")
    choice = choices[0]
    message = choice.get("message") if type(choice) is dict else None
    if type(message) is not dict:
        raise bad("its first choice has no message")
    content = message.get("content")
    if content is not None and type(content) is not str:
        raise bad(f"the message content is a {type(content).__name__}, not text")
    calls = []
    for index, tool_call in enumerate(message.get("tool_calls") or []):
        function = tool_call.get("function") if type(tool_call) is dict else None
        if type(function) is not dict or type(function.get("name")) is not str or \
                type(function.get("arguments")) not in (str, type(None)):
            raise bad(f"tool call {index} has no function name and arguments")
        identifier = tool_call.get("id")
        calls.append({"id": identifier if type(identifier) is str else f"call_{index}",
                      "name": function["name"][:200],
                      "arguments": function.get("arguments") or "{}"})
    finish = choice.get("finish_reason")
    model = raw.get("model")
    return {"model": model if type(model) is str else request.model,
            "content": content, "tool_calls": calls,
            "finish_reason": finish if type(finish) is str else None,
            "usage": _usage(raw.get("usage"), bad)}


def _usage(found: object, bad: Callable[[str], LLMResponseInvalid]) -> dict[str, int] | None:
    """The reported usage, None if the provider reported none (or only zeros)."""
    if found is None:
        return None
    if type(found) is not dict:
        raise bad("its usage is not a mapping")
    numbers = {}
    for name in ("prompt_tokens", "completion_tokens"):
        value = found.get(name, 0)
        if value is None:
            value = 0
        if type(value) is not int or not 0 <= value < 10**9:
            raise bad(f"its usage reports {name} = {str(value)[:40]}")
        numbers[name] = value
    if not numbers["prompt_tokens"] and not numbers["completion_tokens"]:
        return None
    numbers["total_tokens"] = numbers["prompt_tokens"] + numbers["completion_tokens"]
    return numbers


def estimate_prompt_tokens(request: Request) -> int:
    """The prompt's tokens as litellm counts them for the model (bytes, if it cannot)."""
    try:
        counted = litellm().token_counter(model=request.model, messages=request.messages,
                                          tools=request.params.get("tools"))
        if type(counted) is int and counted > 0:
            return counted
    except Exception:  # an unknown tokenizer: fall back to an upper bound
        pass
    return len(json.dumps(request.messages).encode("utf-8"))


def count_completion_tokens(request: Request, answer: dict[str, Any]) -> int:
    text = (answer.get("content") or "") + "".join(
        call["name"] + call["arguments"] for call in answer["tool_calls"])
    try:
        counted = litellm().token_counter(model=request.model, text=text)
        if type(counted) is int:
            return counted
    except Exception:
        pass
    return len(text.encode("utf-8"))


def estimate_cost(model: str, prompt_tokens: int, completion_tokens: int) -> decimal.Decimal | None:
    """USD from litellm's price table (what ``completion_cost`` uses); None if unpriced."""
    try:
        prompt, completion = litellm().cost_per_token(
            model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    except Exception:  # litellm knows no price for the model
        return None
    # repr() of a float is its shortest exact-round-trip decimal: no binary noise; the
    # sum is rounded up to the places budgets count in (kernos.amounts), never down.
    return amounts.round_up(amounts.add(decimal.Decimal(repr(float(prompt))),
                                        decimal.Decimal(repr(float(completion)))))


def jsonable(raw: object) -> Any:
    """A malformed answer, kept for inspection as JSON (unknown objects as their type, a
    NaN or an infinity as its name: canonical JSON holds neither)."""
    try:
        return _finite(json.loads(json.dumps(raw, default=lambda item:
                                              f"<{type(item).__name__}>")))
    except (TypeError, ValueError, RecursionError):
        return f"<{type(raw).__name__}>"


def _finite(value: Any) -> Any:
    if type(value) is float and not math.isfinite(value):
        return repr(value)
    if type(value) is list:
        return [_finite(item) for item in value]
    if type(value) is dict:
        return {key: _finite(item) for key, item in value.items()}
    return value
