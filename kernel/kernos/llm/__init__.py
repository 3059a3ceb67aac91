"""Recorded, budgeted LLM calls through litellm (the core: no Jupyter here).

The contract, in the order a call meets it:

**Request** (``_request``).  A model, messages and parameters from an
allowlist (:data:`PARAMS`): ``api_key``, ``api_base``, ``base_url``,
``headers``, ``callbacks`` and every other name are refused, because a
request may come from agent code and the runtime alone decides where a call
goes and who pays.  ``max_tokens`` defaults to :data:`DEFAULT_MAX_TOKENS`, so
every call's worst case is known before it is made.  The request's hash is
the SHA-256 of its canonical JSON (sorted keys): the same request, however
its dicts were ordered, has the same hash.

**Store** (``_store``).  ``<workspace>/llm/`` holds every request and answer
(content-addressed, written once, atomically), the recording of each request
(the answer replay uses) and the ledger of every call.  It is outside the
image: a rolled-back op's calls were still made and stay recorded and
charged.

**Mode** (``_mode``).  ``record`` by default (an equal request is answered
from its recording), ``off`` (always call the provider) or ``replay`` (never
call it; a miss fails loudly), from ``$KERNOS_LLM_MODE`` or :func:`set_mode`.

**Budgets.**  Each call is checked before it is made, against its worst case
(prompt tokens counted by litellm plus ``max_tokens``, and their price), and
after, against what the provider reported.  The ledger, not the image,
counts what was spent, so no sequence of calls, ops that roll back, or
concurrent clients can spend a token twice.  The limits themselves (grants
and per-op limits) are the agent runtime's (``kernos.agents.runtime``).

**Answer** (``_calls``).  A :class:`Completion`: the text, tool calls with
their arguments parsed and checked against the schema of the tool they name
(``kernos.llm.schema``, the check the agent registry's tools use too),
usage, cost (an exact ``Decimal`` from litellm's price table), the model,
and whether it came from a recording.  Streamed answers are consumed and
recorded whole.  Malformed answers, bad tool calls, provider errors, replay
misses and budgets exceeded raise :class:`~kernos.errors.LLMError`
subclasses; inside an op the runtime vetoes the op, which rolls back, and
its audit record lists its calls.

**Embeddings** (``_embed``, ``_embed_calls``).  :func:`build_embedding_request`
checks one text for one model (``dimensions`` and ``mock_response`` the only
parameters), and :meth:`LlmClient.embed` answers a list of them with one
:class:`Embedding` each: recorded and budgeted like completions, in batches
of at most 64 texts, except that a text already recorded is answered from
its recording *free of charge* (embeddings feed a cache, the memory index,
and rebuilding it must not pay twice).  Its journal entries and ledger
calls say ``"kind": "embedding"``.

**Credentials** are litellm's usual environment variables, read by litellm
in the kernel's process.  Nothing Kernos records is taken from them, and
provider messages are stripped of them.
"""

from kernos.llm._calls import Completion, LlmClient, ToolCall, Usage
from kernos.llm._embed import (
    EMBEDDING_PARAMS,
    MAX_DIMENSIONS,
    MAX_INPUT_CHARS,
    EmbeddingRequest,
    build_embedding_request,
)
from kernos.llm._embed_calls import Embedding
from kernos.llm._mode import ENVIRONMENT, Mode, current_mode, set_mode
from kernos.llm._request import DEFAULT_MAX_TOKENS, PARAMS, Request, build_request
from kernos.llm._store import LEDGER_FILE, Budget, Ledger, LlmStore, Spent

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "EMBEDDING_PARAMS",
    "ENVIRONMENT",
    "LEDGER_FILE",
    "MAX_DIMENSIONS",
    "MAX_INPUT_CHARS",
    "PARAMS",
    "Budget",
    "Completion",
    "Embedding",
    "EmbeddingRequest",
    "Ledger",
    "LlmClient",
    "LlmStore",
    "Mode",
    "Request",
    "Spent",
    "ToolCall",
    "Usage",
    "build_embedding_request",
    "build_request",
    "current_mode",
    "set_mode",
]
