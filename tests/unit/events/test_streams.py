"""The ``kernos.events`` comm target (kernos.kernel.streams) on an in-process workspace.

A kernel announces an op's events once a sync made the op durable; with group
commit, an op's announcement may wait in a task while a later op, already
covered by a sync, is announced first (the loop driver does this between
iterations).  Every subscriber must still get every committed event, once, in
commit order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core_support import CoreEnv
from kernos.kernel.streams import EventStreams


class Comm:
    """What the kernel's comm records: the messages sent, and the handlers."""

    def __init__(self, comm_id: str) -> None:
        self.comm_id = comm_id
        self.sent: list[dict[str, Any]] = []

    def send(self, data: dict[str, Any]) -> None:
        self.sent.append(data)

    def on_close(self, handler: Any) -> None:
        pass

    def on_msg(self, handler: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def received(self) -> list[tuple[int, Any]]:
        return [(event["seq"], event["payload"]) for message in self.sent
                if message["type"] == "events" for event in message["events"]]


def subscribe(streams: EventStreams, topic: str | None = None) -> Comm:
    comm = Comm(f"c{len(streams.subscribers)}")
    streams.open(comm, {"content": {"data": {"v": 1, "since": None, "topic": topic}}})
    return comm


def test_an_op_announced_after_a_later_one_still_reaches_every_subscriber(
        tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    try:
        streams = EventStreams(lambda: env.image.audit)
        everything, some = subscribe(streams), subscribe(streams, "work.*")
        first = env.run("bus.emit('work.done', {'n': 1})")
        other = env.run("bus.emit('other.thing', {'n': 2})")
        third = env.run("bus.emit('work.done', {'n': 3})")
        streams.publish(third.events)  # durable first: announced at once
        streams.publish(first.events)  # its announcement waited for the sync
        streams.publish(other.events)
        assert everything.received() == [(1, {"n": 1}), (2, {"n": 2}), (3, {"n": 3})]
        assert some.received() == [(1, {"n": 1}), (3, {"n": 3})]
    finally:
        env.close()


def test_events_announced_in_order_are_sent_once_each(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    try:
        streams = EventStreams(lambda: env.image.audit)
        comm = subscribe(streams)
        for number in range(3):
            streams.publish(env.run(f"bus.emit('work.done', {{'n': {number}}})").events)
        streams.publish(env.run("x = 1").events)  # an op with no event
        assert comm.received() == [(1, {"n": 0}), (2, {"n": 1}), (3, {"n": 2})]
        assert len([m for m in comm.sent if m["type"] == "events"]) == 3
    finally:
        env.close()
