"""What the kernel's parts may use of the kernel: the :class:`KernelHost` protocol.

The kernel (:class:`kernos.kernel.kernel.KernosKernel`) builds its parts, the
harness request handler (``control``), the agents' loop driver (``loops``),
the ``%kernos`` magics (``magics``) and the inspector comm (``inspector``),
and hands each itself.  The parts annotate it with this protocol, not the
class, so the arrows inside ``kernos.kernel`` point one way: the kernel
imports its parts, the parts import only this module.  The start-up
(``startup``), the durability of commits (``durability``) and the notices
(``notices``) are narrower still: they receive only the callables, or the
small protocol, they use, not the kernel.

The members are what the parts read or call today; a part that needs more of
the kernel adds it here, where a reader sees the whole surface at once.  The
ipykernel members (``session``, ``parent``, the handler tables, ``log``,
``get_parent``) are typed ``Any``, as ipykernel's traits are.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Protocol

from kernos.agents import AgentRuntime, Agents
from kernos.audit.human import Audit
from kernos.errors import KernosError
from kernos.events.human import Events
from kernos.harness.service import Handled
from kernos.image import Image, RestoreReport
from kernos.inspector.backend import Backend, Notice
from kernos.kernel.interrupts import OpInterrupts
from kernos.op import CheckoutReport, CommitReport, Op

__all__ = ["Inspection", "KernelHost", "ProgressReporter"]

ProgressReporter = Callable[[str, int, int], None]
"""Reports ``(what, done, total)`` of a long step to the request's frontend."""


class Inspection(Backend, Protocol):
    """The kernel's inspector backend, as the other parts see it: a :class:`Backend`
    (what the inspector widget talks to) that also takes notices to push."""

    def notify(self, notice: Notice) -> None: ...


class _Wakes(Protocol):
    def wake(self) -> None: ...


class _Publishes(Protocol):
    def publish(self, events: list[dict[str, Any]]) -> None: ...


class KernelHost(Protocol):
    """The kernel, as its parts use it."""

    # -- the workspace and its image --------------------------------------------
    @property
    def image(self) -> Image | None: ...
    @property
    def attach_error(self) -> KernosError | None: ...
    @property
    def restore_error(self) -> BaseException | None: ...
    @property
    def restore_report(self) -> RestoreReport | None: ...
    @property
    def current_op(self) -> Op | None: ...
    @property
    def max_source_bytes(self) -> int: ...
    @property
    def _restore_done(self) -> threading.Event: ...
    @property
    def _op_lock(self) -> asyncio.Lock: ...

    def attached_image(self) -> Image: ...

    def agent_runtime(self) -> AgentRuntime: ...

    async def wait_for_restore(self, parent: dict[str, Any] | None) -> None: ...

    async def _ready(self) -> KernosError | None: ...

    # -- the kernel's other parts ------------------------------------------------
    @property
    def interrupts(self) -> OpInterrupts: ...
    @property
    def loop_driver(self) -> _Wakes: ...
    @property
    def streams(self) -> _Publishes: ...
    @property
    def inspection(self) -> Inspection: ...
    @property
    def agents(self) -> Agents: ...
    @property
    def events(self) -> Events: ...
    @property
    def audit(self) -> Audit: ...

    # -- serving requests and telling what happened -------------------------------
    def serve(self, content: object, *, size: int | None = None,
              progress: ProgressReporter | None = None,
              announce: bool = True) -> Handled: ...

    def progress_reporter(self, parent: dict[str, Any] | None) -> ProgressReporter: ...

    def announce(self, handled: Handled) -> None: ...

    def announce_trips(self) -> None: ...

    def _notify_committed(self, report: CommitReport, extra: dict[str, str] | None = None, *,
                          checkout: CheckoutReport | None = None) -> None: ...

    async def durable(self, ticket: int) -> None: ...

    def fold_when_idle(self) -> None: ...

    # -- ipykernel's ------------------------------------------------------------
    @property
    def session(self) -> Any: ...
    @property
    def parent(self) -> Any: ...
    @property
    def shell_handlers(self) -> Any: ...
    @property
    def control_handlers(self) -> Any: ...
    @property
    def log(self) -> Any: ...

    def get_parent(self, channel: str = ...) -> Any: ...
