"""Agents on the event bus (see kernos.events): the agent runtime's side of it.

The bus (:class:`~kernos.events.bus.EventBus`, ``runtime.events``) knows
topics, subscriptions and delivery; what it knows of agents comes from here,
through :func:`bus_for`:

* who is emitting: the principal whose code runs now, if any;
* whether a principal may emit or subscribe: its grants, checked only while
  its own code runs (inside a tool another agent wrote, the author's too);
* how an in-image subscriber runs: as its own principal, inside the
  emitter's op.  The human's subscriber runs as trusted code, outside the
  emitter's authority; an agent's runs under supervision (under the
  emitter's supervisor if an agent emitted), and not at all while its
  circuit is open: the emitter's op goes on and its audit record lists the
  subscriber under ``circuit_skipped``.

:func:`emit`, :func:`subscribe` and :func:`unsubscribe` are the calls from
agent code (``AgentRuntime.emit`` ... delegate to them); a malformed request
is a denial, and a tool another agent wrote cannot subscribe or unsubscribe
on its caller's behalf.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from kernos.agents import context
from kernos.agents.boundary import check_bounded, to_host
from kernos.agents.context import RunContext
from kernos.agents.namespace import REGISTRY, namespace_key
from kernos.agents.registry import HUMAN
from kernos.errors import BoundaryError, EventError, UsageError
from kernos.events.bus import EventBus

if TYPE_CHECKING:
    from kernos.agents.context import Runtime

__all__ = ["bus_for", "emit", "subscribe", "unsubscribe"]


def bus_for(runtime: Runtime) -> EventBus:
    """The event bus of ``runtime``'s image, running and checking agents as above."""
    return EventBus(runtime.image, runner=partial(_run_subscriber, runtime),
                    authorize=partial(_authorize, runtime), principal=_principal)


def _principal() -> str | None:
    ctx = context.running()
    return None if ctx is None else ctx.principal


def _authorize(runtime: Runtime, principal: str, kind: str, target: str) -> None:
    ctx = context.running()
    if ctx is None or ctx.principal != principal:
        raise UsageError(f"events are checked against {principal!r}'s grants only while "
                         "its code runs")
    runtime.require(ctx, kind, target)


def _run_subscriber(runtime: Runtime, principal: str, handler: Callable[..., Any],
                    event: Any) -> None:
    """Run an in-image subscriber as its own principal, inside the running op."""
    op = runtime.current_op()
    outer = context.running()
    if principal == HUMAN:
        token = context.suspend()  # trusted code: not under the emitter's authority
        try:
            handler(event)
        finally:
            context.leave(token)
        return
    runtime.registry.principal(principal)
    trip = runtime.breakers.circuit(principal)
    if trip is not None and not runtime.breakers.replaying:
        # Not run, and the emitter's op goes on: refusing it would let a tripped
        # agent veto every op that emits what it subscribed to.  Recorded instead.
        skipped = op.facts.setdefault("circuit_skipped", [])
        if len(skipped) < 20:
            skipped.append({"agent": principal, "policy": trip.policy,
                            "topic": str(event.get("topic") if isinstance(event, dict)
                                         else getattr(event, "topic", ""))[:200],
                            "tripped_op": trip.op})
        return
    op.touch(namespace_key(principal), REGISTRY)
    if outer is None:
        with runtime.running(principal, op):
            handler(event)
        return
    # Already under a supervisor (an agent emitted): switch principal only.
    inner = RunContext(runtime=runtime, principal=principal, op=op, limits=outer.limits,
                       output=outer.output, depth=outer.depth + 1)
    token = context.enter(inner)
    try:
        handler(event)
    finally:
        outer.denials += inner.denials
        context.leave(token)


def emit(runtime: Runtime, ctx: RunContext, topic: object, payload: object) -> None:
    try:
        plain = to_host(payload)
        if ctx.foreign() is not None and type(topic) is str:
            runtime.require(ctx, "emit", topic)  # the bus checks only the principal
        runtime.events.emit(topic, plain, principal=ctx.principal)
    except (EventError, BoundaryError) as error:
        raise runtime.invalid(ctx, error) from None


def subscribe(runtime: Runtime, ctx: RunContext, pattern: object,
              handler: object) -> object:
    runtime.on_own_behalf(ctx, "subscribe")
    try:
        check_bounded({"the handler": handler},
                      what=f"a subscriber of {ctx.principal!r}")
    except BoundaryError as error:
        raise runtime.invalid(ctx, error) from None
    try:
        return runtime.events.subscribe(pattern, handler, principal=ctx.principal)
    except EventError as error:
        raise runtime.invalid(ctx, error) from None


def unsubscribe(runtime: Runtime, ctx: RunContext, subscription_id: object) -> None:
    runtime.on_own_behalf(ctx, "unsubscribe")
    try:
        runtime.events.unsubscribe(subscription_id, principal=ctx.principal)
    except UsageError as error:
        raise runtime.invalid(ctx, error) from None
