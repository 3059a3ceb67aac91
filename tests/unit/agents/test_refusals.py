"""Every refused agent action vetoes its op, like a capability denial.

Agent code can catch what a Kernos call raises, but not undo the refusal: a
spawn with a bad name, an LLM request Kernos will not make, a malformed tool
definition all leave the op vetoed, so nothing the agent did around them
commits.  And an LLM call that never reached a model charges nothing: its
reservation is released, also across a reopen.
"""

from __future__ import annotations

import pytest

from kernos.errors import OpVetoed, UsageError
from kernos.llm import Mode, set_mode
from llm_support import metered


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    set_mode(Mode.OFF)
    with env.op():
        env.agents.add("alice")
        env.agents.grant("alice", "agents:spawn")
        env.agents.grant("alice", "llm:*", 2000)
    yield env
    set_mode(None)


def caught(call: str) -> str:
    """Agent code that makes ``call``, catches what it raises, and goes on to change things."""
    return (f"try:\n    {call}\nexcept Exception as error:\n    print('caught')\n"
            "kept = 'the agent went on'\n")


def vetoed(env, source: str) -> str:  # type: ignore[no-untyped-def]
    """Run ``source`` as alice; the op must be vetoed at commit.  What it printed."""
    head = env.image.head
    op = env.image.begin(source="")
    try:
        output = env.runtime.run("alice", source).output
    except BaseException:
        op.abort()
        raise
    with pytest.raises(OpVetoed):
        op.commit()
    assert env.image.head == head
    assert "kept" not in env.ns_of("alice")
    return output  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["Bad Name", "x" * 40, "a/b", ""])
def test_a_spawn_with_an_invalid_name_vetoes_the_op(env, name: str) -> None:  # type: ignore[no-untyped-def]
    agents = env.runtime.agents()
    assert vetoed(env, caught(f"spawn({name!r})"))== "caught\n"
    assert env.runtime.agents() == agents
    assert env.image.audit.records()[-1]["status"] in ("denied", "vetoed")


def test_a_malformed_tool_definition_vetoes_the_op(env) -> None:  # type: ignore[no-untyped-def]
    assert vetoed(env, caught("define_tool('t', 'x = 1', {}, 'no function')")) == \
        "caught\n"


def test_an_llm_request_kernos_refuses_vetoes_the_op(env) -> None:  # type: ignore[no-untyped-def]
    with metered() as meter:
        out = vetoed(env, caught("llm('meter/m', [{'role': 'user', 'content': 'hi'}], "
                                 "max_tokens=5, tools=['no_such_tool'])"))
        assert meter.calls == 0
    assert out== "caught\n"


def llm_used(env) -> str:  # type: ignore[no-untyped-def]
    [grant] = [g for g in env.agents.grants("alice") if g["capability"] == "llm:*"]
    return grant["used"]  # type: ignore[no-any-return]


def test_a_call_that_never_reached_a_model_releases_its_reservation(  # type: ignore[no-untyped-def]
        env, monkeypatch) -> None:
    from kernos.llm import _provider

    def missing() -> None:
        raise UsageError("LLM calls need litellm: pip install 'kernos[llm]'")

    with metered() as meter:
        env.run("alice", "llm('meter/m', [{'role': 'user', 'content': 'hi'}], max_tokens=5)")
        assert meter.calls == 1
    used = llm_used(env)
    assert int(used) == meter.billed > 0
    monkeypatch.setattr(_provider, "litellm", missing)
    out = vetoed(env, caught("llm('meter/m', [{'role': 'user', 'content': 'hello'}], "
                             "max_tokens=1000)"))
    assert out == "caught\n"
    assert llm_used(env) == used  # nothing reserved stays charged
    monkeypatch.undo()
    env.reopen()
    assert llm_used(env) == used  # nor after a restart


def test_refusals_inside_a_tool_veto_the_callers_op(env) -> None:  # type: ignore[no-untyped-def]
    source = ("def mk(name):\n    try:\n        spawn(name)\n    except Exception:\n"
              "        return 'swallowed'\n    return 'made'\n")
    env.run("alice", f"define_tool('mk', {source!r}, "
                     "{'type': 'object', 'properties': {'name': {'type': 'string'}}}, 'spawns')")
    with env.op():
        env.agents.grant("alice", "call:mk")
    assert vetoed(env, "print(call('mk', name='Bad Name'))\nkept = 1\n") == "swallowed\n"

