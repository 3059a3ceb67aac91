"""Capabilities: exact amounts, well-formed capability strings, and what a grant covers."""

from __future__ import annotations

import decimal
import fractions
import re
from decimal import Decimal

import pytest

from kernos.agents.capabilities import KINDS, MAX_AMOUNT, Grant, amount, parse_capability
from kernos.errors import InvalidGrant, UsageError


class MyInt(int):
    pass


class MyDecimal(decimal.Decimal):
    pass


class MyStr(str):
    pass


class EqualsEverything(str):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


# -- amounts --------------------------------------------------------------------


def test_the_maximum_is_ten_to_the_fifteen() -> None:
    assert MAX_AMOUNT == 10**15
    assert type(MAX_AMOUNT) is Decimal


@pytest.mark.parametrize("value", [
    0, 1, 50, 10**15, Decimal("0"), Decimal("12.5"), Decimal("0.000001"), Decimal("1E+15"),
    Decimal("999999999999999.99"),
])
def test_amount_accepts_exact_finite_non_negative_values(value: object) -> None:
    result = amount(value)
    assert type(result) is Decimal
    assert result == value


@pytest.mark.parametrize(("value", "words"), [
    (True, "not bool"),
    (False, "not bool"),
    (1.5, "not float"),
    (1.0, "not float"),
    ("5", "not str"),
    (b"5", "not bytes"),
    (None, "not NoneType"),
    ([1], "not list"),
    (1 + 0j, "not complex"),
    (fractions.Fraction(1, 2), "not Fraction"),
    (MyInt(5), "not MyInt"),
    (MyDecimal(5), "not MyDecimal"),
])
def test_amount_refuses_anything_but_exact_int_or_decimal(value: object, words: str) -> None:
    with pytest.raises(InvalidGrant, match=re.escape(words)) as raised:
        amount(value)
    assert "int or a decimal.Decimal" in str(raised.value)


@pytest.mark.parametrize("value", [
    Decimal("NaN"), Decimal("-NaN"), Decimal("sNaN"), Decimal("Infinity"),
    Decimal("-Infinity"),
])
def test_amount_refuses_non_finite_decimals(value: Decimal) -> None:
    with pytest.raises(InvalidGrant, match="is not finite"):
        amount(value)


@pytest.mark.parametrize("value", [-1, -(10**20), Decimal("-0.01"), Decimal("-1E+3")])
def test_amount_refuses_negative_values(value: object) -> None:
    with pytest.raises(InvalidGrant, match="is negative"):
        amount(value)


@pytest.mark.parametrize("value", [
    10**15 + 1, 10**100, Decimal("1000000000000000.5"), Decimal("1E+16"), Decimal("1E+999999"),
])
def test_amount_refuses_values_over_the_maximum(value: object) -> None:
    with pytest.raises(InvalidGrant, match="over the maximum"):
        amount(value)


def test_amount_names_what_it_checks() -> None:
    with pytest.raises(InvalidGrant, match=r"^the limit -3 is negative"):
        amount(-3, what="limit")


def test_invalid_grant_is_a_usage_error() -> None:
    assert issubclass(InvalidGrant, UsageError)


# -- capability strings -----------------------------------------------------------


@pytest.mark.parametrize(("capability", "parsed"), [
    ("call:search", ("call", "search")),
    ("call:*", ("call", "*")),
    ("read:data", ("read", "data")),
    ("write:data", ("write", "data")),
    ("spend:USD", ("spend", "USD")),
    ("llm:gpt-4.1", ("llm", "gpt-4.1")),
    ("agents:spawn", ("agents", "spawn")),
    ("read:a.b_c-d9", ("read", "a.b_c-d9")),
    ("call:" + "a" * 64, ("call", "a" * 64)),
])
def test_parse_capability_accepts_well_formed_capabilities(capability: str,
                                                           parsed: tuple[str, str]) -> None:
    assert parse_capability(capability) == parsed


def test_the_kinds() -> None:
    assert frozenset({"call", "read", "write", "spend", "llm", "agents", "emit",
                      "subscribe", "memory", "file"}) == KINDS


@pytest.mark.parametrize("capability", ["memory:read", "memory:write"])
def test_memory_grants(capability: str) -> None:
    assert parse_capability(capability) == tuple(capability.split(":"))


@pytest.mark.parametrize("capability", ["memory:*", "memory:erase", "memory:READ"])
def test_memory_grants_are_read_or_write_only(capability: str) -> None:
    with pytest.raises(InvalidGrant, match="'memory:read' and 'memory:write'"):
        parse_capability(capability)


@pytest.mark.parametrize("capability", [
    "", "call", "callsearch", "bogus:x", "CALL:x", "Read:data", ":x", "exec:x", " call:x",
])
def test_parse_capability_refuses_unknown_kinds_and_missing_colons(capability: str) -> None:
    with pytest.raises(InvalidGrant, match="is not a capability; write KIND:TARGET"):
        parse_capability(capability)


@pytest.mark.parametrize("capability", [
    "call:", "call:1abc", "call:a b", "call:a/b", "call:a:b", "read:data\n", "read:ünï",
    "call:" + "a" * 65, "read:_private", "read:**", "read:a*", "spend:$", "read:kernos:agents",
])
def test_parse_capability_refuses_bad_targets(capability: str) -> None:
    with pytest.raises(InvalidGrant, match="has a bad target"):
        parse_capability(capability)


@pytest.mark.parametrize("capability", ["agents:other", "agents:*", "agents:spawner"])
def test_the_only_agents_capability_is_spawn(capability: str) -> None:
    with pytest.raises(InvalidGrant, match="only 'agents' capability is 'agents:spawn'"):
        parse_capability(capability)


@pytest.mark.parametrize(("capability", "words"), [
    (None, "not NoneType"),
    (1, "not int"),
    (b"call:x", "not bytes"),
    (["call", "x"], "not list"),
    (("call", "x"), "not tuple"),
    (MyStr("call:x"), "not MyStr"),
    (EqualsEverything("call:x"), "not EqualsEverything"),
])
def test_parse_capability_refuses_non_strings_and_str_subclasses(capability: object,
                                                                 words: str) -> None:
    with pytest.raises(InvalidGrant, match=re.escape(words)):
        parse_capability(capability)


def test_a_huge_capability_is_quoted_only_in_part() -> None:
    with pytest.raises(InvalidGrant) as raised:
        parse_capability("x" * 100_000)
    assert len(str(raised.value)) < 400


# -- grants -------------------------------------------------------------------------


def make_grant(**overrides: object) -> Grant:
    fields: dict[str, object] = {"id": "g1", "principal": "alice", "kind": "read",
                                 "target": "data", "granted_by": "human", "op": 1}
    fields.update(overrides)
    return Grant(**fields)  # type: ignore[arg-type]


def test_a_grant_covers_its_own_kind_and_target_only() -> None:
    grant = make_grant()
    assert grant.covers("read", "data")
    assert not grant.covers("read", "other")
    assert not grant.covers("write", "data")
    assert not grant.covers("call", "data")


def test_write_covers_read_but_not_the_reverse() -> None:
    assert make_grant(kind="write").covers("read", "data")
    assert make_grant(kind="write").covers("write", "data")
    assert not make_grant(kind="read").covers("write", "data")


def test_a_wildcard_covers_every_target_of_its_kind() -> None:
    grant = make_grant(kind="call", target="*")
    assert grant.covers("call", "anything")
    assert not grant.covers("read", "anything")


def test_a_revoked_grant_covers_nothing() -> None:
    grant = make_grant(revoked_op=3)
    assert not grant.active
    assert not grant.covers("read", "data")


def test_remaining_and_describe() -> None:
    grant = make_grant(kind="spend", target="USD", limit=Decimal(50), used=Decimal("12.5"))
    assert grant.remaining == Decimal("37.5")
    assert grant.capability == "spend:USD"
    assert grant.describe() == {
        "id": "g1", "principal": "alice", "capability": "spend:USD", "limit": "50",
        "used": "12.5", "remaining": "37.5", "granted_by": "human", "parent": None, "op": 1,
        "active": True, "revoked_op": None,
    }
    unlimited = make_grant().describe()
    assert unlimited["limit"] is None and unlimited["used"] is None
    assert unlimited["remaining"] is None
