"""Agents' memory through a real kernel: recall only what the grants let a principal read.

Each test starts a ``kernos`` kernel process (``KernosClient.start``) and
drives it through the harness protocol: agent code calling ``recall``,
``remember`` and ``context``, the harness actions ``recall``/``remember``/
``memory``, the human's ``agents.recall`` in a cell, erasure with
``audit.erase``, and a ``kill -9`` of the kernel.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from kernos.client import KernosClient
from kernos.client.errors import RequestError

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}
WORKTREE = Path(__file__).resolve().parents[2] / "kernel" / "kernos"


def _recall(client: KernosClient, principal: str, query: str, k: int = 50,
            kinds: list[str] | None = None) -> list[dict[str, Any]]:
    """Agent code calling recall(): the plain data it got, as it printed it."""
    result = client.op(f"print(repr(recall({query!r}, k={k}, kinds={kinds!r})))",
                       principal=principal)
    assert result.status == "committed", result.error
    found: list[dict[str, Any]] = ast.literal_eval(result.output.strip())
    return found


def _setup(client: KernosClient) -> None:
    assert client.op("ledger_secret = 'quokka salaries of everyone'\n"
                     "public_note = 'quokka public timetable'").committed
    for agent in ("alice", "bob", "carol"):
        client.add_agent(agent)
    client.grant("alice", "memory:read")
    client.grant("alice", "memory:write")
    client.grant("alice", "read:public_note")
    client.grant("bob", "memory:read")
    client.grant("bob", "memory:write")


def _who(found: list[dict[str, Any]]) -> set[tuple[str, str, str | None]]:
    return {(memory["kind"], memory["principal"], memory.get("name")) for memory in found}


def test_recall_returns_only_what_the_caller_may_read(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace, env=ENV) as client:
        # The kernel imports this worktree's Kernos (PYTHONPATH), not another checkout's.
        where = client.op("import kernos\nprint(kernos.__file__)")
        assert where.output.strip() == str(WORKTREE / "__init__.py"), where.output
        _setup(client)
        assert client.op("alice_note = 'quokka alice private'\n"
                         "remember('quokka migrate in march', tags=['zoo'])",
                         principal="alice").status == "committed"
        # bob's own public_note: a name alice may read in the human's namespace, not his.
        assert client.op("bob_note = 'quokka bob private'\npublic_note = 'quokka bob shadow'\n"
                         "remember('quokka bob fact')", principal="bob").status == "committed"

        alice = _recall(client, "alice", "quokka")
        assert alice, "alice recalls nothing"
        # Hers (ops, facts, names) and the one human name her read grant covers; nothing
        # of bob's, nothing of the human's but public_note.
        assert {principal for _, principal, _ in _who(alice)} <= {"alice", "human"}
        assert {name for kind, principal, name in _who(alice) if principal == "human"} == {
            "public_note"}
        assert all(kind == "working" for kind, principal, _ in _who(alice)
                   if principal == "human")
        assert ("semantic", "alice", "1") in _who(alice)
        assert ("working", "alice", "alice_note") in _who(alice)
        assert "bob" not in json.dumps(alice)
        assert "salaries" not in json.dumps(alice)

        bob = _recall(client, "bob", "quokka")
        assert {principal for _, principal, _ in _who(bob)} == {"bob"}
        assert ("working", "bob", "bob_note") in _who(bob)
        assert "alice" not in json.dumps(bob), bob
        assert "public timetable" not in json.dumps(bob), bob

        # context() goes through the same filter, with or without a query.
        for call in ("context(4000, 'quokka')", "context(4000)"):
            shown = client.op(f"print({call})", principal="bob")
            assert shown.status == "committed" and "quokka bob" in shown.output, shown
            assert "alice" not in shown.output and "salaries" not in shown.output
            assert "timetable" not in shown.output

        # A hostile query: FTS5 syntax is only words, and still only bob's entries.
        for query in ['quokka" OR owner : * OR "', "NEAR(quokka alice) *", 'kind:working OR',
                      "{owner kind}: quokka", "quokka\x00alice", "^quokka -bob"]:
            found = _recall(client, "bob", query)
            assert {principal for _, principal, _ in _who(found)} <= {"bob"}, (query, found)

        # The harness action and the human's API answer as the agent's grants say, too.
        as_bob = client.recall("quokka", principal="bob", k=50)
        assert {memory["principal"] for memory in as_bob} == {"bob"}
        cell = client.op("print(sorted({m['principal'] for m in agents.recall("
                         "'quokka', as_='alice', k=50)}))")
        assert cell.output.strip() == "['alice', 'human']", cell.output

        # Revoking the read grant takes public_note out of alice's recall at once.
        client.revoke("alice", "read:public_note")
        alice = _recall(client, "alice", "quokka")
        assert not any(principal == "human" for _, principal, _ in _who(alice)), alice
        assert client.recall("quokka", principal="alice", k=50)
        assert all(memory["principal"] == "alice"
                   for memory in client.recall("quokka", principal="alice", k=50))

        # No memory:read: the op is denied (and rolled back), and the harness refuses.
        denied = client.op("x = 1\nrecall('quokka')", principal="carol")
        assert denied.status == "denied", denied
        assert "memory:read" in str(denied.error)
        with pytest.raises(RequestError) as refused:
            client.recall("quokka", principal="carol")
        assert refused.value.kind == "denied"
        with pytest.raises(RequestError) as refused:
            client.remember("a fact", principal="carol")
        assert refused.value.kind == "denied"

        # Hostile arguments veto the op, even when the agent catches the error.
        for call in ("recall(42)", "recall('q', k=10**6)", "recall('q', kinds=['secret'])",
                     "recall('x' * 5000)", "remember(['not', 'text'])",
                     "context(10**9)", "remember('fact', tags=['no spaces'])"):
            result = client.op(f"try:\n    {call}\nexcept Exception:\n    pass",
                               principal="alice")
            assert result.status == "denied", (call, result)


def test_context_and_facts_roll_back_with_their_op(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace, env=ENV) as client:
        _setup(client)
        failed = client.op("remember('wombat burrows are square')\nraise ValueError('no')",
                           principal="alice")
        assert failed.status != "committed"
        assert client.op("remember('wombat diet is grass')", principal="alice").committed
        found = client.recall("wombat", principal="alice", kinds=["semantic"])
        assert [memory["text"] for memory in found] == ["wombat diet is grass"]
        shown = client.op("print(context(40))", principal="alice").output
        facts = [line for line in shown.splitlines() if line.startswith("[semantic")]
        assert facts == [f"[semantic op {found[0]['op']}] wombat diet is grass"], shown
        # A tiny budget gives an empty context, never more than asked.
        assert client.op("print(repr(context(1)))", principal="alice").output.strip() == "''"
        # The harness remember is an op by the principal, with the fact in the image.
        stored = client.remember("wombats are marsupials", principal="alice", tags=["zoo"])
        assert stored["fact"]["text"] == "wombats are marsupials" and stored["op"]
        assert {m["text"] for m in client.recall("wombat marsupials", principal="alice")} >= {
            "wombats are marsupials zoo"}
        # An agent whose circuit is open stores nothing through the harness either.
        client.add_agent("dave")
        client.grant("dave", "memory:write")
        assert client.op("agents.policy('dave', failures=1)").committed
        assert client.op("1 / 0", principal="dave").status == "failed"
        with pytest.raises(RequestError) as refused:
            client.remember("dave was here", principal="dave")
        assert refused.value.kind == "denied" and "circuit is open" in refused.value.message
        # (dave holds no memory:read: the human looks, as dave.)
        assert client.op("print(agents.recall('dave', as_='dave', kinds=['semantic']))"
                         ).output.strip() == "[]"


def test_erasure_removes_a_subject_from_recall_also_after_a_rebuild(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace, env=ENV) as client:
        sealed = client.op("guest = personal('Xylophantis guest', subject='c-42')")
        town = client.op("town = 'Xylophantis the town'")
        assert sealed.committed and town.committed
        before = client.recall("Xylophantis", k=20)
        assert {memory["op"] for memory in before if memory["kind"] == "episodic"} == {
            sealed.op, town.op}
        index = workspace / "memory" / "index.sqlite"
        assert b"xylophantis guest" in index.read_bytes().lower()
        erased = client.op("report = audit.erase('c-42')\nprint(report.subject)")
        assert erased.committed and erased.output.strip() == "c-42", erased

        after = client.recall("Xylophantis", k=20)
        assert {memory["op"] for memory in after if memory["kind"] == "episodic"} == {town.op}
        assert "guest" not in json.dumps(after)
        assert b"xylophantis guest" not in index.read_bytes().lower()

        stats = client.request("memory", command="rebuild")
        assert stats["entries"]["episodic"] >= 2
        again = client.recall("Xylophantis", k=20)
        assert {memory["op"] for memory in again if memory["kind"] == "episodic"} == {town.op}
        assert b"xylophantis guest" not in index.read_bytes().lower()


def test_recall_after_kill9_finds_committed_ops_not_rolled_back_ones(
        kernel_factory: Any) -> None:
    kernel = kernel_factory(env=ENV)
    assert kernel.run("kept = 'platypus committed'\n"
                      "agents.remember('platypus committed fact')").committed
    assert kernel.run("agents.recall('platypus')").committed  # the index exists, current
    # A cell in flight when the kernel dies: its fact and its code are never recalled.
    msg_id = kernel.client.execute("agents.remember('platypus lost fact')\n"
                                   "assert agents.recall('platypus lost', kinds=['semantic'])\n"
                                   "print('RAN', flush=True)\nimport time\n"
                                   "while True:\n    time.sleep(0.05)")
    while True:
        message = kernel.client.get_iopub_msg(timeout=60)
        if (message["parent_header"].get("msg_id") == msg_id
                and message["msg_type"] == "stream" and "RAN" in message["content"]["text"]):
            break
    kernel.kill9()
    kernel = kernel_factory(kernel.workspace, env=ENV)
    found = kernel.value("agents.recall('platypus', k=50)")
    texts = repr(found)
    assert "platypus committed fact" in texts and "kept" in texts
    assert "lost" not in texts, found
    # A fact stored by a cell that fails is rolled back with it: never recalled as a fact;
    # the failed cell itself is an episodic memory whose status says so.
    # (The recall inside the cell puts the fact in the index before the cell fails.)
    assert kernel.run("agents.remember('platypus failed fact')\n"
                      "assert agents.recall('platypus failed fact', kinds=['semantic'])\n"
                      "1 / 0").rolled_back
    found = kernel.value("agents.recall('platypus failed', k=50)")
    assert not any(memory["kind"] == "semantic" and "failed" in memory["text"]
                   for memory in found), found
    failed = [memory for memory in found if "ZeroDivisionError" in memory["text"]]
    assert failed and all(memory["status"] == "failed" for memory in failed), found
