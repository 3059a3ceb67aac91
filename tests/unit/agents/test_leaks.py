"""What an agent learns from an error: only names its grants let it use.

An unknown tool or agent is reported to agent code with the tools it wrote or
may call, and with itself and its sub-agents, never with the whole registry;
the human still sees every name.
"""

from __future__ import annotations

import pytest

from kernos.errors import OpVetoed, UnknownAgent, UnknownTool


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    env.cell("def double(x):\n    return 2 * x\ndef launch_codes():\n    return 'x'\n")
    with env.op():
        for name in ("alice", "bob", "ceo_assistant"):
            env.agents.add(name)
        schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
        env.agents.register_tool("double", env.ns["double"], schema=schema, description="2x")
        env.agents.register_tool("launch_codes", env.ns["launch_codes"],
                                 schema={"type": "object"}, description="secret")
        env.agents.grant("alice", "call:double")
        env.agents.grant("alice", "agents:spawn")
        env.agents.grant("alice", "spend:USD", 10)
    env.run("alice", "spawn('helper')\ndefine_tool('mine', 'def mine():\\n    return 1', "
                     "{'type': 'object'}, 'own')")
    return env


def message_seen_by_alice(env, call: str) -> str:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    output = env.runtime.run("alice", f"try:\n    {call}\nexcept Exception as error:\n"
                                      "    print(error)").output
    with pytest.raises(OpVetoed):
        op.commit()
    return output  # type: ignore[no-any-return]


def test_an_unknown_tool_lists_only_the_tools_the_agent_may_call(env) -> None:  # type: ignore[no-untyped-def]
    seen = message_seen_by_alice(env, "call('nope')")
    assert "There is no tool 'nope' (tools: double, mine)" in seen
    assert "launch_codes" not in seen


def test_an_unknown_agent_lists_only_the_agent_and_its_sub_agents(env) -> None:  # type: ignore[no-untyped-def]
    seen = message_seen_by_alice(
        env, "delegate([g['id'] for g in grants() if g['capability'] == 'spend:USD'][0], "
             "'nobody', 1)")
    assert "There is no agent 'nobody' (agents: alice, alice/helper)" in seen
    assert "bob" not in seen and "ceo_assistant" not in seen


def test_the_human_still_sees_every_name(env) -> None:  # type: ignore[no-untyped-def]
    with env.op(), pytest.raises(UnknownTool, match="double, launch_codes, mine"):
        env.agents.call("nope")
    with env.op(), pytest.raises(UnknownAgent, match="alice, alice/helper, bob, ceo_assistant"):
        env.agents.grant("nobody", "call:double")


def test_an_agents_tool_called_by_the_human_learns_only_its_authors_names(env) -> None:  # type: ignore[no-untyped-def]
    source = "def probe():\n    try:\n        call('nope')\n    except Exception as e:\n" \
             "        return str(e)\n"
    env.run("alice", f"define_tool('probe', {source!r}, {{'type': 'object'}}, 'probe')")
    op = env.image.begin(source="")
    seen = env.agents.call("probe")
    with pytest.raises(OpVetoed):
        op.commit()
    assert "(tools: double, mine, probe)" in seen and "launch_codes" not in seen
