"""The harness transport: ``kernos_request`` shell messages, answered with ``kernos_reply``.

A thin adapter over :class:`kernos.harness.service.HarnessService` (the
protocol is documented in ``kernos.harness.protocol``).  Each request waits
for the kernel's op lock, so it is serialized with cells and with every
other client's requests; its committed events are then pushed to the
``kernos.events`` subscribers, exactly as a cell's are.

*Group commit.*  A request's op commits without syncing
(``Workspace.group_commit``) and releases the op lock; its reply, its events
and the inspectors' notices wait in a task until a sync covers it
(``KernosKernel.durable``).  Meanwhile the next requests run, and one sync
covers all the ops that committed while the last one ran.  So no one hears
of an op before it is durable (I2), and clients that queue ops share the cost
of a sync.  Every other request (a cell, a comm message) first makes what
came before durable.

While a request runs, long steps (the start-up restore it waits for, a
checkout) are reported as ``kernos_progress`` IOPub messages whose parent is
the request, throttled by :class:`ThrottledProgress`.

While the kernel owns its workspace it keeps ``<workspace>/kernel.json``
(``{"connection_file", "pid"}``) so that a harness, the CLI or the MCP server
can find the running kernel and connect to it instead of starting another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernos._durable import replace_file
from kernos.harness.protocol import (
    INTERRUPT_REPLY,
    INTERRUPT_REQUEST,
    REPLY_TYPE,
    REQUEST_TYPE,
    ProtocolError,
    error_reply,
)
from kernos.harness.service import Handled, HarnessService
from kernos.kernel.host import KernelHost

__all__ = ["CONNECTION_FILE", "GROUP_COMMIT", "Control", "ThrottledProgress"]

GROUP_COMMIT = os.environ.get("KERNOS_GROUP_COMMIT", "on").strip().lower() not in {
    "off", "0", "no", "false"}
"""Whether harness requests commit as a group (``KERNOS_GROUP_COMMIT=off``: each op syncs
its own commit before the next one runs)."""

CONNECTION_FILE = "kernel.json"
PROGRESS_INTERVAL = 0.1
"""Seconds between two progress messages of one request (the final one is never held back);
``KERNOS_PROGRESS_INTERVAL`` overrides it (0: a message for every step of progress)."""


def progress_interval() -> float:
    """:data:`PROGRESS_INTERVAL`, or ``KERNOS_PROGRESS_INTERVAL`` if set to a number >= 0."""
    import os

    text = os.environ.get("KERNOS_PROGRESS_INTERVAL")
    try:
        chosen = float(text) if text is not None else PROGRESS_INTERVAL
    except ValueError:
        return PROGRESS_INTERVAL
    return chosen if chosen >= 0 else PROGRESS_INTERVAL


class ThrottledProgress:
    """Turns ``(what, done, total)`` calls into at most one message per ``interval``.

    A call that completes a step (``done >= total``) is always sent, as
    ``done == total``, once; so is the first call of a new step.  A call
    that has not moved since the last message sends nothing.
    """

    def __init__(self, send: Callable[[dict[str, Any]], None], *,
                 interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._interval = progress_interval() if interval is None else interval
        self._clock = clock
        self._what: str | None = None
        self._last_sent = 0.0
        self._last_done = -1
        self._finished = False

    def __call__(self, what: str, done: int, total: int) -> None:
        if total <= 0:
            return  # nothing to measure (an empty snapshot)
        now = self._clock()
        final = done >= total
        if what != self._what:
            self._what, self._finished = what, False
        elif self._finished or done == self._last_done or (
                not final and now - self._last_sent < self._interval):
            return  # a stalled step (the restore is polled) repeats nothing
        self._last_sent, self._last_done, self._finished = now, done, final
        self._send({"v": 1, "what": what, "done": min(done, total), "total": total})


class Control:
    """Serves harness requests for one kernel."""

    def __init__(self, kernel: KernelHost) -> None:
        self.kernel = kernel
        self._service: HarnessService | None = None
        self._waiting: set[asyncio.Future[None]] = set()
        """Replies that wait for their op's sync (kept here so they are not collected)."""
        kernel.shell_handlers[REQUEST_TYPE] = self.request
        kernel.control_handlers[INTERRUPT_REQUEST] = self.interrupt

    def service(self) -> HarnessService:
        image = self.kernel.attached_image()
        if self._service is None or self._service.image is not image:
            self._service = HarnessService(image, self.kernel.agent_runtime(),
                                           max_request_bytes=self.kernel.max_source_bytes)
            self._service.interruptible = self.kernel.interrupts.body
        return self._service

    def interrupt(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """``kernos_interrupt_request`` (control channel): interrupt the named op's body."""
        content = parent.get("content")
        named = content if isinstance(content, dict) else {}
        reply = self.kernel.interrupts.request(op=named.get("op"), key=named.get("key"))
        if self.kernel.session is not None:
            self.kernel.session.send(stream, INTERRUPT_REPLY, reply, parent, ident=ident)

    async def request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        kernel = self.kernel
        content = parent.get("content")
        try:
            size = len(json.dumps(content, default=str).encode("utf-8", "surrogatepass"))
        except (TypeError, ValueError):
            size = None
        await kernel.wait_for_restore(parent)
        problem = await kernel._ready()
        if problem is not None:
            error = ProtocolError("workspace", str(problem))
            self._send(stream, ident, parent, error_reply(None, error))
            return
        workspace = kernel.attached_image().workspace
        async with kernel._op_lock:
            with workspace.group_commit() if GROUP_COMMIT else contextlib.nullcontext():
                handled = kernel.serve(content, size=size,
                                       progress=kernel.progress_reporter(parent), announce=False)
            ticket = workspace.commit_ticket
        if workspace.durable_through(ticket):
            self._finish(stream, ident, parent, handled)
        else:  # a group commit: the next requests run while this one's sync does
            task = asyncio.ensure_future(self._finish_when_durable(
                stream, ident, parent, handled, ticket))
            self._waiting.add(task)
            task.add_done_callback(self._waiting.discard)
        kernel.loop_driver.wake()  # the request may have started, paused or reset a loop
        await asyncio.sleep(0)

    async def _finish_when_durable(self, stream: Any, ident: Any, parent: dict[str, Any],
                                   handled: Handled, ticket: int) -> None:
        try:
            await self.kernel.durable(ticket)
        except OSError as error:
            self.kernel.log.error("Kernos: %s", error)
            self._send(stream, ident, parent, error_reply(
                None, ProtocolError("workspace", str(error))))
            return
        self._finish(stream, ident, parent, handled)

    def _finish(self, stream: Any, ident: Any, parent: dict[str, Any],
                handled: Handled) -> None:
        """The op is durable: tell the subscribers and inspectors, then the client."""
        self.kernel.announce(handled)
        self._send(stream, ident, parent, handled.reply)
        self.kernel.fold_when_idle()

    def _send(self, stream: Any, ident: Any, parent: dict[str, Any],
              reply: dict[str, Any]) -> None:
        if self.kernel.session is not None:
            self.kernel.session.send(stream, REPLY_TYPE, reply, parent, ident=ident)

    # -- being found -----------------------------------------------------------------

    def advertise(self, workspace: Path, durable: bool) -> None:
        """Write ``kernel.json`` so that clients can find this kernel."""
        connection_file = getattr(self.kernel.parent, "abs_connection_file", None)
        if not connection_file:
            return
        data = json.dumps({"connection_file": str(connection_file), "pid": os.getpid()})
        try:
            replace_file(workspace / CONNECTION_FILE, data.encode(), durable=durable)
        except OSError as error:  # being findable is a convenience, not a duty
            self.kernel.log.warning("Kernos: could not write %s: %s",
                                    workspace / CONNECTION_FILE, error)

    def withdraw(self, workspace: Path) -> None:
        path = workspace / CONNECTION_FILE
        try:
            data = json.loads(path.read_bytes())
            if type(data) is dict and data.get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass
