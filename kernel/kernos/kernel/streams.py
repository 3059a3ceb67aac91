"""The ``kernos.events`` comm target: committed events for external subscribers.

A harness, a widget or the JupyterLab panel opens a comm on the target
``kernos.events`` with::

    {"v": 1, "since": SEQ | null, "op": OP | null, "topic": PATTERN | null}

``since`` is the sequence number of the last event the subscriber has seen
(0 for "from the beginning"; null for "only what commits from now on").
Instead of ``since``, ``op`` asks for the events of every op after op OP.
The kernel answers on the comm with messages::

    {"v": 1, "type": "events", "events": [EVENT, ...], "cursor": SEQ}
    {"v": 1, "type": "ready", "cursor": SEQ}     after the backlog
    {"v": 1, "type": "error", "error": TEXT}     a bad request; the comm is closed

First the backlog: every committed event after ``since``, from the durable
audit log, in commit order, in batches.  Then ``ready``.  Then, after every
op that commits events, those events.  Each subscriber has a cursor: an
event is sent to it at most once, never before its op committed, and never
for an op that rolled back.  A subscriber that was disconnected (or whose
kernel died between a commit and the notification) reconnects with the
``cursor`` it last saw and gets exactly what it missed.

An EVENT is ``{"seq", "topic", "payload", "principal", "op", "depth",
"commit", "at"}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernos.audit.log import AuditLog
from kernos.audit.topics import compile_pattern, matches
from kernos.errors import EventError

__all__ = ["TARGET", "EventStreams"]

TARGET = "kernos.events"
VERSION = 1
BATCH = 500


@dataclass(kw_only=True)
class _Subscriber:
    comm: Any
    cursor: int
    pattern: tuple[str, ...] | None = None
    topic: str | None = None
    closed: bool = field(default=False)


class EventStreams:
    """Open ``kernos.events`` comms and what each has been sent."""

    def __init__(self, log: Any) -> None:
        self._log = log
        """Returns the audit log (the kernel may reattach its workspace)."""
        self.subscribers: dict[str, _Subscriber] = {}

    def open(self, comm: Any, message: dict[str, Any]) -> None:
        data = (message.get("content") or {}).get("data") or {}
        try:
            since, op, topic = _parse(data)
        except EventError as error:
            comm.send({"v": VERSION, "type": "error", "error": str(error)})
            comm.close()
            return
        log: AuditLog = self._log()
        last = log.next_seq - 1
        if since is not None and since > last:
            comm.send({"v": VERSION, "type": "error",
                       "error": f"'since' is {since}, but the last event is {last}: this cursor "
                                "is not from this workspace. Reconnect with a cursor it sent "
                                "you, or 0 for everything."})
            comm.close()
            return
        if op is not None:
            before = log.events_since(0, op=op, limit=1)
            since = before[0]["seq"] - 1 if before else last
        cursor = last if since is None else since
        subscriber = _Subscriber(comm=comm, cursor=cursor, topic=topic,
                                 pattern=compile_pattern(topic) if topic else None)
        self.subscribers[comm.comm_id] = subscriber
        comm.on_close(lambda _message: self._closed(comm.comm_id))
        comm.on_msg(lambda msg: self._message(subscriber, msg))
        self._send_backlog(subscriber, log)
        subscriber.cursor = max(subscriber.cursor, last)  # past filtered-out events too
        comm.send({"v": VERSION, "type": "ready", "cursor": subscriber.cursor})

    def _message(self, subscriber: _Subscriber, message: dict[str, Any]) -> None:
        subscriber.comm.send({"v": VERSION, "type": "error",
                              "error": "this comm only sends; open a new one to change "
                                       "'since' or 'topic'"})

    def _closed(self, comm_id: str) -> None:
        found = self.subscribers.pop(comm_id, None)
        if found is not None:
            found.closed = True

    def _send_backlog(self, subscriber: _Subscriber, log: AuditLog, *,
                      until: int | None = None) -> None:
        """Send what the log holds after the subscriber's cursor (up to seq ``until``)."""
        while True:
            batch = log.events_since(subscriber.cursor, topic=subscriber.topic, limit=BATCH)
            full = len(batch) == BATCH
            if until is not None:
                batch = [event for event in batch if event["seq"] <= until]
            if not batch:
                return
            self._send(subscriber, batch)
            if not full or (until is not None and subscriber.cursor >= until):
                return

    def _send(self, subscriber: _Subscriber, events: list[dict[str, Any]]) -> None:
        fresh = [event for event in events if event["seq"] > subscriber.cursor]
        if not fresh:
            return
        subscriber.cursor = fresh[-1]["seq"]
        subscriber.comm.send({"v": VERSION, "type": "events", "events": fresh,
                              "cursor": subscriber.cursor})

    def publish(self, events: list[dict[str, Any]]) -> None:
        """Send a just-committed op's events to every subscriber whose pattern matches."""
        if not events:
            return
        first, last = events[0]["seq"], events[-1]["seq"]
        for subscriber in list(self.subscribers.values()):
            if subscriber.cursor < first - 1:
                # Earlier ops' events are not announced yet: with group commit an op's
                # announcement may wait for its sync while a later op's goes out first.
                # They are durable too (syncs cover the log in order), so send them now,
                # from the log, rather than move the cursor past them for good.
                self._send_backlog(subscriber, self._log(), until=last)
            chosen = [event for event in events if subscriber.pattern is None
                      or matches(subscriber.pattern, event["topic"])]
            if chosen:
                self._send(subscriber, chosen)
            # A subscriber's cursor moves past events it filtered out, too.
            subscriber.cursor = max(subscriber.cursor, last)


def _parse(data: object) -> tuple[int | None, int | None, str | None]:
    if type(data) is not dict:
        raise EventError("the comm's open data must be an object like "
                         '{"v": 1, "since": 0, "topic": "orders.*"}')
    assert isinstance(data, dict)
    unknown = sorted(set(data) - {"v", "since", "op", "topic"})
    if unknown:
        raise EventError(f"unknown fields {unknown}; the fields are v, since, op and topic")
    if data.get("v", VERSION) != VERSION:
        raise EventError(f"this kernel speaks version {VERSION} of {TARGET}, not "
                         f"{data.get('v')!r}")
    since = data.get("since")
    if since is not None and (type(since) is not int or since < 0):
        raise EventError(f"'since' is the last sequence number seen (an int >= 0) or null, "
                         f"not {since!r}")
    op = data.get("op")
    if op is not None and (type(op) is not int or op < 0):
        raise EventError(f"'op' is an op number (an int >= 0) or null, not {op!r}")
    if op is not None and since is not None:
        raise EventError("give either 'since' (a sequence number) or 'op', not both")
    topic = data.get("topic")
    if topic is not None:
        compile_pattern(topic)
    return since, op, topic
