"""Budgets are exact: no amount is rounded, absorbed or lost, whatever its size.

Every amount has at most :data:`kernos.amounts.PLACES` decimal places and is
added and subtracted in a context that raises rather than rounds, so a grant's
``used`` is always the exact sum of the spends that committed.
"""

from __future__ import annotations

from decimal import Context, Decimal, Inexact

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernos.agents.capabilities import amount
from kernos.amounts import PLACES, round_up
from kernos.errors import CapabilityDenied, InvalidGrant, OpVetoed


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
    return env


def grant_of(env, capability: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return [g for g in env.agents.grants("alice")
            if g["capability"] == capability and g["active"]][-1]


def test_amounts_past_the_fixed_precision_are_refused_naming_it() -> None:
    assert amount(Decimal("1E-18")) == Decimal("1E-18")
    assert amount(Decimal("0.100000000000000000000")) == Decimal("0.1")  # trailing zeros
    for bad in ("1E-30", "1.0000000000000000001", "999999999999999.0000000000000000001"):
        with pytest.raises(InvalidGrant, match=f"more than {PLACES} decimal places"):
            amount(Decimal(bad))


def test_a_tiny_spend_cannot_make_room_for_a_whole_budget(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "spend:USD", 100)
    env.run("alice", "spend(Decimal('1E-18'), 'USD')")
    op = env.image.begin(source="")
    with pytest.raises(CapabilityDenied, match=r"99\.999999999999999999 left"):
        env.runtime.run("alice", "spend(100, 'USD')")
    with pytest.raises(OpVetoed):
        op.commit()
    assert grant_of(env, "spend:USD")["used"] == "1E-18"


def test_a_huge_budget_still_counts_its_smallest_unit(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "spend:USD", 10 ** 15)
    out = env.run("alice", "print(spend(Decimal('1E-18'), 'USD'))")
    assert out.strip() == "999999999999999.999999999999999999"


def test_a_thousand_tiny_spends_are_all_counted(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "spend:USD", 10 ** 12)
    env.run("alice", "spend(10 ** 12 - 1, 'USD')\n"
                     "for _ in range(1000):\n    spend(Decimal('1E-18'), 'USD')")
    grant = grant_of(env, "spend:USD")
    assert Decimal(grant["used"]) == Decimal(10 ** 12 - 1) + 1000 * Decimal("1E-18")
    assert Decimal(grant["remaining"]) == 1 - Decimal("1E-15")


def test_costs_round_up_to_the_fixed_precision() -> None:
    assert round_up(Decimal("1.5E-25")) == Decimal("1E-18")
    assert round_up(Decimal("0.1234")) == Decimal("0.1234")
    assert round_up(Decimal(0)) == 0


units = st.one_of(st.just(0), st.integers(min_value=0, max_value=100),
                 st.integers(min_value=0, max_value=10 ** 15 - 1))
fractions = st.one_of(st.just(0), st.integers(min_value=0, max_value=99),
                      st.integers(min_value=0, max_value=10 ** PLACES - 1))
amounts = st.builds(lambda whole, fraction: Decimal(f"{whole}.{fraction:0{PLACES}d}"),
                    units, fractions)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=amounts, spends=st.lists(st.lists(amounts, min_size=1, max_size=3),
                                      min_size=1, max_size=6))
def test_used_is_always_the_exact_sum_of_committed_spends(  # type: ignore[no-untyped-def]
        env, limit: Decimal, spends: list[list[Decimal]]) -> None:
    with env.op():  # a fresh budget: an earlier (failed) example may have left one
        if any(g["active"] and g["capability"] == "spend:USD"
               for g in env.agents.grants("alice")):
            env.agents.revoke("alice", "spend:USD")
        env.agents.grant("alice", "spend:USD", limit)
    grant_id = grant_of(env, "spend:USD")["id"]
    committed = Decimal(0)
    for batch in spends:  # one op per batch: all of it commits or none of it
        source = "".join(f"spend(Decimal('{value}'), 'USD')\n" for value in batch)
        total = exact_sum([committed, *batch])
        op = env.image.begin(source="")
        try:
            env.runtime.run("alice", source)
        except CapabilityDenied:
            assert total > limit
            with pytest.raises(OpVetoed):
                op.commit()
        except BaseException:
            op.abort()  # the next example needs the image free
            raise
        else:
            assert total <= limit
            op.commit()
            committed = total
        grant = next(g for g in env.agents.grants("alice") if g["id"] == grant_id)
        assert Decimal(grant["used"]) == committed
        assert Decimal(grant["remaining"]) == TEST_CONTEXT.subtract(limit, committed)


# The test's own sums must not round either, and must not change the context the
# code under test runs in (a localcontext() here would: it is the same thread).
TEST_CONTEXT = Context(prec=200, traps=[Inexact])


def exact_sum(values: list[Decimal]) -> Decimal:
    total = Decimal(0)
    for value in values:
        total = TEST_CONTEXT.add(total, value)
    return total
