"""External effects through the outbox, in process (kernos.effects).

A ``pay`` tool appends to a ledger file the test owns: one line per time the
world was really touched.  Crashes are played by leaving the journal as a
crash would (the integration tests kill real kernels at each point).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from tests.harness_support import Harness

from kernos.effects import OUTBOX
from kernos.errors import UsageError

PAY = '''
import json, os
LEDGER = {ledger!r}
def pay(amount, to, idempotency_key):
    if os.path.exists(LEDGER + ".fail"):
        left = int(open(LEDGER + ".fail").read())
        if left > 0:
            open(LEDGER + ".fail", "w").write(str(left - 1))
            raise ConnectionError("the bank is not answering")
    with open(LEDGER, "a") as f:
        f.write(json.dumps({{"key": idempotency_key, "amount": amount, "to": to}}) + "\\n")
    return {{"receipt": "r-" + idempotency_key[-6:], "amount": amount}}
def find_payment(idempotency_key):
    if os.path.exists(LEDGER):
        for line in open(LEDGER):
            row = json.loads(line)
            if row["key"] == idempotency_key:
                return True, {{"receipt": "r-" + idempotency_key[-6:], "amount": row["amount"]}}
    return False, None
SCHEMA = {{"type": "object", "properties": {{"amount": {{"type": "integer"}},
          "to": {{"type": "string"}}}}, "required": ["amount", "to"]}}
agents.register_tool("pay", pay, schema=SCHEMA, description="pays", effect="external",
                     resolve={resolve}, backoff=0)
'''


def ledger_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.jsonl"


def setup(tmp_path: Path, ledger: Path, *, resolve: bool = True) -> Harness:
    harness = Harness(tmp_path / "ws")
    harness.env.ns["agents"] = harness.env.agents
    harness.env.image.is_persistent = lambda name: name != "agents"  # type: ignore[method-assign]
    harness.op(PAY.format(ledger=str(ledger), resolve="find_payment" if resolve else "None"))
    return harness


def effects(harness: Harness) -> list[dict[str, Any]]:
    return harness.env.runtime.effects.effects()


def effect_records(harness: Harness, key: str) -> list[dict[str, Any]]:
    audit = harness.env.image.audit
    return [audit.read(entry.index) for entry in audit.entries
            if entry.type == "effect" and entry.key == key]


def test_an_effect_runs_after_its_op_commits_and_its_result_is_recorded(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    seen = harness.op("ticket = agents.call('pay', amount=5, to='bob')\n"
                      "import os\nsaw = os.path.exists(" + repr(str(ledger)) + ")\nticket")
    # Inside the op nothing ran: the op saw no ledger, and got a ticket.
    assert harness.env.ns["saw"] is False
    ticket = harness.env.ns["ticket"]
    assert ticket["status"] == "queued" and ticket["tool"] == "pay"
    key = ticket["effect"]
    assert key.endswith(f"-{seen['op']}-0")
    # After it: executed once, with the key, and recorded in a follow-up op.
    assert ledger_rows(ledger) == [{"key": key, "amount": 5, "to": "bob"}]
    [effect] = effects(harness)
    assert effect["status"] == "done" and effect["attempts"] == 1
    assert effect["result"] == {"receipt": "r-" + key[-6:], "amount": 5}
    assert effect["recorded_op"] == seen["op"] + 1
    assert seen["effects"][0]["key"] == key and seen["effects"][0]["status"] == "done"
    # The audit: the queuing op lists it, the journal has started and done, the
    # follow-up op (same principal, kind effect) lists the outcome.
    audit = harness.env.image.audit
    ops = {record["op"]: record for record in audit.records(type="op")}
    assert ops[seen["op"]]["effects"][0]["status"] == "queued"
    assert [r["state"] for r in effect_records(harness, key)] == ["started", "done"]
    follow = ops[seen["op"] + 1]
    assert follow["kind"] == "effect" and follow["principal"] == "human"
    assert follow["effects"] == [{"key": key, "status": "done", "attempts": 1}]


def test_a_rolled_back_op_executes_nothing(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    reply = harness.send(v=1, action="op", principal="human",
                         code="agents.call('pay', amount=5, to='bob')\n1/0")
    assert reply["result"]["status"] == "failed"
    assert not ledger.exists()
    assert effects(harness) == []
    assert OUTBOX not in harness.env.image.system


def test_draining_again_executes_nothing_again(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    harness.op("agents.call('pay', amount=5, to='bob')")
    runner = harness.env.runtime.effects
    for _ in range(20):
        assert runner.drain() == []
    # Even with the image put back to "queued" (a checkout of the op that queued it):
    harness.op("agents.call('pay', amount=7, to='eve')")
    first = harness.env.image.audit.last_op
    outbox = harness.env.image.system[OUTBOX]
    for effect in outbox.effects.values():  # type: ignore[attr-defined]
        effect.status = "queued"
    runner.drain()
    assert sorted(row["amount"] for row in ledger_rows(ledger)) == [5, 7]
    assert harness.env.image.audit.last_op == first + 2  # one follow-up op per queuing op


def test_a_failing_effect_is_retried_with_backoff_then_done(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    waits: list[float] = []
    harness.env.runtime.effects.sleep = waits.append
    (ledger.parent / (ledger.name + ".fail")).write_text("2")
    harness.op("agents.register_tool('pay', pay, schema=SCHEMA, description='pays', "
               "effect='external', resolve=find_payment, attempts=3, backoff=0.5)")
    harness.op("agents.call('pay', amount=5, to='bob')")
    [effect] = effects(harness)
    assert effect["status"] == "done" and effect["attempts"] == 3
    assert waits == [0.5, 1.0]
    assert len(ledger_rows(ledger)) == 1
    states = [r["state"] for r in effect_records(harness, effect["key"])]
    assert states == ["started", "error", "started", "error", "started", "done"]


def test_an_effect_that_keeps_failing_is_recorded_failed(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    (ledger.parent / (ledger.name + ".fail")).write_text("99")
    reply = harness.op("agents.call('pay', amount=5, to='bob')")
    assert reply["status"] == "committed"  # the op committed; its effect failed afterwards
    [effect] = effects(harness)
    assert effect["status"] == "failed" and effect["attempts"] == 3
    assert "ConnectionError: the bank is not answering" in effect["error"]
    assert reply["effects"][0]["status"] == "failed"
    follow = harness.env.image.audit.records(type="op")[-1]
    assert follow["effects"][0]["status"] == "failed"
    assert "ConnectionError" in follow["effects"][0]["error"]
    assert not ledger.exists()
    assert harness.env.runtime.effects.drain() == []  # failed stays failed


def crash_after_start(harness: Harness, ledger: Path, *, executed: bool) -> str:
    """Leave the journal as a crash inside the implementation would."""
    runner = harness.env.runtime.effects
    real = runner.drain
    runner.drain = lambda: []  # type: ignore[method-assign]
    harness.op("agents.call('pay', amount=5, to='bob')")
    runner.drain = real  # type: ignore[method-assign]
    [effect] = harness.env.image.system[OUTBOX].waiting()  # type: ignore[attr-defined]
    runner._journal(effect, "started", 1)
    if executed:
        with ledger.open("a") as f:
            f.write(json.dumps({"key": effect.key, "amount": 5, "to": "bob"}) + "\n")
    return str(effect.key)


@pytest.mark.parametrize("executed", [True, False])
def test_an_in_doubt_effect_is_resolved_by_its_key(
        tmp_path: Path, ledger: Path, executed: bool) -> None:
    harness = setup(tmp_path, ledger)
    key = crash_after_start(harness, ledger, executed=executed)
    harness.env.runtime.effects.drain()
    assert len(ledger_rows(ledger)) == 1  # executed once, whichever it was
    [effect] = effects(harness)
    assert effect["status"] == "done"
    states = [r["state"] for r in effect_records(harness, key)]
    assert states == (["started", "done"] if executed else
                      ["started", "absent", "started", "done"])


def test_without_a_resolver_an_in_doubt_effect_waits_for_a_person(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger, resolve=False)
    key = crash_after_start(harness, ledger, executed=False)
    harness.env.runtime.effects.drain()
    [effect] = effects(harness)
    assert effect["status"] == "in-doubt" and "resolve" in effect["error"]
    assert not ledger.exists()  # never executed blindly
    assert harness.env.runtime.effects.drain() == []  # nor on the next drain
    reply = harness.send(v=1, action="op", principal="human",
                         code="agents.resolve_effect('nope', executed=True)")
    assert "there is no effect 'nope'" in reply["result"]["error"]["message"]
    harness.op(f"agents.resolve_effect({key!r}, executed=False)")
    assert [row["key"] for row in ledger_rows(ledger)] == [key]
    assert effects(harness)[0]["status"] == "done"


def test_a_person_can_say_an_in_doubt_effect_happened(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger, resolve=False)
    key = crash_after_start(harness, ledger, executed=True)
    harness.env.runtime.effects.drain()
    harness.op(f"agents.resolve_effect({key!r}, executed=True, result={{'receipt': 'paper'}})")
    [effect] = effects(harness)
    assert effect["status"] == "done" and effect["result"] == {"receipt": "paper"}
    assert len(ledger_rows(ledger)) == 1
    assert effect_records(harness, key)[-1]["resolved"].startswith("human in op")


def test_a_recorded_outcome_is_not_reused_for_another_request(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    key = crash_after_start(harness, ledger, executed=True)
    outbox = harness.env.image.system[OUTBOX]
    outbox.effects[key].request = "0" * 64  # type: ignore[attr-defined]
    harness.env.runtime.effects.drain()
    [effect] = effects(harness)
    assert effect["status"] == "failed" and "different request" in effect["error"]


def test_effects_run_only_between_ops(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    op = harness.env.image.begin(source="x = 1")
    try:
        with pytest.raises(UsageError, match="not inside one"):
            harness.env.runtime.effects.drain()
    finally:
        op.abort()


def test_an_external_tool_must_take_the_key(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    reply = harness.send(v=1, action="op", principal="human", code=(
        "agents.register_tool('mail', lambda to: None, schema={'type': 'object', "
        "'properties': {'to': {'type': 'string'}}}, description='mails', effect='external')"))
    assert "must accept the keyword argument idempotency_key" in reply["result"]["error"][
        "message"]


def test_an_agent_queues_effects_under_its_grant(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    harness.op("agents.add('alice')\nagents.grant('alice', 'call:pay')")
    result = harness.ok(action="op", principal="alice", code=(
        "t1 = call('pay', amount=1, to='bob')\nt2 = call('pay', amount=2, to='eve')\n"
        "[t1['status'], t2['effect']]"))
    assert result["status"] == "committed"
    assert result["value"]["json"][0] == "queued"
    rows = ledger_rows(ledger)
    assert [row["amount"] for row in rows] == [1, 2]
    assert rows[1]["key"] == result["value"]["json"][1]
    assert {e["principal"] for e in effects(harness)} == {"alice"}
    follow = harness.env.image.audit.records(type="op")[-1]
    assert follow["principal"] == "alice" and len(follow["effects"]) == 2


def test_an_effect_of_a_grouped_commit_waits_for_its_sync(
        tmp_path: Path, ledger: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a group commit (``Workspace.group_commit``) the op that queued an effect is not
    durable yet when the op ends: the drain syncs it before the world is touched."""
    import os

    from kernos.store import tail as tail_module

    harness = setup(tmp_path, ledger)
    workspace = harness.env.image.workspace
    seen: list[bool] = []
    real = os.fdatasync

    def watched(fd: int) -> None:
        seen.append(ledger.exists())
        real(fd)

    monkeypatch.setattr(tail_module.os, "fdatasync", watched)
    with workspace.group_commit():
        harness.op("ticket = agents.call('pay', amount=5, to='bob')")
    assert ledger_rows(ledger) and seen and seen[0] is False  # synced, then paid


SLOW = '''
import json, os, threading, time
GO, LEDGER = {go!r}, {ledger!r}
def slow(idempotency_key):
    deadline = time.monotonic() + 5
    while not os.path.exists(GO) and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(LEDGER, "a") as f:
        f.write(json.dumps({{"key": idempotency_key}}) + "\\n")
    return {{"main": threading.current_thread() is threading.main_thread()}}
agents.register_tool("slow", slow, schema={{"type": "object", "properties": {{}}}},
                     description="waits for GO", effect="external", timeout={timeout})
'''


def setup_slow(tmp_path: Path, ledger: Path, timeout: str) -> tuple[Harness, Path]:
    harness = Harness(tmp_path / "ws")
    harness.env.ns["agents"] = harness.env.agents
    harness.env.image.is_persistent = lambda name: name != "agents"  # type: ignore[method-assign]
    go = tmp_path / "go"
    harness.op(SLOW.format(go=str(go), ledger=str(ledger), timeout=timeout))
    return harness, go


def test_a_hanging_effect_is_left_in_doubt_and_the_kernel_goes_on(
        tmp_path: Path, ledger: Path) -> None:
    harness, go = setup_slow(tmp_path, ledger, "0.3")
    harness.op("ticket = agents.call('slow')")
    [effect] = effects(harness)  # the drain gave up on it after 0.3 s
    assert effect["status"] == "in-doubt" and "0.3 s timeout" in effect["error"]
    assert "resolve_effect" in effect["error"] and not ledger.exists()
    assert harness.op("after = 1")["status"] == "committed"  # the next op runs meanwhile
    states = [record["state"] for record in effect_records(harness, effect["key"])]
    assert states == ["started", "in-doubt"]
    go.touch()  # it finishes late, in its own thread: the world changed, nothing recorded
    for _ in range(500):
        if ledger.exists():
            break
        time.sleep(0.01)
    assert len(ledger_rows(ledger)) == 1
    assert harness.env.runtime.effects.drain() == []  # never run again, never guessed
    assert effects(harness)[0]["status"] == "in-doubt"
    harness.op(f"agents.resolve_effect({effect['key']!r}, executed=True)")
    assert effects(harness)[0]["status"] == "done" and len(ledger_rows(ledger)) == 1


def test_an_effect_runs_in_a_worker_thread_unless_its_timeout_is_none(
        tmp_path: Path, ledger: Path) -> None:
    for timeout, main in (("5", False), ("None", True)):
        harness, go = setup_slow(tmp_path / timeout, ledger, timeout)
        go.touch()
        harness.op("ticket = agents.call('slow')")
        [effect] = effects(harness)
        assert effect["status"] == "done" and effect["result"] == {"main": main}
        harness.env.close()


def test_an_effect_timeout_must_be_a_sane_number_of_seconds(
        tmp_path: Path, ledger: Path) -> None:
    harness = Harness(tmp_path / "ws")
    harness.env.ns["agents"] = harness.env.agents
    harness.env.image.is_persistent = lambda name: name != "agents"  # type: ignore[method-assign]
    for bad in ("0", "-1", "'soon'", "10 ** 9"):
        reply = harness.send(v=1, action="op", principal="human", code=SLOW.format(
            go="g", ledger=str(ledger), timeout=bad))
        assert "timeout must be a number of seconds" in reply["result"]["error"]["message"]
