"""External effects: what the journal, the outbox and the follow-up op hold, pinned.

Mutation testing (``scripts/mutation effects``) found these unpinned: the
request hash's exact form (journals persist it, so a change would refuse every
recorded outcome), the fields of journal records and outbox entries, each
crash-recovery path a journal state leads to, the crash points' names (the
durability tests kill kernels at them), replayed outcomes, and the bounded
form of results that are not JSON.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from tests.harness_support import Harness
from tests.unit.test_effects import effect_records, effects, ledger_rows, setup

from kernos.agents.registry import ToolVersion
from kernos.audit.canonical import canonical
from kernos.effects import (
    OUTBOX,
    Effect,
    EffectRunner,
    _bounded,
    _plain,
    code_identity,
    request_hash,
)
from kernos.errors import UsageError

SOURCE = "def pay(amount, idempotency_key):\n    return amount\n"
JOURNAL_FIELDS = {"type", "key", "op", "tool", "version", "request", "state", "attempt"}


def version(*, source: str | None = SOURCE, function: Any = print) -> ToolVersion:
    return ToolVersion(name="pay", version=2, function=function, schema={}, description="",
                       capability="call:pay", effect="external", author="alice", op=3,
                       source=source)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.jsonl"


def queued(harness: Harness, code: str = "agents.call('pay', amount=5, to='bob')") -> Effect:
    """Queue one effect and leave it queued (as a crash before the drain would)."""
    runner = harness.env.runtime.effects
    real = runner.drain
    runner.drain = lambda: []  # type: ignore[method-assign]
    try:
        harness.op(code)
    finally:
        runner.drain = real  # type: ignore[method-assign]
    [effect] = harness.env.image.system[OUTBOX].waiting()  # type: ignore[attr-defined]
    return effect  # type: ignore[no-any-return]


def runner_of(harness: Harness) -> EffectRunner:
    return harness.env.runtime.effects  # type: ignore[no-any-return]


# -- the request hash ------------------------------------------------------------------


def test_the_request_hash_is_sha256_of_the_canonical_request() -> None:
    tool = version()
    arguments = {"amount": 5, "to": "bob"}
    code = hashlib.sha256(SOURCE.encode()).hexdigest()
    assert code_identity(tool) == code
    expected = hashlib.sha256(canonical({"tool": "pay", "version": 2, "code": code,
                                         "arguments": arguments})).hexdigest()
    assert request_hash(tool, arguments) == expected
    # Journals keep it: the same request must hash the same in every release.
    assert expected == "3ffadd65017ef210f95a79be59e92291fbbd540470d89854167e0afeb30ae941"


def test_source_with_a_lone_surrogate_still_has_an_identity() -> None:
    tool = version(source="x = '\ud800'")
    assert code_identity(tool) == hashlib.sha256(
        "x = '\ud800'".encode("utf-8", "surrogatepass")).hexdigest()


def first(amount: int, idempotency_key: str) -> int:
    return amount


def second(amount: int, idempotency_key: str) -> int:
    return amount + 1


def third(amount: int, idempotency_key: str) -> int:
    return amount + 2


def test_a_function_is_identified_by_its_name_its_code_and_its_constants() -> None:
    identity = code_identity(version(source=None, function=first))
    assert identity == code_identity(version(source=None, function=first))
    # The same bytecode with another constant, and another name, are other code.
    assert identity != code_identity(version(source=None, function=second))
    assert code_identity(version(source=None, function=second)) != code_identity(
        version(source=None, function=third))
    digest = hashlib.sha256(f"{first.__module__}.{first.__qualname__}".encode())
    digest.update(first.__code__.co_code)
    digest.update(repr(first.__code__.co_consts).encode())
    assert identity == digest.hexdigest()


class Callable:
    """A callable object: no ``__code__`` and no ``__qualname__`` of its own."""

    def __call__(self, idempotency_key: str) -> None:
        return None


def test_a_callable_without_code_is_identified_by_its_module() -> None:
    identity = code_identity(version(source=None, function=Callable()))
    assert identity == hashlib.sha256(f"{__name__}.".encode()).hexdigest()


# -- results the journal can hold ---------------------------------------------------------


def test_a_json_result_is_kept_as_the_journal_holds_it() -> None:
    assert _plain({"b": 1, "a": [1, 2.5, None]}) == {"a": [1, 2.5, None], "b": 1}


@pytest.mark.parametrize(("value", "shown"), [
    ((1, 2), "(1, 2)"),
    ({1, 2}, "{1, 2}"),
    (float("nan"), "nan"),
])
def test_a_result_that_is_not_json_is_kept_as_a_repr_with_a_note(
        value: object, shown: str) -> None:
    assert _plain(value) == {"repr": shown, "note": "not JSON (or too large): kept as a repr"}


def test_a_result_of_exactly_the_limit_is_kept_and_one_byte_more_is_not() -> None:
    fits = "a" * (64 * 1024 - 2)  # with its quotes, exactly 64 KiB of JSON
    assert _plain(fits) == fits
    over = _plain(fits + "a")
    assert isinstance(over, dict) and over["note"] == "not JSON (or too large): kept as a repr"
    assert len(over["repr"]) == 300


class LongRepr:
    def __repr__(self) -> str:
        return "x" * 1000


def test_reprs_are_bounded() -> None:
    assert len(_bounded("a" * 1000)) == 300
    assert len(_bounded(LongRepr())) == 300
    assert _bounded([[[[1]]]]) == "[[[[...]]]]"
    assert _bounded([[[1]]]) == "[[[1]]]"
    assert _bounded("abc") == "'abc'"
    assert _bounded(KeyError("k")) == "'k'"
    assert _bounded(ValueError("v" * 2000)) == "v" * 1000


# -- queueing ---------------------------------------------------------------------------


def test_the_queuing_op_lists_each_effect_with_its_request(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness, "agents.call('pay', amount=5, to='bob')\n"
                             "agents.call('pay', amount=6, to='eve')"[:38])
    tool = harness.env.runtime.registry.tools["pay"][-1]
    assert effect.request == request_hash(tool, {"amount": 5, "to": "bob"})
    assert (effect.position, effect.principal, effect.tool, effect.version) == (
        0, "human", "pay", 1)
    record = harness.env.image.audit.records(type="op")[-1]
    assert record["effects"] == [{"key": effect.key, "tool": "pay", "version": 1,
                                  "request": effect.request, "status": "queued"}]
    assert effect.describe() == {
        "key": effect.key, "op": effect.op, "position": 0, "principal": "human",
        "tool": "pay", "version": 1, "request": effect.request,
        "arguments": {"amount": 5, "to": "bob"}, "status": "queued", "result": None,
        "error": None, "attempts": 0, "recorded_op": None}


def test_arguments_that_are_not_json_are_refused(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    harness.op("def ship(items, idempotency_key):\n    return None\n"
               "agents.register_tool('ship', ship, description='ships', effect='external', "
               "schema={'type': 'object', 'properties': {'items': {'type': 'array'}}})")
    reply = harness.send(action="op", principal="human",
                         code="agents.call('ship', items=('a', 'b'))")
    message = reply["result"]["error"]["message"]
    assert message.startswith("the arguments of ship['items'] is a tuple")
    assert message.endswith("; an external effect's arguments are recorded as JSON")
    assert ".;" not in message  # the JSON check's own sentence is joined, not doubled
    assert OUTBOX not in harness.env.image.system


# -- executing ----------------------------------------------------------------------------


def test_journal_records_carry_the_request_and_the_attempt(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner_of(harness).drain()
    started, done = effect_records(harness, effect.key)
    for record, state in ((started, "started"), (done, "done")):
        assert {name: record[name] for name in JOURNAL_FIELDS} == {
            "type": "effect", "key": effect.key, "op": effect.op, "tool": "pay",
            "version": 1, "request": effect.request, "state": state, "attempt": 1}
    assert done["result"] == {"receipt": "r-" + effect.key[-6:], "amount": 5}


def test_the_crash_points_are_passed_in_order(
        tmp_path: Path, ledger: Path, points_passed: list[str]) -> None:
    harness = setup(tmp_path, ledger)
    queued(harness)
    passed = points_passed
    runner_of(harness).drain()
    assert [name for name in passed if name.startswith("effect.")] == [
        "effect.before", "effect.started", "effect.executed", "effect.journaled",
        "effect.record"]


def test_the_follow_up_op_names_the_effects_it_records(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    image = harness.env.image
    begun: list[Any] = []
    real = image.begin

    def begin(**kwargs: Any) -> Any:
        op = real(**kwargs)
        begun.append((op, kwargs))
        return op

    image.begin = begin  # type: ignore[method-assign]
    [report] = runner_of(harness).drain()
    [(op, kwargs)] = begun
    assert kwargs["source"] == canonical({"effects": [effect.key]}).decode()
    assert kwargs["principal"] == "human" and kwargs["kind"] == "effect"
    assert kwargs["reach"].names == frozenset({OUTBOX})
    assert op.note == f"effects of op {effect.op}: 0 done"
    assert report.kind == "effect"


def test_a_single_attempt_is_not_retried(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    (ledger.parent / (ledger.name + ".fail")).write_text("1")
    harness.op("agents.register_tool('pay', pay, schema=SCHEMA, description='pays', "
               "effect='external', attempts=1, backoff=0)")
    harness.op("agents.call('pay', amount=5, to='bob')")
    [effect] = effects(harness)
    assert effect["status"] == "failed" and effect["attempts"] == 1
    assert effect["error"] == "ConnectionError: the bank is not answering"
    states = [record["state"] for record in effect_records(harness, effect["key"])]
    assert states == ["started", "failed"]
    assert effect_records(harness, effect["key"])[-1]["error"] == effect["error"]


def test_the_last_failure_is_journaled_as_failed(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    (ledger.parent / (ledger.name + ".fail")).write_text("99")
    harness.op("agents.call('pay', amount=5, to='bob')")
    [effect] = effects(harness)
    records = effect_records(harness, effect["key"])
    assert [(r["state"], r["attempt"]) for r in records] == [
        ("started", 1), ("error", 1), ("started", 2), ("error", 2), ("started", 3),
        ("failed", 3)]
    assert {r["error"] for r in records if "error" in r} == {
        "ConnectionError: the bank is not answering"}


def test_an_effect_whose_tool_is_gone_fails_without_running(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    del harness.env.runtime.registry.tools["pay"]
    runner_of(harness).drain()
    [described] = effects(harness)
    assert described["status"] == "failed" and described["attempts"] == 0
    assert described["error"] == "tool pay v1 is not in the image"
    [record] = effect_records(harness, effect.key)
    assert (record["state"], record["attempt"], record["error"]) == (
        "failed", 0, "the tool version is gone")
    assert not ledger.exists()


# -- what the journal says when a drain starts ---------------------------------------------


def test_a_journaled_result_is_recorded_not_executed_again(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner = runner_of(harness)
    runner._journal(effect, "started", 2)
    runner._journal(effect, "done", 2, result={"receipt": "journaled"})
    runner.drain()
    [described] = effects(harness)
    assert (described["status"], described["result"], described["attempts"]) == (
        "done", {"receipt": "journaled"}, 2)
    assert not ledger.exists()


@pytest.mark.parametrize("state", ["failed", "in-doubt"])
def test_a_journaled_failure_or_doubt_is_recorded_as_it_is(
        tmp_path: Path, ledger: Path, state: str) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner = runner_of(harness)
    runner._journal(effect, state, 4, error="as journaled")
    runner.drain()
    [described] = effects(harness)
    assert (described["status"], described["error"], described["attempts"]) == (
        state, "as journaled", 4)
    assert not ledger.exists()


def test_another_request_under_the_key_fails_with_the_journaled_attempt(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner = runner_of(harness)
    runner._journal(effect, "started", 3)
    effect.request = "0" * 64
    runner.drain()
    [described] = effects(harness)
    assert (described["status"], described["attempts"], described["error"]) == (
        "failed", 3, "a different request was recorded under this key; refusing to reuse "
                     "its outcome")
    assert not ledger.exists()


def test_an_in_doubt_effect_without_a_resolver_says_how_to_resolve_it(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger, resolve=False)
    effect = queued(harness)
    runner = runner_of(harness)
    runner._journal(effect, "started", 1)
    runner.drain()
    [described] = effects(harness)
    assert (described["status"], described["attempts"]) == ("in-doubt", 1)
    assert described["error"] == (
        "started but never confirmed (the kernel stopped); the tool has no resolve function: "
        "check by its key, then agents.resolve_effect(key, executed=...)")
    record = effect_records(harness, effect.key)[-1]
    assert (record["state"], record["attempt"], record["error"]) == (
        "in-doubt", 1, "it may have happened: resolve it by its key")


@pytest.mark.parametrize("executed", [True, False])
def test_the_resolvers_answer_is_journaled_with_who_gave_it(
        tmp_path: Path, ledger: Path, executed: bool) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner = runner_of(harness)
    runner._journal(effect, "started", 1)
    if executed:
        ledger.write_text(json.dumps({"key": effect.key, "amount": 5, "to": "bob"}) + "\n")
    runner.drain()
    records = effect_records(harness, effect.key)
    answer = records[1]
    assert answer["resolved"] == "the tool's resolve function"
    assert answer["attempt"] == 1
    if executed:
        assert answer["state"] == "done"
        assert answer["result"] == {"receipt": "r-" + effect.key[-6:], "amount": 5}
        assert effects(harness)[0]["result"] == answer["result"]
    else:
        assert answer["state"] == "absent" and "result" not in answer
        assert [r["attempt"] for r in records[2:]] == [2, 2]
    assert len(ledger_rows(ledger)) == 1


def test_a_resolver_that_raises_leaves_the_effect_in_doubt(
        tmp_path: Path, ledger: Path, caplog: pytest.LogCaptureFixture) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner = runner_of(harness)
    runner._journal(effect, "started", 1)

    def broken(key: str) -> tuple[bool, object]:
        raise OSError("the bank's status page is down")

    harness.env.runtime.registry.tools["pay"][-1].resolve = broken
    with caplog.at_level(logging.WARNING, logger="kernos.effects"):
        runner.drain()
    assert effects(harness)[0]["status"] == "in-doubt"
    assert caplog.messages == [
        f"kernos: resolving effect {effect.key} failed: the bank's status page is down"]
    assert not ledger.exists()


# -- a person's answer ----------------------------------------------------------------------


def in_doubt(harness: Harness) -> Effect:
    effect = queued(harness)
    runner = runner_of(harness)
    runner._journal(effect, "started", 1)
    runner.drain()
    assert effect.status == "in-doubt"
    return effect


def test_a_persons_answer_is_journaled_with_their_name_and_op(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger, resolve=False)
    effect = in_doubt(harness)
    reply = harness.op(f"agents.resolve_effect({effect.key!r}, executed=True, "
                       "result={'receipt': 'paper'})")
    record = effect_records(harness, effect.key)[-1]
    assert record["state"] == "done" and record["result"] == {"receipt": "paper"}
    assert record["resolved"] == f"human in op {reply['op']}"


@pytest.mark.parametrize(("call", "message"), [
    ("agents.resolve_effect(['k'], executed=True)",
     "there is no effect \"['k']\"; `agents.effects()` lists them"),
    ("agents.resolve_effect('k' * 100, executed=True)",
     "there is no effect '" + "k" * 80 + "'; `agents.effects()` lists them"),
])
def test_resolving_an_unknown_effect_is_refused(
        tmp_path: Path, ledger: Path, call: str, message: str) -> None:
    harness = setup(tmp_path, ledger, resolve=False)
    reply = harness.send(action="op", principal="human", code=call)
    assert reply["result"]["error"]["message"] == message


def test_only_an_in_doubt_effect_is_resolved_and_only_with_a_bool(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger, resolve=False)
    effect = in_doubt(harness)
    reply = harness.send(action="op", principal="human",
                         code=f"agents.resolve_effect({effect.key!r}, executed=1)")
    assert reply["result"]["error"]["message"] == (
        "resolve() needs executed=True (it happened; give its result) or executed=False "
        "(it did not; it will be executed)")
    reply = harness.send(action="op", principal="human",
                         code=f"agents.resolve_effect({effect.key!r}, executed=True, "
                              "result={1, 2})")
    assert reply["result"]["error"]["message"].startswith("the result ")
    harness.op(f"agents.resolve_effect({effect.key!r}, executed=False)")
    reply = harness.send(action="op", principal="human",
                         code=f"agents.resolve_effect({effect.key!r}, executed=False)")
    assert reply["result"]["error"]["message"] == (
        f"effect {effect.key} is done, not in doubt: only an in-doubt effect is resolved "
        "by hand")


# -- replay -------------------------------------------------------------------------------


def test_a_replay_records_the_recorded_outcome_and_executes_nothing(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner = runner_of(harness)
    runner.replaying = True
    assert runner.drain() == []  # a replay executes nothing without recorded outcomes
    [report] = runner.drain(recorded={effect.key: {
        "request": effect.request, "status": "done", "result": {"receipt": "recorded"},
        "attempts": 2}})
    assert report.kind == "effect"
    [described] = effects(harness)
    assert (described["status"], described["result"], described["error"],
            described["attempts"]) == ("done", {"receipt": "recorded"}, None, 2)
    assert not ledger.exists()


def test_a_replay_keeps_the_recorded_error(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner_of(harness).drain(recorded={effect.key: {
        "request": effect.request, "status": "failed", "error": "declined"}})
    [described] = effects(harness)
    assert (described["status"], described["error"], described["attempts"]) == (
        "failed", "declined", 0)


def test_a_replay_refuses_another_request_or_no_recorded_effect(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner = runner_of(harness)
    with pytest.raises(UsageError) as raised:
        runner.drain(recorded={effect.key: {"request": "0" * 64, "status": "done"}})
    assert str(raised.value) == (
        f"effect {effect.key} (pay) was requested with other arguments or another tool "
        "version than in the original")
    keys = {f"k{n}": {} for n in range(7)}
    with pytest.raises(UsageError) as raised:
        runner.drain(recorded=keys)
    assert str(raised.value) == ("the original recorded effects here, but the replay queued "
                                 "none of them (k0, k1, k2, k3, k4)")
    assert effect.status == "queued" and not ledger.exists()


# -- further paths -----------------------------------------------------------------------


def test_a_callable_without_a_module_is_identified_by_its_qualified_name() -> None:
    wrapper = (1).__add__  # a method-wrapper: no __module__, no __code__
    assert not hasattr(wrapper, "__module__")
    identity = code_identity(version(source=None, function=wrapper))
    assert identity == hashlib.sha256(f".{wrapper.__qualname__}".encode()).hexdigest()


def test_a_name_with_a_lone_surrogate_still_has_an_identity() -> None:
    def tool(idempotency_key: str) -> None:
        return None

    tool.__qualname__ = "tool\ud800"
    digest = hashlib.sha256(f"{__name__}.tool\ud800".encode("utf-8", "surrogatepass"))
    digest.update(tool.__code__.co_code)
    digest.update(repr(tool.__code__.co_consts).encode())
    assert code_identity(version(source=None, function=tool)) == digest.hexdigest()


def test_draining_inside_an_op_is_refused_with_the_reason(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    op = harness.env.image.begin(source="x = 1")
    try:
        with pytest.raises(UsageError) as raised:
            runner_of(harness).drain()
        assert str(raised.value) == "effects are executed after an op, not inside one"
    finally:
        op.abort()


def test_the_follow_up_op_lists_every_effect_of_the_queuing_op(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    image = harness.env.image
    notes: list[str] = []
    real = image.begin

    def begin(**kwargs: Any) -> Any:
        op = real(**kwargs)
        notes.append(op)
        return op

    image.begin = begin  # type: ignore[method-assign]
    reply = harness.op("agents.call('pay', amount=1, to='bob')\n"
                       "agents.call('pay', amount=2, to='eve')")
    assert notes[-1].note == f"effects of op {reply['op']}: 0 done, 1 done"


def test_a_tool_gone_after_an_attempt_keeps_the_attempts_count(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner = runner_of(harness)
    runner._journal(effect, "error", 2, error="ConnectionError: later")
    del harness.env.runtime.registry.tools["pay"]
    runner.drain()
    assert effects(harness)[0]["attempts"] == 2


def test_a_resolved_effect_keeps_its_attempt(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    runner = runner_of(harness)
    runner._journal(effect, "started", 2)
    ledger.write_text(json.dumps({"key": effect.key, "amount": 5, "to": "bob"}) + "\n")
    runner.drain()
    assert (effects(harness)[0]["status"], effects(harness)[0]["attempts"]) == ("done", 2)


def test_an_in_doubt_effect_queued_again_is_not_executed_blindly(
        tmp_path: Path, ledger: Path) -> None:
    """A checkout of the queuing op puts it back to queued; the journal still says in doubt."""
    harness = setup(tmp_path, ledger, resolve=False)
    effect = in_doubt(harness)
    effect.status = "queued"
    runner_of(harness).drain()
    assert effect.status == "in-doubt" and effect.resolution is None
    assert not ledger.exists()


def failing_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op commit fails as a full disk would: the op rolls back, KernosError raised."""
    from kernos.errors import KernosError
    from kernos.op import Op

    def commit(self: Op) -> Any:
        self.abort()
        raise KernosError("the disk is full")

    monkeypatch.setattr(Op, "commit", commit)


def test_outcomes_that_cannot_be_recorded_stay_queued_and_are_logged(
        tmp_path: Path, ledger: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    failing_commits(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="kernos.effects"):
        assert runner_of(harness).drain() == []
    assert caplog.messages == [
        "kernos: recording effects failed (the disk is full); they stay queued"]
    # The follow-up op rolled back: the outbox as committed says queued.
    assert [described["status"] for described in effects(harness)] == ["queued"]
    assert effect_records(harness, effect.key)[-1]["state"] == "done"  # journaled already


def test_a_replay_whose_record_fails_reports_nothing(
        tmp_path: Path, ledger: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = setup(tmp_path, ledger)
    effect = queued(harness)
    failing_commits(monkeypatch)
    assert runner_of(harness).drain(recorded={effect.key: {
        "request": effect.request, "status": "done"}}) == []


def test_a_replayed_outcome_is_recorded_by_the_queuing_principal(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    harness.op("agents.add('alice')\nagents.grant('alice', 'call:pay')")
    runner = runner_of(harness)
    real = runner.drain
    runner.drain = lambda: []  # type: ignore[method-assign]
    harness.ok(action="op", principal="alice", code="call('pay', amount=1, to='bob')")
    runner.drain = real  # type: ignore[method-assign]
    [effect] = harness.env.image.system[OUTBOX].waiting()  # type: ignore[attr-defined]
    image = harness.env.image
    begun: list[Any] = []
    real_begin = image.begin

    def begin(**kwargs: Any) -> Any:
        op = real_begin(**kwargs)
        begun.append(op)
        return op

    image.begin = begin  # type: ignore[method-assign]
    [report] = runner.drain(recorded={effect.key: {"request": effect.request,
                                                   "status": "done"}})
    assert report.principal == "alice"
    assert begun[-1].note == f"effects of op {effect.op}: 0 done"


def test_queued_and_resolved_effects_survive_a_restart(tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger, resolve=False)
    harness.op("agents.call('pay', amount=1, to='bob')")  # the outbox exists from here on
    effect = in_doubt(harness)
    runner = runner_of(harness)
    runner.drain = lambda: []  # type: ignore[method-assign]  # stop before the next drain
    harness.op(f"agents.resolve_effect({effect.key!r}, executed=False)")
    resolution = effect.resolution
    assert resolution is not None and effect.status == "queued"
    harness.reopen()
    harness.env.ns["agents"] = harness.env.agents
    restored = harness.env.image.system[OUTBOX].effects  # type: ignore[attr-defined]
    assert len(restored) == 2
    assert restored[effect.key].status == "queued"
    assert restored[effect.key].resolution == resolution


def test_a_queued_effect_survives_a_restart_before_its_drain(
        tmp_path: Path, ledger: Path) -> None:
    harness = setup(tmp_path, ledger)
    harness.op("agents.call('pay', amount=1, to='bob')")  # the outbox exists from here on
    effect = queued(harness, "agents.call('pay', amount=2, to='eve')")
    harness.reopen()
    restored = harness.env.image.system[OUTBOX].effects  # type: ignore[attr-defined]
    assert restored[effect.key].status == "queued"
    assert restored[effect.key].arguments == {"amount": 2, "to": "eve"}
