"""Token counting for ``context(max_tokens)``.

:func:`count_tokens` uses litellm's ``token_counter`` (through
``kernos.llm._provider.litellm``, so it never goes to the network) when
litellm can be imported (for ``model``, default ``gpt-4o-mini``'s tokenizer); otherwise the
documented fallback: one token per 4 characters, rounded up (an
over-estimate for English prose, so a budget is not exceeded in practice).
"""

from __future__ import annotations

from collections.abc import Callable

from kernos.memory.records import Memory

__all__ = ["DEFAULT_MODEL", "count_tokens", "fallback_count", "render", "warm"]

DEFAULT_MODEL = "gpt-4o-mini"
_counter: Callable[..., int] | None = None
_tried = False


def fallback_count(text: str) -> int:
    """One token per 4 characters, rounded up."""
    return (len(text) + 3) // 4


def warm() -> None:
    """Import litellm's counter now (it is slow to import): the runtime calls this before
    an agent that may ask for a context starts its deadline."""
    global _counter, _tried
    if not _tried:
        _tried = True
        from kernos.errors import UsageError
        from kernos.llm._provider import litellm

        try:  # the one entry to litellm: offline price list, `random` untouched
            _counter = litellm().token_counter
        except (UsageError, AttributeError):  # not installed: the documented fallback
            _counter = None


def count_tokens(text: str, *, model: str = DEFAULT_MODEL) -> int:
    """Tokens in ``text`` (litellm's counter, else :func:`fallback_count`)."""
    warm()
    if _counter is None:
        return fallback_count(text)
    from kernos.determinism import generators_untouched

    try:
        with generators_untouched():
            return int(_counter(model=model, text=text))
    except Exception:  # a model litellm has no tokenizer for
        return fallback_count(text)


def render(memory: Memory) -> str:
    """One memory as a line of context."""
    where = f"op {memory.op}" if memory.op is not None else memory.name or ""
    return f"[{memory.kind} {where}] {memory.text}".replace("\n", " ")
