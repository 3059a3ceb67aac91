"""Kernos events through real kernels: in-image subscribers and the ``kernos.events`` comm.

Cells are real ``execute_request``s.  External subscribers are ``kernos.events``
comms read by ``events_support.Feed``, which keeps every comm message whatever its
parent.  What must hold (invariant I1 of docs/invariants.md, and events):

* an in-image subscriber runs inside the emitting op: its changes commit and roll
  back with that op, survive ``kill -9`` only if the op committed, and a failing
  subscriber (or a cascade past the depth limit) vetoes the op;
* an external subscriber sees an event only after its op committed, never one of a
  rolled-back op, each once, in commit order, and after a disconnect, a restart or a
  crash between the commit and the notification it gets exactly what it missed;
* agent subscribers run as their agent, with its grants.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents_support import agent, committed, denials, fails
from events_support import Feed, KernelDied
from support import canon

pytestmark = pytest.mark.kernel

# The fields of an event that are the same however a subscriber gets it.
STABLE = ("seq", "topic", "payload", "principal", "op", "depth", "commit")


def stable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: event[key] for key in STABLE} for event in events]


def brief(events: list[dict[str, Any]]) -> list[tuple[int, str, Any, int]]:
    """(seq, topic, payload, depth) of each event."""
    return [(event["seq"], event["topic"], event["payload"], event["depth"]) for event in events]


def op_records(kernel: Any, op: int) -> list[dict[str, Any]]:
    """The audit records of op ``op`` (read in the kernel, through ``audit.records``)."""
    return [record for record in kernel.value(f"audit.records(since_op={op - 1}, limit=None)")
            if record["op"] == op]


def feed_commits(feed: Feed, code: str) -> Any:
    cell = feed.run(code)
    assert cell.status == "ok" and cell.committed, (code, cell.errors, cell.kernos)
    return cell


# -- 1. an in-image subscriber's changes commit and roll back with the op ------------------

def test_subscriber_changes_commit_and_roll_back_with_the_op(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace)
    committed(kernel, "totals = {'c-1': 0}\n"
                      "def add_order(event):\n"
                      "    totals[event.payload['customer']] += event.payload['amount']\n"
                      "print(events.subscribe('orders.*', add_order))")
    # The emitting cells never name `totals`: only the subscriber changes it.
    result = committed(kernel, "events.emit('orders.created', {'customer': 'c-1', 'amount': 30})")
    assert [event["payload"]["amount"] for event in result.kernos["events"]] == [30]
    assert kernel.value("totals") == {"c-1": 30}
    fails(kernel, "events.emit('orders.created', {'customer': 'c-1', 'amount': 5})\n"
                  "raise ValueError('after the emit')", "ValueError", "after the emit")
    assert kernel.value("totals") == {"c-1": 30}
    kernel.kill9()

    kernel = kernel_factory(workspace)
    assert kernel.value("totals") == {"c-1": 30}
    # The subscription was restored with the image: it still runs.
    committed(kernel, "events.emit('orders.paid', {'customer': 'c-1', 'amount': 1})")
    assert kernel.value("totals") == {"c-1": 31}
    fails(kernel, "events.emit('orders.created', {'customer': 'c-1', 'amount': 100})\n"
                  "1 / 0", "ZeroDivisionError")
    assert kernel.value("totals") == {"c-1": 31}
    kernel.kill9()

    kernel = kernel_factory(workspace)
    assert kernel.value("totals") == {"c-1": 31}
    assert [event["payload"]["amount"] for event in kernel.value("events.since(0)")] == [30, 1]


# -- 2. a subscriber that raises vetoes the op, even if the emitter catches it -------------

def test_failing_subscriber_vetoes_the_op_even_when_caught(kernel: Any) -> None:
    committed(kernel, "seen = []\n"
                      "def record(event):\n"
                      "    seen.append(event.topic)\n"
                      "def refuse(event):\n"
                      "    raise ValueError('no stock for ' + event.payload['sku'])\n"
                      "events.subscribe('stock.*', record)\n"
                      "events.subscribe('stock.reserved', refuse)\n"
                      "stock = {'sku-1': 3}")
    before = canon(kernel)

    result = fails(kernel, "stock['sku-1'] -= 1\nreserved = True\n"
                           "events.emit('stock.reserved', {'sku': 'sku-1'})",
                   "SubscriberFailed", "s2", "'stock.reserved'", "ValueError", "no stock for sku-1")
    assert result.kernos["status"] == "rolled back"
    assert canon(kernel) == before

    # The emitter catches the error: the op is rolled back anyway (vetoed).
    result = fails(kernel, "stock['sku-1'] -= 1\nreserved = True\n"
                           "try:\n"
                           "    events.emit('stock.reserved', {'sku': 'sku-1'})\n"
                           "except Exception as error:\n"
                           "    print('caught', type(error).__name__)",
                   "OpVetoed", "no stock for sku-1")
    assert "caught SubscriberFailed" in result.stdout
    assert canon(kernel) == before
    assert kernel.value("(stock, seen, 'reserved' in globals())") == ({"sku-1": 3}, [], False)
    vetoed_op = result.kernos["op"]
    assert [(record["status"], record["events"], record["attempted_events"])
            for record in op_records(kernel, vetoed_op)] == [("failed", [], 1)]
    assert kernel.value("events.since(0)") == []

    # Another topic reaches only `record`: that op commits, with the subscriber's change.
    committed(kernel, "events.emit('stock.counted', {'sku': 'sku-1'})")
    assert kernel.value("seen") == ["stock.counted"]


# -- 3. an external subscriber never sees a rolled-back op's events ------------------------

def test_external_subscriber_sees_only_committed_events_in_commit_order(kernel: Any) -> None:
    feed = Feed(kernel)
    comm = feed.open(since=0)
    assert feed.messages[comm] == [{"v": 1, "type": "ready", "cursor": 0}]
    only_a = feed.open(since=0, topic="a.*")

    feed_commits(feed, "def veto(event):\n    raise RuntimeError('vetoed')\n"
                       "events.subscribe('bad.**', veto)")
    expected: list[dict[str, Any]] = []
    steps = [
        ("events.emit('a.one', {'n': 1})", True),
        ("events.emit('a.lost', {'n': -1})\nraise KeyError('x')", False),
        ("events.emit('a.two', {'n': 2})\nevents.emit('b.three', [3, 'three'])", True),
        ("events.emit('a.lost', {'n': -2})\n"
         "try:\n    events.emit('bad.thing', None)\nexcept Exception:\n    pass", False),
        ("events.emit('a.lost', {'n': -3})\nevents.emit('bad..topic')", False),
        ("events.emit('c.four', None)\nevents.emit('c.five', 5.5)", True),
        ("import sys\nevents.emit('a.lost', {'n': -4})\nsys.exit(3)", False),
        ("events.emit('a.six', {'nested': {'list': [1, {'k': True}]}})", True),
    ]
    for code, commits in steps:
        cell = feed.run(code)
        assert cell.committed is commits, (code, cell.kernos, cell.errors)
        if commits:
            assert len(cell.kernos["events"]) >= 1
            expected += cell.kernos["events"]
        else:
            assert "events" not in cell.kernos, cell.kernos

    received = feed.events(comm)
    assert brief(received) == [
        (1, "a.one", {"n": 1}, 0),
        (2, "a.two", {"n": 2}, 0),
        (3, "b.three", [3, "three"], 0),
        (4, "c.four", None, 0),
        (5, "c.five", 5.5, 0),
        (6, "a.six", {"nested": {"list": [1, {"k": True}]}}, 0),
    ]
    assert stable(received) == stable(expected)
    assert feed.cursor(comm) == 6
    # One message per committed op, each after its commit, in commit order.
    batches = [data["events"] for data in feed.of_type(comm, "events")]
    assert [[event["seq"] for event in batch] for batch in batches] == [[1], [2, 3], [4, 5], [6]]
    assert len({event["op"] for event in received}) == 4
    assert not feed.of_type(comm, "error") and comm not in feed.closed
    assert [event["seq"] for event in feed.events(only_a)] == [1, 2, 6]
    # The durable log says the same.
    assert stable(feed.value("events.since(0)")) == stable(expected)


# -- 4. disconnect and reconnect -------------------------------------------------------------

def test_reconnect_gets_exactly_the_missed_events(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace)
    feed = Feed(kernel)
    first = feed.open(since=None)
    for number in range(3):
        feed_commits(feed, f"events.emit('tick.early', {{'n': {number}}})")
    assert [event["payload"]["n"] for event in feed.events(first)] == [0, 1, 2]
    last = feed.cursor(first)
    assert last == 3
    feed.close(first)
    seen_before_close = list(feed.messages[first])

    committed_events = []
    for number in range(100):
        cell = feed_commits(feed, f"events.emit('tick.missed', {{'n': {number}}})")
        assert len(cell.kernos["events"]) == 1
        committed_events += cell.kernos["events"]
    assert feed.messages[first] == seen_before_close  # nothing after its close

    again = feed.open(since=last)
    missed = feed.events(again)
    assert [event["payload"]["n"] for event in missed] == list(range(100))
    assert [event["seq"] for event in missed] == list(range(last + 1, last + 101))
    assert stable(missed) == stable(committed_events)
    assert len({event["op"] for event in missed}) == 100  # each its own committed op
    assert feed.of_type(again, "ready") == [{"v": 1, "type": "ready", "cursor": last + 100}]
    # Live events continue after the backlog, once each.
    feed_commits(feed, "events.emit('tick.live', {'n': 100})")
    assert [event["seq"] for event in feed.events(again)][-2:] == [last + 100, last + 101]
    feed.close(again)
    kernel.kill9()

    # A new kernel on the same workspace serves reconnections from the durable log.
    kernel = kernel_factory(workspace)
    feed = Feed(kernel)
    after_restart = feed.open(since=last)
    replayed = feed.events(after_restart)
    assert stable(replayed[:100]) == stable(committed_events)
    assert [event["seq"] for event in replayed] == list(range(last + 1, last + 102))
    everything = feed.open(since=0)
    assert [event["seq"] for event in feed.events(everything)] == list(range(1, last + 102))
    caught_up = feed.open(since=last + 101)
    assert feed.messages[caught_up] == [{"v": 1, "type": "ready", "cursor": last + 101}]
    # Sequence numbers carry on after the restart; no number is reused.
    feed_commits(feed, "events.emit('tick.restarted', {'n': 101})")
    assert brief(feed.events(caught_up)) == [(last + 102, "tick.restarted", {"n": 101}, 0)]
    assert brief(feed.events(after_restart))[-1] == (last + 102, "tick.restarted", {"n": 101}, 0)


def test_a_backlog_larger_than_a_batch_arrives_complete_and_in_order(kernel: Any) -> None:
    feed = Feed(kernel)
    cell = feed_commits(feed, "for i in range(1201):\n"
                              "    events.emit('bulk.even' if i % 2 == 0 else 'bulk.odd', i)")
    assert len(cell.kernos["events"]) == 1201
    for since, topic, payloads in [(0, None, range(1201)), (700, None, range(700, 1201)),
                                   (0, "bulk.odd", range(1, 1201, 2)),
                                   (1000, "bulk.even", range(1000, 1201, 2))]:
        comm = feed.open(since=since, topic=topic)
        received = feed.events(comm)
        assert [event["payload"] for event in received] == list(payloads), (since, topic)
        assert [event["seq"] for event in received] == [i + 1 for i in payloads]
        assert all(len(data["events"]) <= 500 for data in feed.of_type(comm, "events"))
        assert [data["type"] for data in feed.messages[comm]][-1] == "ready"


# -- 5. a cascade past the depth limit --------------------------------------------------------

def test_cascade_past_the_depth_limit_rolls_back_cleanly(kernel: Any) -> None:
    committed(kernel, "pings = []\n"
                      "def deeper(event):\n"
                      "    pings.append(event.depth)\n"
                      "    events.emit(event.topic + '.again', {'depth': event.depth + 1})\n"
                      "print(events.subscribe('ping.**', deeper))")
    before = canon(kernel)
    result = fails(kernel, "marker = 1\nevents.emit('ping', {'depth': 0})",
                   "EventCascadeTooDeep", "depth", "at most 8 deep")
    failed_op = result.kernos["op"]
    assert canon(kernel) == before
    assert kernel.value("(pings, 'marker' in globals())") == ([], False)
    assert kernel.value("events.since(0)") == []

    records = kernel.value("audit.records(status='vetoed')")
    assert [record["op"] for record in records] == [failed_op]
    record = records[0]
    assert record["events"] == [] and record["attempted_events"] == 8
    assert record["error"]["kind"] == "EventCascadeTooDeep"
    assert result.kernos["audit"]["index"] == record["index"]

    # The kernel keeps working, the subscription too (a shallow emit still runs it).
    committed(kernel, "events.unsubscribe('s1')\nevents.emit('ping', {'depth': 0})")
    result = committed(kernel, "events.emit('pong', {'ok': True})")
    assert [event["topic"] for event in result.kernos["events"]] == ["pong"]
    assert [event["topic"] for event in kernel.value("events.since(0)")] == ["ping", "pong"]


# -- 6. kill -9 between the commit and the notification ----------------------------------------

def test_crash_between_commit_and_notification_delivers_once_after_restart(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace)
    committed(kernel, "events.emit('orders.created', {'id': 1})")
    committed(kernel, "events.emit('orders.created', {'id': 2})")
    kernel.kill9()

    crashing = kernel_factory(workspace, env={"KERNOS_CRASH_AT": "notify"})
    feed = Feed(crashing)
    comm = feed.open(since=0)
    assert [event["payload"]["id"] for event in feed.events(comm)] == [1, 2]
    feed_commits(feed, "order = {'id': 3}")  # no events: no notification, no crash
    cursor = feed.cursor(comm)
    assert cursor == 2
    with pytest.raises(KernelDied):
        feed.run("order['paid'] = True\nevents.emit('orders.paid', {'id': 3})")
    assert not crashing.manager.is_alive()
    assert [event["seq"] for event in feed.events(comm)] == [1, 2]  # nothing for seq 3

    kernel = kernel_factory(workspace)
    feed = Feed(kernel)
    comm = feed.open(since=cursor)
    assert brief(feed.events(comm)) == [(3, "orders.paid", {"id": 3}, 0)]
    assert feed.cursor(comm) == 3
    assert feed.value("order") == {"id": 3, "paid": True}  # the op committed
    again = feed.open(since=feed.cursor(comm))
    assert feed.messages[again] == [{"v": 1, "type": "ready", "cursor": 3}]
    # The next commit is sent once to each open comm, numbered after the recovered one.
    feed_commits(feed, "events.emit('orders.shipped', {'id': 3})")
    assert [event["seq"] for event in feed.events(comm)] == [3, 4]
    assert [event["seq"] for event in feed.events(again)] == [4]


@pytest.mark.parametrize(("point", "happened"), [("sealed", False), ("published", True)])
def test_crash_inside_the_commit_publishes_the_event_only_if_the_op_happened(
        kernel_factory: Callable[..., Any], tmp_path: Path, point: str, happened: bool) -> None:
    # sealed: the audit record is written but the branch not moved (the op is voided at
    # restore); published: the branch moved (the op committed, its reply never sent).
    workspace = tmp_path / "ws"
    crashing = kernel_factory(workspace, env={"KERNOS_CRASH_AT": point})
    feed = Feed(crashing)
    comm = feed.open(since=0)
    with pytest.raises(KernelDied):
        feed.run("order = {'id': 1}\nevents.emit('orders.created', {'id': 1})")
    assert feed.events(comm) == []

    kernel = kernel_factory(workspace)
    feed = Feed(kernel)
    comm = feed.open(since=0)
    recovered = [(1, "orders.created", {"id": 1}, 0)] if happened else []
    assert brief(feed.events(comm)) == recovered
    assert feed.value("'order' in globals()") is happened
    feed_commits(feed, "events.emit('orders.created', {'id': 2})")
    received = feed.events(comm)
    assert brief(received[:-1]) == recovered
    assert received[-1]["payload"] == {"id": 2}
    # A voided op's sequence number is not given to another event.
    assert received[-1]["seq"] == 2
    assert [event["seq"] for event in feed.value("events.since(0)")] == [
        event["seq"] for event in received]


# -- 7. agent subscribers run as their agent ---------------------------------------------------

def test_agent_subscribers_run_with_their_own_grants(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace)
    committed(kernel, "seen = None\n%kernos agent add bob\n"
                      "%kernos grant bob subscribe:orders.*\n%kernos grant bob write:seen")
    result = committed(kernel, agent("bob", "def on_order(event):\n"
                                            "    write('seen', {'by': whoami(), "
                                            "'from': event['principal'], "
                                            "'id': event['payload']['id'], "
                                            "'depth': event['depth']})\n"
                                            "print(subscribe('orders.*', on_order))"))
    assert result.stdout == "s1\n"
    assert kernel.value("[(s['id'], s['principal'], s['pattern']) "
                        "for s in events.subscriptions()]") == [("s1", "bob", "orders.*")]

    # A human emits: bob's handler runs as bob, using bob's write grant.
    result = committed(kernel, "events.emit('orders.created', {'id': 7})")
    assert kernel.value("seen") == {"by": "bob", "from": "human", "id": 7, "depth": 0}
    [record] = op_records(kernel, result.kernos["op"])
    assert record["status"] == "committed"
    assert record["grants"]["used"] == [{"id": "g2", "capability": "write:seen"}]

    # Without the grant the emitting op is denied and rolls back.
    committed(kernel, "%kernos revoke bob write:seen")
    result = fails(kernel, "note = 'kept?'\nevents.emit('orders.created', {'id': 8})",
                   "SubscriberFailed", "s1", "CapabilityDenied", "write:seen")
    assert kernel.value("(seen['id'], 'note' in globals())") == (7, False)
    denied_op = result.kernos["op"]
    assert [record["status"] for record in op_records(kernel, denied_op)] == ["denied"]
    assert [(d["principal"], d["capability"]) for d in denials(kernel.workspace)
            if d["op"] == denied_op] == [("bob", "write:seen")]
    assert [event["payload"]["id"] for event in kernel.value("events.since(0)")] == [7]

    # An agent without a subscribe: grant cannot subscribe; the op rolls back.
    committed(kernel, "%kernos agent add carol")
    result = fails(kernel, agent("carol", "def handler(event):\n    pass\n"
                                          "extra = 1\nsubscribe('orders.*', handler)"),
                   "CapabilityDenied", "'carol'", "subscribe:orders.*")
    assert len(kernel.value("events.subscriptions()")) == 1
    assert kernel.value("dict(agents.namespace('carol'))") == {}
    # A subscribe: grant does not cover a wider pattern.
    committed(kernel, "%kernos grant carol subscribe:orders.created")
    fails(kernel, agent("carol", "def handler(event):\n    pass\nsubscribe('orders.*', handler)"),
          "CapabilityDenied", "subscribe:orders.*")
    assert len(kernel.value("events.subscriptions()")) == 1

    # An agent without an emit: grant cannot emit.
    fails(kernel, agent("carol", "emit('orders.created', {'id': 9})"),
          "CapabilityDenied", "'carol'", "emit:orders.created")
    committed(kernel, "%kernos grant carol emit:invoices.*")
    fails(kernel, agent("carol", "emit('orders.created', {'id': 9})"),
          "CapabilityDenied", "emit:orders.created")
    assert [event["payload"]["id"] for event in kernel.value("events.since(0)")] == [7]
    # With it, carol's event reaches bob's subscriber (who has his write grant back).
    committed(kernel, "%kernos grant carol emit:orders.*\n%kernos grant bob write:seen")
    committed(kernel, agent("carol", "emit('orders.created', {'id': 10})"))
    assert kernel.value("seen") == {"by": "bob", "from": "carol", "id": 10, "depth": 0}
    assert [(event["principal"], event["payload"]["id"])
            for event in kernel.value("events.since(0)")] == [("human", 7), ("carol", 10)]

    # Restored from the workspace, bob's handler still runs as bob, under his grants.
    kernel.kill9()
    kernel = kernel_factory(workspace)
    committed(kernel, "events.emit('orders.created', {'id': 11})")
    assert kernel.value("seen") == {"by": "bob", "from": "human", "id": 11, "depth": 0}
    committed(kernel, "%kernos revoke bob write:seen")
    fails(kernel, "events.emit('orders.created', {'id': 12})", "SubscriberFailed", "write:seen")
    assert kernel.value("seen")["id"] == 11


# -- 8. bad input ----------------------------------------------------------------------------

BAD_OPEN_DATA = [
    ({"v": 1, "since": "x"}, "'since'"),
    ({"v": 1, "since": -1}, "'since'"),
    ({"v": 1, "since": 0, "bogus": True}, "unknown fields ['bogus']"),
    ({"v": 1, "since": 0, "topic": "a..b"}, "'a..b' is not a topic pattern"),
    ({"v": 1, "since": 0, "topic": "a.**.b"}, "'**' may only be the last segment"),
    ({"v": 1, "since": 0, "topic": 7}, "a topic pattern is a string"),
    ({"v": 2}, "version 1"),
    ([1, 2], "must be an object"),
]


def test_comm_with_malformed_open_data_gets_an_error_and_is_closed(kernel: Any) -> None:
    feed = Feed(kernel)
    rejected = []
    for data, fragment in BAD_OPEN_DATA:
        comm = feed.open(data=data)
        assert [message["type"] for message in feed.messages[comm]] == ["error"], data
        assert fragment in feed.messages[comm][0]["error"], (data, feed.messages[comm])
        assert comm in feed.closed, data
        rejected.append(comm)
    # The kernel keeps working, and the rejected comms get nothing more.
    feed_commits(feed, "events.emit('still.working', 1)")
    assert all(len(feed.messages[comm]) == 1 for comm in rejected)
    good = feed.open(since=0, topic="still.*")
    assert brief(feed.events(good)) == [(1, "still.working", 1, 0)]
    assert good not in feed.closed


def test_a_cursor_past_the_last_event_is_refused_or_harmless(kernel: Any) -> None:
    feed = Feed(kernel)
    feed_commits(feed, "events.emit('orders.created', {'id': 1})")
    comm = feed.open(since=50)
    feed_commits(feed, "events.emit('orders.created', {'id': 2})")
    refused = feed.of_type(comm, "error") != [] and comm in feed.closed
    assert refused or [event["seq"] for event in feed.events(comm)] == [2], feed.messages[comm]


def test_bad_payloads_and_patterns_fail_with_event_error_and_change_nothing(kernel: Any) -> None:
    committed(kernel, "state = {'n': 1}\ndef handler(event):\n    state['n'] += 1\n"
                      "events.subscribe('ok.*', handler)")
    before = canon(kernel)
    for payload, path in [("(1, 2)", "payload is a tuple"),
                          ("{'k': {1, 2}}", "payload['k'] is a set"),
                          ("{'k': [1, object()]}", "payload['k'][1] is an object"),
                          ("{'k': float('nan')}", "payload['k']"),
                          ("{1: 'int key'}", "payload"),
                          ("{'$personal': 1}", "'$personal'")]:
        result = fails(kernel, f"state['n'] = 99\nnew_name = 1\n"
                               f"events.emit('ok.fine')\nevents.emit('ok.bad', {payload})",
                       "EventError", path)
        assert "events" not in result.kernos
    for pattern in ["a..b", "a.**.b", "ord*", "", "a." + ".".join(["x"] * 16)]:
        fails(kernel, f"new_name = 1\nevents.subscribe({pattern!r}, handler)",
              "EventError", "is not a topic pattern")
    fails(kernel, "events.emit('bad topic', 1)", "EventError", "is not a topic")
    assert canon(kernel) == before
    assert len(kernel.value("events.subscriptions()")) == 1
    assert kernel.value("events.since(0)") == []


# -- 9. delivery order -----------------------------------------------------------------------

def test_delivery_order_is_depth_first_in_creation_order(kernel: Any) -> None:
    feed = Feed(kernel)
    comm = feed.open(since=None)
    feed_commits(feed, "calls = []\n"
                       "def first(event):\n"
                       "    calls.append(('s1', event.topic, event.depth, event.index))\n"
                       "    if event.topic == 'a.x':\n"
                       "        events.emit('a.x.y', {'from': 's1'})\n"
                       "def second(event):\n"
                       "    calls.append(('s2', event.topic, event.depth, event.index))\n"
                       "events.subscribe('a.**', first)\n"
                       "events.subscribe('**', second)")
    cell = feed_commits(feed, "events.emit('a.x', {'n': 1})\nevents.emit('b.z', {'n': 2})")
    # s1 before s2 for each event; s1's nested emit is delivered fully (to s1, then s2)
    # before its emit returns, so s2 sees a.x only after the nested a.x.y.
    assert feed.value("calls") == [
        ("s1", "a.x", 0, 0),
        ("s1", "a.x.y", 1, 1),
        ("s2", "a.x.y", 1, 1),
        ("s2", "a.x", 0, 0),
        ("s2", "b.z", 0, 2),
    ]
    # Outside, events arrive in emission order with their depth.
    expected = [(1, "a.x", {"n": 1}, 0), (2, "a.x.y", {"from": "s1"}, 1), (3, "b.z", {"n": 2}, 0)]
    assert brief(feed.events(comm)) == expected
    assert brief(cell.kernos["events"]) == expected
    assert [event["principal"] for event in feed.events(comm)] == ["human"] * 3


# -- the same event, live or from the log ------------------------------------------------------

def test_an_event_is_the_same_live_and_from_the_log(kernel: Any) -> None:
    feed = Feed(kernel)
    live = feed.open(since=None)
    for number in range(5):
        feed_commits(feed, f"value = list(range(2000))\nevents.emit('same.event', {number})")
    from_log = feed.open(since=0)
    assert len(feed.events(live)) == 5
    assert feed.events(from_log) == feed.events(live)
    assert feed.value("events.since(0)") == feed.events(live)



def test_a_late_subscriber_can_ask_for_the_events_after_an_op(kernel: Any) -> None:
    """``{"op": N}`` replays the committed events of every op after op N, then goes live."""
    feed = Feed(kernel)
    ops = []
    for number in range(4):
        ops.append(feed_commits(feed, f"events.emit('tick.n', {number})").kernos["op"])
    feed.run("events.emit('tick.n', 99)\nraise ValueError('rolled back')")
    comm = feed.open(data={"v": 1, "op": ops[1]})
    assert [event["payload"] for event in feed.events(comm)] == [2, 3]
    assert [event["op"] for event in feed.events(comm)] == ops[2:]
    feed_commits(feed, "events.emit('tick.n', 4)")
    assert [event["payload"] for event in feed.events(comm)] == [2, 3, 4]
    both = feed.open(data={"v": 1, "op": 1, "since": 0})
    assert feed.of_type(both, "error") and both in feed.closed
