"""Registry rules that mutation testing found unpinned.

Run ``scripts/mutation registry`` to see what these kill: the retry settings
an external tool keeps, the bounds on them, argument checking against a tool's
schema, a revocation that fans out, and the exact refusals (an agent reads
them to fix its request, so their words are behaviour).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from kernos.agents.registry import HUMAN, Registry, check_arguments, check_schema, shown
from kernos.errors import CapabilityDenied, InvalidGrant, UnknownTool, UsageError

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "integer"}}}
SCHEMA_ADVICE = ("Give {'type': 'object', 'properties': {NAME: {'type': ...}}, "
                 "'required': [...]}")


@pytest.fixture
def reg() -> Registry:
    registry = Registry()
    registry.add_agent("alice", parent=HUMAN, op=1)
    return registry


def pay(x: int, idempotency_key: str) -> str:
    return f"paid {x} as {idempotency_key}"


def external(reg: Registry, function: Callable[..., Any] = pay, **kwargs: Any) -> Any:
    return reg.define_tool(name="pay", function=function, schema=SCHEMA, description="pays",
                           effect="external", author=HUMAN, op=2, **kwargs)


def message(error: pytest.ExceptionInfo[BaseException]) -> str:
    return str(error.value)


# -- shown ------------------------------------------------------------------------


def test_shown_cuts_strings_at_eighty_and_names_other_types() -> None:
    assert shown("a" * 100) == "a" * 80
    assert shown(10**100) == "<a int>"
    assert shown(None) == "<a NoneType>"


# -- what a tool version keeps ----------------------------------------------------


def test_a_tool_version_keeps_its_function_source_and_retry_settings(reg: Registry) -> None:
    def resolve(key: str) -> tuple[bool, Any]:
        return False, None

    version = reg.define_tool(
        name="pay", function=pay, schema=SCHEMA, description="pays", effect="external",
        author="alice", op=2, source="def pay(): ...", resolve=resolve, attempts=7,
        backoff=2)
    assert version.function is pay
    assert version.source == "def pay(): ..."
    assert version.resolve is resolve
    assert (version.attempts, version.backoff) == (7, 2.0)
    assert type(version.backoff) is float
    assert (version.name, version.version, version.capability, version.effect,
            version.author, version.op) == ("pay", 1, "call:pay", "external", "alice", 2)


def test_the_retry_settings_default_to_three_attempts_and_fifty_milliseconds(
        reg: Registry) -> None:
    version = external(reg)
    assert (version.attempts, version.backoff, version.resolve) == (3, 0.05, None)


def test_a_pure_tool_keeps_the_default_retry_settings(reg: Registry) -> None:
    version = reg.define_tool(name="double", function=lambda x: 2 * x, schema=SCHEMA,
                              description="doubles", effect="pure", author=HUMAN, op=2,
                              attempts=True, backoff="soon")
    assert (version.attempts, version.backoff) == (3, 0.05)


# -- external tools ---------------------------------------------------------------


@pytest.mark.parametrize("attempts", [1, 20])
def test_attempts_may_be_one_to_twenty(reg: Registry, attempts: int) -> None:
    assert external(reg, attempts=attempts).attempts == attempts


@pytest.mark.parametrize("attempts", [0, 21, 3.0, True, "3"])
def test_other_attempts_are_refused(reg: Registry, attempts: object) -> None:
    with pytest.raises(UsageError) as raised:
        external(reg, attempts=attempts)
    assert message(raised) == "tool 'pay': attempts must be an int from 1 to 20"
    assert reg.tools == {}


@pytest.mark.parametrize("backoff", [0, 0.0, 60, 60.0])
def test_backoff_may_be_zero_to_sixty_seconds(reg: Registry, backoff: float) -> None:
    assert external(reg, backoff=backoff).backoff == backoff


@pytest.mark.parametrize("backoff", [-0.01, 60.01, "1", None])
def test_other_backoffs_are_refused(reg: Registry, backoff: object) -> None:
    with pytest.raises(UsageError) as raised:
        external(reg, backoff=backoff)
    assert message(raised) == "tool 'pay': backoff must be a number of seconds from 0 to 60"


def test_resolve_must_be_callable(reg: Registry) -> None:
    with pytest.raises(UsageError) as raised:
        external(reg, resolve="yes")
    assert message(raised) == "tool 'pay': resolve must be a function of the idempotency key"


def test_only_an_external_tool_takes_resolve(reg: Registry) -> None:
    with pytest.raises(UsageError) as raised:
        reg.define_tool(name="double", function=lambda x: x, schema=SCHEMA, description="",
                        effect="pure", author=HUMAN, op=2, resolve=lambda key: (False, None))
    assert message(raised) == "tool 'double': only an external tool has a resolve function"


def test_the_idempotency_key_is_no_schema_argument(reg: Registry) -> None:
    schema = {"type": "object", "properties": {"idempotency_key": {"type": "string"}}}
    with pytest.raises(UsageError) as raised:
        reg.define_tool(name="pay", function=pay, schema=schema, description="",
                        effect="external", author=HUMAN, op=2)
    assert message(raised) == ("tool 'pay': 'idempotency_key' is passed by Kernos, so it "
                               "cannot be an argument in the schema")


def test_an_external_function_must_take_the_idempotency_key(reg: Registry) -> None:
    with pytest.raises(UsageError) as raised:
        external(reg, function=lambda x: x)
    assert message(raised) == (
        "tool 'pay' is external, so it must accept the keyword argument idempotency_key "
        "(pass it on to the service, so that a retry is not done twice)")


def test_keyword_catch_alls_and_unreadable_signatures_are_accepted(reg: Registry) -> None:
    assert external(reg, function=lambda x, **options: x).version == 1
    # max has no signature inspect can read: there is nothing to check.
    assert external(reg, function=max).version == 2


# -- argument checking --------------------------------------------------------------


CHECKED = check_schema({
    "type": "object",
    "properties": {"n": {"type": "integer"}, "x": {"type": "number"},
                   "flag": {"type": "boolean"}, "name": {"type": "string"}},
    "required": ["n", "name"],
}, tool="t")


@pytest.mark.parametrize("arguments", [
    {"n": 1, "name": "a"},
    {"n": 1, "name": "a", "x": 2},
    {"n": 1, "name": "a", "x": 2.5, "flag": False},
])
def test_arguments_that_fit_the_schema_pass(arguments: dict[str, object]) -> None:
    check_arguments("t", CHECKED, arguments)


@pytest.mark.parametrize(("arguments", "expected"), [
    ({}, "tool 't' needs n, name"),
    ({"name": "a"}, "tool 't' needs n"),
    ({"n": 1, "name": "a", "y": 1}, "tool 't' takes no argument 'y'"),
    ({"n": "1", "name": "a"}, "tool 't': n must be a integer, not str"),
    ({"n": True, "name": "a"}, "tool 't': n must be a integer, not bool"),
    ({"n": 1, "name": "a", "x": True}, "tool 't': x must be a number, not bool"),
    ({"n": 1, "name": "a", "flag": 1}, "tool 't': flag must be a boolean, not int"),
])
def test_arguments_that_do_not_fit_are_refused_by_name(
        arguments: dict[str, object], expected: str) -> None:
    with pytest.raises(TypeError) as raised:
        check_arguments("t", CHECKED, arguments)
    assert message(raised) == expected


def test_a_schema_without_properties_takes_no_arguments() -> None:
    check_arguments("t", {"type": "object"}, {})
    with pytest.raises(TypeError, match="takes no argument 'a'"):
        check_arguments("t", {"type": "object"}, {"a": 1})


# -- schema refusals ----------------------------------------------------------------


@pytest.mark.parametrize(("schema", "problem"), [
    ([], "it is a list, not a dict"),
    ({"type": "array"}, "its 'type' must be 'object'"),
    ({"type": "object", "properties": []}, "'properties' must be a dict"),
    ({"type": "object", "properties": {"_x": {"type": "string"}}},
     "property '_x' is not a plain identifier"),
    ({"type": "object", "properties": {"x": {"type": "date"}}},
     "property 'x' needs a 'type' among ['array', 'boolean', 'integer', 'null', 'number', "
     "'object', 'string']"),
    ({"type": "object", "required": ["x"]}, "'required' must list names from 'properties'"),
    ({"type": "object", "title": "t", "$id": "u"}, "unsupported keys ['$id', 'title']"),
])
def test_schema_refusals_say_what_is_wrong_and_what_to_give(
        schema: object, problem: str) -> None:
    with pytest.raises(InvalidGrant) as raised:
        check_schema(schema, tool="t")
    assert message(raised) == f"the schema of tool 't' is malformed: {problem}. {SCHEMA_ADVICE}"


def test_define_tool_names_the_tool_in_a_schema_refusal(reg: Registry) -> None:
    with pytest.raises(InvalidGrant, match=r"^the schema of tool 'double' is malformed"):
        reg.define_tool(name="double", function=lambda x: x, schema={"type": "array"},
                        description="", effect="pure", author=HUMAN, op=2)


# -- other refusals -----------------------------------------------------------------


def test_a_bad_agent_name_is_quoted_and_the_rule_given() -> None:
    with pytest.raises(UsageError) as raised:
        Registry().add_agent("Bad", parent=HUMAN, op=1)
    assert message(raised) == (
        "'Bad' is not a valid agent name: use lowercase letters, digits and '_', starting "
        "with a letter (sub-agents: 'parent/child')")


def test_a_bad_tool_name_and_description_are_refused_with_the_rule(reg: Registry) -> None:
    with pytest.raises(UsageError) as raised:
        reg.define_tool(name="Bad", function=pay, schema=SCHEMA, description="",
                        effect="pure", author=HUMAN, op=2)
    assert message(raised) == ("'Bad' is not a valid tool name: lowercase letters, digits "
                               "and '_', starting with a letter")
    with pytest.raises(InvalidGrant) as raised:
        reg.define_tool(name="ok", function=pay, schema=SCHEMA, description="d" * 1001,
                        effect="pure", author=HUMAN, op=2)
    assert message(raised) == ("the description of tool 'ok' must be a string of at most "
                               "1000 characters")


def test_an_agent_cannot_redefine_another_principals_tool(reg: Registry) -> None:
    reg.add_agent("bob", parent=HUMAN, op=1)
    reg.define_tool(name="t", function=pay, schema=SCHEMA, description="", effect="pure",
                    author="alice", op=2)
    with pytest.raises(CapabilityDenied) as raised:
        reg.define_tool(name="t", function=pay, schema=SCHEMA, description="", effect="pure",
                        author="bob", op=3)
    assert (raised.value.principal, raised.value.capability, raised.value.detail) == (
        "bob", "define tool t", "it belongs to alice")


def test_a_limit_refusal_calls_it_a_limit(reg: Registry) -> None:
    with pytest.raises(InvalidGrant) as raised:
        reg.grant("alice", "spend:USD", limit=-1, granter=HUMAN, op=2)
    assert message(raised) == "the limit -1 is negative; give zero or more"


def test_an_agent_granting_without_a_parent_is_denied_by_name(reg: Registry) -> None:
    with pytest.raises(CapabilityDenied) as raised:
        reg.grant("alice", "call:search", granter="alice", op=2)
    assert (raised.value.principal, raised.value.capability, raised.value.detail) == (
        "alice", "call:search", "agents can only delegate grants they hold")


def test_a_wildcard_is_not_derived_from_a_narrower_grant(reg: Registry) -> None:
    reg.add_agent("alice/sub", parent="alice", op=1)
    narrow = reg.grant("alice", "call:search", granter=HUMAN, op=2)
    with pytest.raises(InvalidGrant) as raised:
        reg.grant("alice/sub", "call:*", granter="alice", op=3, parent=narrow)
    assert message(raised) == "a wildcard cannot be derived from a narrower grant"
    wide = reg.grant("alice", "call:*", granter=HUMAN, op=2)
    assert reg.grant("alice/sub", "call:*", granter="alice", op=3, parent=wide).parent == wide.id


def test_an_unknown_grant_id_is_denied_to_its_holder(reg: Registry) -> None:
    with pytest.raises(CapabilityDenied) as raised:
        reg.held("alice", "g99")
    assert (raised.value.principal, raised.value.capability, raised.value.detail) == (
        "alice", "grant g99", "no such active grant is held by this principal")


def test_delegating_outside_the_family_is_denied_to_the_holder(reg: Registry) -> None:
    reg.add_agent("bob", parent=HUMAN, op=1)
    held = reg.grant("alice", "call:search", granter=HUMAN, op=2)
    with pytest.raises(CapabilityDenied) as raised:
        reg.attenuate("alice", held.id, "bob", op=3)
    assert (raised.value.principal, raised.value.capability, raised.value.detail) == (
        "alice", "delegate to bob", "grants can only be delegated to your sub-agents")


def test_revocation_reaches_every_child_of_a_grant(reg: Registry) -> None:
    reg.add_agent("alice/a", parent="alice", op=1)
    reg.add_agent("alice/b", parent="alice", op=1)
    root = reg.grant("alice", "spend:USD", limit=Decimal(10), granter=HUMAN, op=2)
    first = reg.attenuate("alice", root.id, "alice/a", limit=1, op=3)
    second = reg.attenuate("alice", root.id, "alice/b", limit=1, op=3)
    revoked = reg.revoke(root, op=4)
    assert {grant.id for grant in revoked} == {root.id, first.id, second.id}
    assert first.revoked_op == second.revoked_op == 4


def test_a_tool_from_this_op_is_unknown_yet_and_the_known_tools_are_listed(
        reg: Registry) -> None:
    reg.define_tool(name="t", function=pay, schema=SCHEMA, description="", effect="pure",
                    author=HUMAN, op=5)
    with pytest.raises(UnknownTool) as raised:
        reg.tool_version("t", before_op=5)
    assert raised.value.known == ["t"]
    assert raised.value.detail == (" yet: it was defined in this op and can be called from "
                                   "the next op")


def test_an_external_tool_may_have_a_schema_without_properties(reg: Registry) -> None:
    def ping(idempotency_key: str) -> None:
        return None

    version = reg.define_tool(name="ping", function=ping, schema={"type": "object"},
                              description="", effect="external", author=HUMAN, op=2)
    assert version.schema == {"type": "object"}


def test_attenuation_refusals_name_the_holder_and_the_limit(reg: Registry) -> None:
    reg.add_agent("alice/sub", parent="alice", op=1)
    held = reg.grant("alice", "spend:USD", limit=Decimal(5), granter=HUMAN, op=2)
    with pytest.raises(InvalidGrant) as raised:
        reg.attenuate("alice", held.id, "alice/sub", target=5, op=3)
    assert message(raised) == "a target is a string"
    with pytest.raises(CapabilityDenied) as denied:
        reg.attenuate("alice", held.id, "alice/sub", target="EUR", op=3)
    assert (denied.value.principal, denied.value.capability) == ("alice", "spend:EUR")
    with pytest.raises(CapabilityDenied) as denied:
        reg.attenuate("alice", held.id, "alice/sub", limit=6, op=3)
    assert (denied.value.principal, denied.value.capability, denied.value.detail) == (
        "alice", "spend:USD up to 6", f"grant {held.id} has only 5 left")
    with pytest.raises(InvalidGrant) as raised:
        reg.attenuate("alice", held.id, "alice/sub", limit=-1, op=3)
    assert message(raised) == "the limit -1 is negative; give zero or more"
