"""Optimistic concurrency: retry an op whose preconditions went stale.

Several harnesses (or agents) can write the same names.  Nothing is locked
while a caller thinks; instead each op states what it read, and the kernel
rejects it with status ``conflict`` if that changed in between.  The pattern:

1. **read** the state, cheaply (``versions()``, ``object()``), outside any op;
2. **think**: decide what to do, outside any op (an LLM call can take seconds,
   and holding an op open that long would stall every other writer);
3. **act** with a precondition: ``op(..., expect_versions=seen)``.

On a conflict nothing ran, so the whole cycle is simply done again::

    async def attempt() -> OpResult:
        seen = await client.versions(["budget"])                        # read
        amount = decide(await client.object("budget"))                  # think
        return await client.op(f"budget -= {amount}",                   # act
                               expect_versions=seen)

    result = await retry_on_conflict(attempt)

``attempt`` must read afresh each time: re-sending the same stale versions
can only conflict again.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from kernos.client.errors import ConflictRetriesExhausted
from kernos.errors import UsageError
from kernos.harness.results import OpResult

__all__ = ["retry_on_conflict"]


def backoff_delay(attempt: int, backoff: float, rng: random.Random | None = None) -> float:
    """The pause after failed attempt ``attempt`` (0-based): exponential, with full jitter.

    Jitter keeps writers that conflicted with each other from retrying in lockstep.
    """
    ceiling = backoff * (2 ** attempt)
    return (rng or random).uniform(0.5 * ceiling, 1.5 * ceiling)


async def retry_on_conflict(attempt: Callable[[], Awaitable[OpResult]], *, attempts: int = 5,
                            backoff: float = 0.005) -> OpResult:
    """Call ``attempt`` until its result is not a conflict, at most ``attempts`` times.

    Returns the first result that is not a conflict (committed, or failed for
    another reason: only conflicts are retried).  Raises
    :class:`~kernos.client.errors.ConflictRetriesExhausted`, carrying the last
    result, when every attempt conflicted.  Between attempts it sleeps an
    exponentially growing, jittered ``backoff`` (seconds).
    """
    if attempts < 1:
        raise UsageError(f"retry_on_conflict: attempts must be at least 1, not {attempts}")
    if backoff < 0:
        raise UsageError(f"retry_on_conflict: backoff is a delay in seconds (>= 0), "
                         f"not {backoff}")
    result: OpResult | None = None
    for number in range(attempts):
        result = await attempt()
        if not isinstance(result, OpResult):
            raise UsageError("retry_on_conflict: attempt() must return the OpResult of an op "
                             f"(from client.op or client.call), not {type(result).__name__}")
        if not result.conflict:
            return result
        if number + 1 < attempts:
            await asyncio.sleep(backoff_delay(number, backoff))
    assert result is not None
    raise ConflictRetriesExhausted(result, attempts)
