"""``agents``: the human's Python API over the agent runtime.

In a Kernos notebook the name ``agents`` is this object (it is the kernel's,
not the image's: it is never persisted).  Everything it changes is part of
the cell's op::

    agents.add("alice")
    agents.grant("alice", "read:dataset")
    agents.grant("alice", "spend:USD", 50)

    @agents.tool(description="Count words", schema={
        "type": "object", "properties": {"text": {"type": "string"}},
        "required": ["text"]})
    def word_count(text):
        return len(text.split())

    agents.run("alice", "print(call('word_count', text='a b c'))")

    agents.grant("alice", "llm:gpt-4o-mini", 20_000)      # tokens
    answer = agents.llm("gpt-4o-mini", [{"role": "user", "content": "Hi"}])

    agents.loop("alice", "print(loop_state()['iteration'])", max_iterations=3)
    agents.pause("alice"); agents.resume("alice"); agents.stop("alice")
    agents.remember("invoices are due on the 5th", tags=["billing"])
    agents.recall("invoices due")                     # the human's memories
    agents.recall("invoices", as_="alice")            # what alice may recall
    agents.memory_embeddings("text-embedding-3-small")  # recall by meaning too
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kernos.agents import loop as loops
from kernos.agents.limits import Limits
from kernos.agents.runtime import AgentRuntime, RunResult

if TYPE_CHECKING:
    from kernos.llm import Completion

__all__ = ["NOT_RESTORED", "Agents"]

NOT_RESTORED = "(not restored)"
"""The one key of ``agents.namespace(NAME)`` when that namespace could not be restored."""


class Agents:
    """Add agents, grant and revoke capabilities, register tools, run agent code."""

    def __init__(self, runtime: Callable[[], AgentRuntime]) -> None:
        self._runtime = runtime

    @property
    def runtime(self) -> AgentRuntime:
        return self._runtime()

    def add(self, name: str, **limits: int) -> str:
        """A new agent with no grants (and, optionally, its own limits)."""
        return self.runtime.add_agent(name, limits=limits)

    def names(self) -> list[str]:
        return self.runtime.agents()

    def grant(self, agent: str, capability: str, limit: object = None) -> dict[str, object]:
        """Grant ``capability`` (``call:TOOL``, ``read:NAME``, ``spend:USD`` ...)."""
        return self.runtime.grant(agent, capability, limit)

    def revoke(self, agent: str, capability_or_id: str) -> list[str]:
        """Revoke by capability or grant id; grants derived from it go too."""
        return self.runtime.revoke(agent, capability_or_id)

    def grants(self, agent: str | None = None) -> list[dict[str, object]]:
        return self.runtime.grants(agent)

    def limits(self, agent: str, **overrides: int) -> Limits:
        """Show (and with keywords, change) an agent's resource limits."""
        if overrides:
            return self.runtime.set_limits(agent, **overrides)
        return self.runtime.limits_for(agent)

    def policy(self, agent: str, **figures: Any) -> dict[str, Any]:
        """Show (and with keywords, set) an agent's circuit-breaker policy (effective).

        ``failures``, ``repeats``, ``iterations``, ``wall_seconds``,
        ``tokens_per_minute``, ``micro_usd_per_minute`` (ints, None to lift one)
        and ``restore_safe``; see kernos.agents.supervisor.
        """
        if figures:
            return self.runtime.breakers.set_policy(agent, **figures)
        self.runtime.registry.principal(agent)
        return self.runtime.breakers.effective(agent).describe()

    def circuit(self, agent: str) -> dict[str, Any] | None:
        """Why ``agent``'s circuit is open (policy, figures, message), or None if closed.

        ``agent`` in the answer is whose circuit it is: a sub-agent's is open while an
        ancestor's is, and only resetting that ancestor closes it.
        """
        self.runtime.registry.principal(agent)
        trip = self.runtime.breakers.circuit(agent)
        return None if trip is None else {"agent": trip.agent, "policy": trip.policy,
                                          "limit": trip.limit, "figures": trip.figures,
                                          "message": trip.message, "op": trip.op,
                                          "at": trip.at}

    def checkpoint(self, agent: str, *, safe: bool = True) -> dict[str, Any]:
        """Tag ``agent``'s namespace, as this op leaves it, as its safe checkpoint."""
        return self.runtime.breakers.checkpoint(agent, safe=safe)

    def reset(self, agent: str, *, restore: bool | None = None) -> dict[str, Any]:
        """Close ``agent``'s circuit (the human only); ``restore``: back to its safe point."""
        return self.runtime.breakers.reset(agent, restore=restore)

    def loop(self, agent: str, step: str, *, every_ms: int = 0,
             max_iterations: int | None = None, plan: object = None,
             pending: Iterable[object] = ()) -> dict[str, Any]:
        """Start ``agent``'s loop: ``step`` (agent code) runs once per op, as ``agent``.

        The kernel turns it between cells, ``every_ms`` apart, until
        ``max_iterations`` have committed or the step calls ``loop_finish()``;
        inside the step, ``loop_state()`` and ``loop_update(...)`` read and set
        the loop's iteration, plan, pending work and notes.  See kernos.agents.loop.
        """
        return loops.start(self.runtime, agent, step, every_ms=every_ms,
                           max_iterations=max_iterations, plan=plan, pending=pending)

    def pause(self, agent: str) -> dict[str, Any]:
        """Pause ``agent``'s loop after the iteration that is running (if any)."""
        return loops.set_status(self.runtime, agent, "paused")

    def resume(self, agent: str) -> dict[str, Any]:
        """Resume ``agent``'s paused loop at its next iteration."""
        return loops.set_status(self.runtime, agent, "running")

    def stop(self, agent: str, reason: str | None = None) -> dict[str, Any]:
        """Stop ``agent``'s loop for good (``agents.loop`` starts a new one)."""
        return loops.set_status(self.runtime, agent, "stopped", reason)

    def loops(self) -> list[dict[str, Any]]:
        """Every loop: agent, status, iteration, plan, pending (a count), every_ms ..., and
        ``output``: what its last iteration committed in this kernel printed (None before
        one did; kept in memory only, see kernos.agents.loop)."""
        held = loops.outputs_of(self.runtime)
        found = loops.loops(self.runtime.image)
        for entry in found:
            entry["output"] = held.last(entry["agent"])
        return found

    def run(self, agent: str, source: str) -> RunResult:
        """Run agent code as ``agent`` in this cell's op; prints what it printed."""
        return self.runtime.run(agent, source, echo=_echo)

    def namespace(self, agent: str) -> Mapping[str, Any]:
        """A read-only view of an agent's names (for looking, not for changing).

        If the agent's namespace could not be restored, the view holds one
        entry, :data:`NOT_RESTORED`: the placeholder saying what was lost and why.
        """
        from kernos.agents.runtime import namespace_key
        from kernos.serialize.unpersisted import Unpersisted

        self.runtime.registry.principal(agent)
        found = self.runtime.image.system.get(namespace_key(agent))
        if isinstance(found, Unpersisted):
            return types.MappingProxyType({NOT_RESTORED: found})
        return types.MappingProxyType(self.runtime.namespace(agent).user_items())

    def call(self, tool: str, /, **arguments: object) -> object:
        """Call a tool as the human (no grant needed)."""
        return self.runtime.call_as_human(tool, arguments)

    def register_tool(self, name: str, function: Callable[..., Any], *,
                      schema: dict[str, Any], description: str, effect: str = "pure",
                      capability: str | None = None,
                      resolve: Callable[[str], tuple[bool, Any]] | None = None,
                      attempts: int = 3, backoff: float = 0.05,
                      timeout: float | None = 60.0) -> dict[str, object]:
        """Register a function as a tool.

        With ``effect="external"`` a call only queues the effect; it runs after
        the op commits, once, with ``idempotency_key=`` (see ``kernos.effects``).
        ``resolve(key)`` answers ``(True, result)`` or ``(False, None)`` for a
        call that was cut short; failures are tried ``attempts`` times.  An
        attempt runs in a worker thread; one still running after ``timeout``
        seconds leaves its effect in doubt and the kernel goes on (``None``:
        unbounded, in the kernel's thread).
        """
        return self.runtime.register_tool(name, function, schema=schema,
                                          description=description, effect=effect,
                                          capability=capability, resolve=resolve,
                                          attempts=attempts, backoff=backoff, timeout=timeout)

    def tool(self, *, schema: dict[str, Any], description: str, effect: str = "pure",
             name: str | None = None, capability: str | None = None,
             resolve: Callable[[str], tuple[bool, Any]] | None = None,
             attempts: int = 3, backoff: float = 0.05,
             timeout: float | None = 60.0) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register_tool`."""
        def register(function: Callable[..., Any]) -> Callable[..., Any]:
            self.register_tool(name or function.__name__, function, schema=schema,
                               description=description, effect=effect,
                               capability=capability, resolve=resolve, attempts=attempts,
                               backoff=backoff, timeout=timeout)
            return function

        return register

    def effects(self, status: str | None = None) -> list[dict[str, Any]]:
        """External effects: queued, done, failed or in-doubt, with keys and results."""
        found = self.runtime.effects.effects()
        return [e for e in found if status is None or e["status"] == status]

    def resolve_effect(self, key: str, *, executed: bool,
                       result: object = None) -> dict[str, Any]:
        """Say whether an in-doubt effect happened; recorded (or executed) after this cell."""
        return self.runtime.resolve_effect(key, executed=executed, result=result)

    def tools(self) -> list[dict[str, object]]:
        return self.runtime.tools()

    def llm(self, model: str, messages: list[dict[str, Any]], /, *, mode: str | None = None,
            **params: object) -> Completion:
        """Call a language model as the human, in this cell's op (see ``kernos.llm``).

        Recorded like an agent's call, with no grant or budget.  ``mode`` is
        ``off``, ``record`` or ``replay`` for this call only.
        """
        return self.runtime.llm_as_human(model, messages, params, mode=mode)

    def recall(self, query: str, as_: str | None = None, k: int = 5,
               kinds: list[str] | None = None) -> list[dict[str, Any]]:
        """The ``k`` memories best matching ``query`` (kernos.memory): the human's own, or
        with ``as_``, what that agent may recall (its grants decide)."""
        from kernos.memory.sources import may_read_for

        principal = self._memory_principal(as_)
        return self.runtime.memory.recall(
            principal, query, k=k, kinds=kinds,
            may_read=may_read_for(self.runtime.registry, principal))

    def remember(self, fact: str, tags: list[str] | tuple[str, ...] = (),
                 as_: str | None = None) -> dict[str, Any]:
        """Store ``fact`` in the human's memory (or, with ``as_``, that agent's), in this op."""
        return self.runtime.memory.remember(self._memory_principal(as_), fact, tags)

    def context(self, max_tokens: int, query: str | None = None,
                as_: str | None = None) -> str:
        """The most relevant memories within ``max_tokens`` (the newest without ``query``)."""
        from kernos.memory.sources import may_read_for

        principal = self._memory_principal(as_)
        return self.runtime.memory.context(
            principal, max_tokens, query, may_read=may_read_for(self.runtime.registry,
                                                                 principal))

    def memory_embeddings(self, model: str | None, *, dimensions: int | None = None,
                          mock_response: list[float] | None = None) -> dict[str, Any]:
        """Let recall also match by meaning, with this embedding model (None: words only).

        Stored in the image in this op (it commits or rolls back with it).  Each recall
        then embeds its query and, at most 32 at a time, the memories without a vector, as
        the asking principal: an agent needs ``llm:MODEL`` to recall.  ``mock_response``
        is a fixed vector every call answers (offline tests)."""
        return self.runtime.memory.configure_embeddings(
            model, dimensions=dimensions, mock_response=mock_response)

    def _memory_principal(self, as_: str | None) -> str:
        if as_ is None or as_ == "human":
            return "human"
        self.runtime.registry.principal(as_)
        return as_

    def denials(self) -> list[dict[str, Any]]:
        """Denials seen by this kernel (the durable log is the workspace's denials.jsonl)."""
        return list(self.runtime.denials)

    def __repr__(self) -> str:
        names = self.names()
        return (f"<Kernos agents: {', '.join(names) if names else 'none yet'}; "
                "help(agents) lists the calls>")


def _echo(text: str) -> None:
    print(text, end="" if text.endswith("\n") else "\n")
