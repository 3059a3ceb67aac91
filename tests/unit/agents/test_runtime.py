"""The runtime: grants at work, denials, budgets, delegation, tools and their versions."""

from __future__ import annotations

import json
import types
from decimal import Decimal

import pytest

from kernos.agents import HUMAN
from kernos.errors import (
    BoundaryError,
    CapabilityDenied,
    InvalidGrant,
    OpVetoed,
    UnknownAgent,
    UnknownTool,
    UsageError,
)

TOOLS = """
def double(x):
    return 2 * x

def leak():
    return {'ok': object()}
"""
SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    env.cell("data = {'k': [1, 2]}\nsecret = 'TOP-SECRET'\n" + TOOLS)
    with env.op():
        env.agents.add("alice")
        env.agents.add("bob")
        env.agents.grant("alice", "read:data")
        env.agents.register_tool("double", env.ns["double"], schema=SCHEMA,
                                 description="Doubles x")
        env.agents.register_tool("leak", env.ns["leak"], schema={"type": "object"},
                                 description="Returns a host object")
    return env


def vetoed_run(env, agent: str, source: str) -> str:  # type: ignore[no-untyped-def]
    """Run agent code whose op must be vetoed; returns what it printed."""
    op = env.image.begin(source="")
    output = env.runtime.run(agent, source).output
    with pytest.raises(OpVetoed):
        op.commit()
    return output  # type: ignore[no-any-return]


def test_everything_happens_inside_an_op(env) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match="only inside an op"):
        env.runtime.run("alice", "x = 1")
    with pytest.raises(UsageError):
        env.agents.add("carol")
    with pytest.raises(UsageError):
        env.agents.grant("alice", "read:secret")
    with env.op():
        with pytest.raises(UsageError, match="the human runs ordinary cells"):
            env.runtime.run(HUMAN, "x = 1")
        with pytest.raises(UnknownAgent):
            env.runtime.run("carol", "x = 1")


def test_the_human_api(env) -> None:  # type: ignore[no-untyped-def]
    assert env.runtime.agents() == ["alice", "bob"]
    assert repr(env.agents).startswith("<Kernos agents: alice, bob;")
    grants = env.agents.grants("alice")
    assert [(g["id"], g["capability"], g["active"]) for g in grants] == [
        ("g1", "read:data", True)]
    assert env.agents.grants() == grants
    assert [tool["name"] for tool in env.agents.tools()] == ["double", "leak"]
    with pytest.raises(UnknownAgent):
        env.agents.grants("carol")
    with env.op():
        assert env.agents.call("double", x=21) == 42
        assert env.agents.run("alice", "x = 1\nprint('hi')").output == "hi\n"
    view = env.agents.namespace("alice")
    assert isinstance(view, types.MappingProxyType) and dict(view) == {"x": 1}
    with pytest.raises(TypeError):
        view["x"] = 2  # type: ignore[index]


def test_grants_are_enforced_and_read_is_read_only(env) -> None:  # type: ignore[no-untyped-def]
    assert env.run("alice", "print(read('data')['k'].copy())") == "[1, 2]\n"
    out = vetoed_run(env, "bob", "try:\n    read('data')\nexcept CapabilityDenied:\n"
                                 "    print('denied')")
    assert out == "denied\n"


def test_read_is_limited_to_the_humans_own_names(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("bob", "read:*")
    out = env.run("bob", """
for name in ('secret', 'missing', '__name__', '__builtins__', 'kernos:agents'):
    try:
        read(name)
        print('read', name)
    except KeyError:
        print('no', name)
""")
    assert out.splitlines() == ["read secret", "no missing", "no __name__", "no __builtins__",
                                "no kernos:agents"]


def test_denials_are_recorded_and_veto_the_op(env) -> None:  # type: ignore[no-untyped-def]
    head = env.image.head
    out = vetoed_run(env, "bob", """
x = 1
for capability_use in (lambda: read('secret'), lambda: call('double', x=1),
                       lambda: spend(1, 'USD'), lambda: spawn('kid'),
                       lambda: write('secret', 'mine')):
    try:
        capability_use()
    except CapabilityDenied:
        print('denied')
""")
    assert out == "denied\n" * 5
    assert env.image.head == head
    assert "x" not in env.ns_of("bob") and env.ns["secret"] == "TOP-SECRET"
    denied = [(d["principal"], d["capability"]) for d in env.agents.denials()]
    assert denied == [("bob", "read:secret"), ("bob", "call:double"), ("bob", "spend:USD"),
                      ("bob", "agents:spawn"), ("bob", "write:secret")]
    records = env.image.audit.records(status="denied")
    assert [d["capability"] for d in records[-1]["grants"]["denied"]] == [c for _, c in denied]


def test_malformed_requests_count_as_denials(env) -> None:  # type: ignore[no-untyped-def]
    for call in ("read(5)", "write('not an identifier', 1)", "spend(1.5, 'USD')",
                 "spend(1, 5)", "spend(-1, 'USD')", "spawn(5)"):
        out = vetoed_run(env, "alice", f"try:\n    {call}\nexcept Exception:\n"
                                       "    print('refused')")
        assert out == "refused\n", call


def test_spending_a_budget(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "spend:USD", 50)
    out = env.run("alice", "print(spend(20, 'USD'), spend(Decimal('0.5'), 'USD'))")
    assert out == "30 29.5\n"
    out = vetoed_run(env, "alice", "try:\n    spend(30, 'USD')\nexcept CapabilityDenied as e:"
                                   "\n    print('29.5 left' in e.args[0])")
    assert out == "True\n"
    grant = env.agents.grants("alice")[-1]
    assert (grant["used"], grant["remaining"]) == ("20.5", "29.5")
    assert env.run("alice", "print(spend(Decimal('29.5'), 'USD'))") == "0.0\n"


def test_a_budget_cannot_be_multiplied_by_delegation(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "spend:USD", 50)
        env.agents.grant("alice", "agents:spawn")
    op = env.image.begin(source="")
    env.runtime.run("alice", """
budget = [g['id'] for g in grants() if g['capability'] == 'spend:USD'][0]
for name in ('one', 'two'):
    try:
        delegate(budget, spawn(name), 50)
    except CapabilityDenied:
        pass
""")
    spent = Decimal(0)
    for agent in ("alice", "alice/one", "alice/two"):
        if agent in env.runtime.agents():
            try:
                env.runtime.run(agent, "spend(50, 'USD')")
                spent += 50
            except CapabilityDenied:
                pass
    op.abort()
    assert spent <= 50


def test_write_is_limited_to_the_humans_own_names(env) -> None:  # type: ignore[no-untyped-def]
    builtins = env.ns["__builtins__"]
    with env.op():
        env.agents.grant("bob", "write:*")
    op = env.image.begin(source="")
    try:
        env.runtime.run("bob", "write('__builtins__', {})")
    except Exception:
        pass
    finally:
        op.abort()
    assert env.ns["__builtins__"] is builtins


def test_spawn_and_delegate(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "agents:spawn")
        env.agents.grant("alice", "spend:USD", 50)
    out = env.run("alice", """
kid = spawn('kid')
ids = {g['capability']: g['id'] for g in grants()}
given = delegate(ids['read:data'], kid)
money = delegate(ids['spend:USD'], kid, 20)
print(kid, given['principal'], given['parent'] == ids['read:data'], money['limit'])
""")
    assert out == "alice/kid alice/kid True 20\n"
    assert env.runtime.registry.principal("alice/kid").parent == "alice"
    assert env.run("alice/kid", "print(read('data')['k'][0], spend(5, 'USD'))") == "1 15\n"
    out = vetoed_run(env, "alice", """
ids = {g['capability']: g['id'] for g in grants()}
for attempt in (lambda: delegate(ids['read:data'], 'bob'),
                lambda: delegate(ids['read:data'], 'alice'),
                lambda: delegate(ids['spend:USD'], 'alice/kid', 51),
                lambda: delegate('g1000', 'alice/kid'),
                lambda: spawn('kid')):
    try:
        attempt()
        print('ALLOWED')
    except CapabilityDenied:
        print('denied')
    except Exception:
        print('refused')
""")
    assert out.splitlines() == ["denied", "denied", "denied", "denied", "refused"]


def test_revoking_a_grant_revokes_what_was_delegated_from_it(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "agents:spawn")
    env.run("alice", "kid = spawn('kid')\nmine = [g['id'] for g in grants()][0]\n"
                     "delegate(mine, kid)")
    env.run("alice/kid", "print(read('data')['k'][1])")
    with env.op():
        revoked = env.agents.revoke("alice", "read:data")
    assert revoked == ["g1", "g3"]
    assert vetoed_run(env, "alice/kid", "try:\n    read('data')\nexcept CapabilityDenied:\n"
                                        "    print('denied')") == "denied\n"
    with env.op(), pytest.raises(UsageError, match="holds no active grant"):
        env.agents.revoke("alice", "read:data")


def test_agents_revoke_only_what_they_delegated(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "agents:spawn")
    out = env.run("alice", "kid = spawn('kid')\ngiven = delegate('g1', kid)\n"
                           "print(revoke(given['id']))")
    assert out == "['g3']\n"
    assert vetoed_run(env, "alice", "try:\n    revoke('g1')\nexcept CapabilityDenied:\n"
                                    "    print('denied')") == "denied\n"
    assert env.agents.grants("alice")[0]["active"]


def test_agents_cannot_grant_directly(env) -> None:  # type: ignore[no-untyped-def]
    with env.op(), pytest.raises(CapabilityDenied, match="only the human grants directly"):
        env.runtime.grant("bob", "read:data", granter="alice")
    assert env.agents.grants("bob") == []


def test_revoke_by_id(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        grant = env.agents.grant("bob", "read:data")
        assert env.agents.revoke("bob", grant["id"]) == [grant["id"]]
        with pytest.raises(CapabilityDenied):
            env.agents.revoke("alice", grant["id"])
    assert env.agents.grants("bob")[0]["active"] is False


# -- tools ------------------------------------------------------------------------------------


def test_calling_tools(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "call:double")
        env.agents.grant("alice", "call:leak")
    out = env.run("alice", """
print(call('double', x=21))
for kwargs in ({}, {'x': '21'}, {'x': True}, {'x': 1, 'y': 2}, {'x': 1.5}):
    try:
        call('double', **kwargs)
        print('ACCEPTED', kwargs)
    except TypeError:
        print('refused')
""")
    assert out.splitlines() == ["42", *["refused"] * 5]
    # What Kernos refuses (a host object as a result, a tool that is not there)
    # vetoes the op like a denial, even when the agent catches it.
    assert vetoed_run(env, "alice", "try:\n    call('leak')\nexcept BoundaryError:\n"
                                    "    print('no host objects')") == "no host objects\n"
    assert vetoed_run(env, "alice", "try:\n    call('nope')\nexcept Exception:\n"
                                    "    print('unknown')") == "unknown\n"


def test_a_new_tool_is_callable_from_the_next_op(env) -> None:  # type: ignore[no-untyped-def]
    env.cell("def triple(x):\n    return 3 * x")
    with env.op():
        env.agents.register_tool("triple", env.ns["triple"], schema=SCHEMA, description="3x")
        with pytest.raises(UnknownTool, match="yet: it was defined in this op"):
            env.agents.call("triple", x=1)
    with env.op():
        assert env.agents.call("triple", x=2) == 6


def test_an_op_keeps_the_tool_version_it_started_with(env) -> None:  # type: ignore[no-untyped-def]
    env.cell("def double_v2(x):\n    return 'v2'")
    with env.op() as op:
        assert env.agents.call("double", x=1) == 2
        env.agents.register_tool("double", env.ns["double_v2"], schema=SCHEMA,
                                 description="v2")
        assert env.agents.call("double", x=1) == 2
        assert op.facts["tools"] == {"double": 1}
    with env.op() as op:
        assert env.agents.call("double", x=1) == "v2"
        assert op.facts["tools"] == {"double": 2}
    assert [tool["version"] for tool in env.agents.tools() if tool["name"] == "double"] == [2]


def test_agents_define_tools(env) -> None:  # type: ignore[no-untyped-def]
    out = env.run("alice", """
source = '''
def shout(text):
    return text.upper() + '!'
'''
schema = {'type': 'object', 'properties': {'text': {'type': 'string'}}}
print(define_tool('shout', source, schema, 'Shouts'))
""")
    assert out == "1\n"
    # A tool is callable from the op after the one that defined it; before, the
    # call is refused, and a refusal vetoes the op.
    assert vetoed_run(env, "alice", "define_tool('hush', 'def hush(text):\\n    return 1', "
                                    "{'type': 'object'}, 'v1')\ntry:\n    call('hush', text='x')"
                                    "\nexcept Exception:\n    print('not yet')") == "not yet\n"
    tool = env.runtime.registry.tools["shout"][0]
    assert (tool.author, tool.effect, tool.capability) == ("alice", "pure", "call:shout")
    assert "def shout" in (tool.source or "")
    assert env.run("alice", "print(call('shout', text='hi'))") == "HI!\n"
    assert vetoed_run(env, "bob", "try:\n    call('shout', text='x')\n"
                                  "except CapabilityDenied:\n    print('denied')") == "denied\n"
    with env.op():
        env.agents.grant("bob", "call:shout")
    assert env.run("bob", "print(call('shout', text='ok'))") == "OK!\n"
    with pytest.raises(CapabilityDenied, match="it belongs to alice"), env.op():
        env.runtime.run("bob", "define_tool('shout', 'def shout(text):\\n    return 1', "
                               "{'type': 'object'}, 'mine')")


def test_a_tool_acts_within_the_callers_grants(env) -> None:  # type: ignore[no-untyped-def]
    env.run("alice", """
define_tool('peek', 'def peek():\\n    return read(\\'data\\')[\\'k\\'].copy()',
            {'type': 'object'}, 'Reads data')
""")
    assert env.run("alice", "print(call('peek'))") == "[1, 2]\n"
    with env.op():
        env.agents.grant("bob", "call:peek")
    out = vetoed_run(env, "bob", "try:\n    call('peek')\nexcept CapabilityDenied:\n"
                                 "    print('denied')")
    assert out == "denied\n"


def test_a_tool_source_must_define_its_function(env) -> None:  # type: ignore[no-untyped-def]
    for source, error, message in (
            ("define_tool('shout', 'x = 1', {'type': 'object'}, 'd')", UsageError,
             "must define a function shout"),
            ("define_tool('shout', 'def shout():\\n    return 1', {'type': 'array'}, 'd')",
             InvalidGrant, "malformed")):
        op = env.image.begin(source="")
        with pytest.raises(error, match=message):
            env.runtime.run("alice", source)
        with pytest.raises(OpVetoed):
            op.commit()
    human = types.SimpleNamespace(principal=HUMAN)
    with pytest.raises(UsageError, match=r"agents\.register_tool"):
        env.runtime.define_tool(human, "t", "def t():\n    return 1", {"type": "object"}, "")


def test_an_agent_tool_returns_only_plain_data_to_the_human(env) -> None:  # type: ignore[no-untyped-def]
    env.run("alice", "define_tool('gen', 'def gen():\\n    def g():\\n        yield 1\\n"
                     "    return g()', {'type': 'object'}, 'Returns a generator')")
    with env.op():
        try:
            result = env.agents.call("gen")
        except BoundaryError:
            result = None
    assert type(result) in (type(None), list, tuple, dict, str, int)


def test_denial_records_are_bounded(env) -> None:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    out = env.runtime.run("bob", """
name = 'x' * 10 ** 6
for i in range(20):
    try:
        read(name)
    except CapabilityDenied:
        pass
print('done')
""").output
    assert out == "done\n"
    with pytest.raises(OpVetoed):
        op.commit()
    assert len(env.image.audit.read(len(env.image.audit) - 1)["grants"]["denied"]) <= 20
    assert (env.path / "audit" / "chain.jsonl").stat().st_size < 200_000
    assert sum(len(json.dumps(record)) for record in env.agents.denials()) < 200_000
