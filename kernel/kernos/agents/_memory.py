"""The memory calls of agent code: ``recall``, ``remember``, ``context`` (see kernos.agents.api).

The agent-facing face of :mod:`kernos.memory`: it sits in the agent runtime's
floor because it asks the runtime (grants, whose behalf) before it asks memory.

Each checks the grant (``memory:read`` / ``memory:write``) for every principal
whose grants bound the running code, refuses to run inside a tool another
agent wrote, and answers plain data through :class:`~kernos.memory.service.ImageMemory`.
Refusals are Kernos errors, so the api wrapper vetoes the op (as for any call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernos.agents.boundary import to_agent
from kernos.memory.sources import may_read_for

if TYPE_CHECKING:
    from kernos.agents.context import RunContext

__all__ = ["context", "recall", "remember"]


def _allowed(ctx: RunContext, what: str, capability: str) -> None:
    runtime = ctx.runtime
    runtime.on_own_behalf(ctx, what)
    runtime.require(ctx, "memory", capability)


def recall(ctx: RunContext, query: object, k: object, kinds: object) -> list[Any]:
    _allowed(ctx, "recall memories", "read")
    runtime = ctx.runtime
    found = runtime.memory.recall(ctx.principal, query, k=k, kinds=kinds,
                                  may_read=may_read_for(runtime.registry, ctx.principal))
    result: list[Any] = to_agent(found)
    return result


def remember(ctx: RunContext, fact: object, tags: object) -> Any:
    _allowed(ctx, "store memories", "write")
    return to_agent(ctx.runtime.memory.remember(ctx.principal, fact, tags))


def context(ctx: RunContext, max_tokens: object, query: object) -> str:
    _allowed(ctx, "recall memories", "read")
    runtime = ctx.runtime
    return runtime.memory.context(ctx.principal, max_tokens, query,
                                  may_read=may_read_for(runtime.registry, ctx.principal))
