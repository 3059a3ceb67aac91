"""``events``: the human's Python API over the image's events.

In a Kernos notebook ``events`` is this object (the kernel's, never
persisted).  Emitting and subscribing are part of the cell's op::

    def on_order(event):
        totals[event.payload["customer"]] += event.payload["amount"]

    events.subscribe("orders.*", on_order)      # returns "s1"
    events.emit("orders.created", {"customer": "c-1", "amount": 30})

    events.since(0)                # every committed event, from the durable log
    events.since(op=12, topic="orders.**")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernos.audit.log import AuditLog
from kernos.events.bus import EventBus

__all__ = ["Events"]


class Events:
    """Emit events, manage in-image subscribers, and read committed events."""

    def __init__(self, bus: Callable[[], EventBus]) -> None:
        self._bus = bus

    @property
    def _log(self) -> AuditLog:
        return self._bus().image.audit

    def emit(self, topic: str, payload: object = None) -> None:
        """Emit an event from the running op; its subscribers run before this returns."""
        self._bus().emit(topic, payload)

    def subscribe(self, pattern: str, handler: Callable[..., Any] | None = None) -> Any:
        """Run ``handler(event)`` in every op that emits a matching event.

        Returns the subscription id; without ``handler``, a decorator.
        """
        if handler is None:
            def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
                self._bus().subscribe(pattern, function)
                return function

            return decorate
        return self._bus().subscribe(pattern, handler)

    def unsubscribe(self, subscription_id: str) -> None:
        self._bus().unsubscribe(subscription_id)

    def subscriptions(self) -> list[dict[str, object]]:
        return self._bus().list()

    def since(self, seq: int | None = None, *, op: int | None = None, topic: str | None = None,
              principal: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Committed events after sequence number ``seq`` (or after op ``op``), oldest first."""
        return self._log.events_since(seq, op=op, topic=topic, principal=principal, limit=limit)

    def __repr__(self) -> str:
        return "<kernos events: emit, subscribe, unsubscribe, subscriptions, since>"
