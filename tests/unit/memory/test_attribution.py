"""Memory credits every exchange to the principal that made it, not to the op it ran in.

One op holds what everyone whose code ran in it did: an agent's subscriber
runs as itself inside the emitter's op, a tool runs as its caller, the human's
trusted code (a subscriber, a tool) acts as the human, a sub-agent is a
principal of its own, and the effects an op queued are recorded after it.
Each test has two principals and checks that one never recalls the other's
exchange, and that the maker recalls it, labelled with its own name.
"""

from __future__ import annotations

import json
import sqlite3
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernos import Image, Workspace
from kernos.agents import AgentRuntime, Agents, Limits
from kernos.events.human import Events
from kernos.image import default_is_persistent
from kernos.llm import Mode, set_mode
from kernos.memory import MemoryIndex
from kernos.memory.episodes import op_entries
from kernos.memory.index import INDEX_PATH

LIMITS = Limits(seconds=30, hard_seconds=600, memory_mb=4096)
HIDDEN = frozenset({"agents", "events"})
"""The kernel's objects in the namespace: never persisted, as in a notebook."""
MODEL = "gpt-4o-mini"


def llm_line(text: str, *, caller: str = "llm") -> str:
    """A call of ``caller`` (agent code's ``llm``, or the human's ``agents.llm``) that sends
    ``text``; litellm's ``mock_response`` answers it (no network)."""
    return (f"{caller}({MODEL!r}, [{{'role': 'user', 'content': {text!r}}}], max_tokens=20, "
            "mock_response='Noted.')")


class Env:
    """A workspace with an image and an agent runtime, ``agents`` and ``events`` in its
    namespace as a kernel has them; ops of the human and of agents."""

    def __init__(self, path: Path) -> None:
        self.workspace = Workspace.open(path, purpose="test")
        module = types.ModuleType("__main__")
        self.ns: dict[str, Any] = module.__dict__
        self.image = Image(self.workspace, self.ns, module=module,
                           is_persistent=lambda name: default_is_persistent(name)
                           and name not in HIDDEN)
        self.image.restore()
        self.runtime = AgentRuntime(self.image, default_limits=LIMITS)
        self.ns.update(agents=Agents(lambda: self.runtime),
                       events=Events(lambda: self.runtime.events))

    def close(self) -> None:
        self.runtime.memory.close()
        self.workspace.close()

    def cell(self, source: str) -> dict[str, Any]:
        """Run ``source`` as the human's op; its audit record (it must commit)."""
        op = self.image.begin(source=source)
        try:
            exec(compile(source, f"<cell {op.id}>", "exec"), self.ns)
        except BaseException as error:
            op.abort(error=error)
            raise
        op.commit()
        return self.last_record()

    def agent_op(self, agent: str, code: str) -> dict[str, Any]:
        """Run ``code`` as an op of ``agent`` (as the harness does); its audit record."""
        op = self.image.begin(source=code, principal=agent)
        try:
            self.runtime.run(agent, code)
        except BaseException as error:
            op.abort(error=error)
            raise
        op.commit()
        return self.last_record()

    def last_record(self) -> dict[str, Any]:
        return next(record for record in reversed(self.image.audit.records())
                    if record["type"] == "op")

    def recall(self, principal: str, query: str) -> list[dict[str, Any]]:
        """What ``principal`` recalls of its past (the episodic layer) for ``query``."""
        return self.runtime.memory.recall(principal, query, k=50, kinds=["episodic"])


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    set_mode(Mode.RECORD)
    environment = Env(tmp_path / "ws")
    environment.cell("agents.add('alice')\nagents.add('bob')")
    yield environment
    environment.close()
    set_mode(None)


def exchanges(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The LLM exchanges among recalled memories."""
    return [memory for memory in found if memory["title"].startswith("llm ")]


def test_a_subscribers_llm_call_in_anothers_op_is_the_subscribers(env: Env) -> None:
    env.cell(f"agents.grant('alice', 'llm:{MODEL}', 5000)\n"
             "agents.grant('alice', 'subscribe:notes.*')\n"
             "agents.grant('bob', 'emit:notes.*')")
    env.agent_op("alice", "def on_note(event):\n"
                          f"    {llm_line('alice private: the heron vault opens with 4471')}\n"
                          "subscribe('notes.*', on_note)")
    record = env.agent_op("bob", "emit('notes.new', {'about': 'the weekly plan'})")
    assert record["principal"] == "bob"
    assert [call["principal"] for call in record["llm"]] == ["alice"]

    seen_by_bob = env.recall("bob", "heron vault private")
    assert not exchanges(seen_by_bob), seen_by_bob
    assert "heron" not in json.dumps(seen_by_bob)
    # bob's own part of his op is still his: the op and the event he emitted.
    assert {memory["title"] for memory in env.recall("bob", "weekly plan notes")} >= {
        f"op {record['op']} committed", "event notes.new"}

    [exchange] = exchanges(env.recall("alice", "heron vault"))
    assert exchange["principal"] == "alice" and exchange["op"] == record["op"]
    assert "heron vault opens with 4471" in exchange["text"]


def test_an_event_a_subscriber_emits_in_anothers_op_is_the_subscribers(env: Env) -> None:
    env.cell("agents.grant('alice', 'subscribe:notes.new')\n"
             "agents.grant('alice', 'emit:notes.echo')\n"
             "agents.grant('bob', 'emit:notes.new')")
    env.agent_op("alice", "def on_note(event):\n"
                          "    emit('notes.echo', {'kept': 'alice ibis diary 1209'})\n"
                          "subscribe('notes.new', on_note)")
    record = env.agent_op("bob", "emit('notes.new', {'about': 'lunch'})")
    assert [(event["topic"], event["principal"], event["depth"])
            for event in record["events"]] == [("notes.new", "bob", 0),
                                               ("notes.echo", "alice", 1)]

    assert "ibis" not in json.dumps(env.recall("bob", "ibis diary echo"))
    [echo] = [memory for memory in env.recall("alice", "ibis diary")
              if memory["title"] == "event notes.echo"]
    assert echo["principal"] == "alice" and echo["op"] == record["op"]


def test_the_humans_subscriber_in_an_agents_op_acts_as_the_human(env: Env) -> None:
    # The human's subscriber is trusted code outside the emitter's authority: what it
    # emits and what it asks a model is the human's, never the emitting agent's.
    env.cell("agents.grant('bob', 'emit:orders.*')\n"
             "def copy_order(event):\n"
             "    events.emit('ledger.copy', {'margin': 'human osprey margin 31%'})\n"
             f"    {llm_line('human osprey pricing strategy', caller='agents.llm')}\n"
             "events.subscribe('orders.new', copy_order)")
    record = env.agent_op("bob", "emit('orders.new', {'item': 'tea'})")
    assert [(event["topic"], event["principal"]) for event in record["events"]] == [
        ("orders.new", "bob"), ("ledger.copy", "human")]
    assert [call["principal"] for call in record["llm"]] == ["human"]

    assert "osprey" not in json.dumps(env.recall("bob", "osprey margin pricing ledger"))
    mine = [memory for memory in env.recall("human", "osprey")
            if memory["op"] == record["op"]]
    assert {memory["title"] for memory in mine} == {"event ledger.copy", f"llm {MODEL}"}
    assert {memory["principal"] for memory in mine} == {"human"}


def test_a_tools_llm_call_is_the_callers_the_runtime_ran_it_as(env: Env) -> None:
    # alice's tool, called by bob, runs as bob (bounded by alice's grants too): the call
    # entry names bob, so the exchange is bob's and never alice's.  The human's trusted
    # tool asks the model as the human (agents.llm): that exchange is the human's.
    env.cell(f"agents.grant('alice', 'llm:{MODEL}', 5000)\n"
             f"agents.grant('bob', 'llm:{MODEL}', 5000)\n"
             "agents.grant('bob', 'call:ask')\n"
             "agents.grant('bob', 'call:brief')\n"
             "def brief(topic):\n"
             f"    {llm_line('human secret playbook: kestrel discounts', caller='agents.llm')}\n"
             "    return 'briefed'\n"
             "agents.register_tool('brief', brief, description='Brief', schema={"
             "'type': 'object', 'properties': {'topic': {'type': 'string'}}})")
    source = ("def ask(x):\n"
              f"    return {llm_line('please weigh x', caller='llm')}['content']\n")
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    env.agent_op("alice", f"define_tool('ask', {source!r}, {schema!r}, 'Ask')")
    record = env.agent_op("bob", "call('ask', x='bob plover question')\n"
                                 "call('brief', topic='plover')")
    assert [call["principal"] for call in record["llm"]] == ["bob", "human"]

    [asked] = exchanges(env.recall("bob", "weigh"))
    assert asked["principal"] == "bob" and asked["op"] == record["op"]
    assert not exchanges(env.recall("alice", "weigh"))
    assert "kestrel" not in json.dumps(env.recall("bob", "kestrel playbook discounts"))
    [briefed] = exchanges(env.recall("human", "kestrel playbook"))
    assert briefed["principal"] == "human" and briefed["op"] == record["op"]


def test_a_sub_agents_subscriber_in_its_parents_op_is_the_sub_agents(env: Env) -> None:
    env.cell("agents.grant('alice', 'agents:spawn')\n"
             "agents.grant('alice', 'emit:jobs.*')")
    env.agent_op("alice", "spawn('helper')")
    env.cell(f"agents.grant('alice/helper', 'llm:{MODEL}', 5000)\n"
             "agents.grant('alice/helper', 'subscribe:jobs.*')")
    env.agent_op("alice/helper", "def on_job(event):\n"
                                 f"    {llm_line('helper scratch: the egret ledger total')}\n"
                                 "subscribe('jobs.*', on_job)")
    record = env.agent_op("alice", "emit('jobs.start', {'job': 1})")
    assert [call["principal"] for call in record["llm"]] == ["alice/helper"]

    # The parent recalls nothing of its sub-agent's exchange, nor the sub-agent its parent's.
    assert "egret" not in json.dumps(env.recall("alice", "egret ledger"))
    [exchange] = exchanges(env.recall("alice/helper", "egret ledger"))
    assert exchange["principal"] == "alice/helper" and exchange["op"] == record["op"]
    assert not any(memory["title"] == "event jobs.start"
                   for memory in env.recall("alice/helper", "jobs start"))


def test_each_principals_effects_are_recorded_by_an_op_of_its_own(env: Env) -> None:
    # bob's op queues his effect and, through alice's subscriber, hers: after the op, each
    # outcome is recorded by an op of the principal that called the tool.
    env.cell("def notify(text, idempotency_key):\n"
             "    return text.upper()\n"
             "agents.register_tool('notify', notify, description='Notify', "
             "effect='external', schema={'type': 'object', "
             "'properties': {'text': {'type': 'string'}}})\n"
             "agents.grant('alice', 'call:notify')\n"
             "agents.grant('alice', 'subscribe:parcels.*')\n"
             "agents.grant('bob', 'call:notify')\n"
             "agents.grant('bob', 'emit:parcels.*')")
    env.agent_op("alice", "def on_parcel(event):\n"
                          "    call('notify', text='alice avocet address')\n"
                          "subscribe('parcels.*', on_parcel)")
    queued = env.agent_op("bob", "call('notify', text='bob parcel')\n"
                                 "emit('parcels.sent', {'n': 1})")
    keys = {effect["principal"]: effect["key"] for effect in env.runtime.effects.effects()}
    reports = env.runtime.effects.drain()
    followups = [record for record in env.image.audit.records()
                 if record["type"] == "op" and record.get("kind") == "effect"]
    assert len(reports) == 2
    assert sorted((record["principal"], [effect["key"] for effect in record["effects"]])
                  for record in followups) == [("alice", [keys["alice"]]),
                                               ("bob", [keys["bob"]])]
    assert queued["op"] not in {record["op"] for record in followups}

    seen_by_bob = env.recall("bob", "effects")
    assert keys["bob"] in json.dumps(seen_by_bob)
    assert keys["alice"] not in json.dumps(seen_by_bob), seen_by_bob
    [recorded] = [memory for memory in env.recall("alice", "effects")
                  if keys["alice"] in memory["text"]]
    assert recorded["principal"] == "alice"


def test_a_record_that_does_not_name_the_maker_credits_only_the_human(env: Env) -> None:
    # An older or damaged record: an event, a call without a principal (or with one that
    # is not a name).  Nothing proves the op's agent made them: only the human sees them.
    record = {"type": "op", "index": 7, "op": 3, "principal": "bob", "status": "committed",
              "code": {"text": "emit('a.b')"},
              "events": [{"topic": "a.b", "payload": {"x": 1}},
                         {"topic": "a.c", "payload": {}, "principal": ["bob"]},
                         {"topic": "a.d", "payload": {}, "principal": "alice"}],
              "llm": [{"model": MODEL}, {"model": MODEL, "principal": None},
                      {"model": MODEL, "principal": "bob"}]}
    owners = [(entry["title"], entry["principal"])
              for entry in op_entries(env.image.audit, record, None)]
    assert owners == [("op 3 committed", "bob"), ("event a.b", "human"),
                      ("event a.c", "human"), ("event a.d", "alice"),
                      (f"llm {MODEL}", "human"), (f"llm {MODEL}", "human"),
                      (f"llm {MODEL}", "bob")]
    unnamed = {key: value for key, value in record.items() if key != "principal"}
    [op_entry, *_] = op_entries(env.image.audit, unnamed, None)
    assert op_entry["principal"] == "human"


def test_an_index_of_the_older_format_is_rebuilt(env: Env) -> None:
    # Its entries credited a subscriber's exchange to the op's principal: a cache of that
    # format is never read again, it is rebuilt from the chain.
    env.cell("x = 'wren'")
    index = MemoryIndex.open(env.workspace.path, env.image.audit)
    index.close()
    path = env.workspace.path / INDEX_PATH
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '3' WHERE key = 'format'")
        db.execute("INSERT INTO entries(kind, principal, title) VALUES "
                   "('episodic', 'bob', 'stale')")
    db.close()
    index = MemoryIndex.open(env.workspace.path, env.image.audit)
    try:
        assert index.rebuilt
        assert index.db.execute("SELECT count(*) FROM entries WHERE title = 'stale'"
                                ).fetchone() == (0,)
    finally:
        index.close()
