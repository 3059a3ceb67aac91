"""Events inside the image: emit, subscribe, and deliver within the op.

An op emits an :class:`Event`: a topic, a JSON payload, the emitting
principal and the op.  In-image subscribers are persistent callables
registered on a topic pattern (``kernos.audit.topics``); the registry of
subscriptions lives in the image (``kernos:events``), so subscribing and
unsubscribing commit and roll back like any other change.

Delivery, and its order
-----------------------
Delivery is synchronous and depth-first, inside the emitting op:

1. ``emit`` checks the topic and the payload, appends the event to the op's
   event list (this fixes its position, and later its sequence number), then
2. calls every active subscription whose pattern matches, in the order they
   were created (``s1``, ``s2``, ...), each under its own principal: a
   human's subscriber is trusted Python; an agent's is its own restricted
   code, run with that agent's grants and limits;
3. an event a subscriber emits is delivered, completely, before ``emit``
   returns to that subscriber (depth-first), one level deeper; it is the
   subscriber's event (its ``principal``), not the op's, also when the human's
   subscriber emits inside an agent's op.  Past
   :data:`MAX_DEPTH` levels, or :data:`MAX_EVENTS` events in one op, the op
   is vetoed and :class:`~kernos.errors.EventCascadeTooDeep` raised.

A subscriber that raises makes the op fail and vetoes it, so the op rolls
back with every event it emitted even if the emitter caught the error.

External subscribers never see these events directly: the audit log records
a committed op's events, in emission order, with global sequence numbers,
and they are published from there after the commit (``AuditLog.events_since``).

Personal values (``kernos.personal``) may appear in payloads.  Subscribers
in the image receive them as they are; the audit log stores such a payload
by reference, with each personal value sealed under its subject's key.
"""

from __future__ import annotations

import contextvars
import copy
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernos.audit.canonical import canonical, check_json
from kernos.audit.log import AuditLog
from kernos.audit.markers import seal_markers
from kernos.audit.topics import check_topic, compile_pattern, matches
from kernos.errors import (
    EventCascadeTooDeep,
    EventError,
    SubscriberFailed,
    UsageError,
)
from kernos.op import Op
from kernos.personal import Keyring, Personal

__all__ = [
    "MAX_DEPTH",
    "MAX_EVENTS",
    "MAX_PAYLOAD_BYTES",
    "SUBSCRIPTIONS",
    "BusImage",
    "Event",
    "EventBus",
    "Subscription",
    "Subscriptions",
]

SUBSCRIPTIONS = "kernos:events"
MAX_DEPTH = 8
"""Delivery depth: an event emitted by a subscriber of an event ... at most this deep."""
MAX_EVENTS = 10_000
"""Events one op may emit."""
MAX_PAYLOAD_BYTES = 1 << 20
"""Canonical size of one payload."""
HUMAN = "human"
_SUBSCRIBER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kernos_event_subscriber", default=None)
"""The principal of the subscriber running now, if one is: the human's subscriber runs
outside any agent's context, and what it emits is still not the op's principal's."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """One event, as in-image subscribers receive it."""

    topic: str
    """What happened, e.g. ``orders.created``."""
    payload: Any
    """Plain JSON data (a copy: changing it changes nothing else)."""
    principal: str
    """Who emitted it."""
    op: int
    """The op that emitted it."""
    index: int
    """Its position among the op's events."""
    depth: int
    """0 for an event the op's code emitted, 1 for one a subscriber emitted, ..."""


@dataclass(kw_only=True)
class Subscription:
    """A persistent subscriber."""

    id: str
    """``s1``, ``s2``, ...: also the delivery order."""
    pattern: str
    """The topic pattern."""
    principal: str
    """Who subscribed; the handler runs as this principal."""
    handler: Callable[..., Any]
    """Called with the event (an :class:`Event`; agents get a plain dict)."""
    op: int
    """The op that subscribed."""
    label: str = ""
    """What the handler is, for listings."""
    _compiled: tuple[str, ...] = field(default=(), repr=False)

    @property
    def compiled(self) -> tuple[str, ...]:
        if not self._compiled:
            self._compiled = compile_pattern(self.pattern)
        return self._compiled

    def describe(self) -> dict[str, object]:
        return {"id": self.id, "pattern": self.pattern, "principal": self.principal,
                "handler": self.label, "op": self.op}

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_compiled"] = ()
        return state


@dataclass(kw_only=True)
class Subscriptions:
    """The image's subscriptions (persisted as ``kernos:events``)."""

    items: dict[str, Subscription] = field(default_factory=dict)
    next_id: int = 1

    def __repr__(self) -> str:
        return f"<{len(self.items)} subscriptions>"

    def ordered(self) -> list[Subscription]:
        return sorted(self.items.values(), key=lambda sub: int(sub.id[1:]))


class BusImage(Protocol):
    """What the bus needs of its image (:class:`kernos.image.Image`): the running op, the
    runtime's own names, where the subscriptions persist, and the audit log, where
    committed events are read back (``kernos.events.human``)."""

    @property
    def current(self) -> Op | None: ...

    @property
    def audit(self) -> AuditLog: ...

    @property
    def system(self) -> dict[str, object]: ...

    @property
    def keyring(self) -> Keyring: ...

    def bind(self, name: str, value: object) -> None: ...


Runner = Callable[[str, Callable[..., Any], Any], None]
Authorizer = Callable[[str, str, str], None]


class EventBus:
    """Emits and delivers events inside the image's running op."""

    def __init__(self, image: BusImage, *, runner: Runner | None = None,
                 authorize: Authorizer | None = None,
                 principal: Callable[[], str | None] | None = None) -> None:
        self.image = image
        self.runner = runner
        """Runs an agent's handler as that agent (set by the agent runtime)."""
        self.authorize = authorize
        """Raises CapabilityDenied unless the principal holds ``kind:target``."""
        self.current_principal = principal
        """Who is running now, if not the op's principal (agent code, a subscriber)."""

    # -- state in the image -------------------------------------------------------

    @property
    def subscriptions(self) -> Subscriptions:
        found = self.image.system.get(SUBSCRIPTIONS)
        return found if isinstance(found, Subscriptions) else Subscriptions()

    def _mutable(self, op: Op) -> Subscriptions:
        found = self.image.system.get(SUBSCRIPTIONS)
        if not isinstance(found, Subscriptions):
            found = Subscriptions()
            self.image.bind(SUBSCRIPTIONS, found)
        op.touch(SUBSCRIPTIONS)
        return found

    def _op(self) -> Op:
        op = self.image.current
        if op is None:
            raise UsageError("events are emitted and subscribed to inside an op: do it from a "
                             "cell (or an op started with image.begin())")
        return op

    def _who(self, op: Op) -> str:
        found = self.current_principal() if self.current_principal is not None else None
        return found or _SUBSCRIBER.get() or op.principal

    # -- subscribing ----------------------------------------------------------------

    def subscribe(self, pattern: object, handler: object, *,
                  principal: str | None = None) -> str:
        op = self._op()
        principal = principal or self._who(op)
        compile_pattern(pattern)
        assert isinstance(pattern, str)
        if not callable(handler):
            raise UsageError(f"a subscriber is a callable taking the event, not "
                             f"{type(handler).__name__}")
        if principal != HUMAN:
            if self.authorize is not None:
                self.authorize(principal, "subscribe", pattern)
            if not _is_agent_function(handler, principal):
                raise UsageError(f"agent {principal!r} subscribes with a function its own code "
                                 "defined")
        subscriptions = self._mutable(op)
        sub_id = f"s{subscriptions.next_id}"
        subscriptions.next_id += 1
        # Fresh string objects: sharing them with the handler's own names would make
        # the subscriptions pickle differently once a restore has split them apart.
        label = "".join(str(getattr(handler, "__qualname__", type(handler).__name__))[:80])
        subscriptions.items[sub_id] = Subscription(
            id=sub_id, pattern="".join(pattern), principal="".join(principal), handler=handler,
            op=op.id, label=label)
        return sub_id

    def unsubscribe(self, sub_id: object, *, principal: str | None = None) -> None:
        op = self._op()
        principal = principal or self._who(op)
        found = self.subscriptions.items.get(sub_id) if type(sub_id) is str else None
        if found is None or (principal != HUMAN and found.principal != principal):
            known = [sub.id for sub in self.subscriptions.ordered()
                     if principal == HUMAN or sub.principal == principal]
            raise UsageError(f"there is no subscription {str(sub_id)[:40]!r} to remove; "
                             f"yours: {', '.join(known) or 'none'}")
        del self._mutable(op).items[found.id]

    def list(self) -> list[dict[str, object]]:
        return [sub.describe() for sub in self.subscriptions.ordered()]

    # -- emitting -------------------------------------------------------------------

    def emit(self, topic: object, payload: object = None, *,
             principal: str | None = None, by_runtime: bool = False) -> Event:
        """Emit ``topic`` in the current op, as ``principal`` (the op's, by default).

        ``by_runtime``: the runtime itself reports on ``principal`` (a loop's iteration),
        so no ``emit`` grant of that principal's is needed, yet the event is attributed to
        whom it is about.
        """
        op = self._op()
        principal = principal or self._who(op)
        check_topic(topic)
        assert isinstance(topic, str)
        if principal != HUMAN and self.authorize is not None and not by_runtime:
            self.authorize(principal, "emit", topic)
        stored = self.stored_form(payload)
        depth = op.event_depth
        if depth >= MAX_DEPTH or len(op.events) >= MAX_EVENTS:
            error = EventCascadeTooDeep(op.id, topic, depth, MAX_DEPTH)
            if depth < MAX_DEPTH:
                error.args = (f"op {op.id} emitted more than {MAX_EVENTS} events; the op rolls "
                              "back. Emit fewer, larger events.",)
            op.veto(str(error), status="vetoed")
            raise error
        event = Event(topic=topic, payload=copy.deepcopy(payload), principal=principal,
                      op=op.id, index=len(op.events), depth=depth)
        op.events.append((event, stored))
        targets = [sub for sub in self.subscriptions.ordered() if matches(sub.compiled, topic)]
        if targets:
            # Subscribers change names the op's own code never mentions: with the
            # subscriptions in its reach, the commit (and a rollback) widens it
            # through the code of every handler.
            op.touch(SUBSCRIPTIONS)
        op.event_depth += 1
        try:
            for sub in targets:
                if sub.id not in self.subscriptions.items:
                    continue  # an earlier subscriber removed it
                self._deliver(op, sub, event)
        finally:
            op.event_depth -= 1
        return event

    def _deliver(self, op: Op, sub: Subscription, event: Event) -> None:
        token = _SUBSCRIBER.set(sub.principal)  # what the handler emits is its principal's
        try:
            argument = dataclass_copy(event) if sub.principal == HUMAN else agent_view(event)
            if self.runner is not None:
                self.runner(sub.principal, sub.handler, argument)
            elif sub.principal == HUMAN:
                sub.handler(argument)
            else:
                raise UsageError("an agent's subscriber needs the agent runtime")
        except (EventCascadeTooDeep, SubscriberFailed):
            raise
        except Exception as error:
            failed = SubscriberFailed(sub.id, sub.principal, event.topic, error)
            op.veto(str(failed), status="failed")
            raise failed from error
        except BaseException as error:
            op.veto(f"subscriber {sub.id} was interrupted ({type(error).__name__})",
                    status="interrupted")
            raise
        finally:
            _SUBSCRIBER.reset(token)

    def stored_form(self, payload: object) -> Any:
        """The payload as the audit log stores it (personal values sealed); checks it."""
        keyring = self.image.keyring
        stored = seal_markers(payload, keyring, "payload", 0)
        check_json(stored)
        size = len(canonical(stored))
        if size > MAX_PAYLOAD_BYTES:
            raise EventError(f"the payload is {size:,} bytes as JSON, over the limit of "
                             f"{MAX_PAYLOAD_BYTES:,}; store the data in the image and send "
                             "its name instead")
        return stored


def dataclass_copy(event: Event) -> Event:
    return Event(topic=event.topic, payload=copy.deepcopy(event.payload),
                 principal=event.principal, op=event.op, index=event.index, depth=event.depth)


def agent_view(event: Event) -> dict[str, Any]:
    """The event as plain data for agent code (personal values reduced to their subject)."""
    return {"topic": event.topic, "payload": _redact(event.payload), "principal":
            event.principal, "op": event.op, "index": event.index, "depth": event.depth}


def _redact(value: Any) -> Any:
    if isinstance(value, Personal):
        return {"$personal": {"subject": value.subject}}
    if type(value) is dict:
        return {key: _redact(item) for key, item in value.items()}
    if type(value) is list:
        return [_redact(item) for item in value]
    return value


def _is_agent_function(handler: object, principal: str) -> bool:
    if type(handler) is not types.FunctionType:
        return False
    filename = handler.__code__.co_filename
    return filename.startswith(f"<agent:{principal}>") or filename.startswith(
        f"<agent:{principal}:tool:")
