"""Leaving cleanly: a shutdown lets the request being served send its reply first.

Why.  jupyter_client's ``shutdown_kernel`` interrupts the kernel, then sends
``shutdown_request`` on the control channel.  ipykernel answers it on its
control thread and then stops the shell channel's thread, which closes the
inproc sockets the main thread sends its replies on.  A cell that was
running (``time.sleep(30)``) ends on the interrupt a moment later, rolls
back, and sends its ``execute_reply`` on a closed socket: ``ZMQError: Socket
operation on non-socket``, a traceback on the kernel's stderr (which a
command that started the kernel for itself shows its user).

So every shell request is counted while it is served (:meth:`InFlight.tracked`),
and the kernel's ``do_shutdown`` first waits, at most :data:`REPLY_WAIT`
seconds, for the one being served to send its reply (:meth:`InFlight.settle`),
before it closes the workspace: the interrupted op rolls back against an open
workspace, and its reply leaves while the shell channel is there.  A reply that
still meets a closed socket (a cell that ignores the interrupt past the wait)
is logged as one line, not a traceback: the client asked the kernel to go.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import zmq

__all__ = ["REPLY_WAIT", "InFlight"]

REPLY_WAIT = 2.0
"""Seconds a shutdown waits for the request being served (jupyter_client kills a kernel
that has not exited 5 s after its shutdown request)."""


class InFlight:
    """The shell requests being served, and whether the kernel is leaving."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._serving = 0
        self._idle = threading.Event()
        self._idle.set()
        self.leaving = False
        """Set by :meth:`settle`: a reply that fails on a closed socket is expected now."""

    def tracked(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        """``handler`` (a shell message handler), counted while it runs."""

        async def served(*args: Any) -> Any:
            with self._lock:
                self._serving += 1
                self._idle.clear()
            try:
                result = handler(*args)
                if asyncio.iscoroutine(result):
                    result = await result
                return result
            except zmq.ZMQError as error:
                if not self.leaving:
                    raise
                self._log.info("Kernos: a reply was not sent, the kernel is shutting down "
                               "and its shell channel is closed (%s)", error)
                return None
            finally:
                with self._lock:
                    self._serving -= 1
                    if self._serving == 0:
                        self._idle.set()

        return served

    def settle(self, timeout: float = REPLY_WAIT) -> bool:
        """From the control thread, at shutdown: wait until no request is being served
        (its reply sent); whether none is."""
        self.leaving = True
        return self._idle.wait(timeout)
