"""Replay (kernos.replay): a recorded session re-run in a fresh workspace, hash for hash.

The session mixes human code, two agents under grants, tool calls, budgets,
LLM calls (litellm's ``mock_response``, recorded; some in ops that fail),
events with an in-image subscriber, external effects (a ledger file the test
owns), failed, denied and conflicting ops, and a checkout.  Replays run in
this process and in fresh processes under different ``PYTHONHASHSEED``
values; every step must match the original, no effect may run again, and a
planted nondeterminism (the OS's randomness, which is not seeded) must be
found at its op, by name.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.harness_support import Harness

from kernos import Image, Workspace
from kernos.replay.driver import replay

SETUP = '''
import json, os
LEDGER = {ledger!r}
def pay(amount, to, idempotency_key):
    with open(LEDGER, "a") as f:
        f.write(json.dumps({{"key": idempotency_key, "amount": amount}}) + "\\n")
    return {{"receipt": idempotency_key[-6:], "amount": amount}}
agents.register_tool("pay", pay, description="pays", effect="external", backoff=0, schema={{
    "type": "object", "properties": {{"amount": {{"type": "integer"}}, "to": {{"type": "string"}}}},
    "required": ["amount", "to"]}})
def fee(amount):
    return {{"fee": amount // 10 + 1}}
agents.register_tool("fee", fee, description="the fee", schema={{
    "type": "object", "properties": {{"amount": {{"type": "integer"}}}}, "required": ["amount"]}})
class Account:
    def __init__(self, owner):
        self.owner, self.balance, self.tags = owner, 0, set()
accounts = {{name: Account(name) for name in ("ann", "bob", "cy")}}
seen = []
def remember(event):
    seen.append(event.payload)
events.subscribe("pay.*", remember)
agents.add("alice")
agents.add("bob")
agents.grant("alice", "call:fee")
agents.grant("alice", "call:pay")
agents.grant("alice", "write:accounts")
agents.grant("alice", "emit:pay.*")
agents.grant("bob", "spend:USD", 300)
agents.grant("bob", "read:accounts")
agents.grant("alice", "llm:gpt-4o-mini", 200000)
'''


def session(harness: Harness, ledger: Path, ops: int, *, seed: int = 7) -> None:
    """About ``ops`` ops of every kind, chosen by a seeded generator."""
    harness.op(SETUP.format(ledger=str(ledger)))
    chooser = random.Random(seed)
    for number in range(ops):
        who = chooser.choice(["ann", "bob", "cy"])
        amount = chooser.randint(1, 40)
        kind = chooser.choice(["human", "human", "alice", "alice", "bob", "tool", "fail",
                               "deny", "effect", "conflict", "checkout", "llm", "llm"])
        if kind == "human":
            # random and uuid4 are seeded per op, time.time() recorded (kernos.determinism).
            harness.op(f"import random, time, uuid\naccounts[{who!r}].balance += {amount} + "
                       "random.randint(0, 3)\n"
                       f"accounts[{who!r}].tags.add('t{number % 5}')\n"
                       f"accounts[{who!r}].last = str(uuid.uuid4())\n"
                       f"accounts[{who!r}].seen_at = (time.time(), time.time_ns())")
        elif kind == "alice":
            harness.send(v=1, action="op", principal="alice", code=(
                f"f = call('fee', amount={amount})['fee']\n"
                f"emit('pay.fee', {{'who': {who!r}, 'fee': f}})\n"
                f"last_fee = f"))
        elif kind == "bob":
            harness.send(v=1, action="op", principal="bob", code=(
                f"left = spend({amount}, 'USD')\nseen_balance = read('accounts')[{who!r}]"
                ".balance"))
        elif kind == "llm":  # a recorded answer; every third op fails after its call
            harness.send(v=1, action="op", principal="alice", code=(
                "answer = llm('gpt-4o-mini', [{'role': 'user', 'content': "
                f"'Plan the next payment for {who}, about {amount} dollars, in one line.'}}], "
                f"mock_response='pay {who} {amount}', max_tokens=20)\n"
                "plan = answer['content']\n" + ("1/0" if number % 3 == 0 else "")))
        elif kind == "tool":
            harness.send(v=1, action="op", principal="alice", tool="fee",
                         arguments={"amount": amount})
        elif kind == "fail":
            harness.send(v=1, action="op", principal="human",
                         code=f"accounts[{who!r}].balance -= 1000\n1/0")
        elif kind == "deny":
            harness.send(v=1, action="op", principal="bob",
                         code=f"write('accounts', {{}})\nx = {amount}")
        elif kind == "effect":
            harness.send(v=1, action="op", principal="alice",
                         code=f"ticket = call('pay', amount={amount}, to={who!r})")
        elif kind == "conflict":
            harness.send(v=1, action="op", principal="human", code="accounts = {}",
                         expect={"versions": {"accounts": 0}})
        elif kind == "checkout" and number > 5:
            harness.send(v=1, action="checkout", ref=f"HEAD~{chooser.randint(1, 3)}")


def ledger_lines(ledger: Path) -> int:
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("recorded")
    ledger = root / "ledger.jsonl"
    harness = Harness(root / "ws")
    harness.env.ns.update(agents=harness.env.agents, events=harness.env.runtime.events)
    from kernos.events.human import Events

    harness.env.ns["events"] = Events(lambda: harness.env.runtime.events)
    harness.env.image.is_persistent = (  # type: ignore[method-assign]
        lambda name: name not in ("agents", "events") and not name.startswith("__"))
    session(harness, ledger, 200)
    harness.env.close()
    return root / "ws", ledger


def statuses(workspace: Path) -> list[str]:
    with Workspace.open(workspace, writable=False) as opened:
        from kernos.audit import open_audit

        return [str(r["status"]) for r in open_audit(opened).records(type="op", limit=10_000)]


def test_the_session_is_varied(recorded: tuple[Path, Path]) -> None:
    workspace, ledger = recorded
    seen = statuses(workspace)
    for status in ("committed", "failed", "denied", "conflict"):
        assert status in seen, status
    assert len(seen) > 200 and ledger_lines(ledger) > 5
    with Workspace.open(workspace, writable=False) as opened:
        from kernos.audit import open_audit

        calls = [(r["status"], r["llm"]) for r in open_audit(opened).records(
            type="op", limit=10_000) if r.get("llm")]
    assert {status for status, _ in calls} >= {"committed", "failed"}
    assert any(call["cached"] for _, made in calls for call in made)  # a retried request


def test_a_replay_reproduces_every_snapshot_and_executes_no_effect(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    workspace, ledger = recorded
    before = ledger_lines(ledger)
    report = replay(workspace, into=tmp_path / "replayed")
    assert report.ok, report.divergence
    committed = [step for step in report.steps if step.status == "committed"]
    assert len(committed) > 100
    assert all(step.digest == step.original and step.digest for step in committed)
    assert {step.kind for step in report.steps} >= {"harness", "effect"}
    assert ledger_lines(ledger) == before  # nothing was paid again


def replay_in_a_fresh_process(workspace: Path, into: Path, seed: str) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-m", "kernos.cli", "replay", "--workspace", str(workspace),
         "--into", str(into), "--json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed},
        timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr + completed.stdout[-2000:]
    result: dict[str, Any] = json.loads(completed.stdout)
    return result


def test_replays_in_fresh_processes_with_other_hash_seeds_agree_hash_for_hash(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    workspace, _ = recorded
    first = replay_in_a_fresh_process(workspace, tmp_path / "one", "1")
    second = replay_in_a_fresh_process(workspace, tmp_path / "two", "4242")
    assert first["ok"] and second["ok"]
    ours = [(s["op"], s["digest"]) for s in first["steps"]]
    theirs = [(s["op"], s["digest"]) for s in second["steps"]]
    assert ours == theirs
    assert [s["original"] for s in first["steps"]] == [s["digest"] for s in first["steps"]]


def test_a_planted_nondeterminism_is_found_at_its_op(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    harness = Harness(tmp_path / "ws")
    from kernos.events.human import Events

    harness.env.ns.update(agents=harness.env.agents,
                          events=Events(lambda: harness.env.runtime.events))
    harness.env.image.is_persistent = (  # type: ignore[method-assign]
        lambda name: name not in ("agents", "events") and not name.startswith("__"))
    session(harness, ledger, 20)
    planted = harness.op("import random\nnoise = {'value': random.SystemRandom().random()}")
    session_tail = harness.op("after = 1")
    harness.env.close()
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert not report.ok
    divergence = report.divergence
    assert divergence is not None and divergence.op == planted["op"]
    assert list(divergence.names) == ["noise"]
    assert "value" in divergence.names["noise"]
    assert report.steps[-1].op == planted["op"]  # it stops at the first divergence
    assert session_tail["op"] not in [step.op for step in report.steps]


def test_until_stops_just_before_an_op_for_a_person_to_run_it(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    harness = Harness(tmp_path / "ws")
    harness.op("total = 1")
    harness.op("total += 10")
    failed = harness.send(v=1, action="op", principal="human",
                          code="total += 100\nraise ValueError('bad')")["result"]
    harness.op("total += 1000")
    harness.env.close()
    report = replay(tmp_path / "ws", until=failed["op"], into=tmp_path / "replayed")
    assert report.ok and report.stopped_before == failed["op"]
    assert report.pending_code is not None and "ValueError('bad')" in report.pending_code
    with Workspace.open(tmp_path / "replayed", purpose="test") as workspace:
        namespace: dict[str, Any] = {}
        Image(workspace, namespace).restore()
    assert namespace["total"] == 11
    assert not ledger.exists()


def test_an_environment_variable_that_differs_at_replay_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNOS_TEST_REGION", "eu-west")
    harness = Harness(tmp_path / "ws")
    harness.op("import os\nregion = os.environ['KERNOS_TEST_REGION']")
    read = harness.op("import os\nzone = os.getenv('KERNOS_TEST_REGION') + '-1'")
    harness.env.close()
    assert replay(tmp_path / "ws", into=tmp_path / "same").ok
    monkeypatch.setenv("KERNOS_TEST_REGION", "us-east")
    report = replay(tmp_path / "ws", into=tmp_path / "other")
    assert report.divergence is not None and report.divergence.op == read["op"] - 1
    assert report.divergence.names == {"$KERNOS_TEST_REGION": "another value"}
    with Workspace.open(tmp_path / "ws", writable=False) as opened:
        from kernos.audit import open_audit

        records = open_audit(opened).records(type="op")
    assert "eu-west" not in json.dumps(records)  # a fingerprint, never the value


ASK = ("answer = llm('gpt-4o-mini', [{{'role': 'user', 'content': 'q{n}'}}], "
       "mock_response='a{n}', max_tokens=8)\nasked = {n}")


def spend_a_token_budget(harness: Harness) -> list[dict[str, Any]]:
    """Agent ``bob`` asks until its 60-token LLM budget refuses; the ops' results."""
    harness.env.ns.update(agents=harness.env.agents)
    harness.env.image.is_persistent = (  # type: ignore[method-assign]
        lambda name: name != "agents" and not name.startswith("__"))
    harness.op("agents.add('bob')\nagents.grant('bob', 'llm:gpt-4o-mini', 60)")
    results = []
    for n in range(10):
        results.append(harness.op(ASK.format(n=n), principal="bob"))
        if results[-1]["status"] != "committed":
            break
    harness.op("after = 1")
    harness.env.close()
    assert [r["status"] for r in results[:-1]] == ["committed"] * (len(results) - 1)
    assert results[-1]["status"] == "vetoed" and len(results) > 1
    assert "budget" in results[-1]["error"]["message"]
    return results


def test_a_call_the_budget_refused_is_refused_again_not_missing(tmp_path: Path) -> None:
    """The original never made (so never recorded) the refused call: a replay, which
    only answers from recordings, must check the budget before it looks."""
    results = spend_a_token_budget(Harness(tmp_path / "ws"))
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.summary()
    assert [s.replayed for s in report.steps if s.op == results[-1]["op"]] == ["vetoed"]


def test_a_replay_from_a_later_snapshot_starts_with_the_budget_spent(tmp_path: Path) -> None:
    """The ledger is outside the image: a replay from a snapshot charges the calls of
    the ops before it (and of ops it does not re-run) before it runs the next."""
    results = spend_a_token_budget(Harness(tmp_path / "ws"))
    last_committed = results[-2]["op"]
    report = replay(tmp_path / "ws", start=f"@{last_committed}", into=tmp_path / "replayed")
    assert report.ok, report.summary()
    assert (report.steps[0].op, report.steps[0].replayed) == (results[-1]["op"], "vetoed")


def test_a_call_vetoed_after_its_answer_is_charged_again_in_the_replay(tmp_path: Path) -> None:
    """A mock answer uses 30 tokens, more than the 21 a fresh call reserves (its prompt
    and max_tokens).  With 55 tokens, bob's second call is admitted (30 + 21), answered
    and vetoed after (60 of 55), its 30 tokens charged; the third is refused before.
    The replay must admit the second as the original did (at its estimate, not at the
    usage of its recording), charge it, and so refuse the third before too: not let it
    through to find no recording ('failed', the torture test's divergence)."""
    harness = Harness(tmp_path / "ws")
    harness.env.ns.update(agents=harness.env.agents)
    harness.env.image.is_persistent = (  # type: ignore[method-assign]
        lambda name: name != "agents" and not name.startswith("__"))
    harness.op("agents.add('bob')\nagents.grant('bob', 'llm:gpt-4o-mini', 55)")
    results = [harness.op(ASK.format(n=n), principal="bob") for n in range(3)]
    harness.env.close()
    assert [r["status"] for r in results] == ["committed", "vetoed", "vetoed"]
    assert "used more than estimated" in results[1]["error"]["message"]
    assert "Nothing was called" in results[2]["error"]["message"]
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.summary()
    assert [s.replayed for s in report.steps[-3:]] == ["committed", "vetoed", "vetoed"]
    from kernos.llm._store import LEDGER_FILE, read_calls

    def charged(workspace: Path) -> int:
        return sum(call["tokens"] for call in read_calls(workspace / LEDGER_FILE))

    assert charged(tmp_path / "replayed") == charged(tmp_path / "ws") == 60
