"""The one way every integration talks to the kernel: either client, from sync or async code.

A framework calls its plug-in point from sync code (any thread), from async
code on its own event loop, or both; the user hands the integration either a
blocking :class:`KernosClient` or an :class:`AsyncKernosClient`.  :class:`Kernel`
makes every pairing work:

* a ``KernosClient`` is called directly from sync code and in a worker thread
  from async code;
* an ``AsyncKernosClient`` belongs to the loop it was first used from: async
  code on that loop awaits it, async code on another loop and sync code on
  another thread hand the request to that loop.  Sync code on the client's own
  loop, or with no loop running it, cannot wait and gets a :class:`UsageError`
  that says which to use instead.

:class:`Conversation` is what a framework's conversation store kept by the
``session_*`` requests stands on: its id, its owner, and the kernel.

:func:`to_the_end` runs a mutation to its end even if its caller is cancelled,
as the frameworks' own stores do, so a caller never loses track of what a
half-seen op did.  This module imports no framework.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from kernos.client import AsyncKernosClient, KernosClient
from kernos.errors import UsageError
from kernos.harness.results import OpResult

__all__ = ["MAX_SESSION_ID_CHARS", "Client", "Conversation", "Kernel", "to_the_end"]

Client = AsyncKernosClient | KernosClient
Result = TypeVar("Result")
MAX_SESSION_ID_CHARS = 200
"""The longest session id a framework's conversation may have (the kernel's limit)."""


class Kernel:
    """Requests and ops to the kernel from sync code (any thread) and async code (any loop).

    ``owner`` names the integration's object in the errors (``"a KernosSaver"``);
    ``async_way`` names what to call from the client's own loop (``"graph.ainvoke"``).
    """

    def __init__(self, client: Client, *, owner: str = "this integration",
                 async_way: str = "") -> None:
        if not isinstance(client, (AsyncKernosClient, KernosClient)):
            raise TypeError(f"a Kernos client is an AsyncKernosClient or a KernosClient, not "
                            f"{type(client).__name__}; make one with KernosClient.start(WS) "
                            "or KernosClient.connect(WS)")
        self.client = client
        self.owner = owner
        self.async_way = async_way
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop an AsyncKernosClient's requests run on: the one it was first used from."""
        if isinstance(client, AsyncKernosClient):
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:
                self.loop = None

    async def arequest(self, action: str, **fields: Any) -> dict[str, Any]:
        client = self.client
        if isinstance(client, KernosClient):
            return await asyncio.to_thread(client.request, action, **fields)
        return await self._await(client.request(action, **fields))

    def request(self, action: str, **fields: Any) -> dict[str, Any]:
        client = self.client
        if isinstance(client, KernosClient):
            return client.request(action, **fields)
        return self._wait(client.request(action, **fields))

    async def aop(self, code: str, *, principal: str, key: str | None = None) -> OpResult:
        client = self.client
        if isinstance(client, KernosClient):
            return await asyncio.to_thread(client.op, code, principal=principal, key=key)
        return await self._await(client.op(code, principal=principal, key=key))

    def op(self, code: str, *, principal: str, key: str | None = None) -> OpResult:
        client = self.client
        if isinstance(client, KernosClient):
            return client.op(code, principal=principal, key=key)
        return self._wait(client.op(code, principal=principal, key=key))

    async def _await(self, work: Coroutine[Any, Any, Result]) -> Result:
        running = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = running
        if self.loop is running:
            return await work
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    def _wait(self, work: Coroutine[Any, Any, Result]) -> Result:
        loop = self.loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or not loop.is_running() or running is loop:
            work.close()
            way = f" ({self.async_way})" if self.async_way else ""
            raise UsageError(
                f"a sync method of {self.owner} was called with an AsyncKernosClient "
                + ("from its own event loop (it would wait for itself): use the async "
                   f"methods there{way}" if loop is not None and loop.is_running()
                   else "whose event loop is not running: give it a blocking "
                   "KernosClient (KernosClient.start / connect) for sync use"))
        return asyncio.run_coroutine_threadsafe(work, loop).result()


async def to_the_end(work: Coroutine[Any, Any, Result]) -> Result:
    """Await ``work`` to its end even if the caller is cancelled meanwhile, then re-raise
    the cancellation."""
    task = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as error:
            cancelled = cancelled or error
    result = task.result()
    if cancelled is not None:
        raise cancelled
    return result


class Conversation:
    """A conversation kept in the image by the ``session_*`` requests: its session id
    (1 to 200 characters), its principal (an agent, or ``human``) and the kernel."""

    def __init__(self, session_id: str, client: Client, *, principal: str,
                 async_way: str = "") -> None:
        kind = type(self).__name__
        if not isinstance(session_id, str) or not 0 < len(session_id) <= MAX_SESSION_ID_CHARS:
            raise UsageError(f"a {kind}'s session id is a string of 1 to "
                             f"{MAX_SESSION_ID_CHARS} characters, not {session_id!r:.80}")
        if not isinstance(principal, str) or not principal:
            raise UsageError(f"principal names the {kind}'s owner (an agent, or 'human'), "
                             f"not {principal!r:.80}")
        self.session_id = session_id
        self.principal = principal
        self._kernel = Kernel(client, owner=f"a {kind}", async_way=async_way)

    def _fields(self) -> dict[str, str]:
        return {"session": self.session_id, "principal": self.principal}
