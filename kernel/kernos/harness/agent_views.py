"""The harness actions behind the inspector's Agents tab: loops and circuits.

(Its memory section reads the ``recall`` and ``memory`` actions of
:mod:`kernos.memory`'s harness service.)

Reads (any client; the inspector, as ``human``):

``loops``
    -> ``{"loops": [LOOP]}``: every ``kernos:loop:<agent>`` in the image
    (``LoopState.describe()``: agent, status, iteration, plan, pending (a
    count), every_ms, max_iterations, last_op, reason, started_op), each
    plus ``"circuit": TRIP | null``: a loop whose agent's circuit is open is
    *tripped* (it waits for the human's reset; the trip is not in the image).
``circuits``
    -> ``{"circuits": [{"agent", "policy", "circuit": TRIP | null,
    "safe_op": int | null}]}``: per agent, its effective policy
    (``Breakers.effective(agent).describe()``: {} when it is not supervised),
    why its circuit is open, and the op of its safe checkpoint, if any.
    TRIP is ``{"agent", "policy", "limit", "figures", "message", "op", "at"}``.

Changes (each an op by ``human``; no request names another principal, and
agent code cannot send requests):

``set_loop``  agent, status, reason?
    ``status`` is ``running`` (resume), ``paused`` or ``stopped``, through
    ``kernos.agents.loop.set_status`` -> ``{"loop": LOOP, "status": "committed",
    "principal": "human", "op", "commit"}``.
``reset_circuit``  agent, restore?
    Close the agent's circuit (``Breakers.reset``; ``restore`` puts its
    namespace back to its safe checkpoint, default: its policy's
    ``restore_safe``) -> ``{"reset": {"agent", "was_open", "restored_from"},
    "status": "committed", "principal": "human", "op", "commit"}``.

Their ``status`` and ``principal`` make the inspectors' ``committed`` notice
(``kernos.inspector.backend.notice_of``), which refreshes every open view.

:class:`AgentViews` is a mixin of :class:`~kernos.harness.service.HarnessService`
(it uses the service's image, runtime and op helpers).  No Jupyter here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from kernos.harness.protocol import ProtocolError, Request

if TYPE_CHECKING:
    from collections.abc import Callable

    from kernos.agents import AgentRuntime
    from kernos.agents.supervisor import Trip
    from kernos.harness.service import Handled
    from kernos.image import Image
    from kernos.op import Op

__all__ = ["LOOP_STATUSES", "AgentViews", "check_fields", "trip_json"]

LOOP_STATUSES = ("running", "paused", "stopped")
"""What the human may set a loop to (``finished`` is the loop's own doing)."""


def trip_json(trip: Trip | None) -> dict[str, Any] | None:
    return None if trip is None else _plain(dataclasses.asdict(trip))


class AgentViews:
    """The ``loops``, ``circuits``, ``set_loop`` and ``reset_circuit`` actions."""

    image: Image
    runtime: AgentRuntime
    _ok: Callable[..., Handled]
    _principal: Callable[[str | None], str]
    _human_op: Callable[[Request, str, Callable[[Op], Any]], Handled]

    # -- reads ---------------------------------------------------------------------------

    def _loops(self, request: Request) -> Handled:
        return self._ok(request, {"loops": self._loop_list()})

    def _loop_list(self) -> list[dict[str, Any]]:
        from kernos.agents.loop import loops

        return [self._with_circuit(described) for described in loops(self.image)]

    def _with_circuit(self, described: dict[str, Any]) -> dict[str, Any]:
        plain: dict[str, Any] = _plain(described)
        plain["circuit"] = self._trip(str(described["agent"]))
        return plain

    def _trip(self, agent: str) -> dict[str, Any] | None:
        if agent not in self.runtime.registry.principals:
            return None
        return trip_json(self.runtime.breakers.circuit(agent))

    def _circuits(self, request: Request) -> Handled:
        breakers = self.runtime.breakers
        safe = breakers.supervision.safe
        circuits = []
        for agent in self.runtime.agents():
            point = safe.get(agent)
            circuits.append({"agent": agent, "policy": _plain(breakers.effective(agent).describe()),
                             "circuit": trip_json(breakers.circuit(agent)),
                             "safe_op": None if point is None else point.op})
        return self._ok(request, {"circuits": circuits})

    # -- changes (ops by the human) ---------------------------------------------------------

    def _set_loop(self, request: Request) -> Handled:
        from kernos.agents.loop import set_status, state_of

        agent, status = request.get("agent"), request.get("status")
        self._principal(agent)
        if state_of(self.image, agent) is None:  # refused before an op begins
            raise ProtocolError("invalid", f"set_loop: {agent[:80]!r} has no loop; start one "
                                f"with agents.loop({agent[:80]!r}, STEP) first")
        return self._human_change(request, f"set loop {agent} {status}", lambda op: {
            "loop": self._with_circuit(set_status(self.runtime, agent, status,
                                                  reason=request.get("reason")))})

    def _human_change(self, request: Request, note: str,
                      body: Callable[[Op], dict[str, Any]]) -> Handled:
        """An op by ``human``; its result says ``committed`` (so inspectors get the notice)."""
        handled = self._human_op(request, note, body)
        handled.reply["result"].update(status="committed", principal="human")
        return handled

    def _reset_circuit(self, request: Request) -> Handled:
        agent = request.get("agent")
        self._principal(agent)
        return self._human_change(request, f"reset circuit {agent}", lambda op: {
            "reset": _plain(self.runtime.breakers.reset(agent, restore=request.get("restore")))})


def check_fields(action: str, fields: dict[str, Any]) -> None:
    """The checks of these actions' fields beyond their types (``protocol._check_action``)."""
    if action == "set_loop":
        status = fields["status"]
        if status not in LOOP_STATUSES:
            raise ProtocolError("malformed", f"set_loop: 'status' is one of "
                                f"{', '.join(LOOP_STATUSES)}, not {status[:40]!r}")
        reason = fields.get("reason")
        if reason is not None and len(reason) > 500:
            raise ProtocolError("malformed", "set_loop: 'reason' is at most 500 characters")


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
