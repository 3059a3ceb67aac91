"""Recall by meaning through a real kernel: litellm's embedding(), granted, budgeted, recorded.

The kernel process calls ``litellm.embedding`` for real; the configured
``mock_response`` is litellm's own stand-in for a provider (no network here),
so every text gets the same vector: a recall then ranks every embedded entry
it may read as an equal match by meaning.  What these tests prove is the path
(the grant, the budget, the recording, the audit, the veto, ``kill -9``), not
the quality of a model; ranking by meaning is proved in
``tests/unit/memory/test_embeddings.py`` with distinct vectors.
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
MODEL = "text-embedding-3-small"
CONFIG = f"agents.memory_embeddings({MODEL!r}, mock_response=[0.6, 0.8, 0.0])"


def _recall(client: KernosClient, principal: str, query: str) -> Any:
    result = client.op(f"print(repr(recall({query!r}, k=20)))", principal=principal)
    found = ast.literal_eval(result.output.strip()) if result.committed else None
    return result, found


def _used(client: KernosClient, agent: str) -> int:
    grant = next(grant for grant in client.grants(agent)
                 if grant["capability"] == f"llm:{MODEL}" and grant["active"])
    return int(grant["used"])


def _embedding_calls(client: KernosClient, op: int) -> list[dict[str, Any]]:
    record = next(entry for entry in client.audit() if entry.get("op") == op)
    return [call for call in record.get("llm") or [] if call.get("kind") == "embedding"]


def test_recall_by_meaning_needs_the_model_grant_and_spends_from_it(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace, env=ENV) as client:
        assert client.op(CONFIG).committed
        client.add_agent("alice")
        client.grant("alice", "memory:read")
        client.grant("alice", "memory:write")
        assert client.op("remember('the invoice of ACME was paid late')",
                         principal="alice").committed

        # Embeddings are on, and alice may not call the model: recall is refused, and
        # the refusal names the grant that is missing.
        refused, _ = _recall(client, "alice", "invoice")
        assert not refused.committed
        assert refused.error is not None and f"llm:{MODEL}" in refused.error.message, refused

        client.grant("alice", f"llm:{MODEL}", 5000)
        result, found = _recall(client, "alice", "tardy settlement")
        assert result.committed, result.error
        # No word is shared with the fact: it is found by meaning, as plain data.
        fact = [memory for memory in found if memory["kind"] == "semantic"]
        assert [memory["text"] for memory in fact] == ["the invoice of ACME was paid late"]
        assert fact[0]["matched"] == "meaning"
        # The calls are in the op's audit record and charged to alice's grant.
        calls = _embedding_calls(client, result.op)
        assert calls and all(call["principal"] == "alice" for call in calls), calls
        spent = _used(client, "alice")
        assert spent == sum(call["tokens"] for call in calls) > 0

        # The embedding calls are the memory's upkeep, not episodes to recall.
        result, again = _recall(client, "alice", MODEL)
        assert result.committed, result.error
        assert not [memory for memory in again
                    if memory["kind"] == "episodic" and memory["title"].startswith("llm")]


def test_the_budget_stops_recall_by_meaning_and_vectors_survive_kill9(
        tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace, env=ENV) as client:
        assert client.op(CONFIG).committed
        client.add_agent("bob")
        for capability in ("memory:read", "memory:write"):
            client.grant("bob", capability)
        client.grant("bob", f"llm:{MODEL}", 1000)
        for n in range(3):
            assert client.op(f"remember('shipment {n} left the harbour')",
                             principal="bob").committed
        result, found = _recall(client, "bob", "shipment")
        assert result.committed, result.error
        assert {memory["matched"] for memory in found if memory["kind"] == "semantic"} == {
            "both"}
        before = _used(client, "bob")

        client.manager.kill()
        client.manager.restart()
        # The index and its vectors survived: the same recall embeds only what is new
        # (the recall op itself), and the texts it embedded before cost nothing now.
        result, found = _recall(client, "bob", "shipment")
        assert result.committed, result.error
        after = _used(client, "bob")
        calls = _embedding_calls(client, result.op)
        fresh = [call for call in calls if not call["cached"]]
        assert after - before == sum(call["tokens"] for call in fresh)
        assert len(fresh) < 3, calls

        # A grant too small for the next recall's worst case: the op is vetoed before any
        # call, the image unchanged, and the grant's use is what it was.
        client.revoke("bob", f"llm:{MODEL}")
        client.grant("bob", f"llm:{MODEL}", 1)
        refused, _ = _recall(client, "bob", "harbour")
        assert refused.status == "vetoed", refused
        assert refused.error is not None
        assert "LLMBudgetExceeded" in json.dumps(refused.error.to_json()), refused.error
        assert _used(client, "bob") == 0
