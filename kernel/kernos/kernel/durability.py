"""When the kernel's commits reach the disk: the group commit's wait, and the idle fold.

Ops commit to the workspace's tail (``kernos.store.tail``).  :class:`Durability`
decides when those commits are made durable and folded into git, around the
requests the kernel serves:

* :meth:`~Durability.durable` is the group commit's wait: a harness request's
  op returns once a sync covers it, and one sync covers every commit before it;
* :meth:`~Durability.durable_first` wraps every other shell handler, so that
  nothing a request shows (a cell's output, an inspector's view, an event
  backlog) can be lost: it makes the commits before it durable first;
* :meth:`~Durability.fold_when_idle` folds the tail into git once the kernel
  has been idle for ``FOLD_IDLE`` seconds, never while an op runs.

A disk that refuses is logged here, and every commit after it fails and says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kernos.image import Image
from kernos.store.tail import FOLD_IDLE

__all__ = ["Durability"]


class Durability:
    """The durability and the fold of the commits of one kernel's image.

    ``image`` gives the attached image (None while none is attached),
    ``attached`` the image or the reason there is none (raised);
    ``op_lock`` is held while an op runs.
    """

    def __init__(self, image: Callable[[], Image | None], attached: Callable[[], Image],
                 op_lock: asyncio.Lock, log: Any) -> None:
        self._image = image
        self._attached = attached
        self._op_lock = op_lock
        self._log = log
        self._sync_lock = asyncio.Lock()
        self._fold_timer: asyncio.TimerHandle | None = None

    def durable_first(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        """``handler``, which first makes the commits made so far durable."""
        async def handled(*args: Any) -> Any:
            self.make_durable_now()
            result = handler(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return handled

    def make_durable_now(self) -> None:
        """Make the commits made so far durable, if a group commit left any waiting."""
        image = self._image()
        if image is None or image.workspace.durable_through(image.workspace.commit_ticket):
            return
        try:
            image.workspace.make_durable()
        except OSError as error:  # every commit from now on fails with this, and says so
            self._log.error("Kernos: %s", error)

    async def durable(self, ticket: int) -> None:
        """Return once the commits of ``ticket`` are durable: the group commit's wait.

        One sync runs at a time, in a worker thread, and covers every frame
        appended before it started; while it runs, the loop serves the next
        requests, whose ops commit and wait for the next sync.  Raises
        ``OSError`` if the disk refuses.
        """
        workspace = self._attached().workspace
        while not workspace.durable_through(ticket):
            async with self._sync_lock:
                if workspace.durable_through(ticket):
                    return
                await asyncio.get_running_loop().run_in_executor(None, workspace.make_durable)

    def fold_when_idle(self) -> None:
        """Fold the tail into git once no request has come for ``FOLD_IDLE`` seconds.

        Ops commit to the tail (``kernos.store.tail``); this keeps git's own
        view (``git log`` by hand, a copy of the directory) a moment behind at
        most while the kernel idles, at no cost to the ops themselves.
        """
        if self._fold_timer is not None:
            self._fold_timer.cancel()
        self._fold_timer = asyncio.get_running_loop().call_later(FOLD_IDLE, self._fold_now)

    def _fold_now(self) -> None:
        self._fold_timer = None
        image = self._image()
        if image is None or not image.workspace.tail.frames:
            return
        try:
            folded = None if self._op_lock.locked() else image.fold(blocking=False)
        except OSError as error:  # the frames are durable: the next fold (or start) retries
            self._log.warning("Kernos: folding the commit tail into git failed (%s); its "
                              "commits are durable in the tail and nothing is lost: the next "
                              "fold, or the workspace's next open, folds them", error)
            return
        if folded is None:
            self.fold_when_idle()  # an op is running: after it
