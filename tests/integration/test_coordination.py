"""Invariant I4 through a real kernel: many clients, one op at a time, no lost update.

Eight clients, each connected to the same kernel as a different agent, spend
from one shared ``account`` and credit a shared ``ledger`` dict.  Ops are
serialized by the kernel whichever client sent them, so a read-modify-write
inside one op can never interleave with another's.  With preconditions, an
op whose reads went stale is refused as a conflict (nothing runs), and the
harness-side retry reads again and decides again.

``KERNOS_COORDINATION_OPS`` sets the ops per client: 250 in the suite (2,000
ops in all), 1,000 in ``scripts/long-tests`` (the full run the invariant was
first proven with, 8,000 ops, about four minutes).  The kernels commit without
fsync (``KERNOS_DURABILITY=process``):
what is proven here is serialization, and every op still commits (durability
is proven by the ``kill -9`` tests).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from kernos.client import AsyncKernosClient, run_kernel
from kernos.client.retry import retry_on_conflict
from kernos.harness.results import OpResult

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

CLIENTS = 8
OPS = int(os.environ.get("KERNOS_COORDINATION_OPS", "250"))
AGENTS = [f"agent{number}" for number in range(CLIENTS)]
ENV = {"KERNOS_DURABILITY": "process"}
# Less than CLIENTS * OPS: some spends must be refused, and none may overdraw.
BUDGET = CLIENTS * OPS * 3 // 4

SPEND = """\
account = read('account')
if account['budget'] < 1:
    raise ValueError('insufficient budget')
account['budget'] = account['budget'] - 1
ledger = read('ledger')
ledger[whoami()] = ledger.get(whoami(), 0) + 1
account['budget']
"""


async def _setup(client: AsyncKernosClient) -> None:
    result = await client.op(f"account = {{'budget': {BUDGET}}}\nledger = {{}}")
    assert result.committed, result
    for agent in AGENTS:
        await client.add_agent(agent)
        for capability in ("read:account", "write:account", "read:ledger", "write:ledger"):
            await client.grant(agent, capability)


async def _state(client: AsyncKernosClient) -> tuple[int, dict[str, int]]:
    account = await client.object("account")
    ledger = await client.object("ledger", preview_bytes=100_000)
    assert account.preview is not None and ledger.preview is not None
    assert account.preview.has_json and ledger.preview.has_json
    return account.preview.json["budget"], ledger.preview.json


async def _check(client: AsyncKernosClient, committed: dict[str, int]) -> None:
    budget, ledger = await _state(client)
    assert budget >= 0, f"the budget was overspent: {budget}"
    # Every acknowledged spend is in the ledger, once: no update was lost or doubled.
    assert ledger == {agent: count for agent, count in committed.items() if count}
    assert sum(ledger.values()) == BUDGET - budget
    assert budget == 0, "the clients stopped while budget was left"


def test_eight_clients_serialize_without_lost_updates(tmp_path: Path) -> None:
    async def main() -> None:
        async with run_kernel(tmp_path / "ws", env=ENV) as (_manager, owner):
            await _setup(owner)
            clients = [await AsyncKernosClient.connect(tmp_path / "ws") for _ in AGENTS]
            committed = dict.fromkeys(AGENTS, 0)
            refused = dict.fromkeys(AGENTS, 0)

            async def work(client: AsyncKernosClient, agent: str) -> None:
                for _ in range(OPS):
                    result = await client.op(SPEND, principal=agent)
                    if result.committed:
                        committed[agent] += 1
                    else:
                        assert result.status == "failed", result
                        assert result.error is not None
                        assert "insufficient budget" in result.error.message
                        refused[agent] += 1

            try:
                await asyncio.gather(*(work(c, a) for c, a in zip(clients, AGENTS, strict=True)))
            finally:
                for client in clients:
                    await client.close()
            assert sum(committed.values()) == BUDGET
            assert sum(refused.values()) == CLIENTS * OPS - BUDGET
            await _check(owner, committed)

    asyncio.run(main())


def test_stale_reads_conflict_and_every_conflict_is_resolved_by_a_retry(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with run_kernel(tmp_path / "ws", env=ENV) as (_manager, owner):
            await _setup(owner)
            clients = [await AsyncKernosClient.connect(tmp_path / "ws") for _ in AGENTS]
            committed = dict.fromkeys(AGENTS, 0)
            conflicts = dict.fromkeys(AGENTS, 0)

            async def work(client: AsyncKernosClient, agent: str) -> None:
                for number in range(OPS):
                    async def attempt(number: int = number) -> OpResult:
                        # Read, decide outside any op, act with a precondition.
                        seen = await client.versions(["account", "ledger"], principal=agent)
                        result = await client.op(SPEND, principal=agent,
                                                 expect_versions=seen,
                                                 key=f"{agent}-{number}")
                        if result.conflict:
                            conflicts[agent] += 1
                        return result

                    result = await retry_on_conflict(attempt, attempts=200)
                    assert not result.conflict
                    if result.committed:
                        committed[agent] += 1
                    else:
                        assert result.status == "failed", result

            try:
                await asyncio.gather(*(work(c, a) for c, a in zip(clients, AGENTS, strict=True)))
            finally:
                for client in clients:
                    await client.close()
            assert sum(conflicts.values()) > 0, "eight racing clients never saw a stale read"
            assert sum(committed.values()) == BUDGET
            await _check(owner, committed)
            records = await owner.audit(status="conflict", limit=100_000)
            assert len(records) == sum(conflicts.values())

    asyncio.run(main())


def test_two_agents_race_for_one_budget_and_exactly_one_wins(tmp_path: Path) -> None:
    """The seed scenario: both read budget = 500, both try to spend 400."""
    async def main() -> None:
        async with run_kernel(tmp_path / "ws", env=ENV) as (_manager, owner):
            assert (await owner.op("budget = 500")).committed
            for agent in ("alice", "bob"):
                await owner.add_agent(agent)
                await owner.grant(agent, "read:budget")
                await owner.grant(agent, "write:budget")
            alice = await AsyncKernosClient.connect(tmp_path / "ws")
            bob = await AsyncKernosClient.connect(tmp_path / "ws")
            try:
                seen = [await client.versions(["budget"], principal=who)
                        for client, who in ((alice, "alice"), (bob, "bob"))]
                spend = "write('budget', read('budget').copy() - 400)"
                results = await asyncio.gather(
                    alice.op(spend, principal="alice", expect_versions=seen[0]),
                    bob.op(spend, principal="bob", expect_versions=seen[1]))
                assert sorted(result.status for result in results) == ["committed", "conflict"]
                loser = next(result for result in results if result.conflict)
                assert loser.versions == {"budget": 2}
                assert loser.error is not None and "version 2" in loser.error.message
                budget = await owner.object("budget")
                assert budget.preview is not None and budget.preview.json == 100
            finally:
                await alice.close()
                await bob.close()

    asyncio.run(main())
