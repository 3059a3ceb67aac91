"""Helpers for tests that drive kernels through ``kernos.client``."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from kernos.client import OpResult

Result = TypeVar("Result")


def run(scenario: Coroutine[Any, Any, Result], deadline: float) -> Result:
    """Run an async scenario to its end; ``deadline`` (seconds) catches a hang."""
    return asyncio.run(asyncio.wait_for(scenario, deadline))


def committed(result: OpResult) -> OpResult:
    """``result``, after checking that its op committed."""
    assert result.committed, result
    return result
