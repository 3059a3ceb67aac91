"""The harness service in-process: ops as principals, preconditions, keys, rejections, reads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness_support import Harness
from kernos.harness.values import safe_repr, value_of


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    opened = Harness(tmp_path / "ws")
    yield opened
    opened.env.close()


def test_a_human_op_commits_with_its_value_output_and_versions(harness: Harness) -> None:
    result = harness.op("budget = 500\nprint('set')\nbudget * 2")
    assert result["status"] == "committed"
    assert result["value"] == {"repr": "1000", "json": 1000}
    assert result["output"] == "set\n"
    assert result["added"] == ["budget"]
    assert result["versions"] == {"budget": 1}
    assert harness.env.ns["budget"] == 500
    result = harness.op("budget -= 100")
    assert result["versions"] == {"budget": 2} and result["value"] is None


def test_a_failing_op_rolls_back_and_says_why(harness: Harness) -> None:
    harness.op("items = [1]")
    result = harness.op("items.append(2)\nraise ValueError('bad tick')")
    assert result["status"] == "failed"
    assert result["error"]["message"] == "ValueError: bad tick"
    assert result["commit"] is None
    assert harness.env.ns["items"] == [1]
    assert harness.records()[-1]["status"] == "failed"


def test_what_agent_code_printed_before_it_failed_is_in_the_answer(harness: Harness) -> None:
    harness.ok(action="add_agent", agent="alice")
    failed = harness.op("print('step 1 done')\nkept = 1\nraise ValueError('step 2')",
                        principal="alice")
    assert failed["status"] == "failed" and "ValueError" in failed["error"]["message"]
    assert failed["output"] == "step 1 done\n"
    committed = harness.op("print('again')\n3", principal="alice")
    assert committed["output"] == "again\n" and committed["value"]["json"] == 3


def test_a_stale_version_is_a_conflict_and_nothing_runs(harness: Harness) -> None:
    harness.op("budget = 500\nspent = []")
    seen = harness.ok(action="versions", names=["budget"])["versions"]
    assert seen == {"budget": 1}
    first = harness.op("budget -= 400\nspent.append('a')", expect={"versions": seen})
    second = harness.op("budget -= 400\nspent.append('b')", expect={"versions": seen})
    assert first["status"] == "committed"
    assert second["status"] == "conflict"
    assert second["versions"] == {"budget": 2}
    assert second["error"]["data"]["versions"] == {"budget": 2}
    assert "budget is at version 2, not 1" in second["error"]["message"]
    assert harness.env.ns["budget"] == 100 and harness.env.ns["spent"] == ["a"]
    assert harness.records()[-1]["status"] == "conflict"
    retried = harness.op("budget -= 50", expect={"versions": second["versions"]})
    assert retried["status"] == "committed" and harness.env.ns["budget"] == 50


def test_version_zero_means_the_name_must_not_exist(harness: Harness) -> None:
    assert harness.op("lock = 'a'", expect={"versions": {"lock": 0}})["status"] == "committed"
    assert harness.op("lock = 'b'", expect={"versions": {"lock": 0}})["status"] == "conflict"
    assert harness.env.ns["lock"] == "a"


def test_a_predicate_is_checked_inside_the_op(harness: Harness) -> None:
    harness.op("budget = 500")
    refused = harness.op("budget -= 600", expect={"predicate": "budget >= 600"})
    assert refused["status"] == "conflict" and harness.env.ns["budget"] == 500
    assert harness.op("budget -= 400", expect={"predicate": "budget >= 400"})["status"] == \
        "committed"
    assert harness.env.ns["budget"] == 100
    error = harness.error(action="op", principal="human", code="x = 1",
                          expect={"predicate": "budget >="})
    assert error["kind"] == "precondition"
    assert "x" not in harness.env.ns


def test_a_precondition_on_a_missing_name_is_refused_and_recorded(harness: Harness) -> None:
    error = harness.error(action="op", principal="human", code="x = 1",
                          expect={"versions": {"nope": 3}})
    assert error["kind"] == "precondition" and error["data"]["missing"] == ["nope"]
    assert "x" not in harness.env.ns
    assert harness.records()[-1]["status"] == "rejected"


def test_an_idempotency_key_runs_the_op_once_even_after_a_restart(harness: Harness) -> None:
    harness.op("count = 0")
    first = harness.op("count += 1", key="deliver-1")
    again = harness.op("count += 1", key="deliver-1")
    assert first["status"] == "committed" and not first["duplicate"]
    assert again["duplicate"] and again["op"] == first["op"] and again["commit"] == first["commit"]
    assert harness.env.ns["count"] == 1
    harness.reopen()
    assert harness.op("count += 1", key="deliver-1")["duplicate"]
    assert harness.env.ns["count"] == 1


def test_the_key_of_a_rolled_back_op_can_be_used_again(harness: Harness) -> None:
    harness.op("count = 0")
    assert harness.op("count += 1\n1 / 0", key="k")["status"] == "failed"
    result = harness.op("count += 1", key="k")
    assert result["status"] == "committed" and not result["duplicate"]
    assert harness.env.ns["count"] == 1


def test_agents_run_restricted_and_a_denial_rolls_back(harness: Harness) -> None:
    harness.op("account = {'budget': 500}")
    harness.ok(action="add_agent", agent="alice")
    harness.ok(action="grant", agent="alice", capability="read:account")
    result = harness.op("left = read('account')['budget']\nleft - 100", principal="alice")
    assert result["status"] == "committed", result
    assert result["value"]["json"] == 400
    assert harness.env.ns_of("alice")["left"] == 500
    denied = harness.op("left = 0\nwrite('account', {'budget': 0})", principal="alice")
    assert denied["status"] == "denied"
    assert denied["error"]["data"].get("type") in ("CapabilityDenied", "OpVetoed")
    assert harness.env.ns_of("alice")["left"] == 500
    assert harness.env.ns["account"] == {"budget": 500}
    rejected = harness.op("import os", principal="alice")
    assert rejected["status"] == "failed" and "imports" in rejected["error"]["message"]


def test_a_tool_call_checks_the_callers_grants(harness: Harness) -> None:
    env = harness.env
    with env.op("register"):
        env.agents.register_tool(
            "double", lambda n: n * 2, schema={"type": "object", "properties": {
                "n": {"type": "integer"}}, "required": ["n"]}, description="twice n")
        env.agents.add("bob")
    refused = harness.ok(action="op", principal="bob", tool="double", arguments={"n": 2})
    assert refused["status"] == "denied"
    harness.ok(action="grant", agent="bob", capability="call:double")
    called = harness.ok(action="op", principal="bob", tool="double", arguments={"n": 21})
    assert called["status"] == "committed" and called["value"]["json"] == 42
    bad = harness.ok(action="op", principal="bob", tool="double", arguments={"n": "x"})
    assert bad["status"] == "failed"
    assert [tool["name"] for tool in harness.ok(action="tools", principal="bob")["tools"]] == \
        ["double"]


def test_an_agent_sees_only_the_objects_it_may_read(harness: Harness) -> None:
    harness.op("public = [1, 2]\nsecret = 'k'")
    harness.ok(action="add_agent", agent="alice")
    harness.ok(action="grant", agent="alice", capability="read:public")
    names = [o["name"] for o in harness.ok(action="objects", principal="alice")["objects"]]
    assert names == ["kernos:ns:alice", "public"]
    shown = harness.ok(action="object", name="public", principal="alice")
    assert shown["preview"] == {"repr": "[1, 2]", "json": [1, 2]} and shown["version"] == 1
    assert harness.error(action="object", name="secret", principal="alice")["kind"] == \
        "unknown_name"
    assert harness.error(action="versions", names=["secret"], principal="alice")["kind"] == \
        "denied"
    every = harness.ok(action="objects")
    assert {"public", "secret", "kernos:agents"} <= {o["name"] for o in every["objects"]}


@pytest.mark.parametrize(("content", "kind", "says"), [
    ({"action": "op", "principal": "mallory", "code": "1"}, "unknown_principal", "mallory"),
    ({"action": "op", "principal": "human"}, "malformed", "exactly one of"),
    ({"action": "op", "principal": "human", "code": "1", "tool": "t"}, "malformed",
     "exactly one of"),
    ({"action": "op", "principal": "human", "code": 5}, "malformed", "'code' must be str"),
    ({"action": "op", "principal": "human", "code": "1", "sudo": True}, "malformed", "sudo"),
    ({"action": "objects", "limit": True}, "malformed", "'limit' must be int"),
    ({"action": "rm -rf"}, "malformed", "unknown action"),
    ({"action": "op", "principal": "human", "code": "1", "key": ""}, "malformed", "'key'"),
    ({"action": "op", "principal": "human", "code": "1", "expect": {"versions": {"a": "1"}}},
     "malformed", "int >= 0"),
    ({"action": "grant", "agent": "ghost", "capability": "read:x"}, "unknown_principal",
     "ghost"),
])
def test_bad_requests_are_refused_clearly_and_recorded(harness: Harness, content: dict[str, Any],
                                                       kind: str, says: str) -> None:
    harness.op("x = 1")
    before = len(harness.records())
    error = harness.error(**content)
    assert error["kind"] == kind and says in error["message"], error
    assert harness.env.ns["x"] == 1
    if content["action"] in ("op", "grant"):
        assert harness.records()[-1]["status"] == "rejected"
        assert len(harness.records()) == before + 1


def test_not_a_request_and_another_version_and_oversized(harness: Harness) -> None:
    for content in ([1, 2], "op", None):
        reply = harness.service.handle(content).reply
        assert reply["status"] == "error" and reply["error"]["kind"] == "malformed"
    old = harness.service.handle({"v": 0, "action": "hello"}).reply
    assert old["error"]["kind"] == "protocol" and old["error"]["data"]["supported"] == [1]
    assert "version 1" in old["error"]["message"]
    big = {"v": 1, "action": "op", "principal": "human", "code": "x = '" + "a" * 20_000 + "'"}
    reply = harness.service.handle(big, size=len(json.dumps(big))).reply
    assert reply["error"]["kind"] == "oversized" and "x" not in harness.env.ns
    statuses = [record["status"] for record in harness.records()]
    assert statuses == ["rejected"] * 5


def test_history_reads_and_checkout(harness: Harness) -> None:
    harness.op("a = 1")
    harness.op("b = 2")
    log = harness.ok(action="log")["snapshots"]
    assert [entry["op"] for entry in log] == [2, 1]
    diff = harness.ok(action="diff", a="@1")
    assert [entry["name"] for entry in diff["added"]] == ["b"]
    shown = harness.ok(action="show", ref="@1")
    assert shown["code"] == "a = 1" and "a" in shown["names"]
    result = harness.ok(action="checkout", ref="@1")
    assert result["status"] == "committed" and result["checkout"]["names"] == 1
    assert "b" not in harness.env.ns
    assert harness.error(action="checkout", ref="@99")["kind"] == "unknown_ref"
    assert harness.error(action="show", ref="nope")["kind"] == "unknown_ref"


def test_values_are_json_only_when_plain_data() -> None:
    class Sneaky(dict):  # type: ignore[type-arg]
        pass

    assert value_of({"a": [1, 2.5, None, True]}).has_json
    assert not value_of(Sneaky(a=1)).has_json
    assert not value_of(float("nan")).has_json
    assert not value_of({1: "int key"}).has_json
    assert not value_of(list(range(20_000))).has_json
    assert not value_of("x" * 10_000).has_json
    assert len(value_of("x" * 10_000).repr) <= 2_000

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert "Broken" in safe_repr(Broken())  # a repr that raises does not break the reply
    assert "Broken" in value_of([Broken()]).repr


@pytest.mark.parametrize("code", ['print("hi")', 'x = 1\nprint("hi")',
                                  'print("a")\nprint("hi")'])
def test_agent_code_that_ends_by_printing_commits(harness: Harness, code: str) -> None:
    harness.ok(action="add_agent", agent="alice")
    result = harness.op(code, principal="alice")
    assert result["status"] == "committed", result
    assert result["output"].endswith("hi\n") and result["value"] is None


def test_a_refusal_that_cannot_be_recorded_is_still_answered(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed request on a full disk: its audit record cannot be written, and the
    client still gets its error reply (nothing escapes the service)."""
    import errno

    from kernos.errors import DiskFull

    def full(*args: Any, **kwargs: Any) -> Any:
        raise DiskFull(path="tail", what="the commit tail", mount="/", free=0, needed=10,
                       code=errno.ENOSPC, reason="No space left on device", then="nothing")

    monkeypatch.setattr(harness.env.image, "begin", full)
    reply = harness.send(v=1, action="op", principal="nobody-known", code="x = 1")
    assert reply["status"] == "error" and reply["error"]["kind"] == "unknown_principal"
    reply = harness.send(v=1, action="no-such-action")
    assert reply["status"] == "error"


def test_a_bug_in_a_handler_is_answered_and_its_op_rolled_back(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception that is not a Kernos error, raised inside a request's op (here in
    the memory service under ``remember``), still gets an ``internal`` reply: a client
    never waits for an answer that cannot come, and the op it began is rolled back."""
    harness.op("x = 1")
    head = harness.env.image.workspace.head()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug below the harness")

    monkeypatch.setattr(harness.service.runtime.memory, "remember", broken)
    error = harness.error(action="remember", fact="the sky is blue")
    assert error["kind"] == "internal" and "RuntimeError" in error["message"], error
    assert "a bug below the harness" in error["message"]
    assert harness.env.image.current is None, "the request's op was left open"
    assert harness.env.image.workspace.head() == head
    assert harness.op("y = 2")["status"] == "committed"  # and the service goes on


def test_an_agents_log_shows_only_what_its_grants_let_it_read(harness: Harness) -> None:
    harness.ok(action="add_agent", agent="alice")
    harness.ok(action="grant", agent="alice", capability="read:public")
    harness.op("public = [1]\nsecret = 'the launch code'")
    harness.op("secret = 'another code'")
    harness.op("mine = len(read('public'))", principal="alice")
    human = harness.ok(action="log")["snapshots"]
    seen = harness.ok(action="log", principal="alice")["snapshots"]
    assert len(seen) < len(human)  # the op that changed only `secret` is not shown
    names = {name for entry in seen for listed in entry["changes"].values() for name in listed}
    assert "secret" not in names and {"public", "kernos:ns:alice"} <= names
    assert "launch code" not in json.dumps(seen)
    assert [entry["message"] for entry in seen if entry["principal"] == "alice"] == [
        "mine = len(read('public'))"]
    assert all(entry["message"] is None and entry["bytes"] is None
               for entry in seen if entry["principal"] != "alice")
    assert len(harness.ok(action="log", principal="alice", limit=1)["snapshots"]) == 1
    assert harness.error(action="log", principal="mallory")["kind"] == "unknown_principal"


def test_human_code_is_not_compiled_with_the_services_own_future_flags(
        harness: Harness) -> None:
    # service.py has `from __future__ import annotations`; compile() inherits it unless told.
    assert harness.op("def typed(x: int) -> int:\n    return x")["status"] == "committed"
    typed = harness.env.ns["typed"]
    assert typed.__annotations__ == {"x": int, "return": int}
    assert not typed.__code__.co_flags & 0x1000000  # CO_FUTURE_ANNOTATIONS
