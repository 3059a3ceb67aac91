"""Embedding calls: recorded per text, budgeted per provider call.

:meth:`LlmClient.embed <kernos.llm.LlmClient.embed>` takes a list of
:class:`~kernos.llm._embed.EmbeddingRequest` (one text each) and does, in
order:

1. in ``record`` or ``replay`` mode, answer every text whose request has a
   recording from it: **charged nothing, and no provider call**.  This
   differs from completions on purpose: a recorded completion is charged
   what it used, because budgets meter what a principal consumed; an
   embedding feeds a cache (the memory index), and rebuilding that cache from
   the recordings must not pay for the same vectors twice.  A text is
   recorded once, whatever it was batched with, so any later batch finds it;
2. reserve nothing yet, but check the worst case of every text left (its
   tokens as litellm counts them, and their price: an embedding has no
   completion tokens) against every :class:`~kernos.llm.Budget`: over a
   limit, :class:`~kernos.errors.LLMBudgetExceeded` and nothing is called.
   ``replay`` mode then raises :class:`~kernos.errors.LLMReplayMiss` (the
   budgets first, as for completions: a call the original refused is refused
   again, not reported missing);
3. call ``litellm.embedding`` in batches of at most :data:`BATCH` texts of
   the same model and parameters (one text per call with ``mock_response``:
   litellm's mock answers one vector whatever the input), each a ledger call
   of its own (``"kind": "embedding"`` in its facts) reserved at its worst
   case before it is made;
4. check the answer (one finite vector per text, at the index it names, all
   of one length, that of ``dimensions`` if it was asked), store each text's
   request and answer (sealed under the data subjects the op touched, as
   completions are, so erasing a subject shreds them) and record the answer
   for the request (first one wins);
5. settle the ledger call with the prompt tokens the provider reported
   (litellm's count if it reported none), split over the texts of the batch
   for each one's ``tokens``, and check the budgets again.

Provider errors are settled as for completions: a timeout or a lost
connection (the provider may have done the work) and a malformed answer are
charged the worst case, a refusal nothing.

**The journal** (the op's ``llm_calls``, its audit record's ``llm``) gets
*one entry per text*, in the order of the requests, also when the call
failed: ``{"kind": "embedding", "request", "model", "principal", "mode",
"cached", "call", "tokens"}`` and ``"error"`` (the error's class name) for a
text the call failed for.  ``call`` is the ledger call that embedded the text
(several texts of a batch share it), None for a recorded one.  Completion
entries have no ``kind``.  No entry names the answer: a vector is not text
anyone reads in an audit record.
"""

from __future__ import annotations

import decimal
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kernos.audit.canonical import canonical
from kernos.errors import (
    LLMError,
    LLMProviderError,
    LLMRecordingErased,
    LLMReplayMiss,
    LLMResponseInvalid,
)
from kernos.llm import _provider
from kernos.llm._embed import MAX_DIMENSIONS, EmbeddingRequest
from kernos.llm._mode import Mode, current_mode
from kernos.llm._store import Budget, LlmStore
from kernos.personal import touched_subjects

__all__ = ["BATCH", "Embedding", "EmbeddingClient", "embed"]

BATCH = 64
"""The most texts one provider call embeds."""


class EmbeddingClient(Protocol):
    """What :func:`embed` needs of its client (an :class:`~kernos.llm.LlmClient` is one)."""

    store: LlmStore
    """Where requests, answers, recordings and the ledger are kept."""
    embedding: _provider.Completion | None
    """Stands in for ``litellm.embedding`` (tests); None: litellm's own."""


@dataclass(frozen=True, kw_only=True)
class Embedding:
    """The vector of one text."""

    vector: tuple[float, ...]
    """The embedding."""
    tokens: int
    """The text's tokens: its share of what its provider call reported (or counted)."""
    cached: bool
    """Answered from a recording: nothing was called or charged."""
    request: str
    """The request's hash."""
    call: int | None
    """The ledger call that embedded it; None when answered from a recording."""


def embed(client: EmbeddingClient, requests: Sequence[EmbeddingRequest], *, principal: str,
          op: int | None, budgets: Sequence[Budget] = (), charge: Sequence[str] = (),
          journal: list[dict[str, Any]] | None = None, mode: Mode | None = None,
          timeout: float | None = None) -> list[Embedding]:
    """Embed every request's text (see the module docstring); the answers in order."""
    mode = mode or current_mode()
    store, ledger = client.store, client.store.ledger
    entries: dict[str, list[dict[str, Any]]] = {}
    unique: dict[str, EmbeddingRequest] = {}
    for request in requests:
        entry: dict[str, Any] = {"kind": "embedding", "request": request.hash,
                                 "model": request.model, "principal": principal,
                                 "mode": mode.value}
        entries.setdefault(request.hash, []).append(entry)
        unique.setdefault(request.hash, request)
        if journal is not None:
            journal.append(entry)
    answers: dict[str, Embedding] = {}
    misses: list[EmbeddingRequest] = []

    def fail(hashes: Sequence[str], error: BaseException) -> None:
        for name in hashes:
            for entry in entries[name]:
                entry.setdefault("error", type(error).__name__)

    for name, request in unique.items():
        stored = None
        if mode is not Mode.OFF and (recorded := store.recorded(name)) is not None:
            try:
                stored = store.get(recorded)
            except LLMRecordingErased as error:
                if mode is Mode.REPLAY:
                    fail([name], error)
                    raise
                # erased with a data subject: asked again
        if stored is None:
            misses.append(request)
            continue
        answers[name] = Embedding(vector=tuple(float(x) for x in stored["vector"]),
                                  tokens=int(stored["tokens"]), cached=True, request=name,
                                  call=None)
        for entry in entries[name]:
            entry.update(cached=True, call=None, tokens=answers[name].tokens)
    if misses:
        worst = {request.hash: _provider.count_text_tokens(request.model, request.input)
                 for request in misses}
        batches = _batches(misses)
        first = misses[0]
        try:
            ledger.admit(budgets, tokens=sum(worst.values()),
                         cost=_total([_worst_cost(batch, worst) for batch in batches]),
                         request=first.hash, model=first.model)
            if mode is Mode.REPLAY:
                raise LLMReplayMiss(request=first.hash, model=first.model,
                                    store=str(store.path))
        except LLMError as error:
            fail(list(worst), error)
            raise
        subjects = touched_subjects()  # what this op's texts may hold: sealed under them
        for at, batch in enumerate(batches):
            try:
                _call(client, batch, worst, principal=principal, op=op, budgets=budgets,
                      charge=charge, timeout=timeout, subjects=subjects, answers=answers,
                      entries=entries)
            except BaseException as error:
                fail([request.hash for later in batches[at:] for request in later], error)
                raise
    return [answers[request.hash] for request in requests]


def _batches(misses: list[EmbeddingRequest]) -> list[list[EmbeddingRequest]]:
    """Texts of one model and parameters together, at most BATCH a call (one with a mock)."""
    groups: dict[tuple[str, bytes], list[EmbeddingRequest]] = {}
    for request in misses:
        groups.setdefault((request.model, canonical(request.params)), []).append(request)
    batches = []
    for group in groups.values():
        size = 1 if "mock_response" in group[0].params else BATCH
        batches += [group[start:start + size] for start in range(0, len(group), size)]
    return batches


def _worst_cost(batch: list[EmbeddingRequest], worst: dict[str, int]
                ) -> decimal.Decimal | None:
    return _provider.estimate_cost(batch[0].model,
                                   sum(worst[request.hash] for request in batch), 0)


def _total(costs: list[decimal.Decimal | None]) -> decimal.Decimal | None:
    """The sum of the priced costs; None if no model of them has a price."""
    priced = [cost for cost in costs if cost is not None]
    return sum(priced, decimal.Decimal(0)) if priced else None


def _call(client: EmbeddingClient, batch: list[EmbeddingRequest], worst: dict[str, int], *,
          principal: str, op: int | None, budgets: Sequence[Budget], charge: Sequence[str],
          timeout: float | None, subjects: frozenset[str], answers: dict[str, Embedding],
          entries: dict[str, list[dict[str, Any]]]) -> None:
    """One provider call for ``batch``: reserved, made, checked, stored, settled."""
    store, ledger = client.store, client.store.ledger
    head, model, params = batch[0].hash, batch[0].model, batch[0].params
    tokens = sum(worst[request.hash] for request in batch)
    cost = _worst_cost(batch, worst)
    number = ledger.reserve(budgets=budgets, keys=charge, tokens=tokens, cost=cost,
                            facts={"op": op, "principal": principal, "kind": "embedding",
                                   "texts": len(batch)},
                            request=head, model=model)
    for request in batch:
        for entry in entries[request.hash]:
            entry["call"] = number
    started = time.perf_counter()
    answered = False
    raw: dict[str, Any] | None = None
    try:
        for request in batch:
            store.put(request.canonical(), subjects=subjects)
        raw = _provider.call_embedding(model, [request.input for request in batch], params,
                                       timeout=timeout, embedding=client.embedding,
                                       request=head)
        answered = True
        vectors, reported, answered_model = _checked(raw, len(batch), params, head, model)
    except LLMError as error:
        # A malformed answer was still produced (and billed); a refused call was not.
        in_doubt = not isinstance(error, LLMProviderError) or error.kind in _provider.IN_DOUBT
        facts: dict[str, Any] = {"kind": "embedding", "error": type(error).__name__}
        if raw is not None:  # kept for inspection, as a malformed completion is
            facts["response"] = store.put({"raw": _provider.jsonable(raw)}, subjects=subjects)
        ledger.settle(number, tokens=tokens if in_doubt else 0,
                      cost=cost if in_doubt else None, facts=facts)
        raise
    except Exception as error:
        # Kernos failed on its own side: before the provider answered nothing was used;
        # after, the answer may have been billed.
        ledger.settle(number, tokens=tokens if answered else 0,
                      cost=cost if answered else None,
                      facts={"kind": "embedding", "error": type(error).__name__})
        raise
    latency = round((time.perf_counter() - started) * 1000, 3)
    used = tokens if reported is None else reported
    used_cost = _provider.estimate_cost(model, used, 0)
    shares = _split(used, [worst[request.hash] for request in batch])
    for request, vector, share in zip(batch, vectors, shares, strict=True):
        response = store.put({"request": request.hash, "model": answered_model,
                              "vector": list(vector), "tokens": share,
                              "estimated": reported is None}, subjects=subjects)
        store.record(request.hash, response)
        answers[request.hash] = Embedding(vector=vector, tokens=share, cached=False,
                                          request=request.hash, call=number)
        for entry in entries[request.hash]:
            entry.update(cached=False, tokens=share)
    ledger.settle(number, tokens=used, cost=used_cost,
                  facts={"kind": "embedding", "estimated": reported is None,
                         "latency_ms": latency})
    ledger.check(budgets, asked=used, asked_cost=used_cost, request=head, model=model)


def _checked(raw: dict[str, Any], count: int, params: dict[str, Any], request: str,
             model: str) -> tuple[list[tuple[float, ...]], int | None, str]:
    """The vectors in text order, the prompt tokens reported (None: none), the model."""
    def bad(problem: str) -> LLMResponseInvalid:
        return LLMResponseInvalid(problem, request=request, model=model)

    data = raw.get("data")
    if type(data) is not list:
        raise bad(f"its data is {_kind(data)}, not a list of vectors")
    if len(data) != count:
        raise bad(f"it has {len(data)} vectors for {count} texts")
    vectors: list[tuple[float, ...] | None] = [None] * count
    for position, item in enumerate(data):
        if type(item) is not dict:
            raise bad(f"data[{position}] is {_kind(item)}, not an object with an embedding")
        index = item.get("index", position)
        if type(index) is not int or not 0 <= index < count or vectors[index] is not None:
            raise bad(f"data[{position}] names the index {str(index)[:20]}, which is not one "
                      f"of the texts' (0 to {count - 1}, each once)")
        vectors[index] = _vector(item.get("embedding"), f"vector {index}", bad)
    found = [vector for vector in vectors if vector is not None]
    length = len(found[0])
    for index, vector in enumerate(found):
        if len(vector) != length:
            raise bad(f"its vectors are ragged: vector {index} has {len(vector)} dimensions, "
                      f"vector 0 has {length}")
    asked = params.get("dimensions")
    if asked is not None and length != asked:
        raise bad(f"its vectors have {length} dimensions, but dimensions={asked} was asked")
    answered = raw.get("model")
    return found, _prompt_tokens(raw.get("usage"), bad), (
        answered if type(answered) is str and len(answered) <= 200 else model)


def _vector(value: object, where: str,
            bad: Any) -> tuple[float, ...]:
    if type(value) is not list:
        raise bad(f"{where} is {_kind(value)}, not a list of numbers")
    assert isinstance(value, list)
    if not 1 <= len(value) <= MAX_DIMENSIONS:
        raise bad(f"{where} has {len(value)} dimensions (1 to {MAX_DIMENSIONS} are accepted)")
    numbers = []
    for item in value:
        if type(item) is float:
            assert isinstance(item, float)
            if not math.isfinite(item):
                raise bad(f"{where} holds {item!r}, not a finite number")
            numbers.append(item)
        elif type(item) is int:
            assert isinstance(item, int)
            if abs(item) > 10**300:
                raise bad(f"{where} holds an int too large for a float")
            numbers.append(float(item))
        else:
            raise bad(f"{where} holds {_kind(item)}, not a number")
    return tuple(numbers)


def _prompt_tokens(usage: object, bad: Any) -> int | None:
    """The prompt tokens the provider reported; None if it reported none (or zero)."""
    if usage is None:
        return None
    if type(usage) is not dict:
        raise bad("its usage is not a mapping")
    value = usage.get("prompt_tokens")
    if value is None or value == 0:
        return None
    if type(value) is not int or not 0 < value < 10**9:
        raise bad(f"its usage reports prompt_tokens = {str(value)[:40]}")
    assert isinstance(value, int)
    return value


def _split(total: int, weights: list[int]) -> list[int]:
    """``total`` shared in proportion to ``weights`` (each at least 1), summing exactly."""
    whole = sum(weights)
    shares = [total * weight // whole for weight in weights]
    for index in range(total - sum(shares)):
        shares[index] += 1
    return shares


def _kind(value: object) -> str:
    return "missing" if value is None else f"a {type(value).__name__}"
