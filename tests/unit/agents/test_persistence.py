"""Agents, grants, tools and agent namespaces commit, roll back, restore and show in history."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kernos import history
from kernos.agents import Registry
from kernos.agents.guards import AGENT_BUILTINS
from kernos.agents.runtime import REGISTRY, AgentNamespace, namespace_key
from kernos.errors import OpVetoed

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}

AGENT_STATE = """
def f(n):
    return n * 10

class Point:
    def __init__(self, x):
        self.x = x
    def double(self):
        return Point(self.x * 2)

p = Point(3)
items = [1, 2, {'nested': (3, 4)}]
v = read('data')['k']
left = spend(5, 'USD')
define_tool('shout', 'def shout(text):\\n    return text.upper()',
            {'type': 'object', 'properties': {'text': {'type': 'string'}}}, 'Shouts')
"""


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    env.cell("data = {'k': [1, 2], 'secret': 'TOP-SECRET'}\n"
             "def double(x):\n    return 2 * x")
    with env.op():
        env.agents.add("alice", seconds=3)
        env.agents.grant("alice", "read:data")
        env.agents.grant("alice", "spend:USD", 50)
        env.agents.grant("alice", "call:double")
        env.agents.register_tool("double", env.ns["double"], schema=SCHEMA, description="2x")
    env.run("alice", AGENT_STATE)
    return env


def snapshot(env) -> dict[str, object]:  # type: ignore[no-untyped-def]
    registry = env.runtime.registry
    return {
        "agents": {name: (p.parent, p.created_op, dict(p.limits))
                   for name, p in registry.principals.items()},
        "grants": env.agents.grants(),
        "tools": {name: [(v.version, v.author, v.op, v.capability) for v in versions]
                  for name, versions in registry.tools.items()},
        "next_grant": registry.next_grant,
        "system": sorted(env.image.system),
    }


def test_the_namespace_is_an_agent_namespace(env) -> None:  # type: ignore[no-untyped-def]
    ns = env.runtime.namespace("alice")
    assert type(ns) is AgentNamespace and ns.owner == "alice"
    assert ns["__builtins__"] is AGENT_BUILTINS and ns["__name__"] == "agent:alice"
    assert sorted(ns.user_items()) == ["Point", "f", "items", "left", "p", "v"]
    assert env.image.system[namespace_key("alice")] is ns
    assert type(env.image.system[REGISTRY]) is Registry


def test_everything_survives_a_reopen(env) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(env)
    assert before["grants"][1]["used"] == "5"  # type: ignore[index]
    env.reopen()
    assert env.restore_report.failed == {}
    assert snapshot(env) == before
    assert env.agents.limits("alice").seconds == 3
    ns = env.runtime.namespace("alice")
    assert type(ns) is AgentNamespace and ns.owner == "alice"
    assert ns["f"].__globals__ is ns
    assert isinstance(ns["p"], ns["Point"]) and ns["p"].x == 3
    assert ns["items"] == [1, 2, {"nested": (3, 4)}] and ns["left"] == Decimal(45)
    out = env.run("alice", """
print(f(2), p.double().x, Point(5).x, isinstance(p, Point), items[2]['nested'][1])
print(v.copy(), call('double', x=4), call('shout', text='hi'), spend(5, 'USD'))
""")
    assert out.splitlines() == ["20 6 5 True 4", "[1, 2] 8 HI 40"]


def test_a_restored_view_reads_the_current_value_by_name(env) -> None:  # type: ignore[no-untyped-def]
    env.reopen()
    env.cell("data['k'] = ['changed after the restore']")
    assert env.run("alice", "print(v.copy())") == "['changed after the restore']\n"


def test_builtins_and_viewed_data_are_never_pickled(env) -> None:  # type: ignore[no-untyped-def]
    ns = env.runtime.namespace("alice")
    tool = env.runtime.registry.tools["shout"][0]
    for name, value in ((namespace_key("alice"), ns), (REGISTRY, env.runtime.registry)):
        stream = bytes(env.image.serializer.dump([(name, value)], op=99).stream)
        for marker in (b"guarded_getattr", b"AGENT_BUILTINS", b"kernos.agents.api",
                       b"_call_print", b"guarded_binop"):
            assert marker not in stream, (name, marker)
    stream = bytes(env.image.serializer.dump([("ns", ns)], op=99).stream)
    assert b"TOP-SECRET" not in stream  # the view `v` is a name and a path
    env.reopen()
    ns = env.runtime.namespace("alice")
    assert ns["__builtins__"] is AGENT_BUILTINS
    assert ns["f"].__globals__["__builtins__"] is AGENT_BUILTINS
    tool = env.runtime.registry.tools["shout"][0]
    assert tool.function.__globals__["__builtins__"] is AGENT_BUILTINS
    assert tool.function.__globals__ is not ns


def test_an_aborted_op_restores_registry_and_namespace_exactly(env) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(env)
    names = sorted(env.runtime.namespace("alice"))
    op = env.image.begin(source="")
    env.agents.grant("alice", "agents:spawn")
    env.agents.revoke("alice", "read:data")
    env.agents.limits("alice", seconds=9)
    env.runtime.run("alice", """
f = 'rebound'
items.append(99)
items[2]['new'] = 1
p.x = 100
p.extra = True
fresh = Point(7)
left = spend(45, 'USD')
kid = spawn('kid')
define_tool('shout', 'def shout(text):\\n    return text', {'type': 'object'}, 'v2')
""")
    assert env.agents.grants("alice")[1]["used"] == "50"
    op.abort()
    assert snapshot(env) == before
    ns = env.runtime.namespace("alice")
    assert type(ns) is AgentNamespace and sorted(ns) == names
    assert ns["__builtins__"] is AGENT_BUILTINS
    assert ns["f"](1) == 10 and ns["f"].__globals__ is ns
    assert ns["items"] == [1, 2, {"nested": (3, 4)}]
    assert vars(ns["p"]) == {"x": 3} and ns["left"] == Decimal(45)
    assert isinstance(ns["p"], ns["Point"])
    assert "alice/kid" not in env.runtime.agents()
    assert namespace_key("alice/kid") not in env.image.system
    assert env.agents.limits("alice").seconds == 3
    assert env.run("alice", "print(f(1), spend(1, 'USD'), call('shout', text='x'))") == \
        "10 44 X\n"


def test_a_vetoed_op_restores_the_budget(env) -> None:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    env.runtime.run("alice", "left = spend(40, 'USD')\ntry:\n    read('secret')\n"
                             "except CapabilityDenied:\n    pass")
    with pytest.raises(OpVetoed):
        op.commit()
    assert env.agents.grants("alice")[1]["used"] == "5"
    assert env.runtime.namespace("alice")["left"] == Decimal(45)
    env.reopen()
    assert env.agents.grants("alice")[1]["used"] == "5"


def test_history_shows_the_agents_changes(env) -> None:  # type: ignore[no-untyped-def]
    workspace = env.workspace
    entries = history.log(workspace)
    setup, run = entries[1], entries[0]
    assert {"kernos:agents", "kernos:ns:alice"} <= set(setup.changes["added"])
    assert set(run.changes["changed"]) == {"kernos:agents", "kernos:ns:alice"}
    env.run("alice", "items.append(3)")
    latest = history.log(workspace, limit=1)[0]
    assert "kernos:ns:alice" in latest.changes["changed"]
    assert latest.changes["added"] == [] and latest.changes["deleted"] == []
    assert latest.principal == "human"
    shown = history.show(workspace)
    assert "kernos:ns:alice" in shown["manifest"]["names"]
    assert "kernos:agents" in shown["manifest"]["names"]
    difference = history.diff(workspace, "HEAD~1", "HEAD")
    assert "kernos:ns:alice" in difference.changed and not difference.added
    old, new = difference.changed["kernos:ns:alice"]
    assert new["version"] == old["version"] + 1
    assert "kernos:ns:alice" in history.format_diff(difference)
    with env.op():
        env.agents.grant("alice", "read:secret")
    latest = history.log(workspace, limit=1)[0]
    assert latest.changes["changed"] == ["kernos:agents"]


def test_the_manifest_records_the_tool_versions_an_op_used(env) -> None:  # type: ignore[no-untyped-def]
    env.run("alice", "x = call('double', x=1)\ny = call('shout', text='a')")
    shown = history.show(env.workspace)
    assert shown["manifest"]["facts"]["tools"] == {"double": 1, "shout": 1}
    assert "tools: double v1, shout v1" in history.format_show(shown)
    env.run("alice", "define_tool('shout', 'def shout(text):\\n    return 2', "
                     "{'type': 'object', 'properties': {'text': {'type': 'string'}}}, 'v2')")
    assert "tools" not in history.show(env.workspace)["manifest"].get("facts", {})
    env.run("alice", "z = call('shout', text='a')")
    assert history.show(env.workspace)["manifest"]["facts"]["tools"] == {"shout": 2}
    env.reopen()
    assert env.run("alice", "print(call('shout', text='a'))") == "2\n"
    assert [v.version for v in env.runtime.registry.tools["shout"]] == [1, 2]


def test_a_run_that_changes_nothing_after_a_reopen_records_no_change(env) -> None:  # type: ignore[no-untyped-def]
    # Agent namespaces pickle to other bytes after a restore (string identities the
    # memo follows); what they pickled to when loaded is what unchanged looks like.
    env.reopen()
    env.run("alice", "unused = None\ndel unused")
    assert env.report.changed == []
