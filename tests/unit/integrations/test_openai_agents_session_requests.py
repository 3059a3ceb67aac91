"""The harness session requests in-process (``kernos.harness.session_requests``).

They back ``kernos.integrations.openai_agents.KernosSession``: a principal's
conversation items in the image, in pages; every change one op of that principal,
all or nothing; reads run no op; an append costs what it adds, not the session's length.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness_support import Harness
from kernos.harness import session_requests
from kernos.harness.session_requests import PAGE_ITEMS, SessionRequests, session_name


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    opened = Harness(tmp_path / "ws")
    opened.service.max_request_bytes = 4_000_000
    yield opened
    opened.env.close()


def _items(start: int, count: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"message {n}"} for n in range(start, start + count)]


def _add(harness: Harness, items: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    fields.setdefault("session", "chat")
    return harness.ok(action="session_add", items=items, **fields)


def _get(harness: Harness, **fields: Any) -> list[dict[str, Any]]:
    fields.setdefault("session", "chat")
    items: list[dict[str, Any]] = harness.ok(action="session_items", **fields)["items"]
    return items


def _record(harness: Harness, op: int) -> dict[str, Any]:
    [record] = [record for record in harness.env.image.audit.records(type="op")
                if record["op"] == op]
    return record


def test_add_read_pop_and_clear_across_pages(harness: Harness) -> None:
    total = 2 * PAGE_ITEMS + 44
    added = _add(harness, _items(0, 10))
    assert (added["added"], added["total"]) == (10, 10) and added["commit"]
    for start in range(10, total, 97):  # turns that straddle page boundaries
        _add(harness, _items(start, min(97, total - start)))
    assert _get(harness) == _items(0, total)
    assert _get(harness, limit=3) == _items(total - 3, 3)
    assert _get(harness, limit=PAGE_ITEMS + 5) == _items(total - PAGE_ITEMS - 5, PAGE_ITEMS + 5)
    assert _get(harness, limit=0) == []
    assert _get(harness, limit=10 * total) == _items(0, total)
    for n in range(total - 1, 2 * PAGE_ITEMS - 2, -1):  # pops that empty the last page
        popped = harness.ok(action="session_pop", session="chat")
        assert popped["item"] == _items(n, 1)[0] and popped["total"] == n and popped["op"]
    assert _get(harness) == _items(0, 2 * PAGE_ITEMS - 1)
    index = harness.env.image.lookup(session_name("human", "chat"))
    assert index == {"count": 2 * PAGE_ITEMS - 1, "pages": 2, "page_items": PAGE_ITEMS}
    assert harness.env.image.lookup(session_name("human", "chat") + ":2") is None
    _add(harness, _items(900, 5))  # fills the second page, then opens a third
    assert _get(harness, limit=6) == [*_items(2 * PAGE_ITEMS - 2, 1), *_items(900, 5)]
    cleared = harness.ok(action="session_clear", session="chat")
    assert cleared["cleared"] == 2 * PAGE_ITEMS + 4 and cleared["op"]
    assert _get(harness) == []
    assert not [name for name in harness.env.image.system if name.startswith("kernos:session:")]
    nothing = harness.ok(action="session_pop", session="chat")
    assert (nothing["item"], nothing["op"]) == (None, None)
    assert harness.ok(action="session_clear", session="chat")["op"] is None


def test_reads_run_no_op_and_changes_are_ops_of_the_sessions_principal(
        harness: Harness) -> None:
    harness.ok(action="add_agent", agent="alice")
    before = harness.env.image.audit.last_op
    _get(harness, principal="alice")
    harness.ok(action="session_list", principal="alice")
    assert harness.env.image.audit.last_op == before
    added = _add(harness, _items(0, 2), principal="alice", session="a/b: c")
    record = _record(harness, added["op"])
    assert '"action": "session_add"' in record["code"]["text"]
    assert (record["op"], record["principal"], record["status"]) == (added["op"], "alice",
                                                                     "committed")
    assert _get(harness, principal="alice", session="a/b: c") == _items(0, 2)
    assert _get(harness, session="a/b: c") == []  # the human's session of that id: another
    _add(harness, _items(5, 1), principal="alice", session="z")
    listed = harness.ok(action="session_list", principal="alice")["sessions"]
    assert listed == [{"session": "a/b: c", "items": 2}, {"session": "z", "items": 1}]
    assert harness.ok(action="session_list")["sessions"] == []


def test_a_turn_is_added_whole_or_not_at_all(harness: Harness,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _add(harness, _items(0, PAGE_ITEMS - 1))
    head = harness.env.image.head

    def fail(self: SessionRequests, *names: str) -> None:
        raise RuntimeError("the disk vanished halfway")  # after the pages were bound

    monkeypatch.setattr(SessionRequests, "_touch", fail)
    reply = harness.send(action="session_add", session="chat", items=_items(500, 3))
    assert reply["status"] == "error" and reply["error"]["kind"] == "internal"
    monkeypatch.undo()
    assert _get(harness) == _items(0, PAGE_ITEMS - 1)
    assert harness.env.image.head == head
    assert harness.env.image.lookup(session_name("human", "chat") + ":1") is None
    last = harness.env.image.audit.records(type="op")[-1]
    assert last["status"] == "failed" and last["changes"] is None


def test_sessions_survive_a_restart(harness: Harness) -> None:
    _add(harness, _items(0, PAGE_ITEMS + 3), principal="human", session="kept")
    harness.ok(action="session_pop", session="kept")
    harness.reopen()
    assert _get(harness, session="kept") == _items(0, PAGE_ITEMS + 2)
    _add(harness, _items(700, 1), session="kept")
    assert _get(harness, session="kept", limit=2) == [*_items(PAGE_ITEMS + 1, 1),
                                                      *_items(700, 1)]


def test_an_append_stores_the_last_page_only_however_long_the_session(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append to a 5,096-item session pickles what one to a 1,000-item session does (the
    two lengths sit at the same place in a page): the index and the last page only."""
    assert 4096 % PAGE_ITEMS == 0
    serializer = harness.env.image.serializer
    dump = serializer.dump
    pickled: dict[str, int] = {}

    def recording(roots: Any, **options: Any) -> Any:
        done = dump(roots, **options)
        for name, _ in roots:
            pickled[name] = pickled.get(name, 0) + len(done.stream)
        return done

    cost = {}
    for length in (1000, 1000 + 4096):
        session = f"s{length}"
        for start in range(0, length, 512):
            _add(harness, _items(start, min(512, length - start)), session=session)
        index_name = session_name("human", session)
        pickled.clear()
        monkeypatch.setattr(serializer, "dump", recording)
        added = _add(harness, _items(10**6, 2), session=session)
        monkeypatch.undo()
        last_page = f"{index_name}:{(length + 2) // PAGE_ITEMS}"
        assert set(pickled) == {index_name, last_page}  # not the full pages before it
        changes = _record(harness, added["op"])["changes"]
        assert sorted(changes["added"] + changes["changed"]) == sorted([index_name, last_page])
        cost[length] = sum(pickled.values())
    assert cost[5096] <= cost[1000] * 1.05, cost


def test_an_idempotency_key_adds_a_turn_once(harness: Harness) -> None:
    first = _add(harness, _items(0, 2), key="turn-1")
    again = _add(harness, _items(0, 2), key="turn-1")
    assert again["duplicate"] is True and again["op"] == first["op"]
    assert _get(harness) == _items(0, 2)


def test_bad_requests_are_refused_before_anything_runs(harness: Harness) -> None:
    before = harness.env.image.head
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"items": [{"a": 1}, "text"]}, "malformed", "item 1 is a str"),
        ({"items": [{"a": 1}], "session": ""}, "malformed", "'session' must be 1 to 200"),
        ({"items": [{"a": 1}], "session": "x" * 201}, "malformed", "must be 1 to 200"),
        ({"items": {"a": 1}}, "malformed", "'items' must be list"),
        ({"items": [{"a": 1}], "principal": "nobody"}, "unknown_principal", "'nobody'"),
        ({"items": [{"a": 1}], "key": "k" * 201}, "malformed", "'key' must be 1 to 200"),
    ]
    for fields, kind, said in cases:
        content: dict[str, Any] = {"action": "session_add", "session": "chat", **fields}
        error = harness.error(**content)
        assert error["kind"] == kind and said in error["message"], (fields, error)
    assert harness.error(action="session_items", session="chat", limit=-1)["kind"] == \
        "malformed"
    assert harness.env.image.head == before
    assert _get(harness) == []
    assert _add(harness, [])["op"] is None  # nothing to add: no op


def test_a_corrupt_index_is_reported_not_guessed(harness: Harness) -> None:
    _add(harness, _items(0, 1))
    harness.env.image.system[session_name("human", "chat")] = ["not an index"]
    error = harness.error(action="session_items", session="chat")
    assert error["kind"] == "internal" and "not one Kernos wrote" in error["message"]
    assert session_requests.SESSION_PREFIX == "kernos:session:"


def test_the_recorded_source_is_the_request_with_each_items_keys_in_order(
        harness: Harness) -> None:
    items = [{"type": "message", "role": "user", "content": "hi"}, {"z": 1, "a": 2}]
    added = _add(harness, items, principal="human", session="c")
    source = json.loads(_record(harness, added["op"])["code"]["text"])
    assert source == {"action": "session_add", "items": items, "principal": "human",
                      "session": "c"}
    assert [list(item) for item in source["items"]] == [list(item) for item in items]


def test_a_replay_rebuilds_the_sessions_hash_for_hash(harness: Harness) -> None:
    from kernos.replay import replay

    harness.ok(action="add_agent", agent="alice")
    _add(harness, [{"role": "user", "content": "hi"}], principal="alice")
    _add(harness, [{"role": "assistant", "content": "yo"}, {"b": 1, "a": 0}], principal="alice")
    harness.ok(action="session_pop", session="chat", principal="alice")
    harness.ok(action="session_clear", session="chat", principal="alice")
    harness.env.close()
    report = replay(harness.env.path, keep_going=True)
    assert [step.digest == step.original for step in report.steps] == [True] * 5
