"""What a kernel holds for its remote while it runs: the writer lease and the pusher.

A kernel started with ``KERNOS_REMOTE=<name>`` (:func:`kernos.remote.start.start_remote`)
holds a :class:`RemoteSession`: a thread renews the lease
(:mod:`kernos.remote.lease`) at a third of its ``ttl``, and the pusher
(:class:`kernos.remote.autopush.AutoPusher`) pushes after commits.  At close
the last ops are pushed, and the lease goes back only if they all reached the
remote.
"""

from __future__ import annotations

import logging
import threading

from kernos.errors import RemoteError, RemoteLeaseHeld
from kernos.remote.autopush import AutoPusher
from kernos.remote.lease import Lease, utc

__all__ = ["RemoteSession"]

log = logging.getLogger("kernos.remote")


class RemoteSession:
    """What a kernel holds for its remote: the lease (if on) and the pusher."""

    def __init__(self, lease: Lease | None, pusher: object | None) -> None:
        self.lease = lease
        self.pusher: AutoPusher | None = pusher if isinstance(pusher, AutoPusher) else None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        if lease is not None:
            self._renewer = threading.Thread(target=self._renew, name="kernos-lease",
                                             daemon=True)
            self._renewer.start()

    def _renew(self) -> None:
        assert self.lease is not None
        while not self._stop.wait(self.lease.ttl / 3):
            try:
                self.lease.renew()
            except RemoteLeaseHeld:
                if self.pusher is not None:
                    self.pusher.stop_pushing("the remote's lease was taken over")
                return
            except RemoteError:
                continue  # the remote is unreachable for now: try again at the next beat

    def close(self) -> None:
        """Final push, then the lease goes back: only if the remote has every op, else a
        kernel elsewhere would resume without them (the lease then expires, or the next
        kernel on this copy renews it and pushes them)."""
        self._stop.set()
        if self.pusher is not None:
            self.pusher.close()
        if self._renewer is not None:
            self._renewer.join()
        if self.lease is None:
            return
        if self.pusher is not None and not self.pusher.complete:
            log.warning("keeping the lease on %s until %s: its last ops did not reach it "
                        "(%s)", self.lease.name, utc(self.lease.holder.expires),
                        self.pusher.error or "not pushed")
            return
        try:
            self.lease.release()
        except RemoteError as error:  # a shutdown goes on: the lease expires by itself
            log.warning("the lease on %s could not be released (it expires at %s): %s",
                        self.lease.name, utc(self.lease.holder.expires), error)
