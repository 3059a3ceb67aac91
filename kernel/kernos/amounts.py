"""Exact amounts: what budgets are counted in.

A budget (a ``spend`` or ``llm`` grant's limit, what it used, what an LLM call
cost) is a ``decimal.Decimal`` with at most :data:`PLACES` decimal places.
Amounts that enter from agent code with more places are refused
(:func:`kernos.agents.capabilities.amount`); costs computed from a provider's
price table are rounded *up* to that precision (:func:`round_up`), so a
budget never counts less than was spent.

All arithmetic on amounts goes through :func:`add` and :func:`subtract`,
which work in :data:`EXACT`: a context wide enough for any sum of amounts
this project allows, that *raises* (``decimal.Inexact``) instead of rounding.
So ``used`` is always the exact sum of what was spent: a tiny spend is never
absorbed by a large one (which the default 28-digit context does), and two
budgets that differ in their 18th place never compare equal.
"""

from __future__ import annotations

import decimal

__all__ = ["EXACT", "PLACES", "QUANTUM", "add", "places", "round_up", "subtract"]

PLACES = 18
"""The most decimal places an amount may have (``1E-18`` is the smallest unit)."""
QUANTUM = decimal.Decimal(1).scaleb(-PLACES)

EXACT = decimal.Context(
    prec=100, rounding=decimal.ROUND_HALF_EVEN, Emin=-999_999, Emax=999_999,
    traps=[decimal.Inexact, decimal.Rounded, decimal.InvalidOperation, decimal.Overflow,
           decimal.DivisionByZero])
"""Arithmetic that cannot round: any result that would need rounding raises."""


def add(a: decimal.Decimal, b: decimal.Decimal | int) -> decimal.Decimal:
    return EXACT.add(a, b)


def subtract(a: decimal.Decimal, b: decimal.Decimal | int) -> decimal.Decimal:
    return EXACT.subtract(a, b)


def places(value: decimal.Decimal) -> int:
    """How many decimal places ``value`` needs (trailing zeros do not count)."""
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int), "only finite amounts have places"
    if not value:
        return 0
    zeros = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    return max(0, -(exponent + zeros))


def round_up(value: decimal.Decimal) -> decimal.Decimal:
    """``value`` rounded up (towards +infinity) to :data:`PLACES` places: for costs."""
    if places(value) <= PLACES:
        return value
    return value.quantize(QUANTUM, rounding=decimal.ROUND_CEILING,
                          context=decimal.Context(prec=EXACT.prec))
