"""The circuit on the paths where an agent's code runs inside someone else's op (its
tools, its subscribers), the announcing op, and the supervisor at scale: the ledger
read incrementally, the journal compacted, a fork's copy of it."""

from __future__ import annotations

import json

import pytest

from kernos.agents import supervisor
from kernos.agents.supervisor import JOURNAL_FILE, copy_journal
from kernos.errors import CircuitOpen, OpVetoed
from kernos.harness.service import HarnessService
from kernos.llm import LEDGER_FILE
from supervisor_support import attempt, charge, policy


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
        env.agents.add("bob")
        env.agents.grant("alice", "subscribe:orders.*")
    return env


SHOUT = "def shout(text):\n    return text.upper()\n"


def trip(env, agent: str = "alice") -> None:  # type: ignore[no-untyped-def]
    policy(env, agent, failures=1)
    assert attempt(env, "1/0", agent) == "failed"
    assert env.agents.circuit(agent) is not None


def test_a_tool_an_agent_wrote_is_refused_to_every_caller_while_its_circuit_is_open(env) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    env.run("alice", f"define_tool('shout', {SHOUT!r}, {schema!r}, 'Shout')")
    with env.op():
        env.agents.grant("bob", "call:shout")
    with env.op():
        assert env.agents.call("shout", text="a") == "A"
    trip(env)
    for caller in ("human", "bob"):
        op = env.image.begin(source="")
        with pytest.raises(CircuitOpen, match="policy failures=1"):
            env.runtime.call_as(caller, "shout", {"text": "b"})
        assert op.facts["circuit"]["via"] == "tool shout"
        with pytest.raises(OpVetoed):
            op.commit()
        record = env.image.audit.records()[-1]
        assert record["status"] == "refused"
        assert record["circuit"]["agent"] == "alice"
        assert record["circuit"]["policy"] == "failures"
    with env.op():
        env.agents.reset("alice")
    with env.op():
        assert env.agents.call("shout", text="c") == "C"


def test_a_tripped_agents_subscriber_is_skipped_and_the_emitting_op_commits(env) -> None:  # type: ignore[no-untyped-def]
    env.run("alice", "def on(event):\n    seen.append(event['topic'])\nseen = []\n"
                     "subscribe('orders.*', on)")
    with env.op():
        env.runtime.events.emit("orders.new", {"n": 1}, principal="human")
    assert env.ns_of("alice")["seen"] == ["orders.new"]
    trip(env)
    with env.op():
        env.runtime.events.emit("orders.new", {"n": 2}, principal="human")
    assert env.ns_of("alice")["seen"] == ["orders.new"]   # not run
    record = env.image.audit.records()[-1]
    assert record["status"] == "committed"
    assert record["circuit_skipped"] == [{"agent": "alice", "policy": "failures",
                                          "topic": "orders.new",
                                          "tripped_op": record["circuit_skipped"][0]
                                          ["tripped_op"]}]


def test_the_service_announces_a_trip_in_an_op_of_its_own_at_once(env) -> None:  # type: ignore[no-untyped-def]
    service = HarnessService(env.image, env.runtime)
    assert service.announce_trips() is None                # nothing to announce
    trip(env)
    report = service.announce_trips()
    assert report is not None
    assert [event["topic"] for event in report.events] == ["kernos.circuit.open"]
    assert report.events[0]["payload"]["policy"] == "failures"
    record = env.image.audit.records()[-1]
    assert record["kind"] == "supervisor" and record["status"] == "committed"
    assert service.announce_trips() is None                # once
    env.reopen()
    assert HarnessService(env.image, env.runtime).announce_trips() is None


def test_the_burn_check_reads_only_what_the_ledger_gained(env) -> None:  # type: ignore[no-untyped-def]
    import time

    breakers = env.runtime.breakers
    charge(env, "alice", 60)
    now = time.time()
    assert breakers.burn("alice", now) == (60, 0)
    size = (env.path / LEDGER_FILE).stat().st_size
    assert breakers._burn.offset == size
    charge(env, "alice", 40)
    assert breakers.burn("alice", now) == (100, 0)
    assert breakers._burn.offset == (env.path / LEDGER_FILE).stat().st_size > size
    assert breakers.burn("alice", now + 61) == (0, 0)
    assert breakers._burn.calls == {}                      # nothing older than the window


def test_a_long_journal_is_compacted_on_open_into_the_same_state(env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(supervisor, "COMPACT_LINES", 10)
    policy(env, "bob", failures=3, iterations=100)
    for _ in range(6):
        assert attempt(env, "n = 1", "bob") == "committed"
    assert attempt(env, "1/0", "bob") == "failed"
    assert attempt(env, "1/0", "bob") == "failed"
    trip(env, "alice")
    service = HarnessService(env.image, env.runtime)
    assert service.announce_trips() is not None
    path = env.path / JOURNAL_FILE
    assert len(path.read_bytes().splitlines()) > 10
    env.reopen()
    assert env.runtime.breakers.circuit("bob") is None     # opening the workspace compacts
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert [line["type"] for line in lines] == ["state", "trip", "announced", "state"]
    assert env.agents.circuit("alice")["policy"] == "failures"
    assert HarnessService(env.image, env.runtime).announce_trips() is None
    assert attempt(env, "1/0", "bob") == "failed"          # the third in a row: counted on
    assert env.agents.circuit("bob")["policy"] == "failures"


def test_a_fork_keeps_the_journal_up_to_its_snapshot(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    policy(env, failures=1)
    assert attempt(env, "n = 1") == "committed"
    before = env.image.head_op
    assert attempt(env, "1/0") == "failed"
    source, dest = env.path / JOURNAL_FILE, tmp_path / "fork" / JOURNAL_FILE
    copy_journal(source, dest, before)
    kept = [json.loads(line)["type"] for line in dest.read_bytes().splitlines()]
    assert kept == ["admit", "end"]                        # the trip came after the snapshot
    copy_journal(source, dest, None)
    assert dest.read_bytes() == source.read_bytes()


def test_a_replay_reproduces_a_trip_its_refusals_its_announcement_and_the_reset(
        tmp_path, request) -> None:  # type: ignore[no-untyped-def]
    from harness_support import Harness
    from kernos.replay.driver import replay

    harness = Harness(tmp_path / "ws")
    request.addfinalizer(harness.env.close)  # the workspace lock, also if an assert fails
    harness.ok(action="add_agent", agent="carol")
    harness.ok(action="policy", agent="carol", set={"failures": 2})
    harness.op("n = 1", principal="carol")
    for _ in range(2):
        assert harness.op("1/0", principal="carol")["status"] == "failed"
    assert harness.op("n = 2", principal="carol")["status"] == "refused"
    kinds = [(record["kind"], record["status"]) for record in harness.records()]
    assert kinds[-2:] == [("supervisor", "committed"), ("harness", "refused")]
    assert harness.ok(action="reset", agent="carol")["was_open"] == "failures"
    harness.op("n = 3", principal="carol")
    harness.env.close()
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.divergence
    assert [step.replayed for step in report.steps][-3:] == ["refused", "committed",
                                                            "committed"]
