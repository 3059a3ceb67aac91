"""The harness file requests in-process: files_read/exists/list/write/append/delete.

Each request is one op of its principal through ``kernos.agents.files.FileAccess``:
grants decide, a refusal rolls the op back with nothing on disk and an audit record,
every field is checked before anything runs, bytes travel as base64.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness_support import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    opened = Harness(tmp_path / "ws")
    opened.service.max_request_bytes = 1_000_000
    yield opened
    opened.env.close()


def _root(harness: Harness) -> Path:
    return harness.env.image.files.root()


def _head(harness: Harness) -> str | None:
    head = harness.env.image.workspace.head()
    return None if head is None else head.hex()


def _agent(harness: Harness, name: str, *capabilities: str) -> None:
    harness.ok(action="add_agent", agent=name)
    for capability in capabilities:
        harness.ok(action="grant", agent=name, capability=capability)


def test_the_human_writes_reads_lists_and_deletes_each_as_one_op(harness: Harness) -> None:
    written = harness.ok(action="files_write", path="reports/r.md", data="# Report\n")
    assert written["path"] == "reports/r.md" and written["bytes"] == 9
    assert written["files"] == {"added": ["reports/r.md"], "changed": [], "deleted": []}
    assert written["commit"] == _head(harness)
    assert (_root(harness) / "reports" / "r.md").read_text() == "# Report\n"
    appended = harness.ok(action="files_append", path="reports/r.md", data="more\n")
    assert appended["files"]["changed"] == ["reports/r.md"] and appended["op"] > written["op"]
    read = harness.ok(action="files_read", path="reports/r.md")
    assert (read["data"], read["encoding"], read["bytes"]) == ("# Report\nmore\n", "utf-8", 14)
    assert harness.ok(action="files_exists", path="reports/r.md")["exists"] is True
    assert harness.ok(action="files_exists", path="reports/none.md")["exists"] is False
    harness.ok(action="files_write", path="notes.txt", data="n")
    assert harness.ok(action="files_list")["paths"] == ["notes.txt", "reports/r.md"]
    listed = harness.ok(action="files_list", prefix="reports/")
    assert (listed["paths"], listed["total"]) == (["reports/r.md"], 1)
    listed = harness.ok(action="files_list", limit=1)
    assert (listed["paths"], listed["total"]) == (["notes.txt"], 2)
    deleted = harness.ok(action="files_delete", path="reports/r.md")
    assert deleted["deleted"] is True and deleted["files"]["deleted"] == ["reports/r.md"]
    assert not (_root(harness) / "reports" / "r.md").exists()
    records = harness.records()
    assert [record["principal"] for record in records[-3:]] == ["human"] * 3


def test_reads_are_audited_ops_that_write_no_snapshot(harness: Harness) -> None:
    _agent(harness, "alice", "file:read:reports/*")
    harness.ok(action="files_write", path="reports/r.md", data="hello")
    head = _head(harness)
    read = harness.ok(action="files_read", path="reports/r.md", principal="alice")
    assert read["data"] == "hello" and read["commit"] == head == _head(harness)
    record = harness.records()[-1]
    assert (record["op"], record["principal"], record["status"]) == (read["op"], "alice",
                                                                      "committed")
    assert record.get("unchanged") is True
    assert "file:read:reports/*" in [used["capability"] for used in record["grants"]["used"]]
    assert [(entry["action"], entry["path"], entry["outcome"], entry["bytes"])
            for entry in record["file_access"]] == [("read", "reports/r.md", "ok", 5)]
    # The audit keeps what was written as a size and a hash, never the bytes.
    harness.ok(action="files_write", path="reports/s.md", data="confidential words")
    assert "confidential" not in str(harness.records()[-1])


def test_an_agent_with_a_write_grant_writes_its_report(harness: Harness) -> None:
    _agent(harness, "alice", "file:write:reports/*", "file:read:reports/*")
    written = harness.ok(action="files_write", path="reports/r.md", data="by alice",
                         principal="alice")
    assert written["files"]["added"] == ["reports/r.md"]
    assert harness.records()[-1]["principal"] == "alice"
    assert harness.ok(action="files_read", path="reports/r.md",
                      principal="alice")["data"] == "by alice"
    assert (_root(harness) / "reports" / "r.md").read_text() == "by alice"


def test_an_agent_without_the_grant_is_denied_and_nothing_is_written(
        harness: Harness) -> None:
    _agent(harness, "bob", "file:read:reports/*")
    head, ops = _head(harness), len(harness.records())
    error = harness.error(action="files_write", path="reports/r.md", data="by bob",
                          principal="bob")
    assert error["kind"] == "denied" and "file:write" in error["message"], error
    assert not (_root(harness) / "reports").exists()
    assert _head(harness) == head
    record = harness.records()[-1]
    assert len(harness.records()) == ops + 1
    assert (record["principal"], record["status"]) == ("bob", "denied")
    assert record["grants"]["denied"], record
    assert record["error"]["kind"] == "CapabilityDenied", record
    assert [(entry["action"], entry["outcome"]) for entry in record["file_access"]] == [
        ("write", "denied")]
    # Reads are checked too: bob may not read what lies outside his grant.
    harness.ok(action="files_write", path="secret.txt", data="s")
    for action in ("files_read", "files_exists"):
        error = harness.error(action=action, path="secret.txt", principal="bob")
        assert error["kind"] == "denied", error
    assert harness.records()[-1]["status"] == "denied"
    assert harness.error(action="files_delete", path="secret.txt",
                         principal="bob")["kind"] == "denied"
    assert (_root(harness) / "secret.txt").read_text() == "s"


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a\0b", "reports/../../x"])
def test_a_bad_path_is_refused_and_changes_nothing(harness: Harness, bad: str) -> None:
    _agent(harness, "alice", "file:write:*", "file:read:*")
    head = _head(harness)
    for principal in ("human", "alice"):
        error = harness.error(action="files_write", path=bad, data="x", principal=principal)
        assert error["kind"] in ("invalid", "denied"), error
        assert "refused" in error["message"] and ("'..'" in error["message"]
                                                  or "absolute" in error["message"]
                                                  or "NUL" in error["message"]), error
        assert _head(harness) == head
    assert not (harness.env.path.parent / "x").exists()
    assert not (harness.env.path / "x").exists()


def test_bytes_travel_as_base64_both_ways(harness: Harness) -> None:
    blob = bytes(range(256)) * 3
    encoded = base64.b64encode(blob).decode()
    assert harness.ok(action="files_write", path="data/b.bin", data=encoded,
                      encoding="base64")["bytes"] == len(blob)
    assert (_root(harness) / "data" / "b.bin").read_bytes() == blob
    read = harness.ok(action="files_read", path="data/b.bin", encoding="base64")
    assert base64.b64decode(read["data"]) == blob and read["encoding"] == "base64"
    error = harness.error(action="files_read", path="data/b.bin")
    assert error["kind"] == "invalid" and "base64" in error["message"], error
    harness.ok(action="files_append", path="data/b.bin", data=base64.b64encode(b"\xff").decode(),
               encoding="base64")
    assert (_root(harness) / "data" / "b.bin").read_bytes() == blob + b"\xff"


@pytest.mark.parametrize(("fields", "named"), [
    ({"action": "files_write", "path": "a", "data": "not base64!", "encoding": "base64"},
     "base64"),
    ({"action": "files_write", "path": "a", "data": "QQ", "encoding": "base64"}, "base64"),
    ({"action": "files_write", "path": "a", "data": "QUJD%%%", "encoding": "base64"},
     "base64"),
    ({"action": "files_write", "path": "a", "data": "QUJD", "encoding": "latin-1"},
     "'encoding' is one of utf-8, base64"),
    ({"action": "files_write", "path": "a", "data": b"x".hex(), "mode": "w"}, "unknown"),
    ({"action": "files_write", "path": "a", "data": 7}, "'data'"),
    ({"action": "files_write", "path": "a"}, "'data'"),
    ({"action": "files_write", "path": "", "data": "x"}, "empty"),
    ({"action": "files_write", "path": "a" * 5000, "data": "x"}, "1024"),
    ({"action": "files_read", "path": ["a"]}, "'path'"),
    ({"action": "files_append", "path": "a", "data": "x", "key": ""}, "'key'"),
    ({"action": "files_write", "path": "a", "data": "\ud800"}, "surrogate"),
])
def test_bad_fields_are_refused_before_anything_runs(harness: Harness, fields: dict[str, Any],
                                                     named: str) -> None:
    head = _head(harness)
    error = harness.error(**fields)
    assert error["kind"] == "malformed" and named in error["message"], error
    assert not (_root(harness) / "a").exists() and _head(harness) == head
    assert harness.records()[-1]["status"] == "rejected"


def test_a_missing_file_is_unknown_file(harness: Harness) -> None:
    for action in ("files_read", "files_delete"):
        error = harness.error(action=action, path="nowhere.txt")
        assert error["kind"] == "unknown_file" and "nowhere.txt" in error["message"], error


def test_a_key_makes_an_append_idempotent(harness: Harness) -> None:
    first = harness.ok(action="files_append", path="log.txt", data="line\n", key="k1")
    again = harness.ok(action="files_append", path="log.txt", data="line\n", key="k1")
    assert again["duplicate"] is True and again["op"] == first["op"]
    assert (_root(harness) / "log.txt").read_text() == "line\n"
    harness.ok(action="files_append", path="log.txt", data="line\n", key="k2")
    assert (_root(harness) / "log.txt").read_text() == "line\nline\n"


def test_an_agent_whose_circuit_is_open_is_refused(harness: Harness) -> None:
    _agent(harness, "carol", "file:write:*", "file:read:*")
    harness.ok(action="policy", agent="carol", set={"failures": 1})
    assert harness.op("raise ValueError('boom')", principal="carol")["status"] == "failed"
    error = harness.error(action="files_write", path="c.txt", data="x", principal="carol")
    assert error["kind"] == "denied" and error["data"]["type"] == "CircuitOpen", error
    assert not (_root(harness) / "c.txt").exists()


def test_an_unknown_principal_is_refused_and_recorded(harness: Harness) -> None:
    error = harness.error(action="files_read", path="x", principal="mallory")
    assert error["kind"] == "unknown_principal"
    record = harness.records()[-1]
    assert record["status"] == "rejected" and "mallory" in record["code"]["text"]


def test_a_file_limit_of_the_op_refuses_the_write(harness: Harness) -> None:
    harness.ok(action="add_agent", agent="dave", limits={"file_write_bytes": 10})
    harness.ok(action="grant", agent="dave", capability="file:write:*")
    assert harness.ok(action="files_write", path="small.txt", data="0123456789",
                      principal="dave")["bytes"] == 10
    error = harness.error(action="files_write", path="big.txt", data="x" * 11, principal="dave")
    assert error["kind"] == "oversized" and "file_write_bytes" in error["message"], error
    assert error["data"]["limit"] == "file_write_bytes"
    assert not (_root(harness) / "big.txt").exists()
    assert harness.records()[-1]["status"] == "denied"


def test_a_read_longer_than_one_reply_carries_is_refused(harness: Harness,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.harness import file_requests

    harness.ok(action="files_write", path="long.txt", data="12345")
    monkeypatch.setattr(file_requests, "MAX_READ_BYTES", 4)
    # The human has no read limit: the size is looked at before anything is read.
    monkeypatch.setattr(file_requests.FileAccess, "read", lambda *args, **kwargs: pytest.fail(
        "a file too long to answer was read"))
    error = harness.error(action="files_read", path="long.txt")
    assert error["kind"] == "oversized" and error["data"] == {"bytes": 5, "limit": 4}, error
    assert harness.records()[-1]["status"] == "rejected"


def test_a_bug_below_still_gets_an_answer_and_rolls_back(harness: Harness,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.harness import file_requests

    def broken(self: object, path: object, data: object) -> int:
        (_root(harness) / "half.txt").write_text("half")
        raise AttributeError("'FileAccess' object has no attribute 'oops'")

    monkeypatch.setattr(file_requests.FileAccess, "write", broken)
    head = _head(harness)
    error = harness.error(action="files_write", path="half.txt", data="x")
    assert error["kind"] == "internal" and "AttributeError" in error["message"], error
    assert not (_root(harness) / "half.txt").exists() and _head(harness) == head
    assert harness.records()[-1]["status"] == "failed"
