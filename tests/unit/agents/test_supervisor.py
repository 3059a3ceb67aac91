"""Circuit breakers (kernos.agents.supervisor): each policy trips at exactly its figure,
the refusal names the policy and the figures, only the human closes a circuit, a
sub-agent's policy is never looser than its parent's, and the counters survive the
rollback of the ops they count (they live outside the image)."""

from __future__ import annotations

import time

import pytest

from kernos.agents import context
from kernos.agents.context import BoundedOutput, RunContext
from kernos.agents.supervisor import JOURNAL_FILE, fingerprint
from kernos.errors import CapabilityDenied, CircuitOpen, InvalidGrant
from supervisor_support import attempt, charge, policy, refusal


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
        env.agents.add("bob")
    return env


def test_consecutive_failures_trip_at_exactly_n_and_rolled_back_ops_still_count(env) -> None:  # type: ignore[no-untyped-def]
    policy(env, failures=3)
    assert attempt(env, "1/0") == "failed"
    caught = "try:\n    write('x', 1)\nexcept CapabilityDenied:\n    pass"
    assert attempt(env, caught) == "vetoed"                # denied, caught: vetoed at commit
    assert attempt(env, "n = 1") == "committed"           # a commit starts the count again
    assert attempt(env, "1/0") == "failed"
    assert attempt(env, "1/0") == "failed"
    assert env.agents.circuit("alice") is None             # N-1 failures: still closed
    assert attempt(env, "1/0") == "failed"                 # the Nth
    trip = env.agents.circuit("alice")
    assert trip is not None and trip["policy"] == "failures"
    error = refusal(env, "n = 2")
    assert error.policy == "failures"
    assert "3 op(s) of 'alice' in a row did not commit (ops 6, 7, 8)" in str(error)
    assert "policy failures=3 opens the circuit at 3 in a row" in str(error)
    assert env.ns_of("alice") == {"n": 1}                  # refused before its body ran
    assert attempt(env, "n = 3", agent="bob") == "committed"  # bob's circuit is his own


def test_an_open_circuit_survives_a_restart(env) -> None:  # type: ignore[no-untyped-def]
    policy(env, failures=1)
    assert attempt(env, "1/0") == "failed"
    env.reopen()
    assert env.agents.circuit("alice")["policy"] == "failures"
    assert attempt(env, "pass") == "refused"
    assert (env.path / JOURNAL_FILE).exists()


def test_the_same_op_repeated_trips_after_n_in_a_row(env) -> None:  # type: ignore[no-untyped-def]
    policy(env, repeats=3)
    for _ in range(2):
        assert attempt(env, "x = 1") == "committed"
    assert attempt(env, "y = 1") == "committed"            # a different op: a new run
    for _ in range(3):
        assert attempt(env, "x = 1") == "committed"
    error = refusal(env, "x = 1")
    sha = fingerprint("code", "x = 1")
    assert error.policy == "repeats"
    assert f"code sha {sha[:12]}" in str(error)
    assert "4 times in a row; policy repeats<=3" in str(error)
    assert attempt(env, "y = 2") == "refused"              # open: every op is refused


def test_a_tool_call_with_other_arguments_is_another_op(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.register_tool("echo", lambda text: text, description="Echo", schema={
            "type": "object", "properties": {"text": {"type": "string"}},
            "required": ["text"]})
        env.agents.grant("alice", "call:echo")
    policy(env, repeats=1)

    def call(text: str) -> str:
        with env.op():
            return env.runtime.call_as("alice", "echo", {"text": text})  # type: ignore[no-any-return]

    assert call("a") == "a"
    assert call("b") == "b"
    op = env.image.begin(source="")
    with pytest.raises(CircuitOpen, match="policy repeats<=1"):
        env.runtime.call_as("alice", "echo", {"text": "b"})
    op.abort()


def test_iterations_allow_exactly_n_ops(env) -> None:  # type: ignore[no-untyped-def]
    policy(env, iterations=3)
    assert [attempt(env, f"i = {n}") for n in range(3)] == ["committed"] * 3
    error = refusal(env, "i = 3")
    assert error.policy == "iterations"
    assert "already ran 3 ops since it was last reset; policy iterations<=3" in str(error)


def test_one_op_with_several_runs_is_one_iteration(env) -> None:  # type: ignore[no-untyped-def]
    policy(env, iterations=2)
    with env.op():
        env.runtime.run("alice", "a = 1")
        env.runtime.run("alice", "b = 1")
    assert attempt(env, "c = 1") == "committed"
    assert attempt(env, "d = 1") == "refused"


def test_wall_time_trips_at_exactly_n_seconds(env) -> None:  # type: ignore[no-untyped-def]
    now = [1000.0]
    env.runtime.breakers.clock = lambda: now[0]
    policy(env, wall_seconds=10)
    assert attempt(env, "a = 1") == "committed"            # the first supervised op: t=0
    now[0] = 1009.999
    assert attempt(env, "a = 2") == "committed"
    now[0] = 1010.0
    error = refusal(env, "a = 3")
    assert error.policy == "wall_seconds"
    assert "for 10.0 s since its first supervised op; policy wall_seconds<10" in str(error)


def test_token_burn_rate_comes_from_the_ledger_and_trips_at_n(env) -> None:  # type: ignore[no-untyped-def]
    policy(env, tokens_per_minute=100)
    charge(env, "alice", 60)
    charge(env, "bob", 500)                                # another agent's spending
    charge(env, "alice", 39)
    assert attempt(env, "a = 1") == "committed"            # 99 in the last minute
    charge(env, "alice", 1)
    error = refusal(env, "a = 2")
    assert error.policy == "tokens_per_minute"
    assert "charged 100 LLM tokens in the last 60 s; policy tokens_per_minute<100" in str(error)


def test_the_burn_window_forgets_older_spending(env) -> None:  # type: ignore[no-untyped-def]
    charge(env, "alice", 100)
    now = time.time()
    assert env.runtime.breakers.burn("alice", now) == (100, 0)
    assert env.runtime.breakers.burn("alice", now + 61) == (0, 0)


def test_usd_burn_rate_trips_at_n_micro_usd(env) -> None:  # type: ignore[no-untyped-def]
    policy(env, micro_usd_per_minute=2_000)
    charge(env, "alice", 1, "0.001999")
    assert attempt(env, "a = 1") == "committed"
    charge(env, "alice", 1, "0.000001")
    error = refusal(env, "a = 2")
    assert error.policy == "micro_usd_per_minute"
    assert "0.002000 USD" in str(error)


RUNTIMES: list = []


def close_circuit(name: str) -> object:
    """A trusted tool that tries to close a circuit (stored by reference: module-level)."""
    return RUNTIMES[0].breakers.reset(name)


def test_only_the_human_closes_a_circuit(env) -> None:  # type: ignore[no-untyped-def]
    breakers = env.runtime.breakers
    RUNTIMES[:] = [env.runtime]
    with env.op():
        env.agents.register_tool("close", close_circuit,
                                 description="Close a circuit", schema={
                                     "type": "object",
                                     "properties": {"name": {"type": "string"}},
                                     "required": ["name"]})
        env.agents.grant("bob", "call:close")
    policy(env, failures=1)
    assert attempt(env, "1/0") == "failed"
    # Agent code has no handle on the supervisor ...
    assert attempt(env, "agents.reset('alice')", agent="bob") == "failed"
    # ... and a trusted tool that has one acts with its caller's authority: refused.
    op = env.image.begin(source="")
    with pytest.raises(CapabilityDenied, match="supervisor: close a circuit"):
        env.runtime.call_as("bob", "close", {"name": "alice"})
    op.abort()
    assert env.agents.circuit("alice") is not None
    for action in (lambda: breakers.set_policy("bob", failures=9),
                   lambda: breakers.checkpoint("bob"), lambda: breakers.reset("alice")):
        op = env.image.begin(source="")
        token = context.enter(RunContext(runtime=env.runtime, principal="bob", op=op,
                                         limits=env.limits, output=BoundedOutput(100)))
        try:
            with pytest.raises(CapabilityDenied, match="only the human's own code may"):
                action()
        finally:
            context.leave(token)
            op.abort()
    with env.op():
        assert env.agents.reset("alice")["was_open"] == "failures"
    assert env.agents.circuit("alice") is None
    assert attempt(env, "n = 1") == "committed"


def test_a_trip_is_announced_by_the_next_committed_op(env) -> None:  # type: ignore[no-untyped-def]
    seen = []
    with env.op():
        env.runtime.events.subscribe("kernos.circuit.*", seen.append)
    policy(env, failures=1)
    assert attempt(env, "1/0") == "failed"
    assert attempt(env, "pass") == "refused"
    record = env.image.audit.records()[-1]
    assert record["status"] == "refused" and record["error"]["kind"] == "CircuitOpen"
    assert "policy failures=1" in record["error"]["message"]
    with env.op():
        env.agents.reset("alice")
    assert [event.payload["policy"] for event in seen] == ["failures"]
    topics = [event["topic"] for event in env.image.audit.events_since(0)]
    assert topics.count("kernos.circuit.open") == 1


def test_a_sub_agents_policy_is_never_looser_than_its_parents(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.grant("alice", "agents:spawn")
    env.run("alice", "spawn('helper')")
    policy(env, "alice", repeats=3, failures=5)
    assert env.agents.policy("alice/helper") == {"repeats": 3, "failures": 5}  # inherited
    with env.op(), pytest.raises(InvalidGrant, match=r"repeats=4 \(the parent allows 3\)"):
        env.agents.policy("alice/helper", repeats=4)
    policy(env, "alice/helper", repeats=2, iterations=10)
    assert env.agents.policy("alice/helper") == {"repeats": 2, "failures": 5,
                                                 "iterations": 10}
    policy(env, "alice", failures=1)                        # the parent tightens later
    assert env.agents.policy("alice/helper")["failures"] == 1
    assert attempt(env, "1/0", agent="alice/helper") == "failed"
    assert attempt(env, "pass", agent="alice/helper") == "refused"


def test_policies_roll_back_with_their_op(env) -> None:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    env.agents.policy("alice", iterations=1)
    op.abort()
    assert env.agents.policy("alice") == {}
    env.reopen()
    policy(env, iterations=1)
    env.reopen()
    assert env.agents.policy("alice") == {"iterations": 1}


def test_reset_can_put_only_that_agents_namespace_back_to_its_safe_checkpoint(env) -> None:  # type: ignore[no-untyped-def]
    env.run("alice", "notes = ['good']")
    env.run("bob", "notes = ['bob']")
    with env.op():
        assert env.agents.checkpoint("alice", safe=True)["names"] == ["notes"]
    policy(env, failures=1, restore_safe=True)
    env.run("alice", "notes.append('runaway')\nextra = 1")
    env.run("bob", "notes.append('bob 2')")
    assert attempt(env, "1/0") == "failed"
    with env.op():
        env.agents.reset("alice")
    assert env.ns_of("alice") == {"notes": ["good"]}
    assert env.ns_of("bob") == {"notes": ["bob", "bob 2"]}
    env.reopen()
    assert env.ns_of("alice") == {"notes": ["good"]}


def test_an_unsupervised_agent_writes_nothing(env) -> None:  # type: ignore[no-untyped-def]
    assert attempt(env, "1/0") == "failed"
    assert attempt(env, "pass") == "committed"
    assert not (env.path / JOURNAL_FILE).exists()
