"""Circuits flow down (kernos.agents.supervisor): while an agent's circuit is open, every
sub-agent below it (child, grandchild) is refused on every path, as the agent is, with a
message that names both and the reset to ask for; only resetting the tripped agent lets
them run again, and a sub-agent's trip never stops its parent."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernos.agents import loop
from kernos.agents.supervisor import JOURNAL_FILE
from kernos.errors import CircuitOpen, OpVetoed
from kernos.harness.service import HarnessService
from supervisor_support import attempt, policy

HELPER, INTERN = "alice/helper", "alice/helper/intern"
SHOUT = "def shout(text):\n    return text.upper()\n"
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
        env.agents.add("bob")
        env.agents.grant("alice", "agents:spawn")
    env.run("alice", "spawn('helper')")
    with env.op():
        env.agents.grant(HELPER, "agents:spawn")
    env.run(HELPER, "spawn('intern')")
    return env


def trip(env, agent: str = "alice") -> str:  # type: ignore[no-untyped-def]
    """Open ``agent``'s circuit (failures=1, one failure); the trip's message, from the journal."""
    policy(env, agent, failures=1)
    assert attempt(env, "1/0", agent) == "failed"
    return journal_trip(env, agent)["message"]


def journal_trip(env, agent: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    lines = [json.loads(line) for line in (env.path / JOURNAL_FILE).read_bytes().splitlines()]
    [found] = [line for line in lines if line["type"] == "trip" and line["agent"] == agent]
    return found


def journal_lines(env, agent: str) -> int:  # type: ignore[no-untyped-def]
    path = env.path / JOURNAL_FILE
    return sum(json.loads(line)["agent"] == agent for line in path.read_bytes().splitlines())


def refused_by(env, agent: str, code: str = "n = 2") -> CircuitOpen:  # type: ignore[no-untyped-def]
    """Run ``code`` as ``agent`` as a cell would; it must be refused like the tripped agent's."""
    op = env.image.begin(source=code)
    with pytest.raises(CircuitOpen) as caught:
        env.runtime.run(agent, code)
    op.abort(error=caught.value)
    return caught.value


def last_record(env) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    record: dict[str, Any] = env.image.audit.records()[-1]
    return record


def test_a_tripped_agents_child_and_grandchild_are_refused_until_it_is_reset(env) -> None:  # type: ignore[no-untyped-def]
    env.run(HELPER, "n = 1")
    env.run(INTERN, "n = 1")
    reason = trip(env)
    assert env.agents.circuit(HELPER)["agent"] == "alice"
    assert env.agents.circuit(INTERN)["message"] == reason
    for agent, chain in ((HELPER, "a sub-agent of 'alice'"),
                         (INTERN, "a sub-agent of 'alice/helper', a sub-agent of 'alice'")):
        counted = journal_lines(env, agent)
        error = refused_by(env, agent)
        text = str(error)
        assert f"{agent!r} is {chain}, whose circuit is open ({reason})" in text
        assert "`agents.reset('alice')` in a cell or `kernos agent reset alice` in a shell" \
            in text
        assert f"then {agent!r} runs again" in text
        assert (error.agent, error.policy, error.message) == ("alice", "failures", reason)
        record = last_record(env)
        assert record["status"] == "refused" and record["error"]["kind"] == "CircuitOpen"
        assert text.startswith(record["error"]["message"])    # bounded in the audit
        assert record["circuit"]["agent"] == "alice"
        assert record["circuit"]["sub_agent"] == agent
        assert (record["circuit"]["policy"], record["circuit"]["via"]) == ("failures", "op")
        assert env.ns_of(agent) == {"n": 1}                    # refused before its body ran
        assert journal_lines(env, agent) == counted            # and counted nothing
    assert attempt(env, "n = 2", "bob") == "committed"         # bob is no one's sub-agent
    env.reopen()                                               # the journal keeps it open
    assert attempt(env, "n = 2", INTERN) == "refused"
    with env.op():
        assert env.agents.reset(HELPER)["was_open"] is None    # its own: closed already
    assert attempt(env, "n = 2", HELPER) == "refused"          # the ancestor's stays open
    with env.op():
        env.agents.reset("alice")
    assert env.agents.circuit(INTERN) is None
    assert attempt(env, "n = 2", HELPER) == "committed"
    assert attempt(env, "n = 2", INTERN) == "committed"
    assert env.ns_of(INTERN) == {"n": 2}


def test_an_unsupervised_sub_agent_is_refused_too(env) -> None:  # type: ignore[no-untyped-def]
    trip(env)
    policy(env, "alice", failures=None)                        # no policy left anywhere
    assert env.agents.policy(HELPER) == {}
    assert attempt(env, "n = 1", HELPER) == "refused"
    assert attempt(env, "n = 1", "alice") == "refused"


def test_a_sub_agents_trip_does_not_stop_its_parent(env) -> None:  # type: ignore[no-untyped-def]
    reason = trip(env, HELPER)
    assert env.agents.circuit("alice") is None
    assert attempt(env, "n = 1", "alice") == "committed"
    error = refused_by(env, INTERN)                             # but it flows down
    assert "a sub-agent of 'alice/helper', whose circuit is open" in str(error)
    assert reason in str(error) and "`agents.reset('alice/helper')`" in str(error)
    refused_by(env, HELPER)                                     # its own, as before
    circuit = last_record(env)["circuit"]
    assert (circuit["agent"], circuit["via"]) == (HELPER, "op") and "sub_agent" not in circuit


def test_tool_calls_and_tools_of_a_sub_agent_are_refused(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.register_tool("echo", lambda text: text, schema=SCHEMA,
                                 description="Echo")
        env.agents.grant(HELPER, "call:echo")
        env.agents.grant("bob", "call:shout")
    env.run(HELPER, f"define_tool('shout', {SHOUT!r}, {SCHEMA!r}, 'Shout')")
    reason = trip(env)
    # the sub-agent calls a tool (``call_as``: the harness op with a tool, MCP tools)
    op = env.image.begin(source="")
    with pytest.raises(CircuitOpen, match="'alice/helper''s op was refused"):
        env.runtime.call_as(HELPER, "echo", {"text": "a"})
    with pytest.raises(OpVetoed):
        op.commit()
    assert last_record(env)["circuit"]["sub_agent"] == HELPER
    # a tool the sub-agent wrote, whoever calls it
    for caller in ("human", "bob"):
        op = env.image.begin(source="")
        with pytest.raises(CircuitOpen) as caught:
            env.runtime.call_as(caller, "shout", {"text": "b"})
        assert "'alice/helper''s tool shout was refused before it ran" in str(caught.value)
        assert reason in str(caught.value)
        with pytest.raises(OpVetoed):
            op.commit()
        record = last_record(env)
        assert record["status"] == "refused"
        assert record["circuit"]["agent"] == "alice"
        assert (record["circuit"]["sub_agent"], record["circuit"]["via"]) == (
            HELPER, "tool shout")
    with env.op():
        env.agents.reset("alice")
    with env.op():
        assert env.runtime.call_as("bob", "shout", {"text": "c"}) == "C"
        assert env.runtime.call_as(HELPER, "echo", {"text": "d"}) == "d"


def test_a_sub_agents_subscriber_is_skipped_and_the_emitting_op_commits(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant(HELPER, "subscribe:orders.*")
    env.run(HELPER, "seen = []\ndef on(event):\n    seen.append(event['payload']['n'])\n"
                    "subscribe('orders.*', on)")
    trip(env)
    with env.op():
        env.runtime.events.emit("orders.new", {"n": 1}, principal="human")
    record = last_record(env)
    assert record["status"] == "committed"
    assert [(item["agent"], item["policy"], item["topic"])
            for item in record["circuit_skipped"]] == [(HELPER, "failures", "orders.new")]
    assert env.ns_of(HELPER)["seen"] == []
    with env.op():
        env.agents.reset("alice")
    with env.op():
        env.runtime.events.emit("orders.new", {"n": 2}, principal="human")
    assert env.ns_of(HELPER)["seen"] == [2]


def test_a_sub_agents_loop_trips_and_goes_on_after_the_reset(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.loop(HELPER, "count = loop_state()['iteration']")
    assert loop.run_once(env.runtime, HELPER).committed
    trip(env)
    turn = loop.run_once(env.runtime, HELPER)
    assert turn.outcome == "tripped" and isinstance(turn.error, CircuitOpen)
    assert env.agents.loops()[0]["iteration"] == 1
    with env.op():
        env.agents.reset("alice")
    assert loop.run_once(env.runtime, HELPER).committed
    assert env.ns_of(HELPER)["count"] == 1


def test_a_harness_op_as_a_sub_agent_is_refused(env) -> None:  # type: ignore[no-untyped-def]
    service = HarnessService(env.image, env.runtime)
    reason = trip(env)
    for request in ({"code": "n = 1"}, {"tool": "nothing", "arguments": {}}):
        reply = service.handle({"v": 1, "action": "op", "principal": INTERN,
                                **request}).reply
        result = reply["result"]
        assert result["status"] == "refused", reply
        assert reason in result["error"]["message"]
        assert "`kernos agent reset alice`" in result["error"]["message"]
        [record] = [record for record in env.image.audit.records()
                    if record.get("op") == result["op"]]
        assert (record["status"], record["circuit"]["sub_agent"]) == ("refused", INTERN)
