"""The kernel's loop driver: turns agents' ``running`` loops, one op per iteration.

A thin adapter over :mod:`kernos.agents.loop`.  One asyncio task on the
kernel's event loop picks a due loop (round robin among those due), takes the
op lock for *one* iteration op (the agent as principal, committed without a
sync like a harness request, ``kernos.kernel.control``), releases it, and
yields: cells, harness requests and comm messages queued meanwhile get the
lock before the next iteration.  Like a harness request's, an iteration's
events and inspector notices wait until a sync made its op durable.

* ``every_ms`` is the pause between two iterations of a loop; 0 still yields.
* An iteration refused by an open circuit (or a loop whose agent's circuit is
  open) is *parked* until the human resets the circuit: the driver looks at the
  in-memory circuit each time it wakes, and runs no op for it meanwhile.  The
  trip's event is committed at once, in the supervisor's own op
  (``KernosKernel.announce_trips``).
* *Waking.*  Every path that can make a loop due ends by calling :meth:`LoopDriver.wake`:
  a cell (``do_execute``), a harness request (``Control.request``: the CLI, the
  MCP server, a harness) and a comm message (``KernosKernel._after_ops``: the
  sidebar's and the widget's buttons).  Due times (``every_ms``, back-off) are
  slept to exactly.  Nothing else changes what is due: circuits and loops
  change only in this kernel's ops (the supervisor's journal is read when the
  workspace opens, and one kernel owns a workspace).  So ``IDLE_POLL`` is only
  a safety net, and long: an idle kernel wakes every 5 s, not every 250 ms.
* An iteration that does not commit is retried after a short back-off that
  doubles up to ``MAX_BACKOFF``.
* At start the driver waits for the restore, then turns what is ``running`` in
  the image (so loops resume where the last durable commit left them); at
  shutdown it is cancelled between ops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from kernos.agents import loop as loops
from kernos.kernel.control import GROUP_COMMIT
from kernos.kernel.host import KernelHost
from kernos.kernel.interrupts import deferred_sigint

if TYPE_CHECKING:
    from kernos.agents.runtime import AgentRuntime
    from kernos.op import CommitReport

__all__ = ["IDLE_POLL", "LoopDriver"]

log = logging.getLogger(__name__)

IDLE_POLL = 5.0
"""Seconds the driver sleeps when nothing is due (whatever can make a loop due wakes it);
``KERNOS_LOOP_IDLE_POLL`` overrides it (a test makes it huge to show that a wake suffices)."""
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 2.0
STOP_WAIT = 10.0
"""Seconds a shutdown waits for the iteration that is running to end."""


def idle_poll() -> float:
    """:data:`IDLE_POLL`, or ``KERNOS_LOOP_IDLE_POLL`` if set to a number > 0."""
    text = os.environ.get("KERNOS_LOOP_IDLE_POLL")
    try:
        chosen = float(text) if text is not None else IDLE_POLL
    except ValueError:
        return IDLE_POLL
    return chosen if 0 < chosen < float("inf") else IDLE_POLL


class LoopDriver:
    """Turns the running loops of one kernel's image."""

    def __init__(self, kernel: KernelHost) -> None:
        self.kernel = kernel
        self.idle_poll = idle_poll()
        """Seconds to sleep when nothing is due (:data:`IDLE_POLL`)."""
        self._task: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._due: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._parked: set[str] = set()
        self._waiting: set[asyncio.Future[None]] = set()
        self._thread: threading.Thread | None = None
        self._ended = threading.Event()
        """Set once the task has ended (no iteration of the driver's runs any more)."""
        self._stopping = False
        self._iterating = False
        """Whether an iteration's op runs (set before ``_stopping`` is read: see ``stop``)."""

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the task (on the running loop, once)."""
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.current_thread()
            self._wake = asyncio.Event()
            self._task = asyncio.ensure_future(self._run())

    def wake(self) -> None:
        """Look at the loops again now (a cell or a request may have changed them)."""
        if self._wake is not None:
            self._wake.set()

    def stop(self, wait: float = STOP_WAIT) -> None:
        """Cancel the task, from any thread; an iteration running finishes first.

        From another thread (ipykernel's control thread, which handles a shutdown
        request) this waits up to ``wait`` seconds for an iteration that is
        running to end, so that the workspace is not closed under its commit; it
        does not wait otherwise (a cell may hold the event loop: the task could
        not end before the kernel is killed).  ``_stopping`` is set before
        ``_iterating`` is read, and an iteration sets ``_iterating`` before it
        reads ``_stopping``: either this waits, or the iteration does not start.
        """
        self._stopping = True
        task, running = self._task, self._loop
        self._task = None
        if task is None or running is None or running.is_closed():
            return
        try:
            running.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop is closing anyway
            return
        if threading.current_thread() is not self._thread and self._iterating:
            self._ended.wait(wait)

    # -- the task -----------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._turning()
        finally:
            self._ended.set()

    async def _turning(self) -> None:
        kernel = self.kernel
        while not kernel._restore_done.is_set():
            await asyncio.sleep(0.05)
        while True:
            try:
                agent, wait = self._next()
            except Exception as error:  # the kernel must keep serving
                log.error("Kernos: the loop driver could not read the loops: %s", error)
                agent, wait = None, self.idle_poll
            if agent is None:
                await self._sleep(wait)
                continue
            try:
                await self._turn(agent)
            except Exception as error:
                log.error("Kernos: an iteration of %r's loop could not be run: %s", agent, error)
                self._failed(agent)
            await asyncio.sleep(0)  # what queued for the lock goes first

    def _next(self) -> tuple[str | None, float]:
        """The due loop that waited longest, or None and how long until one is due."""
        kernel = self.kernel
        image = kernel.image
        if image is None or kernel.restore_error is not None or kernel.attach_error is not None:
            return None, self.idle_poll
        now = time.monotonic()
        soonest = self.idle_poll
        due: list[tuple[float, str]] = []
        breakers = kernel.agent_runtime().breakers
        for state in loops.running(image):
            agent = state.agent
            if breakers.circuit(agent) is not None:
                self._parked.add(agent)
                continue
            if agent in self._parked:  # reset by the human: on again, at once
                self._parked.discard(agent)
                self._due[agent] = now
            at = self._due.get(agent, now)
            if at <= now:
                due.append((self._last.get(agent, 0.0), agent))
            else:
                soonest = min(soonest, at - now)
        if due:
            return min(due)[1], 0.0
        return None, soonest

    async def _sleep(self, seconds: float) -> None:
        wake = self._wake
        assert wake is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wake.wait(), max(seconds, 0.001))
        wake.clear()

    async def _turn(self, agent: str) -> None:
        """One iteration op under the op lock; announced once durable."""
        kernel = self.kernel
        async with kernel._op_lock:
            image = kernel.image
            state = None if image is None else loops.state_of(image, agent)
            if image is None or state is None or state.status != "running":
                return  # changed while this waited for the lock
            runtime = kernel.agent_runtime()
            workspace = image.workspace
            self._iterating = True
            try:
                if self._stopping:
                    return
                turn, followups = self._iterate(runtime, agent)
            finally:
                self._iterating = False
            ticket = workspace.commit_ticket
        now = time.monotonic()
        self._last[agent] = now
        if turn.committed:
            self._failures.pop(agent, None)
            self._due[agent] = now + state.every_ms / 1000
        elif turn.outcome == "tripped":
            self._parked.add(agent)
        else:
            self._failed(agent)
            if self._failures[agent] in (1, 10, 100) or self._failures[agent] % 1000 == 0:
                log.warning("Kernos: iteration %d of %r's loop did not commit (%s: %s); "
                            "retrying (%d in a row)", state.iteration, agent, turn.outcome,
                            turn.error, self._failures[agent])
        if workspace.durable_through(ticket):
            self._announce(turn, followups)
        else:
            task = asyncio.ensure_future(self._announce_when_durable(turn, followups, ticket))
            self._waiting.add(task)
            task.add_done_callback(self._waiting.discard)
        kernel.fold_when_idle()

    def _iterate(self, runtime: AgentRuntime,
                 agent: str) -> tuple[loops.Turn, list[CommitReport]]:
        """The iteration's op, then the effects it queued or the trip it caused (each in
        ops of their own)."""
        with deferred_sigint(), \
                runtime.image.workspace.group_commit() if GROUP_COMMIT \
                else contextlib.nullcontext():
            turn = loops.run_once(runtime, agent, blocking=False)
        followups: list[CommitReport] = []
        if turn.committed:
            try:
                followups = runtime.effects.drain()
            except Exception as error:  # recorded by the next drain
                log.error("Kernos: executing effects failed: %s", error)
        else:
            self.kernel.announce_trips()  # a trip's event, in the supervisor's own op, now
        return turn, followups

    def _failed(self, agent: str) -> None:
        count = self._failures.get(agent, 0) + 1
        self._failures[agent] = count
        self._due[agent] = time.monotonic() + min(FIRST_BACKOFF * 2 ** (count - 1),
                                                  MAX_BACKOFF)

    async def _announce_when_durable(self, turn: loops.Turn, followups: list[CommitReport],
                                     ticket: int) -> None:
        try:
            await self.kernel.durable(ticket)
        except OSError as error:
            self.kernel.log.error("Kernos: %s", error)
            return
        self._announce(turn, followups)

    def _announce(self, turn: loops.Turn, followups: list[CommitReport]) -> None:
        """The op is durable: tell the event subscribers and the inspectors."""
        kernel = self.kernel
        if turn.report is not None:
            if turn.report.events:
                kernel.streams.publish(turn.report.events)
            kernel._notify_committed(turn.report)
        else:
            error = None if turn.error is None else f"{type(turn.error).__name__}: {turn.error}"
            kernel.inspection.notify({"type": "rolled_back", "op": turn.op,
                                      "principal": turn.agent, "error": error})
        for report in followups:
            kernel._notify_committed(report)
