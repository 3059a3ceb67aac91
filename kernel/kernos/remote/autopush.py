"""Push after commit, with bounded lag: :class:`AutoPusher`.

A background thread watches the workspace's head (a read-only view, tail
included: the kernel's own commit path is untouched) and pushes when it has
moved.  Pushes coalesce: at most one every ``interval`` seconds, and one push
carries every op committed before it started, so under a steady stream of
ops the lag of an op (its commit to its arrival at the remote) is bounded by
about ``interval`` plus one push.  :meth:`AutoPusher.notify` wakes it at once
(a kernel may call it after each commit); without it, it looks every
``interval``.  :meth:`AutoPusher.close` makes a final push (``complete`` says
whether the remote then has the head).

A refused push (another writer, a lease held elsewhere) stops pushing (it
would be refused again): :attr:`AutoPusher.error` says why and the kernel
goes on committing locally.  An unreachable remote is retried at the next
beat.  :attr:`AutoPusher.lags` records, per push, the seconds from when the
pusher first saw the head it carried to when the remote had it.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from kernos.errors import KernosError, RemoteDiverged, RemoteLeaseHeld, WorkspaceError
from kernos.remote.transfer import PushResult, push
from kernos.store.workspace import Workspace

__all__ = ["AutoPusher"]

log = logging.getLogger("kernos.remote")


class AutoPusher:
    """Pushes a workspace to one remote after its head moves (see the module doc)."""

    def __init__(self, workspace: Path, name: str, *, interval: float = 0.2) -> None:
        self.workspace = Path(workspace).absolute()
        self.name = name
        self.interval = interval
        self.pushed: bytes | None = None
        """The head the remote has (as far as this pusher knows)."""
        self.pushes: list[PushResult] = []
        self.lags: list[float] = []
        self.error: str | None = None
        """Why pushing stopped (a refusal), or the last transient failure."""
        self.stopped = False
        self.complete = False
        """After :meth:`close`: whether the remote has the workspace's head."""
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._view: Workspace | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kernos-push", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        """A commit happened: look now (still at most one push per ``interval``)."""
        self._wake.set()

    def stop_pushing(self, why: str) -> None:
        self.stopped = True
        self.error = why

    def head(self) -> bytes | None:
        try:
            if self._view is None:
                self._view = Workspace.open(self.workspace, writable=False)
            return self._view.head()
        except WorkspaceError:
            return None

    def push_now(self) -> PushResult | None:
        """Push if the head moved since the last push; what it did."""
        with self._lock:
            if self.stopped:
                return None
            head = self.head()
            if head is None or head == self.pushed:
                return None
            seen = time.monotonic()
            try:
                result = push(self.workspace, self.name)
            except (RemoteDiverged, RemoteLeaseHeld) as error:
                self.stop_pushing(str(error))
                log.warning("pushing to %s stopped: %s", self.name, error)
                return None
            except (KernosError, OSError) as error:
                if str(error) != self.error:  # once per distinct failure, not every beat
                    log.warning("pushing to %s failed (retried): %s", self.name, error)
                self.error = str(error)
                return None
            self.lags.append(time.monotonic() - seen)
            self.pushed = bytes.fromhex(result.head) if result.head else None
            self.pushes.append(result)
            self.error = None
            return result

    def _run(self) -> None:
        while not self._closing:
            started = time.monotonic()
            self.push_now()
            self._wake.wait(self.interval)
            self._wake.clear()
            rest = self.interval - (time.monotonic() - started)
            if rest > 0 and not self._closing:
                time.sleep(rest)  # coalesce: no more than one push per interval

    def close(self) -> None:
        """Stop the thread and push what is left."""
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self.push_now()
        head = self.head()
        self.complete = head is None or head == self.pushed
        if self._view is not None:
            self._view.close()
            self._view = None
