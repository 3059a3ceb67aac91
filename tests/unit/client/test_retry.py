"""retry_on_conflict: bounded, jittered, and it retries conflicts only."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from kernos.client import ConflictRetriesExhausted, OpResult, retry_on_conflict
from kernos.client.retry import backoff_delay
from kernos.errors import UsageError


def result(status: str, **versions: int) -> OpResult:
    return OpResult(status=status, principal="human", versions=dict(versions))


def attempts_returning(*statuses: str) -> tuple[list[int], Callable[[], Awaitable[OpResult]]]:
    calls: list[int] = []

    async def attempt() -> OpResult:
        calls.append(len(calls))
        return result(statuses[min(len(calls) - 1, len(statuses) - 1)], x=len(calls))

    return calls, attempt


def test_retries_conflicts_until_one_is_not() -> None:
    calls, attempt = attempts_returning("conflict", "conflict", "committed")
    final = asyncio.run(retry_on_conflict(attempt, backoff=0))
    assert final.committed and len(calls) == 3


def test_other_outcomes_are_returned_at_once() -> None:
    for status in ("failed", "denied", "rejected", "committed"):
        calls, attempt = attempts_returning(status)
        assert asyncio.run(retry_on_conflict(attempt)).status == status
        assert len(calls) == 1


def test_gives_up_after_the_attempts_with_the_last_result() -> None:
    calls, attempt = attempts_returning("conflict")
    with pytest.raises(ConflictRetriesExhausted) as exhausted:
        asyncio.run(retry_on_conflict(attempt, attempts=4, backoff=0))
    assert len(calls) == 4
    assert exhausted.value.result.versions == {"x": 4} and exhausted.value.attempts == 4
    assert "4 times" in str(exhausted.value) and "x=4" in str(exhausted.value)


def test_misuse_is_a_usage_error() -> None:
    _calls, attempt = attempts_returning("committed")
    with pytest.raises(UsageError, match="at least 1"):
        asyncio.run(retry_on_conflict(attempt, attempts=0))

    async def not_an_op() -> OpResult:
        return {"status": "committed"}  # type: ignore[return-value]

    with pytest.raises(UsageError, match="OpResult"):
        asyncio.run(retry_on_conflict(not_an_op))


def test_backoff_grows_and_is_jittered() -> None:
    rng = random.Random(7)
    for attempt in range(5):
        ceiling = 0.01 * 2 ** attempt
        delays = {backoff_delay(attempt, 0.01, rng) for _ in range(20)}
        assert all(0.5 * ceiling <= delay <= 1.5 * ceiling for delay in delays)
        assert len(delays) > 1
