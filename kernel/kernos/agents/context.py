"""The context an agent's code runs in: who, in which op, under which limits, by which runtime.

The guards and builtins that agent code calls are module-level functions
shared by every agent; they find the caller through :func:`current`, a
context variable the runtime sets for the length of each run (and each tool
call).  Authority is the *running* principal's, bounded by ``bounds``: while
a tool an agent wrote runs, its author is in ``bounds``, and every check must
pass for the caller and for each of them (the intersection of their grants),
so a tool never acts with more authority than the agent that wrote it.

:class:`Runtime` is the interface the agent runtime
(:class:`kernos.agents.runtime.AgentRuntime`) offers to what sits below it:
the calls agent code makes (``kernos.agents.api``, through
``RunContext.runtime``) and what the runtime's seams (``_tools``, ``_llm``,
``_events``, ``_memory``, ``supervisor``) ask of the runtime that composes
them.  The seams depend on this protocol, never on the runtime's module, so
the runtime imports them and not the other way round.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kernos.agents.registry import HUMAN
from kernos.errors import UsageError

if TYPE_CHECKING:
    from kernos.agents._journal import Trip
    from kernos.agents.limits import Limits
    from kernos.agents.registry import Registry, ToolVersion
    from kernos.errors import CapabilityDenied, KernosError
    from kernos.events.bus import EventBus
    from kernos.image import Image
    from kernos.memory.service import ImageMemory
    from kernos.op import Op

__all__ = [
    "BoundedOutput",
    "Circuits",
    "RunContext",
    "Runtime",
    "Toolshelf",
    "current",
    "running",
]


class Circuits(Protocol):
    """The circuit breakers as the seams ask them (``kernos.agents.supervisor.Breakers``)."""

    replaying: bool
    """A replay: nothing is counted or refused again."""

    def circuit(self, agent: str) -> Trip | None:
        """Why ``agent``'s ops are refused (its own or an ancestor's open circuit), or None."""

    def admit(self, agent: str, op: Op, fingerprint_of: Callable[[], str]) -> None:
        """Before an op of ``agent`` runs: refuse it (CircuitOpen, vetoed) or count it in."""

    def refuse_if_open(self, agent: str, op: Op, *, via: str) -> None:
        """Refuse (CircuitOpen, vetoed) if ``agent``'s circuit is open; count nothing."""


class Toolshelf(Protocol):
    """The tools as the LLM seam asks them (``kernos.agents._tools.Toolbox``)."""

    def pinned(self, ctx: RunContext, name: object) -> ToolVersion:
        """The version of tool ``name`` that ``ctx``'s op uses (UnknownTool if none)."""


class Runtime(Protocol):
    """The agent runtime, as agent code's calls and the runtime's seams reach it.

    State (all looked up afresh in the image on each use): ``image``,
    ``registry`` (read-only use), ``events`` (the image's bus), ``memory``,
    ``breakers`` and ``toolbox``.  Authority: :meth:`require` raises a denial
    (which vetoes the op) unless every principal of ``ctx.authority()``
    holds ``kind:target``; :meth:`deny` records one and returns the error;
    :meth:`invalid` counts a malformed request as one; :meth:`on_own_behalf`
    refuses an action inside a tool another agent wrote.  :meth:`running`
    enters agent context for ``principal`` under supervision (or yields the
    context already running).  The calls of agent code (``read`` ...
    ``refused``) take the running :class:`RunContext` first; see
    ``kernos.agents.api``.
    """

    image: Image
    events: EventBus

    @property
    def registry(self) -> Registry: ...
    @property
    def memory(self) -> ImageMemory: ...
    @property
    def breakers(self) -> Circuits: ...
    @property
    def toolbox(self) -> Toolshelf: ...

    # -- what the seams ask -------------------------------------------------------------

    def current_op(self) -> Op:
        """The running op (UsageError outside one)."""

    def mutable_registry(self, op: Op) -> Registry:
        """The registry, bound in the image and touched in ``op`` (for a change)."""

    def limits_for(self, principal: str) -> Limits:
        """``principal``'s resource limits (the defaults with its overrides)."""

    def require(self, ctx: RunContext, kind: str, target: str, *,
                exempt: str | None = None) -> None:
        """Deny unless every principal of ``ctx.authority()`` (but ``exempt``) holds it."""

    def deny(self, ctx: RunContext, capability: str, detail: str = "") -> CapabilityDenied:
        """Record a denial, veto the op, and return the error to raise."""

    def invalid(self, ctx: RunContext, error: KernosError) -> KernosError:
        """A malformed request from agent code: a denial too; returns ``error``."""

    def on_own_behalf(self, ctx: RunContext, action: str) -> None:
        """Refuse ``action`` inside a tool another agent wrote."""

    def running(self, principal: str, op: Op) -> AbstractContextManager[RunContext]:
        """Agent context for ``principal`` in ``op``, under supervision."""

    # -- the calls of agent code (kernos.agents.api, kernos.agents.boundary) -------------

    def read(self, ctx: RunContext, name: object) -> object: ...
    def write(self, ctx: RunContext, name: object, value: object) -> None: ...
    def resolve_view(self, ctx: RunContext, name: str, path: tuple[tuple[str, object], ...],
                     *, write: bool) -> object: ...
    def spend(self, ctx: RunContext, value: object, unit: object) -> object: ...
    def my_grants(self, ctx: RunContext) -> list[object]: ...
    def delegate(self, ctx: RunContext, grant_id: object, to: object,
                 limit: object = None) -> object: ...
    def revoke_delegated(self, ctx: RunContext, grant_id: object) -> list[object]: ...
    def spawn(self, ctx: RunContext, name: object) -> object: ...
    def define_tool(self, ctx: RunContext, name: object, source: object, schema: object,
                    description: object) -> object: ...
    def call(self, ctx: RunContext, name: object, arguments: dict[str, object]) -> object: ...
    def emit(self, ctx: RunContext, topic: object, payload: object) -> None: ...
    def subscribe(self, ctx: RunContext, pattern: object, handler: object) -> object: ...
    def unsubscribe(self, ctx: RunContext, subscription_id: object) -> None: ...
    def llm(self, ctx: RunContext, model: object, messages: object,
            params: dict[str, object]) -> object: ...
    def refused(self, ctx: RunContext, error: KernosError) -> KernosError: ...


class BoundedOutput:
    """What agent code printed, up to a limit in UTF-8 bytes; the rest is counted, not kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        room = self.limit - self.size
        if room <= 0:
            self.dropped += len(data)
            return
        kept = data[:room].decode("utf-8", "ignore")
        self.parts.append(kept)
        self.size += len(kept.encode("utf-8"))
        self.dropped += len(data) - len(kept.encode("utf-8"))

    def text(self) -> str:
        tail = f"\n... ({self.dropped:,} more bytes not shown)\n" if self.dropped else ""
        return "".join(self.parts) + tail


@dataclass(kw_only=True)
class RunContext:
    runtime: Runtime
    principal: str
    op: Op
    limits: Limits
    output: BoundedOutput
    depth: int = 0
    denials: int = 0
    bounds: tuple[str, ...] = ()
    """Authors of the agent-written tools running now: their grants bound every check."""

    def authority(self) -> list[str]:
        """Whose grants every check must pass: the principal and ``bounds``, not the human."""
        return [name for name in dict.fromkeys((self.principal, *self.bounds))
                if name != HUMAN]

    def foreign(self) -> str | None:
        """The author of a tool running for someone else, if one is running."""
        return next((name for name in self.bounds if name != self.principal), None)

    def bounded_by(self, principal: str) -> str:
        """Why ``principal``'s grants count in a check of this principal's, if they do."""
        if principal == self.principal:
            return ""
        return (f"inside a tool {principal!r} wrote, {principal!r}'s grants bound it too, and "
                f"{principal!r} does not hold it")


_CURRENT: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "kernos_agent_context", default=None)


def current() -> RunContext:
    context = _CURRENT.get()
    if context is None:
        raise UsageError("this can only be called from agent code run by the Kernos runtime")
    return context


def running() -> RunContext | None:
    return _CURRENT.get()


def enter(context: RunContext) -> contextvars.Token[RunContext | None]:
    return _CURRENT.set(context)


def suspend() -> contextvars.Token[RunContext | None]:
    """Leave agent context for trusted code (a human's subscriber); undo with leave()."""
    return _CURRENT.set(None)


def leave(token: contextvars.Token[RunContext | None]) -> None:
    _CURRENT.reset(token)
