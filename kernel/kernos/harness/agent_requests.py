"""The harness requests about agents: who they are, what they may do, their loops, memory.

:class:`AgentRequests` carries out ``add_agent``, ``grant`` and ``revoke``
(the registry, ``kernos.agents``); ``policy``, ``circuit`` and ``reset`` (the
circuit breakers, ``kernos.agents.supervisor``); ``loop`` (an agent's loop,
``kernos.agents.loop``); and ``recall``, ``remember`` and ``memory``
(``kernos.memory``).  A change runs as a human op; only the human may set a
policy or close a circuit.  ``remember`` by an agent is that agent's op, under
its circuit and its ``memory:write`` grant.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kernos.agents.supervisor import fingerprint
from kernos.errors import CapabilityDenied
from kernos.harness.protocol import ProtocolError, Request
from kernos.harness.serving import HUMAN, Handled, ServiceBase, plain

if TYPE_CHECKING:
    from kernos.op import Op

__all__ = ["AgentRequests"]


class AgentRequests(ServiceBase):
    """Requests about agents: the registry and grants, circuits, loops and memory."""

    # -- the registry and its grants ----------------------------------------------------

    def _add_agent(self, request: Request) -> Handled:
        agent = request.get("agent")
        return self._human_op(request, f"add agent {agent}", lambda op: {
            "agent": self.runtime.add_agent(agent, limits=request.get("limits"))})

    def _grant(self, request: Request) -> Handled:
        agent, capability = request.get("agent"), request.get("capability")
        self._principal(agent)
        return self._human_op(request, f"grant {agent} {capability}", lambda op: {
            "grant": plain(self.runtime.grant(agent, capability, request.get("limit")))})

    def _revoke(self, request: Request) -> Handled:
        agent, capability = request.get("agent"), request.get("capability")
        self._principal(agent)
        return self._human_op(request, f"revoke {agent} {capability}", lambda op: {
            "revoked": self.runtime.revoke(agent, capability)})

    # -- the supervisor (kernos.agents.supervisor) ----------------------------------------

    def _human_only(self, request: Request, what: str) -> None:
        principal = self._principal(request.get("principal"))
        if principal != HUMAN:
            raise ProtocolError("denied", f"only the human may {what}; {principal!r} may not "
                                "(an agent can neither close its circuit nor loosen its "
                                "policy)", {"principal": principal})

    def _policy(self, request: Request) -> Handled:
        agent: str = request.get("agent")
        breakers = self.runtime.breakers
        figures = request.get("set")
        if figures is None:
            self._principal(agent)
            return self._ok(request, self._policy_of(agent))
        self._human_only(request, "set a circuit-breaker policy")
        self._principal(agent)
        return self._human_op(request, f"policy {agent}", lambda op: {
            **self._policy_of(agent, breakers.set_policy(agent, **figures))})

    def _policy_of(self, agent: str, effective: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
        breakers = self.runtime.breakers
        own = breakers.supervision.policies.get(agent)
        return {"agent": agent,
                "policy": effective or breakers.effective(agent).describe(),
                "own": {} if own is None else own.describe()}

    def _circuit(self, request: Request) -> Handled:
        agent: str | None = request.get("agent")
        names = [self._principal(agent)] if agent is not None else \
            sorted(self.runtime.registry.principals)
        breakers = self.runtime.breakers
        pending = {(trip.agent, trip.op) for trip in breakers.pending()}
        circuits: dict[str, Any] = {}
        for name in names:
            trip = breakers.circuit(name)
            circuits[name] = None if trip is None else {
                "policy": trip.policy, "limit": trip.limit, "figures": trip.figures,
                "message": trip.message, "op": trip.op, "at": trip.at,
                "announced": (trip.agent, trip.op) not in pending}
        safe = {name: breakers.safe_point(name) for name in names}
        return self._ok(request, {"circuits": circuits, "safe": safe})

    def _reset(self, request: Request) -> Handled:
        agent: str = request.get("agent")
        self._human_only(request, "close a circuit")
        self._principal(agent)
        return self._human_op(request, f"reset {agent}", lambda op: plain(
            self.runtime.breakers.reset(agent, restore=request.get("restore"))))

    # -- loops (kernos.agents.loop) ---------------------------------------------------------

    def _loop(self, request: Request) -> Handled:
        """An agent's loop: start, pause, resume, stop (each a human op), or status."""
        from kernos.agents import loop

        do: str = request.get("do")
        agent: str | None = request.get("agent")
        if agent is not None:
            self._principal(agent)
        if do == "status":
            outputs = loop.outputs_of(self.runtime)
            since = request.get("since_op")
            found = [entry for entry in loop.loops(self.image)
                     if agent is None or entry["agent"] == agent]
            for entry in found:
                entry["output"] = outputs.last(entry["agent"])
                if since is not None:
                    entry["outputs"] = outputs.since(entry["agent"], since)
            return self._ok(request, {"loops": plain(found)})
        assert agent is not None
        if do == "start":
            return self._human_op(request, f"loop start {agent}", lambda op: {
                "loop": plain(loop.start(
                    self.runtime, agent, request.get("step"),
                    every_ms=request.get("every_ms", 0),
                    max_iterations=request.get("max_iterations"), plan=request.get("plan"),
                    pending=request.get("pending") or ()))})
        status = {"pause": "paused", "resume": "running", "stop": "stopped"}[do]
        return self._human_op(request, f"loop {do} {agent}", lambda op: {
            "loop": plain(loop.set_status(self.runtime, agent, status,
                                          request.get("reason")))})

    # -- memory (kernos.memory) ------------------------------------------------------------

    def _memory_principal(self, request: Request, capability: str) -> str:
        principal = self._principal(request.get("principal"))
        if principal != HUMAN and self.runtime.registry.find(
                principal, "memory", capability) is None:
            raise CapabilityDenied(principal, f"memory:{capability}")
        return principal

    def _recall(self, request: Request) -> Handled:
        from kernos.memory.sources import may_read_for

        principal = self._memory_principal(request, "read")
        found = self.runtime.memory.recall(
            principal, request.get("query"), k=request.get("k", 5), kinds=request.get("kinds"),
            may_read=may_read_for(self.runtime.registry, principal))
        return self._ok(request, {"memories": found})

    def _remember(self, request: Request) -> Handled:
        principal = self._memory_principal(request, "write")
        source = json.dumps({"action": "remember", **request.fields}, sort_keys=True)

        def remember(op: Op) -> dict[str, Any]:
            if principal != HUMAN:  # the grant it used, as for any agent op
                grant = self.runtime.registry.find(principal, "memory", "write")
                if grant is not None:
                    op.grants_used[grant.id] = grant.capability
            return {"fact": self.runtime.memory.remember(principal, request.get("fact"),
                                                         request.get("tags") or [])}

        return self._principal_op(
            request, principal=principal, source=source, note=f"remember ({principal})",
            body=remember, same=lambda: fingerprint(
                "remember", repr(request.get("fact"))[:10_000]))

    def _memory(self, request: Request) -> Handled:
        command = request.get("command")
        if command not in ("stats", "rebuild"):
            raise ProtocolError("malformed", f"the memory command is 'stats' or 'rebuild', "
                                f"not {str(command)[:40]!r}")
        memory = self.runtime.memory
        if command == "rebuild":
            memory.rebuild()
        return self._ok(request, memory.stats())
