"""The memory index: layers, visibility, safe queries, staleness, erasure, rollback of facts."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from core_support import CoreEnv
from kernos.audit import erase
from kernos.errors import UsageError
from kernos.memory import Facts, MemoryIndex, WorkingItem, facts_name, remember
from kernos.memory.context import fallback_count
from kernos.memory.index import INDEX_PATH, fts_query, iter_entries
from kernos.personal import personal
from kernos.remote.transfer import ALLOWED


def _env(tmp_path: Path) -> CoreEnv:
    return CoreEnv(tmp_path / "ws", hidden={"personal": personal})


def _bare(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir(exist_ok=True)
    return tmp_path / "ws"


def test_recall_ranks_own_ops_and_hides_other_principals_ops(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env.run("invoice_total = 41 + 1  # invoices reconciled")
    env.run("shipping_note = 'carrier delayed'", principal="agent-a")
    env.run("other = 'invoices of agent a'", principal="agent-a")
    index = MemoryIndex.open(env.path, env.image.audit)
    mine = index.recall("invoices", principal="human", kinds=["episodic"])
    assert [m.op for m in mine] == [1]
    assert all(m.principal == "human" for m in mine)
    theirs = index.recall("invoices carrier", principal="agent-a", kinds=["episodic"])
    assert {m.op for m in theirs} == {2, 3}
    assert all(m.principal == "agent-a" for m in theirs)
    env.close()


def test_working_names_of_others_only_through_may_read(tmp_path: Path) -> None:
    index = MemoryIndex.open(_bare(tmp_path))
    index.sync_working("human", [WorkingItem(name="ledger", type="dict", preview="salaries"),
                                 WorkingItem(name="public", type="str", preview="salaries")])
    index.sync_working("agent-a", [WorkingItem(name="notes", type="str", preview="salaries")])
    assert {m.name for m in index.recall("salaries", principal="agent-a")} == {"notes"}
    seen = index.recall("salaries", principal="agent-a", may_read=lambda name: name == "public")
    assert {m.name for m in seen} == {"notes", "public"}
    assert len(index.recall("salaries", principal="human")) == 2
    index.sync_working("human", [])
    assert [m.name for m in index.recall("salaries", principal="human")] == []


@pytest.mark.parametrize("query", [
    '"', "'", "NEAR(a b)", "a AND", "OR OR", "*", "body:x", "x) OR (y", "^start",
    "-x", "a\x00b", '"unterminated', "{body}: x", "x" * 10_000, "🔥 émoji",
])
def test_hostile_queries_are_only_words(tmp_path: Path, query: str) -> None:
    index = MemoryIndex.open(_bare(tmp_path))
    index.sync_working("human", [WorkingItem(name="x", type="int", preview="start émoji")])
    index.recall(query, principal="human")  # never an FTS5 syntax error
    expression = fts_query(query)
    if expression is not None:
        for term in expression.split(" OR "):
            assert term.startswith('"') and term.endswith('"')
            assert '"' not in term[1:-1]


def test_recall_rejects_bad_arguments(tmp_path: Path) -> None:
    index = MemoryIndex.open(_bare(tmp_path))
    with pytest.raises(UsageError, match="kinds"):
        index.recall("x", principal="human", kinds=["secrets"])
    with pytest.raises(UsageError, match="k from 1"):
        index.recall("x", principal="human", k=0)
    with pytest.raises(UsageError, match="str"):
        index.recall(b"x", principal="human")  # type: ignore[arg-type]


def test_facts_live_in_the_image_and_roll_back_with_their_op(tmp_path: Path) -> None:
    env = _env(tmp_path)
    name = facts_name("agent-a")
    op = env.image.begin(source="# remember", principal="agent-a")
    facts = Facts()
    remember(facts, "the supplier Acme ships on Tuesdays", tags=["suppliers"], op=op.id)
    env.image.bind(name, facts)
    op.abort()
    assert env.image.lookup(name) is None
    op = env.image.begin(source="# remember", principal="agent-a")
    facts = Facts()
    remember(facts, "the supplier Acme ships on Tuesdays", tags=["suppliers"], op=op.id)
    env.image.bind(name, facts)
    op.commit()
    env.reopen()
    kept = env.image.lookup(name)
    assert isinstance(kept, Facts) and [f.text for f in kept.items] == [
        "the supplier Acme ships on Tuesdays"]
    index = MemoryIndex.open(env.path, env.image.audit)
    index.sync_semantic("agent-a", kept)
    found = index.recall("when does Acme ship", principal="agent-a", kinds=["semantic"])
    assert [m.title for m in found] == ["fact 1"]
    assert index.recall("Acme", principal="human", kinds=["semantic"]) == []
    env.close()


def test_remember_refuses_what_it_cannot_erase(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="personal"):
        remember(Facts(), personal("x", subject="c-1"))
    with pytest.raises(UsageError, match="tag"):
        remember(Facts(), "fine", tags=["no spaces"])


def test_index_is_rebuilt_when_missing_corrupt_or_from_another_chain(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env.run("alpha = 'first findings'")
    index = MemoryIndex.open(env.path, env.image.audit)
    assert index.rebuilt
    index.close()
    env.run("beta = 'second findings'")
    index = MemoryIndex.open(env.path, env.image.audit)
    assert not index.rebuilt  # caught up, not rebuilt
    assert {m.op for m in index.recall("findings", principal="human")} == {1, 2}
    index.close()
    (env.path / INDEX_PATH).write_bytes(b"not a database" * 100)
    index = MemoryIndex.open(env.path, env.image.audit)
    assert index.rebuilt and len(index.recall("findings", principal="human")) == 2
    # an index built to a chain whose record differs now: rebuilt, not caught up
    with index.db:
        index.db.execute("UPDATE meta SET value='0'*64 WHERE key='built_hash'")
        index.db.execute("UPDATE meta SET value='deadbeef' WHERE key='built_hash'")
    index.close()
    index = MemoryIndex.open(env.path, env.image.audit)
    assert index.rebuilt and len(index.recall("findings", principal="human")) == 2
    env.close()


def test_erasure_removes_the_subject_from_the_index_and_the_file(tmp_path: Path) -> None:
    env = _env(tmp_path)
    padding = "# padding\n" * 600  # the code goes to a payload, sealed for the subject
    env.run(f"a = personal('Zanzibarova', subject='c-alice')  # Qwertyzanzi\n{padding}")
    env.run("b = 'Zanzibarova is also a town, not personal'")
    index = MemoryIndex.open(env.path, env.image.audit)
    assert {m.op for m in index.recall("Zanzibarova", principal="human")} == {1, 2}
    assert b"qwertyzanzi" in (env.path / INDEX_PATH).read_bytes()
    erase(env.image.audit, "c-alice")
    index.catch_up(env.image.audit)
    assert {m.op for m in index.recall("Zanzibarova", principal="human")} == {2}
    index.close()
    data = (env.path / INDEX_PATH).read_bytes()
    assert data.count(b"Zanzibarova") == data.count(b"Zanzibarova is also a town")
    assert b"personal('Zanzibarova'" not in data
    # nor in the inverted index, which holds the tokens lowercased
    assert b"qwertyzanzi" not in data.lower()
    # a rebuild after the erasure never sees the text again either
    (env.path / INDEX_PATH).unlink()
    index = MemoryIndex.open(env.path, env.image.audit)
    assert {m.op for m in index.recall("Zanzibarova", principal="human")} == {2}
    assert not any("personal('Zanzibarova'" in body for _, _, body in iter_entries(index))
    env.close()


def test_context_stays_within_the_budget(tmp_path: Path) -> None:
    index = MemoryIndex.open(_bare(tmp_path))
    index.sync_working("human", [WorkingItem(name=f"v{i}", type="str",
                                             preview="quarterly revenue " * (i + 1))
                                 for i in range(20)])
    text = index.context("quarterly revenue", principal="human", max_tokens=60,
                         counter=fallback_count)
    assert text and sum(fallback_count(line + "\n") for line in text.split("\n")) <= 60
    with pytest.raises(UsageError):
        index.context("x", principal="human", max_tokens=0)


def test_the_index_is_never_pushed() -> None:
    assert not any(pattern.startswith("memory") for pattern in ALLOWED)


def test_the_index_file_is_sqlite_with_fts5(tmp_path: Path) -> None:
    index = MemoryIndex.open(_bare(tmp_path))
    index.close()
    with sqlite3.connect(tmp_path / "ws" / INDEX_PATH) as db:
        assert db.execute("SELECT value FROM meta WHERE key='format'").fetchone() == ("4",)


def test_entries_with_every_word_come_before_those_with_some(tmp_path: Path) -> None:
    index = MemoryIndex.open(_bare(tmp_path))
    index.sync_working("human", [
        WorkingItem(name="a", type="str", preview="refund refund refund refund"),
        WorkingItem(name="b", type="str", preview="refund for the late carrier"),
        WorkingItem(name="c", type="str", preview="carrier"),
        WorkingItem(name="d", type="str", preview="nothing to see")])
    found = index.recall("carrier refund", principal="human", k=5)
    assert found[0].name == "b"
    assert {m.name for m in found} == {"a", "b", "c"}


def test_sync_from_image_follows_commits_and_rollbacks(tmp_path: Path) -> None:
    from kernos.memory.sources import sync_from_image

    env = _env(tmp_path)
    env.run("forecast_q3 = {'revenue': 120}")
    env.run("secret = personal('Quillonfeather', subject='c-bob')")
    op = env.image.begin(source="# remember", principal="agent-a")
    facts = Facts()
    remember(facts, "forecast for q3 was raised", op=op.id)
    env.image.bind(facts_name("agent-a"), facts)
    op.commit()
    index = MemoryIndex.open(env.path, env.image.audit)
    sync_from_image(index, env.image)
    assert [m.name for m in index.recall("forecast_q3", principal="human",
                                         kinds=["working"])] == ["forecast_q3"]
    assert [m.title for m in index.recall("forecast", principal="agent-a",
                                          kinds=["semantic"])] == ["fact 1"]
    assert not any("Quillonfeather" in body for kind, _, body in iter_entries(index)
                   if kind == "working")  # the summary, never the value
    op = env.image.begin(source="# forget", principal="agent-a")
    env.image.unbind(facts_name("agent-a"))
    op.commit()
    sync_from_image(index, env.image)
    assert index.recall("forecast", principal="agent-a", kinds=["semantic"]) == []
    env.close()


def test_erasure_reaches_event_payloads_and_llm_exchanges(tmp_path: Path) -> None:
    from kernos.llm._store import LlmStore

    env = _env(tmp_path)
    env.run("bus.emit('crm.note', {'who': personal('Vortiganza', subject='c-carol'), "
            "'what': 'callback booked'})")
    log = env.image.audit
    store = LlmStore(env.path, durable=False, keyring=log.keyring)
    request = store.put({"messages": [{"role": "user", "content": "about Mirelvanta"}]},
                        subjects=["c-carol"])
    answer = store.put({"content": "Mirelvanta prefers email"}, subjects=["c-carol"])
    plain = store.put({"content": "the weather is fine in Mirelvanta"})
    log.append({"type": "op", "op": 2, "kind": "cell", "principal": "human",
                "status": "committed", "error": None, "code": None, "events": [],
                "commit": None, "llm": [
                    {"request": request, "response": answer, "model": "test/m"},
                    {"request": plain, "response": plain, "model": "test/m"}]})
    index = MemoryIndex.open(env.path, log)
    titles = {m.title for m in index.recall("Vortiganza", principal="human")}
    assert titles == {"event crm.note", "op 1 committed"}  # the code is sealed too
    assert len(index.recall("Mirelvanta", principal="human")) == 2
    erase(log, "c-carol")
    index.catch_up(log)
    assert index.recall("Vortiganza", principal="human") == []
    assert [m.text for m in index.recall("Mirelvanta", principal="human")] == [
        'test/m {"content": "the weather is fine in Mirelvanta"} '
        '{"content": "the weather is fine in Mirelvanta"}']
    assert b"vortiganza" not in (env.path / INDEX_PATH).read_bytes().lower()
    assert b"prefers" not in (env.path / INDEX_PATH).read_bytes().lower()
    env.close()


def test_a_fork_does_not_copy_the_index(tmp_path: Path) -> None:
    from kernos.fork import fork

    env = _env(tmp_path)
    env.run("x = 'something to remember'")
    MemoryIndex.open(env.path, env.image.audit).close()
    env.close()
    assert (env.path / INDEX_PATH).exists()
    fork(env.path, tmp_path / "dst")
    assert not (tmp_path / "dst" / "memory").exists()


def test_erase_deletes_the_index_and_an_open_index_rebuilds_without_the_subject(
        tmp_path: Path) -> None:
    env = _env(tmp_path)
    env.run("a = personal('Plovdivska', subject='c-dan')")
    index = MemoryIndex.open(env.path, env.image.audit)
    assert index.recall("Plovdivska", principal="human")
    erase(env.image.audit, "c-dan")
    assert not (env.path / INDEX_PATH).exists()  # no moment with the text on disk
    index.catch_up(env.image.audit)
    assert index.rebuilt and index.recall("Plovdivska", principal="human") == []
    assert b"plovdivska" not in (env.path / INDEX_PATH).read_bytes().lower()
    env.close()


def test_the_memory_core_does_not_import_jupyter() -> None:
    import subprocess
    import sys

    code = ("import sys, kernos.memory, kernos.memory.sources; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('ipykernel', 'jupyter_client', 'ipywidgets', 'IPython')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_a_write_cut_short_is_rebuilt(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env.run("alpha = 'findings'")
    MemoryIndex.open(env.path, env.image.audit).close()
    assert not MemoryIndex.open(env.path, env.image.audit).rebuilt
    (env.path / "memory" / "index.dirty").touch()  # what a kill -9 mid-write leaves
    index = MemoryIndex.open(env.path, env.image.audit)
    assert index.rebuilt and not (env.path / "memory" / "index.dirty").exists()
    assert index.recall("findings", principal="human")
    env.close()


def test_a_voided_op_is_marked_void(tmp_path: Path) -> None:
    env = _env(tmp_path)
    report = env.run("gamma = 'voidable findings'")
    index = MemoryIndex.open(env.path, env.image.audit)
    assert [m.status for m in index.recall("voidable", principal="human")] == ["committed"]
    voided = env.image.audit.records(type="op")[-1]["index"]
    env.image.audit.append({"type": "void", "voids": voided})
    index.catch_up(env.image.audit)
    assert [m.status for m in index.recall("voidable", principal="human")] == ["void"]
    assert report.op == 1
    env.close()


def test_token_counting_falls_back_when_litellm_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.memory import context

    assert context.count_tokens("hello world") >= 1
    monkeypatch.setattr(context, "_tried", True)
    monkeypatch.setattr(context, "_counter", None)
    assert context.count_tokens("x" * 9) == 3


def test_grants_decide_which_human_names_an_agent_recalls(tmp_path: Path) -> None:
    from kernos.agents.registry import Registry
    from kernos.memory.sources import may_read_for

    registry = Registry()
    registry.add_agent("scout", parent="human", op=1)
    registry.grant("scout", "read:prices", granter="human", op=1)
    index = MemoryIndex.open(_bare(tmp_path))
    index.sync_working("human", [WorkingItem(name="prices", type="dict", preview="widgets"),
                                 WorkingItem(name="salaries", type="dict", preview="widgets")])
    found = index.recall("widgets", principal="scout",
                         may_read=may_read_for(registry, "scout"))
    assert [m.name for m in found] == ["prices"]
    for grant in registry.of("scout"):
        registry.revoke(grant, op=2)
    assert index.recall("widgets", principal="scout",
                        may_read=may_read_for(registry, "scout")) == []
