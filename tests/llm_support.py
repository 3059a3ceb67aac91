"""Offline LLM providers for the tests: litellm's ``mock_response``, and a custom provider.

:class:`Meter` is a provider registered in litellm (``custom_provider_map``)
under the prefix ``meter/``: it answers every call itself (nothing reaches a
network), reports usage honestly (the prompt as litellm counts it, and a
completion of at most ``max_tokens``), and keeps its own tally of every
token it "billed".  That tally is the ground truth the budget tests compare
with: it does not come from Kernos's ledger, so a ledger that undercounts
cannot hide it.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from litellm import CustomLLM, ModelResponse

PREFIX = "meter"
SECRET = "sk-kernos-canary-4f1d2c3b9a8e7d6c"
"""A fake provider key: set in the environment, it must appear in no recorded file."""


class Meter(CustomLLM):
    """Answers every call; bills honestly; counts what it billed."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.billed = 0
        self.calls = 0
        self.fail: str | None = None
        """If set, the next calls raise this litellm exception name."""
        self.leak_key = False
        """Put the environment's key in fields Kernos must not record."""

    def completion(self, model: str, messages: list[Any], *args: Any, **kwargs: Any
                   ) -> ModelResponse:
        optional: dict[str, Any] = kwargs.get("optional_params") or {}
        if self.fail is not None:
            raise getattr(litellm, self.fail)(message=f"meter refuses ({SECRET})",
                                              llm_provider=PREFIX, model=model)
        prompt = litellm.token_counter(model=f"{PREFIX}/{model}", messages=messages)
        limit = optional.get("max_tokens", 1024)
        completion = self.random.randint(1, limit)
        with self.lock:
            self.billed += prompt + completion
            self.calls += 1
        response = ModelResponse(
            model=model,
            choices=[{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": f"{completion} tokens"}}],
            usage={"prompt_tokens": prompt, "completion_tokens": completion,
                   "total_tokens": prompt + completion})
        if self.leak_key:
            response.system_fingerprint = os.environ.get("OPENAI_API_KEY")
            response._hidden_params = {"api_key": os.environ.get("OPENAI_API_KEY")}
        return response


@contextlib.contextmanager
def metered(seed: int = 0) -> Iterator[Meter]:
    """Register a :class:`Meter` as litellm's ``meter/`` provider for the block."""
    meter = Meter(seed)
    saved = list(litellm.custom_provider_map)
    litellm.custom_provider_map = [*saved, {"provider": PREFIX, "custom_handler": meter}]
    try:
        yield meter
    finally:
        litellm.custom_provider_map = saved


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]
