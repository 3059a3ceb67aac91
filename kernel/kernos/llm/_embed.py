"""The canonical embedding request: one model, ONE text, allowlisted parameters.

An embedding request holds a single text, so that the recording of each text
is independent of what it was batched with: the same text, model and
parameters have the same hash whichever call asked for them, and a memory
index rebuilt from other batches finds every recording again.  Batching is
the client's business (:mod:`kernos.llm._embed_calls`), not the request's.

Parameters come from :data:`EMBEDDING_PARAMS` only (``dimensions`` and
``mock_response``); every other name is refused with the allowed list, as
:func:`~kernos.llm.build_request` refuses them for completions: where a call
goes and who pays are the runtime's to decide, never the caller's.

The canonical form is ``{"kind": "embedding", "model", "input", "params"}``:
a completion's is ``{"model", "messages", "params"}``, so no embedding
request ever has the canonical JSON, hence the hash, of a completion request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernos.audit.canonical import canonical, digest
from kernos.errors import LLMRequestInvalid
from kernos.llm._request import MODEL_PATTERN

__all__ = ["EMBEDDING_PARAMS", "MAX_DIMENSIONS", "MAX_INPUT_CHARS", "EmbeddingRequest",
           "build_embedding_request"]

MAX_INPUT_CHARS = 32_768
"""The most characters one text to embed may have."""
MAX_DIMENSIONS = 8192
"""The most dimensions a vector may have (asked for, mocked, or answered)."""

EMBEDDING_PARAMS: dict[str, str] = {
    "dimensions": f"an int from 1 to {MAX_DIMENSIONS:,}: the length of the vector",
    "mock_response": f"a list of 1 to {MAX_DIMENSIONS:,} finite numbers: litellm answers "
                     "with it and calls no provider",
}
"""The parameters an embedding request may set, and what each takes."""


@dataclass(frozen=True, kw_only=True)
class EmbeddingRequest:
    """One text to embed with one model, checked and normalized."""

    model: str
    """The model, as litellm names it."""
    input: str
    """The text."""
    params: dict[str, Any]
    """Allowlisted parameters, normalized (``mock_response`` as a list of float)."""

    def canonical(self) -> dict[str, Any]:
        """What the hash covers (and what is stored as the request's recording)."""
        return {"kind": "embedding", "model": self.model, "input": self.input,
                "params": self.params}

    @property
    def hash(self) -> str:
        """SHA-256 of the canonical JSON."""
        return digest(canonical(self.canonical()))


def build_embedding_request(model: object, text: object,
                            params: dict[str, object] | None = None) -> EmbeddingRequest:
    """Check and normalize one embedding request; :class:`LLMRequestInvalid` says what is
    wrong."""
    if type(model) is not str or not MODEL_PATTERN.fullmatch(model):
        raise LLMRequestInvalid(
            "the embedding model must be a str such as 'text-embedding-3-small' (letters, "
            f"digits, '_.-/:@', at most 128), not {_shown(model)}")
    if type(text) is not str:
        raise LLMRequestInvalid(f"a text to embed must be a str, not {_shown(text)}")
    if not text:
        raise LLMRequestInvalid("a text to embed must not be empty (providers refuse it)")
    if len(text) > MAX_INPUT_CHARS:
        raise LLMRequestInvalid(f"a text to embed has {len(text):,} characters, over "
                                f"{MAX_INPUT_CHARS:,}; split it or shorten it")
    given = {} if params is None else params
    if type(given) is not dict:
        raise LLMRequestInvalid(f"the embedding parameters must be a dict, not {_shown(given)}")
    unknown = sorted(str(name)[:40] for name in given if name not in EMBEDDING_PARAMS)
    if unknown:
        raise LLMRequestInvalid(
            f"unknown embedding parameter{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}; the allowed ones are {', '.join(sorted(EMBEDDING_PARAMS))}. "
            "Credentials, endpoints and headers are set by the runtime from its environment, "
            "never by a request.")
    checked: dict[str, Any] = {}
    for name, value in given.items():
        checked[name] = _check_param(name, value)
    return EmbeddingRequest(model=model, input=text, params=checked)


def _check_param(name: str, value: object) -> Any:
    if name == "dimensions":
        if type(value) is not int or not 1 <= value <= MAX_DIMENSIONS:
            raise LLMRequestInvalid(f"dimensions must be {EMBEDDING_PARAMS[name]}, not "
                                    f"{_shown(value)}")
        return value
    if name == "mock_response":
        if type(value) not in (list, tuple):
            raise LLMRequestInvalid(f"mock_response must be {EMBEDDING_PARAMS[name]}, not "
                                    f"{_shown(value)}")
        assert isinstance(value, (list, tuple))
        if not 1 <= len(value) <= MAX_DIMENSIONS:
            raise LLMRequestInvalid(f"mock_response must be {EMBEDDING_PARAMS[name]}, not "
                                    f"{len(value):,} of them")
        return [_finite(item, f"mock_response[{index}]") for index, item in enumerate(value)]
    raise AssertionError(name)  # every name in EMBEDDING_PARAMS is handled above


def _finite(value: object, where: str) -> float:
    if type(value) not in (int, float):
        raise LLMRequestInvalid(f"{where} must be a finite number, not {_shown(value)}")
    assert isinstance(value, (int, float))
    if type(value) is int and abs(value) > 10**300:  # float() of it would overflow
        raise LLMRequestInvalid(f"{where} must be a finite number, not an int of "
                                f"{value.bit_length()} bits")
    if not math.isfinite(value):
        raise LLMRequestInvalid(f"{where} must be a finite number, not {value!r}")
    return float(value)


def _shown(value: object) -> str:
    if type(value) is str:
        return repr(value[:80])
    return f"a {type(value).__name__}"
