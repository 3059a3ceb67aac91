"""Feeding the working and semantic layers from an image (the adapter the runtime calls).

:func:`sync_from_image` replaces the index's working layer of the human
namespace with the image's per-name facts (name, type, the summary the
history already keeps: never the value itself, so a ``personal()`` value shows
only as its hidden summary), and each principal's semantic layer with the
:class:`~kernos.memory.facts.Facts` value the image holds for it.  Call it after
a commit or a rollback (cheap: it reads ``image.meta``, no unpickling).

Agents' own namespaces are fed by :class:`kernos.memory.service.ImageMemory`
before each of their recalls (and by a rebuild).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from kernos.memory.facts import Facts
from kernos.memory.index import MemoryIndex, WorkingItem

if TYPE_CHECKING:
    from kernos.image import Image

__all__ = ["FACTS_PREFIX", "Grants", "may_read_for", "sync_from_image"]

FACTS_PREFIX = "kernos:memory:"


class Grants(Protocol):
    """What :func:`may_read_for` asks of the grants (a :class:`kernos.agents.registry.Registry`
    is one): the active grant, if any, that lets ``principal`` do ``kind`` on ``target``."""

    def find(self, principal: str, kind: str, target: str) -> object | None: ...


def sync_from_image(index: MemoryIndex, image: Image, *, owner: str = "human") -> None:
    """Replace the working layer of ``owner`` and every principal's facts from ``image``."""
    index.sync_working(owner, [
        WorkingItem(name=name, type=meta.type, preview=meta.summary)
        for name, meta in sorted(image.meta.items()) if not name.startswith("kernos:")])
    held = {name[len(FACTS_PREFIX):]: value for name, value in image.system.items()
            if name.startswith(FACTS_PREFIX) and isinstance(value, Facts)}
    for principal in sorted(set(held) | index.semantic_principals()):
        index.sync_semantic(principal, held.get(principal))


def may_read_for(registry: Grants, principal: str) -> Callable[[str], bool]:
    """The ``may_read`` predicate of ``principal``: the human reads every name, an agent
    the names a ``read:``/``write:`` grant covers (as the harness's ``objects`` filters),
    never a ``kernos:`` name."""
    if principal == "human":
        return lambda name: True

    def may_read(name: str) -> bool:
        return (not name.startswith("kernos:")
                and registry.find(principal, "read", name) is not None)

    return may_read
