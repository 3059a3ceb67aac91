"""Helpers for the supervisor's tests: an agent's op run as a cell would run it, a
policy set in an op of its own, a call charged in the workspace's real LLM ledger."""

from __future__ import annotations

import decimal

import pytest

from kernos.errors import CircuitOpen, OpVetoed
from kernos.llm import LEDGER_FILE, Ledger

__all__ = ["attempt", "charge", "policy", "refusal"]


def attempt(env, code: str, agent: str = "alice") -> str:  # type: ignore[no-untyped-def]
    """Run ``code`` as ``agent`` in its own op, as a cell would: what became of it."""
    op = env.image.begin(source=code)
    try:
        env.runtime.run(agent, code)
    except CircuitOpen as error:
        op.abort(error=error)
        return "refused"
    except Exception as error:  # the op failed, as a cell's would
        op.abort(error=error)
        return "failed"
    try:
        op.commit()
    except OpVetoed:
        return "vetoed"
    return "committed"


def refusal(env, code: str = "pass", agent: str = "alice") -> CircuitOpen:  # type: ignore[no-untyped-def]
    op = env.image.begin(source=code)
    with pytest.raises(CircuitOpen) as caught:
        env.runtime.run(agent, code)
    with pytest.raises(OpVetoed):
        op.commit()
    return caught.value


def policy(env, agent: str = "alice", **figures: object) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.policy(agent, **figures)


def charge(env, agent: str, tokens: int, cost: str = "0") -> None:  # type: ignore[no-untyped-def]
    """One settled call in the workspace's real LLM ledger, charged to ``agent``."""
    ledger = Ledger(env.path / LEDGER_FILE, durable=False)
    (env.path / LEDGER_FILE).parent.mkdir(exist_ok=True)
    number = ledger.reserve(budgets=[], keys=[f"principal:{agent}"], tokens=tokens,
                            cost=decimal.Decimal(cost), facts={"op": 0}, request="r",
                            model="m")
    ledger.settle(number, tokens=tokens, cost=decimal.Decimal(cost), facts={})
