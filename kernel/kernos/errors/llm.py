"""Errors of LLM calls: a request refused before sending, a provider's failure, a
malformed answer, a replay without a recording, a budget that would be exceeded.

Part of the tree drawn in ``kernos.errors``, which is where they are imported from.
"""

from __future__ import annotations

from kernos.errors.base import KernosError, UsageError

__all__ = ["LLMBudgetExceeded", "LLMError", "LLMProviderError", "LLMRecordingErased",
           "LLMReplayMiss", "LLMRequestInvalid", "LLMResponseInvalid", "LLMToolCallInvalid"]


class LLMRequestInvalid(UsageError):
    """An LLM request that Kernos refuses to send: nothing was called or charged."""


class LLMError(KernosError):
    """An LLM call that failed or was refused.  Inside an op, the op rolls back.

    ``request`` is the request's hash (its recording in ``<workspace>/llm/``)
    and ``model`` the model asked for.
    """

    def __init__(self, message: str, *, request: str, model: str) -> None:
        self.request = request
        self.model = model
        super().__init__(message)


class LLMRecordingErased(LLMError):
    """A recorded LLM request or answer held a data subject's data, and it was erased."""

    def __init__(self, name: str, subjects: list[str], *, request: str = "",
                 model: str = "") -> None:
        self.name = name
        self.subjects = subjects
        super().__init__(
            f"the recorded LLM exchange {name[:16]} held data of the data subject(s) "
            f"{', '.join(map(repr, subjects))}, which was erased; it cannot be read or "
            "replayed any more (by design). Replay from a snapshot after that op, or call "
            "the model again.", request=request, model=model)


class LLMProviderError(LLMError):
    """The provider refused or failed the call (litellm raised ``kind``)."""

    def __init__(self, message: str, *, request: str, model: str, kind: str,
                 status_code: int | None, retryable: bool) -> None:
        self.kind = kind
        self.status_code = status_code
        self.retryable = retryable
        super().__init__(message, request=request, model=model)

    @classmethod
    def from_exception(cls, error: BaseException, *, request: str, model: str,
                       text: str) -> LLMProviderError:
        """``text`` is the provider's message, already stripped of credentials."""
        kind = type(error).__name__
        status = getattr(error, "status_code", None)
        status_code = status if type(status) is int else None
        retryable = kind in _RETRYABLE
        return cls(
            f"the LLM provider failed the call to {model!r} ({kind}"
            + (f", HTTP {status_code}" if status_code else "") + f": {text[:300]}). "
            + ("It may succeed if tried again later. " if retryable else
               "Fix the request, the model name or the provider's key in the environment. ")
            + f"Request {request[:16]}; the op rolls back.",
            request=request, model=model, kind=kind, status_code=status_code,
            retryable=retryable)


_RETRYABLE = frozenset({"RateLimitError", "Timeout", "APIConnectionError",
                        "ServiceUnavailableError", "InternalServerError", "BadGatewayError"})


class LLMResponseInvalid(LLMError):
    """The provider answered, but not with a usable completion."""

    def __init__(self, problem: str, *, request: str, model: str) -> None:
        self.problem = problem
        super().__init__(
            f"the answer of {model!r} to request {request[:16]} is malformed: {problem}. "
            "The op rolls back; the answer is kept in the workspace's llm store for "
            "inspection.", request=request, model=model)


class LLMToolCallInvalid(LLMError):
    """A tool call in the answer names no offered tool, or its arguments fail its schema."""

    def __init__(self, tool: str, problem: str, *, request: str, model: str) -> None:
        self.tool = tool
        self.problem = problem
        super().__init__(
            f"{model!r} called the tool {tool[:80]!r} with arguments that do not fit: "
            f"{problem}. Request {request[:16]}; the op rolls back. Describe the tool's schema "
            "to the model more clearly, or validate and retry in a new op.",
            request=request, model=model)


class LLMReplayMiss(LLMError):
    """Replay mode found no recorded response for a request."""

    def __init__(self, *, request: str, model: str, store: str) -> None:
        self.store = store
        super().__init__(
            f"replay mode: no recorded response for request {request} to model {model!r} "
            f"in {store}. Nothing was called. Record it first: run the op with "
            "KERNOS_LLM_MODE=record (or kernos.llm.set_mode('record')) and the provider's "
            "key in the environment; the op rolls back.", request=request, model=model)


class LLMBudgetExceeded(LLMError):
    """A call would exceed (``phase="before"``) or did exceed (``"after"``) a budget."""

    def __init__(self, *, budget: str, unit: str, limit: str, used: str, asked: str,
                 phase: str, request: str, model: str) -> None:
        self.budget = budget
        self.unit = unit
        self.limit = limit
        self.used = used
        self.asked = asked
        self.phase = phase
        if phase == "before":
            what = (f"a call to {model!r} may use up to {asked} {unit}, but {budget} has "
                    f"{used} of {limit} {unit} used. Nothing was called")
        else:
            what = (f"a call to {model!r} used {asked} {unit}, which took {budget} to {used} "
                    f"of {limit} {unit} (the provider used more than estimated; what it "
                    "used stays charged)")
        super().__init__(
            f"LLM budget exceeded: {what}. The op rolls back. Ask for fewer tokens "
            "(max_tokens, shorter messages), or have a human raise the budget.",
            request=request, model=model)
