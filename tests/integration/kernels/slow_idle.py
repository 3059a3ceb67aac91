"""A Kernos kernel whose control thread stalls at the worst instant of a shutdown.

After the shutdown handler returns, ipykernel's control thread announces
"idle": it sees the IOPub thread alive, queues the message and wakes that
thread through a socket.  Meanwhile the main thread has left its loop and
runs the exit handlers, which stop the IOPub thread and close those sockets.
A control thread descheduled between its check and its send writes to a
closed socket and prints a traceback (a CI run lost this race once).  Here
the control thread sleeps right after the check, as a busy machine's
scheduler might make it, so every shutdown would lose the race.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ipykernel.iostream import IOPubThread
from ipykernel.thread import CONTROL_THREAD_NAME

from kernos.kernel.app import main
from kernos.kernel.kernel import KernosKernel

_shutdown_request = KernosKernel.shutdown_request
_schedule = IOPubThread.schedule
_answered = threading.Event()


async def shutdown_request(self: KernosKernel, *args: Any) -> None:
    await _shutdown_request(self, *args)
    _answered.set()  # what the control thread publishes next ends the request


def schedule(self: IOPubThread, function: Callable[[], None]) -> None:
    # Each message also costs a line on the process's stderr: these writes give
    # the main thread the instants it needs to reach its exit handlers first
    # (without them the stall below did not reproduce the race).
    sys.__stderr__.write(f"slow_idle: {threading.current_thread().name} publishes\n")
    sys.__stderr__.flush()
    if (_answered.is_set() and threading.current_thread().name == CONTROL_THREAD_NAME
            and self.thread.is_alive()):
        _answered.clear()  # once: the flushes and the "idle" that follow go as usual
        # Descheduled between the check and the send, until the exit handlers have
        # stopped the IOPub thread and closed its sockets (or for two seconds).
        deadline = time.monotonic() + 2
        while not self._event_pipe.closed and time.monotonic() < deadline:
            time.sleep(0.001)
        self._events.append(function)
        self._event_pipe.send(b"")
        return
    _schedule(self, function)


KernosKernel.shutdown_request = shutdown_request  # type: ignore[method-assign]
IOPubThread.schedule = schedule  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
