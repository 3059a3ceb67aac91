"""EventSubscription: committed events pushed on one ``kernos.events`` comm.

The comm's protocol is documented in ``kernos.kernel.streams``: a backlog of
``events`` batches, then ``ready``, then each committed op's events.  The
client's IOPub reader hands this object every message of its comm; the
caller reads events in order with ``get()`` or ``async for``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from kernos.client.errors import ClientClosed, ClientError, RequestError

__all__ = ["EventSubscription"]


class EventSubscription:
    """Committed events pushed by the kernel on one ``kernos.events`` comm.

    ``async for event in subscription`` yields each event once, in commit
    order, never one of an op that rolled back.  ``cursor`` is the sequence
    number to resume from (``client.subscribe(since=subscription.cursor)``)
    after a disconnect or a restart: it covers exactly the events already
    handed out.
    """

    def __init__(self, comm_id: str, since: int | None,
                 unsubscribe: Callable[[str], None]) -> None:
        """Made by ``AsyncKernosClient.subscribe``; ``unsubscribe`` closes the comm."""
        self.comm_id = comm_id
        self.cursor: int | None = since
        """Resume point: the kernel's cursor as of the last event handed out."""
        self._unsubscribe = unsubscribe
        # Items: ("event", event, cursor) or ("cursor", None, cursor).
        self._queue: deque[tuple[str, dict[str, Any] | None, int]] = deque()
        self._arrived = asyncio.Event()
        self._ended: ClientError | None = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _receive(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "comm_close":
            self._fail(ClientClosed("the kernel closed the kernos.events comm"))
            return
        what = data.get("type")
        if what == "events":
            for event in data.get("events") or []:
                if isinstance(event, dict) and isinstance(event.get("seq"), int):
                    self._queue.append(("event", event, event["seq"]))
            if isinstance(data.get("cursor"), int):
                self._advance(data["cursor"])
            self._arrived.set()
        elif what == "ready":
            if isinstance(data.get("cursor"), int):
                self._advance(data["cursor"])
            if not self._ready.done():
                self._ready.set_result(None)
        elif what == "error":
            self._unsubscribe(self.comm_id)
            self._fail(RequestError("invalid", str(data.get("error") or "no reason given"),
                                    action="subscribe"))

    def _advance(self, cursor: int) -> None:
        if self._queue:
            self._queue.append(("cursor", None, cursor))
            self._arrived.set()
        else:
            self.cursor = max(cursor, self.cursor or 0)

    def _fail(self, error: ClientError) -> None:
        if self._ended is None:
            self._ended = error
        if not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # retrieved: nobody need await it
        self._arrived.set()

    async def get(self, timeout: float | None = None) -> dict[str, Any]:
        """The next event.  Raises ``TimeoutError`` if none comes within ``timeout``;
        :class:`ClientClosed` once the subscription ended; :class:`KernelDied`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self._queue:
                kind, event, cursor = self._queue.popleft()
                self.cursor = max(cursor, self.cursor or 0)
                if kind == "event":
                    assert event is not None
                    # Cursor marks right behind it cover nothing still unread.
                    while self._queue and self._queue[0][0] == "cursor":
                        self.cursor = max(self._queue.popleft()[2], self.cursor)
                    return event
            if self._ended is not None:
                raise self._ended
            self._arrived.clear()
            if deadline is None:
                await self._arrived.wait()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no event within {timeout:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    def __aiter__(self) -> EventSubscription:
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            return await self.get()
        except ClientClosed:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        """Close the comm; events already received can still be read."""
        self._unsubscribe(self.comm_id)
        self._fail(ClientClosed("this subscription was closed"))
