"""Capabilities: boundaries and messages that mutation testing found unpinned.

Run ``scripts/mutation capabilities`` to see what these kill: the last
decimal place an amount may have, the event kinds' pattern coverage, litellm
model names, and the exact refusals (an agent reads them to fix its request).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from kernos.agents.capabilities import Grant, amount, parse_capability
from kernos.amounts import PLACES, QUANTUM
from kernos.errors import InvalidGrant


def grant(capability: str, **kwargs: object) -> Grant:
    kind, target = parse_capability(capability)
    return Grant(id="g1", principal="alice", kind=kind, target=target, granted_by="human",
                 op=1, **kwargs)  # type: ignore[arg-type]


# -- amounts --------------------------------------------------------------------


def test_an_amount_may_have_exactly_the_allowed_places() -> None:
    assert amount(QUANTUM) == QUANTUM
    assert PLACES == 18
    with pytest.raises(InvalidGrant):
        amount(QUANTUM / 10)


def test_too_many_places_is_refused_with_the_value_cut_to_sixty_characters() -> None:
    value = Decimal("0." + "1" * 70)
    with pytest.raises(InvalidGrant) as raised:
        amount(value)
    assert str(raised.value) == (
        f"the amount {str(value)[:60]} has more than 18 decimal places; amounts are exact "
        f"to {QUANTUM} (round it to that yourself)")


def test_a_wrong_type_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidGrant) as raised:
        amount(1.5, what="limit")
    assert str(raised.value) == (
        "the limit must be an int or a decimal.Decimal, not float (floats round, strings "
        "and subclasses are not accepted)")


@pytest.mark.parametrize(("value", "message"), [
    (-1, "the amount -1 is negative; give zero or more"),
    (Decimal("Infinity"), "the amount Infinity is not finite; give a finite int or Decimal"),
])
def test_the_default_name_in_refusals_is_amount(value: object, message: str) -> None:
    with pytest.raises(InvalidGrant) as raised:
        amount(value)
    assert str(raised.value) == message


# -- parsing --------------------------------------------------------------------


@pytest.mark.parametrize(("capability", "expected"), [
    ("emit:orders.*", ("emit", "orders.*")),
    ("subscribe:orders.**", ("subscribe", "orders.**")),
    ("llm:openai/gpt-4o-mini", ("llm", "openai/gpt-4o-mini")),
    ("llm:ollama/x:7b", ("llm", "ollama/x:7b")),
])
def test_event_patterns_and_litellm_model_names_parse(
        capability: str, expected: tuple[str, str]) -> None:
    assert parse_capability(capability) == expected


def test_a_model_name_is_no_target_for_other_kinds() -> None:
    with pytest.raises(InvalidGrant, match="bad target"):
        parse_capability("call:openai/gpt-4o-mini")


def long(prefix: str) -> str:
    return prefix + "x" * 100


@pytest.mark.parametrize(("capability", "tail"), [
    (long("nokind"),
     " is not a capability; write KIND:TARGET with KIND one of agents, call, emit, file, llm, "
     "memory, read, spend, subscribe, write (for example 'call:search' or 'spend:USD')"),
    (long("call:") + "/",
     " has a bad target; use letters, digits, '_', '.', '-' (at most 64), or '*'"),
])
def test_refusals_quote_the_first_eighty_characters(capability: str, tail: str) -> None:
    with pytest.raises(InvalidGrant) as raised:
        parse_capability(capability)
    assert str(raised.value) == repr(capability[:80]) + tail


def test_a_bad_event_pattern_is_refused_with_the_pattern_error() -> None:
    capability = "emit:" + "a." * 60 + "b"
    with pytest.raises(InvalidGrant) as raised:
        parse_capability(capability)
    message = str(raised.value)
    assert message.startswith(repr(capability[:80]) + ": ")
    assert len(message) > len(repr(capability[:80])) + 2


def test_only_agents_spawn_exists() -> None:
    with pytest.raises(InvalidGrant) as raised:
        parse_capability("agents:kill")
    assert str(raised.value) == "the only 'agents' capability is 'agents:spawn'"


# -- what a grant covers --------------------------------------------------------


def test_an_emit_grant_covers_topics_its_pattern_matches() -> None:
    emit = grant("emit:orders.*")
    assert emit.covers("emit", "orders.new")
    assert emit.covers("emit", "orders.*")
    assert not emit.covers("emit", "orders.new.paid")
    assert not emit.covers("emit", "payments.new")


def test_an_event_grant_covers_nothing_of_another_kind() -> None:
    assert not grant("emit:orders.*").covers("subscribe", "orders.new")
    assert not grant("subscribe:orders.**").covers("emit", "orders.new")
    assert not grant("emit:orders").covers("call", "orders")


def test_a_subscribe_grant_covers_narrower_patterns() -> None:
    subscribe = grant("subscribe:orders.**")
    assert subscribe.covers("subscribe", "orders.new.paid")
    assert subscribe.covers("subscribe", "orders.*")
    assert not subscribe.covers("subscribe", "payments.*")


def test_a_wildcard_call_grant_covers_dotted_tool_names() -> None:
    # Tool targets are names, not topic patterns: '*' covers 'a.b' whole.
    assert grant("call:*").covers("call", "search.web")


def test_a_revoked_event_grant_covers_nothing() -> None:
    assert not grant("emit:orders.*", revoked_op=3).covers("emit", "orders.new")
