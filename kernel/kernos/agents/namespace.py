"""The agent runtime's names in the image: the registry's, and each agent's namespace.

The registry is the image's ``kernos:agents`` (:data:`REGISTRY`); an agent's
globals are the image's ``kernos:ns:NAME`` (:func:`namespace_key`), an
:class:`AgentNamespace`.  Both commit, roll back and restore with the image,
so whoever needs them looks them up afresh (:func:`namespace_of`): a rollback
may have replaced them.

On-disk format: an :class:`AgentNamespace` is pickled as a call of
:func:`rebuild_namespace` with its owner, then its items (never the agent
builtins).  Images name that function ``kernos.agents.runtime.rebuild_namespace``,
where it was defined before this module held it; it keeps that name (and
``kernos.agents.runtime`` re-exports it), so images written before and after
the move are the same bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernos.agents.guards import AGENT_BUILTINS
from kernos.errors import UsageError
from kernos.op import AGENT_NAMESPACE

if TYPE_CHECKING:
    from kernos.agents.registry import Registry
    from kernos.image import Image

__all__ = ["REGISTRY", "AgentNamespace", "namespace_key", "namespace_of", "rebuild_namespace"]

REGISTRY = "kernos:agents"
"""The image name of the registry (:class:`kernos.agents.registry.Registry`)."""


def namespace_key(agent: str) -> str:
    """The image name of ``agent``'s namespace."""
    return AGENT_NAMESPACE + agent


class AgentNamespace(dict[str, Any]):
    """An agent's globals: its own names, plus the agent builtins (never persisted)."""

    def __init__(self, owner: str, label: str | None = None) -> None:
        super().__init__()
        self.owner = owner
        self["__builtins__"] = AGENT_BUILTINS
        self["__name__"] = f"agent:{label or owner}"

    def __repr__(self) -> str:
        # Cheap and bounded: summaries of the image call repr() on every value.
        return f"<namespace of {self.owner}: {len(self) - 2} names>"

    def user_items(self) -> dict[str, Any]:
        return {key: value for key, value in self.items()
                if not (key.startswith("__") and key.endswith("__"))}

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        items = [(key, value) for key, value in self.items() if key != "__builtins__"]
        return (rebuild_namespace, (self.owner,), None, None, iter(items))


def rebuild_namespace(owner: str) -> AgentNamespace:
    """Load-side constructor (part of the on-disk format)."""
    return AgentNamespace(owner)


# The name images store (see the module docstring): kernos.agents.runtime re-exports it.
rebuild_namespace.__module__ = "kernos.agents.runtime"


def namespace_of(image: Image, registry: Registry, agent: str) -> AgentNamespace:
    """``agent``'s namespace as ``image`` holds it now (UnknownAgent if it is no agent)."""
    registry.principal(agent)
    found = image.system.get(namespace_key(agent))
    if not isinstance(found, AgentNamespace):
        raise UsageError(f"the namespace of agent {agent!r} is missing from the image")
    return found
