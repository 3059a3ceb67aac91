"""Registry rules: principals, grants and their attenuation and revocation, tool versions."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kernos.agents.registry import HUMAN, Registry, check_schema
from kernos.errors import CapabilityDenied, InvalidGrant, UnknownAgent, UnknownTool, UsageError

OBJECT_SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


class MyStr(str):
    pass


class MyDict(dict):  # type: ignore[type-arg]
    pass


@pytest.fixture
def reg() -> Registry:
    registry = Registry()
    registry.add_agent("alice", parent=HUMAN, op=1)
    registry.add_agent("bob", parent=HUMAN, op=1)
    return registry


def family(reg: Registry) -> None:
    """alice -> alice/sub -> alice/sub/leaf, and a sibling alice/other."""
    reg.add_agent("alice/sub", parent="alice", op=2)
    reg.add_agent("alice/sub/leaf", parent="alice/sub", op=2)
    reg.add_agent("alice/other", parent="alice", op=2)


# -- principals -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "alice", "a1_b", "a" * 32, "x9"])
def test_add_agent_accepts_valid_names(name: str) -> None:
    reg = Registry()
    principal = reg.add_agent(name, parent=HUMAN, op=4)
    assert reg.principal(name) is principal
    assert (principal.name, principal.parent, principal.created_op) == (name, HUMAN, 4)
    assert principal.limits == {}


@pytest.mark.parametrize("name", [
    "", "Alice", "1a", "_a", "a-b", "a b", "a.b", "a" * 33, "alice/", "/alice", "alice//x",
    "a/b/c/d/e", "alice\n", "ålice", 5, None, b"alice", MyStr("alice"), ["alice"],
])
def test_add_agent_refuses_invalid_names(name: object) -> None:
    reg = Registry()
    with pytest.raises(UsageError, match="is not a valid agent name"):
        reg.add_agent(name, parent=HUMAN, op=1)
    assert reg.principals == {}


def test_add_agent_refuses_duplicates_and_the_human(reg: Registry) -> None:
    with pytest.raises(UsageError, match="'alice' already exists"):
        reg.add_agent("alice", parent=HUMAN, op=2)
    with pytest.raises(UsageError, match="'human' already exists"):
        reg.add_agent(HUMAN, parent=HUMAN, op=2)
    assert sorted(reg.principals) == ["alice", "bob"]


def test_sub_agents_are_created_only_by_their_parent(reg: Registry) -> None:
    for parent in (HUMAN, "bob"):
        with pytest.raises(UsageError, match="can only be created by 'alice'"):
            reg.add_agent("alice/helper", parent=parent, op=2)
    helper = reg.add_agent("alice/helper", parent="alice", op=2)
    assert helper.parent == "alice"
    deeper = reg.add_agent("alice/helper/x", parent="alice/helper", op=3)
    assert deeper.parent == "alice/helper"
    with pytest.raises(UsageError, match="can only be created by 'alice/helper'"):
        reg.add_agent("alice/helper/y", parent="alice", op=3)


def test_unknown_principals(reg: Registry) -> None:
    with pytest.raises(UnknownAgent) as raised:
        reg.principal("carol")
    assert raised.value.known == ["alice", "bob"]
    assert "There is no agent 'carol' (agents: alice, bob)" in str(raised.value)
    with pytest.raises(UnknownAgent):
        reg.principal(MyStr("alice"))
    with pytest.raises(UnknownAgent):
        reg.principal(None)


def test_is_descendant(reg: Registry) -> None:
    family(reg)
    assert reg.is_descendant("alice/sub", "alice")
    assert reg.is_descendant("alice/sub/leaf", "alice")
    assert reg.is_descendant("alice/sub/leaf", "alice/sub")
    assert not reg.is_descendant("alice", "alice")
    assert not reg.is_descendant("alice/other", "alice/sub")
    assert not reg.is_descendant("alice", "alice/sub")
    assert not reg.is_descendant("bob", "alice")


@pytest.mark.parametrize("call", ["add_agent", "principal", "held", "tool_version"])
def test_error_messages_survive_huge_int_arguments(reg: Registry, call: str) -> None:
    huge = 10**5000
    with pytest.raises(UsageError if call != "held" else CapabilityDenied):
        if call == "add_agent":
            reg.add_agent(huge, parent=HUMAN, op=2)
        elif call == "principal":
            reg.principal(huge)
        elif call == "held":
            reg.held("alice", huge)
        else:
            reg.tool_version(huge, before_op=2)


# -- grants ------------------------------------------------------------------------


def test_the_human_grants_with_sequential_ids(reg: Registry) -> None:
    first = reg.grant("alice", "read:data", granter=HUMAN, op=2)
    second = reg.grant("alice", "spend:USD", limit=50, granter=HUMAN, op=3)
    assert (first.id, second.id) == ("g1", "g2")
    assert second.limit == Decimal(50) and second.used == 0
    assert (second.principal, second.granted_by, second.parent, second.op) == (
        "alice", HUMAN, None, 3)
    assert reg.grants == {"g1": first, "g2": second}
    assert reg.of("alice") == [first, second] and reg.of("bob") == []


def test_limited_kinds_need_a_limit_and_others_refuse_one(reg: Registry) -> None:
    for capability in ("spend:USD", "llm:gpt"):
        with pytest.raises(InvalidGrant, match="needs a limit"):
            reg.grant("alice", capability, granter=HUMAN, op=2)
    for capability in ("read:data", "call:x", "agents:spawn"):
        with pytest.raises(InvalidGrant, match="takes no limit"):
            reg.grant("alice", capability, limit=5, granter=HUMAN, op=2)
    for bad in (5.0, "5", True, -1, Decimal("NaN")):
        with pytest.raises(InvalidGrant):
            reg.grant("alice", "spend:USD", limit=bad, granter=HUMAN, op=2)
    assert reg.grants == {}
    assert reg.next_grant == 1


def test_grants_need_a_known_principal_and_a_valid_capability(reg: Registry) -> None:
    with pytest.raises(UnknownAgent):
        reg.grant("carol", "read:data", granter=HUMAN, op=2)
    with pytest.raises(UnknownAgent):
        reg.grant(HUMAN, "read:data", granter=HUMAN, op=2)
    with pytest.raises(InvalidGrant):
        reg.grant("alice", "read data", granter=HUMAN, op=2)
    assert reg.grants == {}


def test_agents_cannot_grant_directly(reg: Registry) -> None:
    reg.grant("alice", "read:data", granter=HUMAN, op=2)
    reg.add_agent("alice/sub", parent="alice", op=2)
    with pytest.raises(CapabilityDenied, match="agents can only delegate grants they hold"):
        reg.grant("alice/sub", "read:data", granter="alice", op=3)
    assert [grant.principal for grant in reg.grants.values()] == ["alice"]


def test_held_refuses_other_principals_ids_and_revoked_grants(reg: Registry) -> None:
    mine = reg.grant("alice", "read:data", granter=HUMAN, op=2)
    theirs = reg.grant("bob", "read:data", granter=HUMAN, op=2)
    assert reg.held("alice", mine.id) is mine
    for holder, grant_id in (("alice", theirs.id), ("bob", mine.id), ("alice", "g99"),
                             ("alice", 1), ("alice", None), ("alice", MyStr(mine.id))):
        with pytest.raises(CapabilityDenied, match="no such active grant"):
            reg.held(holder, grant_id)
    reg.revoke(mine, op=3)
    with pytest.raises(CapabilityDenied):
        reg.held("alice", mine.id)


def test_attenuation_to_sub_agents(reg: Registry) -> None:
    family(reg)
    parent = reg.grant("alice", "spend:USD", limit=50, granter=HUMAN, op=2)
    child = reg.attenuate("alice", parent.id, "alice/sub", limit=20, op=3)
    assert (child.principal, child.kind, child.target, child.limit) == (
        "alice/sub", "spend", "USD", Decimal(20))
    assert (child.parent, child.granted_by, child.op) == (parent.id, "alice", 3)
    grandchild = reg.attenuate("alice/sub", child.id, "alice/sub/leaf", op=4)
    assert grandchild.limit == Decimal(20)  # no limit given: the rest of the parent's
    assert grandchild.parent == child.id
    assert reg.attenuate("alice", parent.id, "alice/sub/leaf", limit=1, op=4).limit == 1


def test_attenuation_cannot_exceed_the_remaining_limit(reg: Registry) -> None:
    family(reg)
    parent = reg.grant("alice", "spend:USD", limit=50, granter=HUMAN, op=2)
    with pytest.raises(CapabilityDenied, match="has only 50 left"):
        reg.attenuate("alice", parent.id, "alice/sub", limit=51, op=3)
    parent.used = Decimal(30)
    with pytest.raises(CapabilityDenied, match="has only 20 left"):
        reg.attenuate("alice", parent.id, "alice/sub", limit=Decimal("20.01"), op=3)
    assert reg.attenuate("alice", parent.id, "alice/sub", limit=20, op=3).limit == 20
    assert reg.attenuate("alice", parent.id, "alice/other", op=3).limit == 20
    for bad in (5.0, "5", -1, True):
        with pytest.raises(InvalidGrant):
            reg.attenuate("alice", parent.id, "alice/sub", limit=bad, op=3)


def test_attenuation_cannot_change_the_target(reg: Registry) -> None:
    family(reg)
    narrow = reg.grant("alice", "read:data", granter=HUMAN, op=2)
    with pytest.raises(CapabilityDenied, match="covers only read:data"):
        reg.attenuate("alice", narrow.id, "alice/sub", target="secrets", op=3)
    with pytest.raises(CapabilityDenied):
        reg.attenuate("alice", narrow.id, "alice/sub", target="*", op=3)
    with pytest.raises(InvalidGrant, match="a target is a string"):
        reg.attenuate("alice", narrow.id, "alice/sub", target=5, op=3)
    with pytest.raises(InvalidGrant, match="takes no limit"):
        reg.attenuate("alice", narrow.id, "alice/sub", limit=5, op=3)
    wide = reg.grant("alice", "read:*", granter=HUMAN, op=2)
    assert reg.attenuate("alice", wide.id, "alice/sub", target="data", op=3).capability == \
        "read:data"
    assert reg.attenuate("alice", wide.id, "alice/sub", op=3).capability == "read:*"


def test_attenuation_only_to_own_descendants(reg: Registry) -> None:
    family(reg)
    grant = reg.grant("alice/sub", "read:data", granter=HUMAN, op=2)
    for recipient in ("alice/sub", "alice", "alice/other", "bob"):
        with pytest.raises(CapabilityDenied, match="only be delegated to your sub-agents"):
            reg.attenuate("alice/sub", grant.id, recipient, op=3)
    with pytest.raises(UnknownAgent):
        reg.attenuate("alice/sub", grant.id, "alice/sub/ghost", op=3)
    with pytest.raises(CapabilityDenied):  # someone else's grant id
        reg.attenuate("alice", grant.id, "alice/sub/leaf", op=3)
    assert len(reg.grants) == 1


def test_revocation_cascades_through_every_level(reg: Registry) -> None:
    family(reg)
    root = reg.grant("alice", "spend:USD", limit=50, granter=HUMAN, op=2)
    other_root = reg.grant("alice", "read:data", granter=HUMAN, op=2)
    sub = reg.attenuate("alice", root.id, "alice/sub", limit=30, op=3)
    leaf = reg.attenuate("alice/sub", sub.id, "alice/sub/leaf", limit=10, op=4)
    sibling = reg.attenuate("alice", root.id, "alice/other", limit=5, op=4)
    unrelated = reg.attenuate("alice", other_root.id, "alice/sub", op=4)

    assert reg.revoke(sub, op=5) == [sub, leaf]
    assert (sub.revoked_op, leaf.revoked_op) == (5, 5)
    assert root.active and sibling.active and unrelated.active

    revoked = reg.revoke(root, op=6)
    assert sorted(grant.id for grant in revoked) == sorted([root.id, sibling.id])
    assert not root.active and not sibling.active
    assert leaf.revoked_op == 5  # already revoked: keeps the op that revoked it
    assert unrelated.active and other_root.active
    assert reg.find("alice/sub", "read", "data") is unrelated
    assert reg.find("alice/sub/leaf", "spend", "USD") is None
    with pytest.raises(CapabilityDenied):
        reg.attenuate("alice", root.id, "alice/sub", limit=1, op=7)


def test_matching_and_find(reg: Registry) -> None:
    read = reg.grant("alice", "read:data", granter=HUMAN, op=2)
    write = reg.grant("alice", "write:data", granter=HUMAN, op=2)
    assert reg.matching("alice", "read:data") == [read]
    assert reg.matching("bob", "read:data") == []
    assert reg.find("alice", "read", "data") is read
    reg.revoke(read, op=3)
    assert reg.matching("alice", "read:data") == []
    assert reg.find("alice", "read", "data") is write  # write covers read
    assert reg.find("bob", "read", "data") is None


# -- tools -----------------------------------------------------------------------------


def define(reg: Registry, name: object = "double", **overrides: object):  # type: ignore[no-untyped-def]
    fields: dict[str, object] = {"name": name, "function": lambda x: 2 * x,
                                 "schema": OBJECT_SCHEMA, "description": "doubles",
                                 "effect": "pure", "author": HUMAN, "op": 2}
    fields.update(overrides)
    return reg.define_tool(**fields)  # type: ignore[arg-type]


def test_define_tool(reg: Registry) -> None:
    version = define(reg)
    assert (version.name, version.version, version.capability, version.effect) == (
        "double", 1, "call:double", "pure")
    assert version.describe() == {
        "name": "double", "version": 1, "description": "doubles", "capability": "call:double",
        "effect": "pure", "author": HUMAN, "op": 2, "schema": OBJECT_SCHEMA}
    assert define(reg, effect="external", capability="spend:USD", op=3,
                  function=lambda x, idempotency_key: 2 * x).version == 2
    with pytest.raises(UsageError, match="must accept the keyword argument idempotency_key"):
        define(reg, effect="external", op=3)
    assert reg.tools["double"][1].capability == "spend:USD"


@pytest.mark.parametrize("name", [
    "Double", "1x", "_x", "a-b", "a b", "a" * 65, "", None, 3, MyStr("double"), "dou\nble",
])
def test_define_tool_refuses_bad_names(reg: Registry, name: object) -> None:
    with pytest.raises(UsageError, match="is not a valid tool name"):
        define(reg, name)
    assert reg.tools == {}


@pytest.mark.parametrize(("overrides", "words"), [
    ({"description": None}, "description"),
    ({"description": 5}, "description"),
    ({"description": MyStr("doubles")}, "description"),
    ({"description": "x" * 1001}, "at most 1000"),
    ({"effect": "impure"}, "effect"),
    ({"effect": None}, "effect"),
    ({"capability": "bogus"}, "not a capability"),
    ({"capability": 5}, "a capability is a string"),
])
def test_define_tool_refuses_bad_descriptions_effects_and_capabilities(
        reg: Registry, overrides: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidGrant, match=words):
        define(reg, **overrides)
    assert define(reg, description="x" * 1000).version == 1


def test_define_tool_refuses_an_unhashable_effect(reg: Registry) -> None:
    with pytest.raises(InvalidGrant):
        define(reg, effect=["pure"])


MALFORMED_SCHEMAS = [
    None, [], "object", MyDict(type="object"),
    {}, {"type": "array"}, {"type": "Object"}, {"properties": {}},
    {"type": "object", "properties": []},
    {"type": "object", "properties": {"_x": {"type": "string"}}},
    {"type": "object", "properties": {"1x": {"type": "string"}}},
    {"type": "object", "properties": {"a b": {"type": "string"}}},
    {"type": "object", "properties": {1: {"type": "string"}}},
    {"type": "object", "properties": {MyStr("x"): {"type": "string"}}},
    {"type": "object", "properties": {"x": "string"}},
    {"type": "object", "properties": {"x": {}}},
    {"type": "object", "properties": {"x": {"type": "float"}}},
    {"type": "object", "properties": {"x": MyDict(type="string")}},
    {"type": "object", "properties": {"x": {"type": "string"}}, "required": "x"},
    {"type": "object", "properties": {"x": {"type": "string"}}, "required": ("x",)},
    {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["y"]},
    {"type": "object", "required": ["x"]},
    {"type": "object", "$schema": "http://json-schema.org/draft-07/schema#"},
    {"type": "object", "anyOf": []},
]


@pytest.mark.parametrize("schema", MALFORMED_SCHEMAS)
def test_check_schema_refuses_malformed_schemas(schema: object) -> None:
    with pytest.raises(InvalidGrant, match="the schema of tool 't' is malformed"):
        check_schema(schema, tool="t")


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"x": {"type": ["string", "null"]}}},
    {"type": "object", "properties": {"x": {"type": "string"}}, "required": [["x"]]},
    {"type": "object", "required": [{}]},
])
def test_check_schema_refuses_unhashable_parts(schema: object) -> None:
    with pytest.raises(InvalidGrant):
        check_schema(schema, tool="t")


def test_check_schema_accepts_good_schemas() -> None:
    for schema in ({"type": "object"}, OBJECT_SCHEMA,
                   {"type": "object", "description": "d", "additionalProperties": False,
                    "properties": {name: {"type": name} for name in (
                        "string", "integer", "number", "boolean", "array", "object", "null")}}):
        assert check_schema(schema, tool="t") is schema


def test_define_tool_refuses_a_bad_schema(reg: Registry) -> None:
    with pytest.raises(InvalidGrant, match="malformed"):
        define(reg, schema={"type": "array"})
    with pytest.raises(UnknownTool):
        reg.tool_version("double", before_op=10)


def test_a_refused_tool_leaves_no_trace(reg: Registry) -> None:
    with pytest.raises(InvalidGrant):
        define(reg, schema={"type": "array"})
    assert reg.tools == {}


def test_agents_cannot_redefine_other_principals_tools(reg: Registry) -> None:
    define(reg, author="alice")
    with pytest.raises(CapabilityDenied, match="it belongs to alice"):
        define(reg, author="bob", op=3)
    assert define(reg, author="alice", op=3).version == 2
    assert define(reg, author=HUMAN, op=4).version == 3  # the human may take it over
    with pytest.raises(CapabilityDenied, match="it belongs to human"):
        define(reg, author="alice", op=5)
    assert [v.author for v in reg.tools["double"]] == ["alice", "alice", HUMAN]


def test_a_tool_is_visible_from_the_op_after_its_definition(reg: Registry) -> None:
    first = define(reg, op=5)
    with pytest.raises(UnknownTool, match="yet: it was defined in this op") as raised:
        reg.tool_version("double", before_op=5)
    assert raised.value.name == "double"
    with pytest.raises(UnknownTool):
        reg.tool_version("double", before_op=3)
    assert reg.tool_version("double", before_op=6) is first
    second = define(reg, op=6)
    assert reg.tool_version("double", before_op=6) is first
    assert reg.tool_version("double", before_op=7) is second
    assert reg.tool_version("double", before_op=100) is second


def test_unknown_tools_name_the_known_ones(reg: Registry) -> None:
    with pytest.raises(UnknownTool, match=r"no tool 'nope' \(tools: none yet\)"):
        reg.tool_version("nope", before_op=2)
    define(reg, "beta")
    define(reg, "alpha")
    with pytest.raises(UnknownTool, match=r"no tool 'nope' \(tools: alpha, beta\)") as raised:
        reg.tool_version("nope", before_op=9)
    assert raised.value.known == ["alpha", "beta"]
    for name in (None, 5, MyStr("alpha")):
        with pytest.raises(UnknownTool):
            reg.tool_version(name, before_op=9)
