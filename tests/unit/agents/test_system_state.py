"""The runtime's own names (``kernos:*``) always persist, whatever agent code puts in them.

Agent code reaches into system state through what it defines: a tool's module
state lives in ``kernos:agents``, a subscriber's defaults in ``kernos:events``,
its own names in ``kernos:ns:NAME``.  If any of that could not be stored, a
restart would bring back an image without the principals, grants, tools or
subscribers (the human's included).  So an op that would leave a ``kernos:*``
name unpersistable is vetoed, naming what could not be stored; what agents
put in system state is bounded when it enters; and a namespace that cannot be
restored still shows the human what was lost.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernos.agents.human import NOT_RESTORED
from kernos.errors import OpVetoed
from kernos.serialize.unpersisted import Unpersisted

GROW = """
state = []

def grow(depth):
    node = state
    for _ in range(depth):
        child = []
        node.append(child)
        node = child
    return len(state)
"""
SCHEMA = {"type": "object", "properties": {"depth": {"type": "integer"}}}


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    env.cell("def audit(event):\n    pass\n")
    with env.op():
        env.agents.add("alice")
        env.agents.add("mallory")
        env.agents.grant("alice", "spend:USD", 10)
        env.agents.grant("mallory", "subscribe:chat.*")
    with env.op():
        env.runtime.events.subscribe("orders.*", env.ns["audit"], principal="human")
    return env


def system_intact(env) -> None:  # type: ignore[no-untyped-def]
    """Principals, grants and the human's subscriber are all there."""
    assert set(env.runtime.agents()) >= {"alice", "mallory"}
    assert [g["capability"] for g in env.agents.grants("alice")] == ["spend:USD"]
    patterns = [s["pattern"] for s in env.runtime.events.list()]
    assert "orders.*" in patterns


def vetoed(env, agent: str, source: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Run ``source`` as ``agent``; its op must be vetoed.  What it printed, and why."""
    head = env.image.head
    op = env.image.begin(source="")
    try:
        printed = env.runtime.run(agent, source).output
    except BaseException:
        op.abort()
        raise
    with pytest.raises(OpVetoed) as raised:
        op.commit()
    assert env.image.head == head
    return printed, str(raised.value)


def test_a_tool_that_makes_the_registry_unpersistable_is_vetoed(env) -> None:  # type: ignore[no-untyped-def]
    env.run("mallory", f"define_tool('grow', {GROW!r}, {SCHEMA!r}, 'grows')")
    _, message = vetoed(env, "mallory", "call('grow', depth=30000)")
    assert "kernos:agents" in message and "could not be stored" in message
    system_intact(env)
    env.reopen()
    system_intact(env)
    assert env.run("mallory", "print(call('grow', depth=3))") == "1\n"


def test_deep_module_state_is_refused_when_a_tool_is_defined(env) -> None:  # type: ignore[no-untyped-def]
    source = "deep = []\nnode = deep\nfor _ in range(5000):\n    node.append([])\n" \
             "    node = node[0]\ndef t():\n    return 1\n"
    printed, _ = vetoed(env, "mallory", f"try:\n    define_tool('t', {source!r}, "
                                     "{'type': 'object'}, 'deep')\nexcept Exception as e:\n"
                                     "    print(e)")
    assert "the module state of tool 't' by 'mallory'" in printed
    assert "nested over 64 levels" in printed
    assert "t" not in env.runtime.registry.tools
    env.reopen()
    system_intact(env)


def test_a_subscriber_with_a_deep_default_is_refused(env) -> None:  # type: ignore[no-untyped-def]
    source = ("deep = []\nnode = deep\nfor _ in range(5000):\n    node.append([])\n"
              "    node = node[0]\n"
              "def handler(event, memory=deep):\n    return None\n"
              "try:\n    subscribe('chat.*', handler)\nexcept Exception as e:\n"
              "    print(e)\n")
    printed, _ = vetoed(env, "mallory", source)
    assert "a subscriber of 'mallory'" in printed and "nested over 64 levels" in printed
    env.reopen()
    system_intact(env)


class LoadBomb:
    """Pickles, but cannot be loaded again (a restore finds it broken)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_explode, ())


def _explode() -> None:
    raise RuntimeError("this value cannot be rebuilt")


def test_an_unrestorable_namespace_shows_the_human_what_was_lost(env) -> None:  # type: ignore[no-untyped-def]
    env.run("alice", "notes = ['kept']")
    with env.op() as op:
        env.runtime.namespace("alice")["bomb"] = LoadBomb()
        op.touch("kernos:ns:alice")
    env.reopen()
    seen = env.agents.namespace("alice")
    [(key, placeholder)] = seen.items()
    assert key == NOT_RESTORED
    assert isinstance(placeholder, Unpersisted)
    assert "kernos:ns:alice" in placeholder.explain()
    assert "cannot be rebuilt" in placeholder.explain()
    system_intact(env)
