"""Interrupting a harness op, like a cell: SIGINT stops its body, never its commit.

A cell is interrupted by SIGINT (Jupyter's ``interrupt_request``): while its
code runs the interrupt raises ``KeyboardInterrupt`` and the op rolls back;
while it commits or rolls back the interrupt is dropped (:func:`deferred_sigint`).
A harness op (the
client, the CLI, MCP) gets the same rule from :class:`OpInterrupts`: while
the service runs an op's *body* (:meth:`OpInterrupts.body`) SIGINT raises
``KeyboardInterrupt`` there; before it (the key lookup, the preconditions)
and after it (the commit, the rollback, the reply) SIGINT is dropped.

SIGINT is process-wide, and several clients share a kernel: a client that
means to stop *its* op names it (``kernos_interrupt_request`` on the control
channel, with the op's id or its idempotency key; the control channel is
served while the shell is busy).  :meth:`OpInterrupts.request` aims the
interrupt at that op and signals the main thread; the handler raises only if
that op's body is still the one running, so an interrupt that arrives after
its op has finished (and another began) is dropped, never misdirected.  A
plain SIGINT (no target) stops whichever op body runs, as for cells.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = ["OpInterrupts", "deferred_sigint"]


@contextlib.contextmanager
def deferred_sigint() -> Iterator[None]:
    """Hold SIGINT off while the body runs (main thread only); a late interrupt is dropped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class _Running:
    op: int
    key: str | None


class OpInterrupts:
    """Which harness op body may be interrupted now, and the SIGINT handler that decides."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: _Running | None = None
        self._target: int | None = None
        """The op a targeted interrupt was aimed at (None: whichever body runs)."""

    # -- the main thread ---------------------------------------------------------------

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """SIGINT goes to :meth:`_handler` while the body runs (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            with self._lock:
                self._running = None
                self._target = None

    @contextlib.contextmanager
    def body(self, op: int, key: str | None) -> Iterator[None]:
        """The op's body runs inside: here, and only here, SIGINT interrupts it."""
        with self._lock:
            self._running = _Running(op=op, key=key)
        try:
            yield
        finally:
            with self._lock:
                self._running = None
                self._target = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        with self._lock:
            running, target = self._running, self._target
            hit = running is not None and (target is None or target == running.op)
            if hit:
                self._running = None  # one interrupt per body
                self._target = None
        if hit:
            raise KeyboardInterrupt

    # -- the control thread ------------------------------------------------------------

    def request(self, *, op: object = None, key: object = None) -> dict[str, Any]:
        """Interrupt the op named by ``op`` (its id) or ``key``, if its body runs now."""
        if (op is None) == (key is None) or (op is not None and type(op) is not int) or (
                key is not None and type(key) is not str):
            return {"interrupted": False, "error": "name the op to interrupt: give exactly "
                    "one of 'op' (an int, the op's id) or 'key' (a string, its idempotency "
                    "key)"}
        with self._lock:
            running = self._running
            if running is None or (running.op != op if op is not None else running.key != key):
                return {"interrupted": False, "running": None if running is None else
                        running.op, "reason": "that op's body is not running (it has not "
                                              "started, or it is committing, or it ended)"}
            self._target = running.op
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        return {"interrupted": True, "op": running.op}
