"""The in-image event bus against a real image: delivery, limits, rollback, the durable log.

Handlers are defined by ``exec`` of source in the image's namespace (a
``__main__`` module), like notebook cells, so they persist by value.  The bus
itself sits in the namespace as ``bus`` but is not persisted.
"""

from __future__ import annotations

import copy
import enum
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_support import CoreEnv
from kernos import Image, Workspace
from kernos.audit.log import INLINE_PAYLOAD_BYTES
from kernos.errors import (
    EventCascadeTooDeep,
    EventError,
    OpVetoed,
    SubscriberFailed,
    UsageError,
)
from kernos.events.bus import MAX_DEPTH, MAX_EVENTS, MAX_PAYLOAD_BYTES, SUBSCRIPTIONS, EventBus
from kernos.image import default_is_persistent
from kernos.op import CommitReport


class Env(CoreEnv):
    """A workspace with an image and a bus on it; ``reopen()`` is a kernel restart."""

    def user(self) -> dict[str, Any]:
        return {name: copy.deepcopy(value) for name, value in self.ns.items()
                if default_is_persistent(name) and name != "bus"
                and not isinstance(value, types.FunctionType)}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    opened = Env(tmp_path / "ws")
    yield opened
    opened.close()


def without_at(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in event.items() if key != "at"} for event in events]


def op_records(env: Env) -> list[dict[str, Any]]:
    return env.image.audit.records(type="op")


# -- outside an op ------------------------------------------------------------------------


def test_emit_subscribe_and_unsubscribe_outside_an_op_are_usage_errors(env: Env) -> None:
    with pytest.raises(UsageError, match="inside an op"):
        env.bus.emit("orders.created", {"id": 1})
    with pytest.raises(UsageError, match="inside an op"):
        env.bus.subscribe("orders.*", print)
    with pytest.raises(UsageError, match="inside an op"):
        env.bus.unsubscribe("s1")
    assert env.bus.list() == []
    assert env.image.audit.events_since() == []
    assert len(env.image.audit) == 1  # genesis only


# -- delivery order -------------------------------------------------------------------------

ORDER_HANDLERS = """
log = []
def first(event):
    log.append(("first", event.topic, event.depth, event.index))
    if event.topic == "a.start":
        bus.emit("a.inner", {"from": "first"})
        log.append(("first: emit returned",))
def second(event):
    log.append(("second", event.topic, event.depth, event.index))
def third(event):
    log.append(("third", event.topic, event.depth, event.index))
ids = [bus.subscribe("a.*", first), bus.subscribe("a.**", second),
       bus.subscribe("b.**", third)]
"""


def test_delivery_is_in_creation_order_and_depth_first(env: Env) -> None:
    env.run(ORDER_HANDLERS)
    assert env.ns["ids"] == ["s1", "s2", "s3"]
    report = env.run("bus.emit('a.start', {'n': 1})")
    assert env.ns["log"] == [
        ("first", "a.start", 0, 0),
        ("first", "a.inner", 1, 1),   # first's own emit reaches first again, then
        ("second", "a.inner", 1, 1),  # every subscriber of a.inner, before emit returns
        ("first: emit returned",),
        ("second", "a.start", 0, 0),
    ]
    assert [(e["topic"], e["depth"], e["payload"]) for e in report.events] == [
        ("a.start", 0, {"n": 1}), ("a.inner", 1, {"from": "first"})]
    first_seq = report.events[0]["seq"]
    assert [e["seq"] for e in report.events] == [first_seq, first_seq + 1]
    assert {e["op"] for e in report.events} == {report.op}
    assert {e["commit"] for e in report.events} == {report.commit}


def test_delivery_order_is_numeric_past_nine_subscriptions(env: Env) -> None:
    env.run("calls = []\n"
            "def make(n):\n"
            "    def handler(event):\n"
            "        calls.append(n)\n"
            "    return handler\n"
            "ids = [bus.subscribe('t', make(n)) for n in range(1, 13)]")
    assert env.ns["ids"] == [f"s{n}" for n in range(1, 13)]
    env.run("bus.emit('t')")
    assert env.ns["calls"] == list(range(1, 13))  # s10 after s9, not after s1
    assert [sub["id"] for sub in env.bus.list()] == [f"s{n}" for n in range(1, 13)]
    env.reopen()
    env.run("calls.clear()\nbus.emit('t')")
    assert env.ns["calls"] == list(range(1, 13))  # the order survives a restart


def test_a_subscriber_removed_during_delivery_is_skipped_and_one_added_waits(env: Env) -> None:
    env.run("calls = []\ndone = []\n"
            "def late(event):\n"
            "    calls.append('late')\n"
            "def remover(event):\n"
            "    calls.append('remover')\n"
            "    if not done:\n"
            "        done.append(1)\n"
            "        bus.unsubscribe('s2')\n"
            "        bus.subscribe('t', late)\n"
            "def victim(event):\n"
            "    calls.append('victim')\n"
            "bus.subscribe('t', remover)\n"
            "bus.subscribe('t', victim)")
    env.run("bus.emit('t')")
    assert env.ns["calls"] == ["remover"]
    assert [sub["id"] for sub in env.bus.list()] == ["s1", "s3"]
    env.run("calls.clear()\nbus.emit('t')")
    assert env.ns["calls"] == ["remover", "late"]


def test_an_event_without_subscribers_is_still_recorded(env: Env) -> None:
    report = env.run("bus.emit('nobody.listens', [1, 'two', None, True, 2.5])")
    assert [(e["topic"], e["payload"]) for e in report.events] == [
        ("nobody.listens", [1, "two", None, True, 2.5])]
    assert without_at(env.image.audit.events_since()) == without_at(report.events)


def test_committed_events_are_the_same_live_and_from_the_log(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # A clock that ticks at every reading, so the outcome does not depend on whether
    # two readings fall within the same millisecond.
    ticks = iter(range(60))

    def clock() -> str:
        return f"2030-01-01T00:00:{next(ticks):02d}.000Z"

    import kernos.audit.record
    import kernos.image.changes

    monkeypatch.setattr(kernos.image.changes, "utc_now", clock)
    monkeypatch.setattr(kernos.audit.record, "utc_now", clock)
    report = env.run("bus.emit('a', 1)\nbus.emit('b', 2)")
    assert env.image.audit.events_since() == report.events


def test_handlers_get_a_copy_of_the_payload(env: Env) -> None:
    env.run("seen_by_second = []\n"
            "def vandal(event):\n"
            "    event.payload['items'].append('vandal')\n"
            "def second(event):\n"
            "    seen_by_second.append(list(event.payload['items']))\n"
            "bus.subscribe('t', vandal)\nbus.subscribe('t', second)")
    payload = {"items": [1]}
    op = env.image.begin(source="bus.emit('t', payload)")
    event = env.bus.emit("t", payload)
    payload["items"].append("after emit")  # the recorded payload is fixed at emit
    report = op.commit()
    assert payload == {"items": [1, "after emit"]}
    assert event.payload == {"items": [1]}
    assert report.events[0]["payload"] == {"items": [1]}
    assert env.ns["seen_by_second"] == [[1]]  # each subscriber gets its own copy


# -- limits ---------------------------------------------------------------------------------

LOOP = """
depths = []
def loop(event):
    depths.append(event.depth)
    bus.emit("loop.again", {"depth": event.depth + 1})
sid = bus.subscribe("loop.*", loop)
"""


def test_a_cascade_past_max_depth_vetoes_the_op_and_rolls_everything_back(env: Env) -> None:
    env.run(LOOP + "counter = 0")
    before = env.user()
    subscriptions_before = env.bus.list()
    records_before = len(env.image.audit)
    source = ("counter += 1\nfresh = 'new'\n"
              "def extra(event):\n    pass\n"
              "bus.subscribe('other.*', extra)\n"
              "bus.unsubscribe('s1')\n"
              "bus.subscribe('loop.*', loop)\n"
              "try:\n    bus.emit('loop.start')\nexcept Exception as error:\n"
              "    caught = error\n")
    op = env.image.begin(source=source)
    exec(source, env.ns)
    caught = env.ns["caught"]
    assert isinstance(caught, EventCascadeTooDeep)
    assert caught.limit == MAX_DEPTH and caught.op == op.id
    assert caught.topic == "loop.again"
    assert caught.depth == MAX_DEPTH  # the refused event would have been at depth 8 (0-based)
    assert "rolls back" in str(caught)
    assert env.ns["depths"] == list(range(MAX_DEPTH))  # delivered at depths 0..MAX_DEPTH-1
    with pytest.raises(OpVetoed) as vetoed:
        op.commit()  # the code caught the error, the op is vetoed anyway
    assert vetoed.value.op == op.id
    assert env.user() == before
    assert "fresh" not in env.ns and "caught" not in env.ns and "extra" not in env.ns
    assert env.bus.list() == subscriptions_before
    assert env.image.current is None
    record = env.image.audit.read(records_before)
    assert (record["op"], record["status"], record["events"]) == (op.id, "vetoed", [])
    assert record["attempted_events"] == MAX_DEPTH
    assert env.image.audit.events_since() == []
    # the image is usable, and a restart sees the pre-op state
    env.reopen()
    assert env.user() == before
    assert env.bus.list() == subscriptions_before


def test_a_subscriber_that_swallows_the_cascade_error_cannot_save_the_op(env: Env) -> None:
    env.run("swallowed = []\n"
            "def loop(event):\n"
            "    try:\n"
            "        bus.emit('loop.again')\n"
            "    except Exception as error:\n"
            "        swallowed.append(type(error).__name__)\n"
            "bus.subscribe('loop.*', loop)")
    op = env.image.begin(source="bus.emit('loop.start')")
    env.bus.emit("loop.start")  # returns normally: the deepest subscriber caught the error
    assert env.ns["swallowed"] == ["EventCascadeTooDeep"]
    with pytest.raises(OpVetoed, match="nest at most 8 deep"):
        op.commit()
    assert env.ns["swallowed"] == []
    assert op_records(env)[-1]["status"] == "vetoed"


def test_an_outer_subscriber_that_swallows_a_failure_cannot_save_the_op(env: Env) -> None:
    env.run("def inner(event):\n    raise RuntimeError('inner')\n"
            "def outer(event):\n"
            "    try:\n        bus.emit('inner')\n"
            "    except Exception:\n        pass\n"
            "bus.subscribe('inner', inner)\nbus.subscribe('outer', outer)\nvalue = 1")
    op = env.image.begin(source="value = 2; bus.emit('outer')")
    env.ns["value"] = 2
    env.bus.emit("outer")
    with pytest.raises(OpVetoed, match="subscriber s1"):
        op.commit()
    assert env.ns["value"] == 1
    assert op_records(env)[-1]["status"] == "failed"


def test_a_cascade_that_stays_within_max_depth_commits(env: Env) -> None:
    env.run("depths = []\n"
            "def step(event):\n"
            "    depths.append(event.depth)\n"
            "    if event.payload < MAX - 1:\n"
            "        bus.emit('chain.next', event.payload + 1)\n"
            "bus.subscribe('chain.*', step)\n"
            f"MAX = {MAX_DEPTH}")
    report = env.run("bus.emit('chain.first', 0)")
    assert env.ns["depths"] == list(range(MAX_DEPTH))
    assert [e["depth"] for e in report.events] == list(range(MAX_DEPTH))
    assert [e["payload"] for e in report.events] == list(range(MAX_DEPTH))


def test_more_than_max_events_in_one_op_vetoes_it(env: Env) -> None:
    env.run("kept = 1")
    op = env.image.begin(source="for i in range(MAX_EVENTS + 1): bus.emit('many', i)")
    for number in range(MAX_EVENTS):
        env.bus.emit("many", number)
    env.ns["scratch"] = "discarded"
    with pytest.raises(EventCascadeTooDeep, match=f"more than {MAX_EVENTS} events"):
        env.bus.emit("many", MAX_EVENTS)
    assert len(op.events) == MAX_EVENTS
    with pytest.raises(OpVetoed, match=f"more than {MAX_EVENTS} events"):
        op.commit()
    assert "scratch" not in env.ns and env.ns["kept"] == 1
    record = op_records(env)[-1]
    assert (record["status"], record["events"], record["attempted_events"]) == (
        "vetoed", [], MAX_EVENTS)
    assert env.image.audit.events_since() == []


# -- failing subscribers --------------------------------------------------------------------


def test_a_failing_subscriber_vetoes_the_op_even_if_the_emitter_catches_it(env: Env) -> None:
    env.run("total = 0\nseen = []\n"
            "def count(event):\n    global total\n    total += event.payload\n"
            "    seen.append(event.payload)\n"
            "def picky(event):\n"
            "    if event.payload > 10:\n        raise ValueError('too big: %d' % event.payload)\n"
            "bus.subscribe('n', count)\nbus.subscribe('n', picky)")
    env.run("bus.emit('n', 5)")
    before = env.user()
    assert before["total"] == 5
    source = ("fresh = 1\ntry:\n    bus.emit('n', 50)\nexcept Exception as error:\n"
              "    caught = error\n")
    op = env.image.begin(source=source)
    exec(source, env.ns)
    caught = env.ns["caught"]
    assert isinstance(caught, SubscriberFailed)
    assert (caught.subscription, caught.principal, caught.topic, caught.cause_name) == (
        "s2", "human", "n", "ValueError")
    assert isinstance(caught.__cause__, ValueError)
    assert "too big: 50" in str(caught) and "unsubscribe('s2')" in str(caught)
    assert env.ns["total"] == 55  # count ran before picky failed
    with pytest.raises(OpVetoed):
        op.commit()
    assert env.user() == before
    assert "fresh" not in env.ns
    record = op_records(env)[-1]
    assert (record["status"], record["events"], record["attempted_events"]) == (
        "failed", [], 1)
    assert [e["payload"] for e in env.image.audit.events_since()] == [5]
    assert env.reopen().user() == before


def test_an_interrupted_subscriber_propagates_and_the_op_is_recorded_interrupted(
        env: Env) -> None:
    env.run("def stop(event):\n    raise KeyboardInterrupt\nbus.subscribe('halt', stop)\n"
            "value = 1")
    with pytest.raises(KeyboardInterrupt):
        env.run("value = 2\nbus.emit('halt')")
    assert env.ns["value"] == 1
    assert op_records(env)[-1]["status"] == "interrupted"


# -- subscriptions live in the image --------------------------------------------------------


def test_subscribing_commits_and_rolls_back_with_the_op(env: Env) -> None:
    env.run("def on(event):\n    pass")
    assert SUBSCRIPTIONS not in env.image.system

    op = env.image.begin(source="bus.subscribe('a.*', on)")
    assert env.bus.subscribe("a.*", env.ns["on"]) == "s1"
    op.abort()
    assert env.bus.list() == []
    assert SUBSCRIPTIONS not in env.image.system

    op = env.image.begin(source="bus.subscribe('a.*', on)")
    assert env.bus.subscribe("a.*", env.ns["on"]) == "s1"  # the rolled-back id is reused
    report = op.commit()
    assert SUBSCRIPTIONS in report.added
    listed = env.bus.list()
    assert listed == [{"id": "s1", "pattern": "a.*", "principal": "human", "handler": "on",
                       "op": report.op}]

    op = env.image.begin(source="bus.unsubscribe('s1')")
    env.bus.unsubscribe("s1")
    assert env.bus.list() == []
    op.abort(error=("ValueError", "changed my mind"))
    assert env.bus.list() == listed

    env.reopen()
    assert env.bus.list() == listed
    report = env.run("bus.unsubscribe('s1')")
    assert report.changed == [SUBSCRIPTIONS]
    assert env.bus.list() == []
    env.reopen()
    assert env.bus.list() == []
    # ids are never reused once committed
    env.run("sid = bus.subscribe('a.*', on)")
    assert env.ns["sid"] == "s2"


def test_unsubscribing_an_unknown_id_is_a_usage_error_listing_the_known_ones(env: Env) -> None:
    env.run("def on(event):\n    pass\nbus.subscribe('a', on)\nbus.subscribe('b', on)")
    with pytest.raises(UsageError, match=r"'s9'.*yours: s1, s2"):
        env.run("bus.unsubscribe('s9')")
    with pytest.raises(UsageError, match="there is no subscription"):
        env.run("bus.unsubscribe(1)")
    assert [sub["id"] for sub in env.bus.list()] == ["s1", "s2"]


@pytest.mark.parametrize("pattern", ["ord*", "**.x", "", "a..b"])
def test_subscribing_with_a_bad_pattern_changes_nothing(env: Env, pattern: str) -> None:
    env.run("def on(event):\n    pass")
    op = env.image.begin(source="bus.subscribe(pattern, on)")
    with pytest.raises(EventError, match="is not a topic pattern"):
        env.bus.subscribe(pattern, env.ns["on"])
    assert SUBSCRIPTIONS not in env.image.system
    report = op.commit()
    assert SUBSCRIPTIONS not in report.added


def test_subscribing_something_not_callable_is_a_usage_error(env: Env) -> None:
    op = env.image.begin(source="bus.subscribe('a', 42)")
    with pytest.raises(UsageError, match="callable"):
        env.bus.subscribe("a", 42)
    op.abort()


def test_subscriptions_and_handlers_survive_a_restart(env: Env) -> None:
    env.run("received = []\n"
            "def on_order(event):\n"
            "    received.append((event.topic, event.payload['id'], event.principal))\n"
            "sid = bus.subscribe('orders.*', on_order)")
    env.run("bus.emit('orders.created', {'id': 1})")
    env.reopen()
    assert [sub["id"] for sub in env.bus.list()] == ["s1"]
    handler = env.image.system[SUBSCRIPTIONS].items["s1"].handler  # type: ignore[attr-defined]
    assert handler.__globals__ is env.ns  # bound to the new namespace, not the old one
    report = env.run("bus.emit('orders.paid', {'id': 2})")
    assert env.ns["received"] == [("orders.created", 1, "human"), ("orders.paid", 2, "human")]
    assert "received" in report.changed
    env.reopen()
    assert env.ns["received"] == [("orders.created", 1, "human"), ("orders.paid", 2, "human")]


# -- in-image subscriber changes (I1) -------------------------------------------------------

TOTALS = """
totals = {}
history = []
def on_sale(event):
    customer = event.payload["customer"]
    totals[customer] = totals.get(customer, 0) + event.payload["amount"]
    history.append(event.payload["amount"])
bus.subscribe("sales.*", on_sale)
"""


def test_changes_a_subscriber_makes_commit_with_the_op(env: Env) -> None:
    env.run(TOTALS)
    report = env.run("bus.emit('sales.new', {'customer': 'c-1', 'amount': 30})")
    assert sorted(report.changed) == ["history", "totals"]  # the op's code names neither
    env.reopen()
    assert env.ns["totals"] == {"c-1": 30} and env.ns["history"] == [30]


def test_changes_a_subscriber_makes_roll_back_with_the_op(env: Env) -> None:
    env.run(TOTALS)
    env.run("bus.emit('sales.new', {'customer': 'c-1', 'amount': 30})")
    before = env.user()
    op = env.image.begin(source="bus.emit('sales.new', {'customer': 'c-2', 'amount': 5})")
    env.bus.emit("sales.new", {"customer": "c-1", "amount": 7})
    env.bus.emit("sales.new", {"customer": "c-2", "amount": 5})
    assert env.ns["totals"] == {"c-1": 37, "c-2": 5}
    op.abort(error=RuntimeError("later failure"))
    assert env.user() == before
    assert env.ns["totals"] == {"c-1": 30} and env.ns["history"] == [30]
    assert op_records(env)[-1]["status"] == "failed"
    assert env.reopen().user() == before


def test_rollback_restores_subscriptions_a_subscriber_changed(env: Env) -> None:
    env.run("def once(event):\n    bus.unsubscribe(event.payload)\n"
            "def added(event):\n    pass\n"
            "def grow(event):\n    bus.subscribe('new.*', added)\n"
            "bus.subscribe('remove', once)\nbus.subscribe('grow', grow)")
    listed = env.bus.list()
    op = env.image.begin(source="bus.emit('remove', 's1'); bus.emit('grow')")
    env.bus.emit("remove", "s1")
    env.bus.emit("grow")
    assert [sub["id"] for sub in env.bus.list()] == ["s2", "s3"]
    op.abort()
    assert env.bus.list() == listed
    assert env.reopen().bus.list() == listed


# -- payloads -------------------------------------------------------------------------------


class Color(enum.IntEnum):
    RED = 1


def cyclic_list() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def cyclic_dict() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = {"again": value}
    return value


def deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("payload, problem", [
    ((1, 2), "payload is a tuple, which is not JSON (use a list)"),
    ({"items": (1, 2)}, "payload['items'] is a tuple"),
    ({1, 2}, "payload is a set"),
    (frozenset({1}), "payload is a frozenset"),
    (float("nan"), "payload is nan"),
    ({"x": [1.0, float("inf")]}, "payload['x'][1] is inf"),
    ({1: "one"}, "the key 1 of type int"),
    ({("a",): 1}, "of type tuple"),
    (object(), "payload is an object"),
    ({"when": types.SimpleNamespace()}, "is a SimpleNamespace"),
    (b"bytes", "payload is a bytes"),
    (Color.RED, "payload is a Color"),
    (deep(33), "nests deeper than 32 levels"),
    ("x" * (MAX_PAYLOAD_BYTES - 1), "over the limit"),
    (cyclic_list(), "nests deeper than 32 levels"),
    (cyclic_dict(), "nests deeper than 32 levels"),
    ({"$personal": {"subject": "c-1"}}, "reserves"),
    ({"ok": [{"$erased": True}]}, "the key '$erased', which Kernos reserves"),
])
def test_a_payload_that_is_not_plain_json_is_refused_and_changes_nothing(
        env: Env, payload: object, problem: str) -> None:
    env.run("calls = []\ndef on(event):\n    calls.append(1)\nbus.subscribe('t', on)")
    before = env.user()
    op = env.image.begin(source="bus.emit('t', payload)")
    with pytest.raises(EventError) as caught:
        env.bus.emit("t", payload)
    assert problem in str(caught.value)
    assert op.events == [] and env.ns["calls"] == []
    report = op.commit()  # the emitter may carry on: nothing of the refused event remains
    assert report.events == [] and report.changed == []
    assert env.user() == before
    assert op_records(env)[-1]["events"] == []
    assert env.image.audit.events_since() == []


def test_payload_limits_are_inclusive(env: Env) -> None:
    at_limit = "x" * (MAX_PAYLOAD_BYTES - 2)  # two quotes make it exactly the limit
    op = env.image.begin(source="bus.emit(...)")
    env.bus.emit("big", at_limit)
    env.bus.emit("deep", deep(32))
    report = op.commit()
    assert [e["topic"] for e in report.events] == ["big", "deep"]
    assert report.events[0]["payload"] == at_limit
    assert report.events[1]["payload"] == deep(32)


def test_an_invalid_topic_is_refused_before_delivery(env: Env) -> None:
    env.run("calls = []\ndef on(event):\n    calls.append(1)\nbus.subscribe('**', on)")
    op = env.image.begin(source="bus.emit('orders.*')")
    for topic in ["orders.*", "", "a..b", None]:
        with pytest.raises(EventError):
            env.bus.emit(topic)
    assert op.events == [] and env.ns["calls"] == []
    op.commit()


# -- the durable log ------------------------------------------------------------------------


def test_events_of_aborted_ops_never_appear_in_the_log(env: Env) -> None:
    env.run("def fail(event):\n    raise ValueError('no')\nbus.subscribe('bad.*', fail)")
    env.run("bus.emit('ok.one', 1)")
    op = env.image.begin(source="bus.emit('aborted.two', 2)")
    env.bus.emit("aborted.two", 2)
    op.abort(error=("RuntimeError", "crash"))
    with pytest.raises(SubscriberFailed):
        env.run("bus.emit('aborted.three', 3)\nbus.emit('bad.x', 3)")
    op = env.image.begin(source="bus.emit('aborted.four', 4)")
    env.bus.emit("aborted.four", 4)
    op.veto("no, thanks")
    with pytest.raises(OpVetoed):
        op.commit()
    env.run("bus.emit('ok.five', 5)")

    def check(events: list[dict[str, Any]]) -> None:
        assert [(e["topic"], e["payload"]) for e in events] == [("ok.one", 1), ("ok.five", 5)]
        assert [e["seq"] for e in events] == [1, 2]  # aborted events consume no numbers

    check(env.image.audit.events_since())
    statuses = [r["status"] for r in op_records(env)]
    assert statuses == ["committed", "committed", "failed", "failed", "vetoed", "committed"]
    assert [r["attempted_events"] for r in op_records(env)] == [0, 0, 1, 2, 1, 0]
    check(env.reopen().image.audit.events_since())


@pytest.fixture
def log_env(env: Env) -> tuple[Env, list[CommitReport]]:
    """Four committed ops with events from two principals; one rolled-back op between."""
    reports = [env.run("bus.emit('orders.created', {'id': 1})\n"
                       "bus.emit('orders.paid', {'id': 1})")]
    op = env.image.begin(source="bus.emit('orders.created', {'id': 99})")
    env.bus.emit("orders.created", {"id": 99})
    op.abort()
    reports.append(env.run("bus.emit('ledger.debit', {'amount': 3})"))
    reports.append(env.run("bus.emit('orders.created', {'id': 2})", principal="alice"))
    reports.append(env.run("bus.emit('ledger.credit', {'blob': 'z' * 2000})"))
    return env, reports


def summary(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(e["seq"], e["topic"]) for e in events]


ALL = [(1, "orders.created"), (2, "orders.paid"), (3, "ledger.debit"),
       (4, "orders.created"), (5, "ledger.credit")]


def test_events_since_returns_committed_events_oldest_first(
        log_env: tuple[Env, list[CommitReport]]) -> None:
    env, reports = log_env
    log = env.image.audit
    events = log.events_since()
    assert summary(events) == ALL
    assert [e["op"] for e in events] == [reports[0].op, reports[0].op, reports[1].op,
                                         reports[2].op, reports[3].op]
    assert [e["commit"] for e in events] == [reports[0].commit, reports[0].commit,
                                             reports[1].commit, reports[2].commit,
                                             reports[3].commit]
    assert events[3]["principal"] == "alice"
    assert events[4]["payload"] == {"blob": "z" * 2000}  # stored by reference, resolved
    record = log.read(reports[3].audit["index"])
    assert "ref" in record["events"][0] and "payload" not in record["events"][0]
    assert INLINE_PAYLOAD_BYTES < 2000 and len(record["events"][0]["ref"]) == 64
    assert without_at([e for r in reports for e in r.events]) == without_at(events)
    assert summary(log.events_since(0)) == ALL


@pytest.mark.parametrize("kwargs, expected", [
    ({"seq": 2}, ALL[2:]),                                  # exclusive cursor
    ({"seq": 1}, ALL[1:]),
    ({"seq": 5}, []),
    ({"seq": 50}, []),
    ({"topic": "orders.*"}, [ALL[0], ALL[1], ALL[3]]),
    ({"topic": "orders.created"}, [ALL[0], ALL[3]]),
    ({"topic": "ledger.**"}, [ALL[2], ALL[4]]),
    ({"topic": "nothing"}, []),
    ({"principal": "alice"}, [ALL[3]]),
    ({"principal": "human"}, [ALL[0], ALL[1], ALL[2], ALL[4]]),
    ({"principal": "nobody"}, []),
    ({"limit": 2}, ALL[:2]),
    ({"seq": 1, "limit": 2}, ALL[1:3]),
    ({"seq": 1, "topic": "orders.**", "limit": 1}, [ALL[1]]),
    ({"topic": "**", "principal": "human", "seq": 2}, [ALL[2], ALL[4]]),
])
def test_events_since_filters(log_env: tuple[Env, list[CommitReport]],
                              kwargs: dict[str, Any], expected: list[tuple[int, str]]) -> None:
    env, _ = log_env
    seq = kwargs.pop("seq", None)
    assert summary(env.image.audit.events_since(seq, **kwargs)) == expected


def test_events_since_with_limit_zero_returns_nothing(
        log_env: tuple[Env, list[CommitReport]]) -> None:
    env, _ = log_env
    assert env.image.audit.events_since(limit=0) == []


def test_events_since_an_op_returns_the_events_of_later_ops(
        log_env: tuple[Env, list[CommitReport]]) -> None:
    env, reports = log_env
    log = env.image.audit
    assert summary(log.events_since(op=0)) == ALL
    assert summary(log.events_since(op=reports[0].op)) == ALL[2:]
    assert summary(log.events_since(op=reports[0].op + 1)) == ALL[2:]  # the aborted op
    assert summary(log.events_since(op=reports[2].op)) == ALL[4:]
    assert summary(log.events_since(op=reports[3].op)) == []


def test_events_since_with_a_bad_topic_pattern_is_an_event_error(
        log_env: tuple[Env, list[CommitReport]]) -> None:
    env, _ = log_env
    with pytest.raises(EventError):
        env.image.audit.events_since(topic="orders.*x")


def test_events_since_is_the_same_after_a_restart(
        log_env: tuple[Env, list[CommitReport]]) -> None:
    env, _ = log_env
    before = env.image.audit.events_since()
    env.reopen()
    assert env.image.audit.events_since() == before
    report = env.run("bus.emit('after.restart')")
    assert report.events[0]["seq"] == len(ALL) + 1


def test_the_emitting_principal_is_the_op_principal_unless_given(env: Env) -> None:
    op = env.image.begin(source="...", principal="alice")
    first = env.bus.emit("a")
    second = env.bus.emit("b", principal="bob")
    report = op.commit()
    assert (first.principal, second.principal) == ("alice", "bob")
    assert [e["principal"] for e in report.events] == ["alice", "bob"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8).filter(lambda key: not key.startswith("$")),
                      children, max_size=4),
    max_leaves=20)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=JSON)
def test_any_plain_json_payload_comes_back_from_the_log_unchanged(
        env: Env, payload: Any) -> None:
    op = env.image.begin(source="bus.emit('json.any', payload)")
    event = env.bus.emit("json.any", payload)
    report = op.commit()
    assert event.payload == payload
    assert report.events[0]["payload"] == payload
    last = env.image.audit.events_since(report.events[0]["seq"] - 1)
    assert [e["payload"] for e in last] == [payload]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.recursive(
    st.tuples(st.integers()) | st.sets(st.integers(), min_size=1, max_size=2)
    | st.just(float("nan")) | st.just(b"x"),
    lambda children: st.lists(children, min_size=1, max_size=3)
    | st.dictionaries(st.text(max_size=4).filter(lambda key: not key.startswith("$")),
                      children, min_size=1, max_size=3),
    max_leaves=6))
def test_a_payload_with_any_non_json_part_is_refused(env: Env, payload: Any) -> None:
    op = env.image.begin(source="bus.emit('json.bad', payload)")
    try:
        with pytest.raises(EventError, match="JSON"):
            env.bus.emit("json.bad", payload)
        assert op.events == []
    finally:
        op.abort()


def test_a_reopen_does_not_make_the_subscriptions_look_changed(tmp_path: Path) -> None:
    """The subscriptions pickle to the same bytes after a restore (no spurious version)."""
    import types

    def session() -> tuple[Workspace, dict[str, object], Image, EventBus]:
        module = types.ModuleType("__main__")
        workspace = Workspace.open(tmp_path / "ws")
        image = Image(workspace, module.__dict__, module=module)
        image.restore()
        return workspace, module.__dict__, image, EventBus(image)

    workspace, ns, image, bus = session()
    source = "seen = {}\ndef remember(event):\n    seen['last'] = event.payload"
    op = image.begin(source=source)
    exec(source, ns)
    op.commit()
    op = image.begin(source="subscribe")
    bus.subscribe("a.*", ns["remember"])
    op.commit()
    op = image.begin(source="emit")
    bus.emit("a.b", 1)
    assert op.commit().changed == ["seen"]
    workspace.close()
    workspace, ns, image, bus = session()
    op = image.begin(source="emit")
    bus.emit("a.b", 1)  # the same value again: nothing changes
    report = op.commit()
    assert report.changed == [] and report.added == []
    workspace.close()
