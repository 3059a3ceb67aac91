"""Memory through a real kernel: an exchange belongs to the principal that made it.

The security review's scenario (issue 32): alice subscribes a handler that
asks a model about her private note; bob, who holds only ``emit`` and
``memory:read``, emits the event; the handler runs as alice inside bob's op.
bob's recall must never return alice's prompt, and alice's must, labelled
alice.  The kernel process calls ``litellm.completion`` for real, answered by
litellm's own ``mock_response`` (no network).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from kernos.client import KernosClient

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}
MODEL = "gpt-4o-mini"
NOTE = "alice private note: the heron vault opens with 4471"
ALICE_SUBSCRIBES = f"""
def on_note(event):
    llm({MODEL!r}, [{{'role': 'user', 'content': 'Keep this for me: ' + {NOTE!r}}}],
        max_tokens=20, mock_response='Kept.')
subscribe('notes.*', on_note)
"""


def _agent_recall(client: KernosClient, principal: str, query: str) -> list[dict[str, Any]]:
    """Agent code calling recall(): the plain data it got, as it printed it."""
    result = client.op(f"print(repr(recall({query!r}, k=50)))", principal=principal)
    assert result.status == "committed", result.error
    found: list[dict[str, Any]] = ast.literal_eval(result.output.strip())
    return found


def _exchanges(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [memory for memory in found if memory["title"] == f"llm {MODEL}"]


def test_a_subscribers_prompt_in_anothers_op_is_recalled_only_by_the_subscriber(
        tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace, env=ENV) as client:
        for agent in ("alice", "bob"):
            client.add_agent(agent)
            client.grant(agent, "memory:read")
        client.grant("alice", f"llm:{MODEL}", 5000)
        client.grant("alice", "subscribe:notes.*")
        client.grant("bob", "emit:notes.*")  # bob holds emit and memory:read, nothing else
        assert client.op(ALICE_SUBSCRIBES, principal="alice").committed

        emitted = client.op("emit('notes.new', {'about': 'the weekly plan'})", principal="bob")
        assert emitted.committed, emitted.error
        # The record says who did what: bob's op, alice's call in it.
        record = next(entry for entry in client.audit() if entry.get("op") == emitted.op)
        assert record["principal"] == "bob"
        assert [call["principal"] for call in record["llm"]] == ["alice"]

        # bob's recall (agent code, the harness action, the human asking as bob) never
        # returns alice's prompt.  (His recall op's own code holds the query's words, so
        # the prompt is looked for by what only it holds.)
        for found in (_agent_recall(client, "bob", "heron vault private note"),
                      client.recall("heron vault private note Keep", principal="bob", k=50),
                      client.recall("Kept", principal="bob", k=50)):
            assert not _exchanges(found), found
            assert "4471" not in json.dumps(found) and "Keep this" not in json.dumps(found)
        asked = client.op("print(repr(agents.recall('heron vault', as_='bob', k=50)))")
        assert asked.committed and "4471" not in asked.output, asked.output
        # What bob did in his op is still his.
        titles = {memory["title"] for memory in client.recall("weekly plan", principal="bob",
                                                               k=50)}
        assert {f"op {emitted.op} committed", "event notes.new"} <= titles

        # alice recalls her exchange, labelled alice, in the op bob ran.
        [exchange] = _exchanges(_agent_recall(client, "alice", "heron vault"))
        assert exchange["principal"] == "alice" and exchange["op"] == emitted.op
        assert NOTE in exchange["text"]

        # A rebuilt index (from the chain) credits it the same way.
        assert client.request("memory", command="rebuild")["entries"]["episodic"] > 0
        assert not _exchanges(client.recall("heron vault", principal="bob", k=50))
        [again] = _exchanges(client.recall("heron vault", principal="alice", k=50))
        assert again["principal"] == "alice" and again["op"] == emitted.op
