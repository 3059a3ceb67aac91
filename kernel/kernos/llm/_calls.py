"""One LLM call, start to finish: recording, budgets, the provider, the answer.

:meth:`LlmClient.complete` does, in order:

1. in ``record`` or ``replay`` mode, look up the recording of the request's
   hash; ``replay`` without one raises :class:`~kernos.errors.LLMReplayMiss`;
2. reserve the call's worst case against every :class:`Budget` (a recorded
   answer: exactly what it used; otherwise the prompt's tokens as litellm
   counts them plus ``max_tokens``, and that at the model's price; a replay
   reserves what the original did, the estimate for a call it made fresh):
   over a limit, :class:`~kernos.errors.LLMBudgetExceeded` and nothing is called;
3. call the provider (a stream is consumed whole), store the request and
   the answer, and record the answer for the request (first one wins);
4. settle the reservation with what the provider reported (if it reported
   no usage, litellm's count of the prompt and the answer), and check the
   budgets again: a provider that used more than its limit still charges
   what it used, and the call fails;
5. parse every tool call's arguments as JSON and check them against the
   schema of the tool they name.

Every call that reached step 2 is appended to ``journal`` (the op's list of
LLM calls, which its audit record holds), also when it failed.  A recorded
answer is charged what it used, like a fresh one: budgets meter what a
principal consumed, and a session replays with the same charges.
"""

from __future__ import annotations

import decimal
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kernos import amounts
from kernos.errors import (
    LLMError,
    LLMProviderError,
    LLMRecordingErased,
    LLMReplayMiss,
    LLMToolCallInvalid,
)
from kernos.llm import _embed_calls, _provider
from kernos.llm._embed import EmbeddingRequest
from kernos.llm._embed_calls import Embedding
from kernos.llm._mode import Mode, current_mode
from kernos.llm._request import Request
from kernos.llm._store import Budget, LlmStore
from kernos.llm.schema import check_arguments
from kernos.personal import touched_subjects

__all__ = ["Completion", "LlmClient", "ToolCall", "Usage"]



@dataclass(frozen=True, kw_only=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    estimated: bool = False
    """The provider reported none: these are litellm's counts of the prompt and answer."""


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    id: str
    """The provider's id for the call (answer it with a ``tool`` message of that id)."""
    name: str
    """The tool it calls (one of those offered)."""
    arguments: dict[str, Any]
    """Its arguments, parsed and checked against the tool's schema."""


@dataclass(frozen=True, kw_only=True)
class Completion:
    """The answer to one call, as plain data."""

    content: str | None
    """The text of the answer (None when it only calls tools)."""
    tool_calls: list[ToolCall]
    """Tool calls in the answer, checked."""
    finish_reason: str | None
    """Why the model stopped (``stop``, ``length``, ``tool_calls`` ...)."""
    usage: Usage
    """Tokens used."""
    cost: decimal.Decimal | None
    """USD, from litellm's price table; None for a model it has no price for."""
    model: str
    """The model that answered (as the provider names it)."""
    cached: bool
    """Answered from a recording, without calling the provider."""
    request: str
    """The request's hash."""
    response: str
    """The stored answer's hash."""
    call: int
    """The call's number in the ledger."""
    latency_ms: float = field(default=0.0, compare=False)
    """How long the provider took (0 for a recorded answer)."""

    def to_plain(self) -> dict[str, Any]:
        """What agent code gets: plain data only."""
        return {
            "content": self.content,
            "tool_calls": [{"id": call.id, "name": call.name, "arguments": call.arguments}
                           for call in self.tool_calls],
            "finish_reason": self.finish_reason,
            "usage": {"prompt_tokens": self.usage.prompt_tokens,
                      "completion_tokens": self.usage.completion_tokens,
                      "total_tokens": self.usage.total_tokens},
            "cost": self.cost, "model": self.model, "cached": self.cached,
            "request": self.request,
        }


class LlmClient:
    """Makes recorded, budgeted calls against one :class:`LlmStore`."""

    def __init__(self, store: LlmStore, *, completion: _provider.Completion | None = None,
                 embedding: _provider.Completion | None = None) -> None:
        self.store = store
        self.completion = completion
        """Stands in for ``litellm.completion`` (tests); None: litellm's own."""
        self.embedding = embedding
        """Stands in for ``litellm.embedding`` (tests); None: litellm's own."""
        self.replay_cached: list[bool] = []
        """A replay's ``cached`` flags for the op's next calls, as the original reported
        them (in replay mode every answer comes from a recording, but what code was
        told must be what it was told then)."""

    def complete(self, request: Request, *, principal: str, op: int | None,
                 budgets: Sequence[Budget] = (), charge: Sequence[str] = (),
                 journal: list[dict[str, Any]] | None = None, mode: Mode | None = None,
                 timeout: float | None = None) -> Completion:
        """One call (see the module docstring); ``charge`` are ledger keys charged, unlimited."""
        mode = mode or current_mode()
        ledger = self.store.ledger
        entry: dict[str, Any] = {"request": request.hash, "model": request.model,
                                 "principal": principal, "mode": mode.value}
        if journal is not None:
            journal.append(entry)
        facts = {"op": op, "principal": principal}
        recorded = self.store.recorded(request.hash) if mode is not Mode.OFF else None
        stored = None
        if recorded is not None:
            try:
                stored = self.store.get(recorded)
            except LLMRecordingErased as error:
                if mode is Mode.REPLAY:
                    entry["error"] = type(error).__name__
                    raise
                recorded = None  # erased with a data subject: asked again, if ever
        subjects = touched_subjects()  # what this op's exchange may hold: sealed under them
        cached = stored is not None
        if mode is Mode.REPLAY and stored is not None and self.replay_cached:
            cached = self.replay_cached.pop(0)  # as the original reported it
        if stored is not None and cached:  # a replay reserves as the original did
            worst = stored["usage"]["total_tokens"]
            worst_cost = _cost(stored["cost"])
        else:
            prompt = _provider.estimate_prompt_tokens(request)
            worst = prompt + request.max_tokens
            worst_cost = _provider.estimate_cost(request.model, prompt, request.max_tokens)
        if recorded is None and mode is Mode.REPLAY:
            # The budgets first: a call the original refused for its budget (and so
            # never recorded) is refused again, not reported missing.
            try:
                ledger.admit(budgets, tokens=worst, cost=worst_cost, request=request.hash,
                             model=request.model)
            except LLMError as error:
                entry["error"] = type(error).__name__
                raise
            entry["error"] = "LLMReplayMiss"
            raise LLMReplayMiss(request=request.hash, model=request.model,
                                store=str(self.store.path))
        entry["cached"] = cached
        try:
            number = ledger.reserve(budgets=budgets, keys=charge, tokens=worst, cost=worst_cost,
                                    facts=facts, request=request.hash, model=request.model)
        except LLMError as error:
            entry["error"] = type(error).__name__
            raise
        entry["call"] = number
        latency = 0.0
        if stored is None:
            started = time.perf_counter()
            answered = False
            try:
                self.store.put(request.canonical(), subjects=subjects)
                raw = _provider.call(request, timeout=timeout, completion=self.completion)
                answered = True
                answer = _provider.normalize(raw, request)
            except LLMError as error:
                # A malformed answer was still produced (and billed); a refused call was not.
                in_doubt = (not isinstance(error, LLMProviderError)
                            or error.kind in _provider.IN_DOUBT)
                spent = worst if in_doubt else 0
                ledger.settle(number, tokens=spent, cost=worst_cost if spent else None,
                              facts={"error": type(error).__name__})
                entry.update(error=type(error).__name__, tokens=_tokens(spent, 0))
                if not isinstance(error, LLMProviderError):
                    entry["response"] = self.store.put({"raw": _provider.jsonable(raw)},
                                                       subjects=subjects)
                raise
            except Exception as error:
                # Kernos failed on its own side.  Before the provider answered (no
                # litellm, a store error) nothing was used: the reservation is released
                # whole; after, the answer may have been billed: it is charged whole.
                spent = worst if answered else 0
                ledger.settle(number, tokens=spent, cost=worst_cost if spent else None,
                              facts={"error": type(error).__name__})
                entry.update(error=type(error).__name__, tokens=_tokens(spent, 0))
                raise
            latency = round((time.perf_counter() - started) * 1000, 3)
            stored = self._stored(request, answer)
            response = self.store.put(stored, subjects=subjects)
            self.store.record(request.hash, response)
        else:
            assert recorded is not None
            response = recorded
        usage = stored["usage"]
        cost = _cost(stored["cost"])
        ledger.settle(number, tokens=usage["total_tokens"], cost=cost,
                      facts={"response": response, "cached": entry["cached"],
                             "latency_ms": latency})
        entry.update(call=number, response=response, latency_ms=latency,
                     tokens={key: usage[key] for key in
                             ("prompt_tokens", "completion_tokens", "total_tokens")},
                     cost=None if cost is None else str(cost))
        try:
            ledger.check(budgets, asked=usage["total_tokens"], asked_cost=cost,
                         request=request.hash, model=request.model)
            calls = _tool_calls(stored["answer"], request)
        except LLMError as error:
            entry["error"] = type(error).__name__
            raise
        return Completion(
            content=stored["answer"]["content"], tool_calls=calls,
            finish_reason=stored["answer"]["finish_reason"],
            usage=Usage(prompt_tokens=usage["prompt_tokens"],
                        completion_tokens=usage["completion_tokens"],
                        total_tokens=usage["total_tokens"], estimated=usage["estimated"]),
            cost=cost, model=stored["answer"]["model"], cached=entry["cached"],
            request=request.hash, response=response, call=number, latency_ms=latency)

    def embed(self, requests: Sequence[EmbeddingRequest], *, principal: str, op: int | None,
              budgets: Sequence[Budget] = (), charge: Sequence[str] = (),
              journal: list[dict[str, Any]] | None = None, mode: Mode | None = None,
              timeout: float | None = None) -> list[Embedding]:
        """The vector of each request's text, in order (see :mod:`kernos.llm._embed_calls`:
        a recorded text is charged nothing, unlike a recorded completion)."""
        return _embed_calls.embed(self, requests, principal=principal, op=op, budgets=budgets,
                                  charge=charge, journal=journal, mode=mode, timeout=timeout)

    def _stored(self, request: Request, answer: dict[str, Any]) -> dict[str, Any]:
        """What is stored for an answer: the answer, its usage and its price."""
        usage = answer.pop("usage")
        estimated = usage is None
        if usage is None:
            prompt = _provider.estimate_prompt_tokens(request)
            completion = _provider.count_completion_tokens(request, answer)
            usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion}
        cost = _provider.estimate_cost(request.model, usage["prompt_tokens"],
                                       usage["completion_tokens"])
        return {"request": request.hash, "answer": answer,
                "usage": {**usage, "estimated": estimated},
                "cost": None if cost is None else str(cost)}


def _cost(text: object) -> decimal.Decimal | None:
    return None if text is None else amounts.round_up(decimal.Decimal(str(text)))


def _tokens(total: int, prompt: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": total - prompt, "total_tokens": total}


def _tool_calls(answer: dict[str, Any], request: Request) -> list[ToolCall]:
    calls = []
    for found in answer["tool_calls"]:
        name = found["name"]

        def bad(problem: str, name: str = name) -> LLMToolCallInvalid:
            return LLMToolCallInvalid(name, problem, request=request.hash, model=request.model)

        schema = request.tools.get(name)
        if schema is None:
            offered = ", ".join(sorted(request.tools)) or "none"
            raise bad(f"it is not one of the tools offered ({offered})")
        try:
            arguments = json.loads(found["arguments"])
        except json.JSONDecodeError as error:
            raise bad(f"the arguments are not JSON ({error.msg} at {error.pos})") from None
        if type(arguments) is not dict:
            raise bad(f"the arguments are a JSON {type(arguments).__name__}, not an object")
        try:
            check_arguments(name, schema, arguments)
        except TypeError as error:
            raise bad(str(error)) from None
        calls.append(ToolCall(id=found["id"], name=name, arguments=arguments))
    return calls
