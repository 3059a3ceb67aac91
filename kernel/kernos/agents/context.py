"""The context an agent's code runs in: who, in which op, under which limits.

The guards and builtins that agent code calls are module-level functions
shared by every agent; they find the caller through :func:`current`, a
context variable the runtime sets for the length of each run (and each tool
call).  Authority is the *running* principal's, bounded by ``bounds``: while
a tool an agent wrote runs, its author is in ``bounds``, and every check must
pass for the caller and for each of them (the intersection of their grants),
so a tool never acts with more authority than the agent that wrote it.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernos.agents.registry import HUMAN
from kernos.errors import UsageError

if TYPE_CHECKING:
    from kernos.agents.limits import Limits
    from kernos.agents.runtime import AgentRuntime
    from kernos.op import Op

__all__ = ["BoundedOutput", "RunContext", "current", "running"]


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
    runtime: AgentRuntime
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
