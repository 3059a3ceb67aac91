"""The harness actions for agents' circuit breakers, as the inspector's Agents tab shows them.

(The tab's loops section uses the ``loop`` action, and its memory section
``recall`` and ``memory``: see ``kernos.harness.protocol``.)

``circuits``  (a read)
    -> ``{"circuits": [{"agent", "policy", "circuit": TRIP | null,
    "safe_op": int | null}]}``: per agent, its effective policy
    (``Breakers.effective(agent).describe()``: {} when it is not supervised),
    why its circuit is open, and the op of its safe checkpoint, if any.
    TRIP is ``{"agent", "policy", "limit", "figures", "message", "op", "at"}``.
    A loop whose agent's circuit is open is *tripped*: it waits for the
    human's reset (the trip is not in the image).
``reset_circuit``  agent, restore?   (an op by ``human``: it names no
principal, and agent code cannot send requests)
    Close the agent's circuit (``Breakers.reset``; ``restore`` puts its
    namespace back to its safe checkpoint, default: its policy's
    ``restore_safe``) -> ``{"reset": {"agent", "was_open", "restored_from"},
    "op", "commit"}``.

:class:`AgentViews` is a mixin of :class:`~kernos.harness.service.HarnessService`
(it uses the service's image, runtime and op helpers).  No Jupyter here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from kernos.harness.protocol import Request

if TYPE_CHECKING:
    from collections.abc import Callable

    from kernos.agents import AgentRuntime
    from kernos.agents.supervisor import Trip
    from kernos.harness.service import Handled
    from kernos.op import Op

__all__ = ["AgentViews", "trip_json"]


def trip_json(trip: Trip | None) -> dict[str, Any] | None:
    return None if trip is None else _plain(dataclasses.asdict(trip))


class AgentViews:
    """The ``circuits`` and ``reset_circuit`` actions."""

    runtime: AgentRuntime
    _ok: Callable[..., Handled]
    _principal: Callable[[str | None], str]
    _human_op: Callable[[Request, str, Callable[[Op], Any]], Handled]

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

    def _reset_circuit(self, request: Request) -> Handled:
        agent = request.get("agent")
        self._principal(agent)
        return self._human_op(request, f"reset circuit {agent}", lambda op: {
            "reset": _plain(self.runtime.breakers.reset(agent, restore=request.get("restore")))})


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
