"""KernosClient: the blocking facade over :class:`AsyncKernosClient`.

It holds no logic of its own.  Each facade runs one private event loop in a
daemon thread, and every method hands the async client's coroutine to that
loop (``run_coroutine_threadsafe``) and waits for it.  So it works from
plain scripts and from inside Jupyter alike (where the calling thread may
already run a loop of its own)::

    with KernosClient.start("/path/to/workspace") as client:   # starts and owns a kernel
        client.op("x = 1")
        client.manager.kill()                                 # blocking lifecycle, too
        client.manager.restart()                              # the facade follows
    with KernosClient.connect("/path/to/workspace") as client:  # a kernel already running
        print(client.objects())

A ``progress`` callback (``op``, ``checkout``, ``request``, ``send_raw``) is
called on the facade's loop thread, not the caller's: keep it quick, and
make it thread-safe if it touches what the calling thread uses.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

from kernos.client.client import AsyncKernosClient, EventSubscription, ProgressCallback
from kernos.client.errors import ClientClosed
from kernos.client.manager import KernosManager
from kernos.client.retry import retry_on_conflict
from kernos.errors import UsageError
from kernos.harness.results import ObjectInfo, OpResult

__all__ = ["BlockingManager", "EventStream", "KernosClient"]

Result = TypeVar("Result")


class _Loop:
    """One event loop running in a daemon thread, and a way to wait on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kernos-client",
                                        daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, Result]) -> Result:
        if threading.current_thread() is self._thread:
            work.close()
            raise UsageError("a blocking KernosClient method was called from its own event "
                             "loop (an async callback?); it would wait for itself forever. "
                             "Use the async client there (client.async_client).")
        if not self.loop.is_running():
            work.close()
            raise ClientClosed("this KernosClient is closed; make a new one")
        future: Future[Result] = asyncio.run_coroutine_threadsafe(work, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. Ctrl-C while waiting: stop the coroutine too
            raise

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        if not self.loop.is_closed():
            self.loop.close()


class KernosClient:
    """Blocking requests to a Kernos kernel: see :class:`AsyncKernosClient`."""

    def __init__(self, loop: _Loop, client: AsyncKernosClient,
                 manager: KernosManager | None = None) -> None:
        """Use :meth:`start` or :meth:`connect`."""
        self._loop = loop
        self._client = client
        self._manager = BlockingManager(self, manager) if manager is not None else None

    @classmethod
    def start(cls, workspace: str | Path, *, env: dict[str, str] | None = None,
              kernel_name: str = "kernos", timeout: float = 120, gateway: str | None = None,
              token: str | None = None) -> KernosClient:
        """Start a kernel on ``workspace`` and own it: closing the client shuts it down.

        ``gateway``/``token``: through a Jupyter Enterprise Gateway (``workspace`` is then
        a name; see :class:`KernosManager`)."""
        loop = _Loop()
        manager = KernosManager(workspace, env=env, kernel_name=kernel_name, gateway=gateway,
                                token=token)

        async def begin() -> AsyncKernosClient:
            try:
                await manager.start(timeout=timeout)
                return await manager.client()
            except BaseException:
                await manager.shutdown()
                raise

        try:
            client = loop.run(begin())
        except BaseException:
            loop.stop()
            raise
        return cls(loop, client, manager)

    @classmethod
    def connect(cls, workspace: str | Path, *, timeout: float = 30,
                gateway: str | None = None, token: str | None = None) -> KernosClient:
        """Connect to the kernel already running on ``workspace`` (see
        :meth:`AsyncKernosClient.connect`; ``gateway``: under that Enterprise Gateway)."""
        loop = _Loop()
        try:
            client = loop.run(AsyncKernosClient.connect(workspace, timeout=timeout,
                                                        gateway=gateway, token=token))
        except BaseException:
            loop.stop()
            raise
        return cls(loop, client)

    @property
    def manager(self) -> BlockingManager:
        """The kernel's lifecycle, blocking; only for a client made by :meth:`start`."""
        if self._manager is None:
            raise ClientClosed("this client connected to a kernel it does not own, so it has "
                               "no manager; use KernosClient.start(workspace) to own one")
        return self._manager

    @property
    def async_client(self) -> AsyncKernosClient:
        """The async client underneath (its coroutines run on this facade's loop only)."""
        return self._client

    # -- requests: each one delegates -------------------------------------------------

    def request(self, action: str, *, timeout: float | None = None,
                progress: ProgressCallback | None = None, **fields: Any) -> dict[str, Any]:
        return self._loop.run(self._client.request(action, timeout=timeout, progress=progress,
                                                   **fields))

    def send_raw(self, content: dict[str, Any], *, timeout: float | None = None,
                 progress: ProgressCallback | None = None) -> dict[str, Any]:
        return self._loop.run(self._client.send_raw(content, timeout=timeout,
                                                    progress=progress))

    def hello(self) -> dict[str, Any]:
        return self._loop.run(self._client.hello())

    def op(self, code: str | None = None, *, principal: str = "human", tool: str | None = None,
           arguments: Mapping[str, Any] | None = None, key: str | None = None,
           expect_versions: Mapping[str, int | None] | None = None,
           predicate: str | None = None, timeout: float | None = None,
           progress: ProgressCallback | None = None, on_error: str | None = None) -> OpResult:
        return self._loop.run(self._client.op(
            code, principal=principal, tool=tool, arguments=arguments, key=key,
            expect_versions=expect_versions, predicate=predicate, timeout=timeout,
            progress=progress, on_error=on_error))

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None, *,
             principal: str = "human", key: str | None = None,
             expect_versions: Mapping[str, int | None] | None = None,
             predicate: str | None = None) -> OpResult:
        return self._loop.run(self._client.call(
            tool, arguments, principal=principal, key=key, expect_versions=expect_versions,
            predicate=predicate))

    def versions(self, names: list[str], *,
                 principal: str | None = None) -> dict[str, int | None]:
        return self._loop.run(self._client.versions(names, principal=principal))

    def objects(self, *, principal: str | None = None, prefix: str | None = None,
                limit: int | None = None, offset: int | None = None) -> list[ObjectInfo]:
        return self._loop.run(self._client.objects(principal=principal, prefix=prefix,
                                                   limit=limit, offset=offset))

    def object(self, name: str, *, principal: str | None = None,
               preview_bytes: int | None = None) -> ObjectInfo:
        return self._loop.run(self._client.object(name, principal=principal,
                                                  preview_bytes=preview_bytes))

    def grant(self, agent: str, capability: str,
              limit: int | str | None = None) -> dict[str, Any]:
        return self._loop.run(self._client.grant(agent, capability, limit))

    def revoke(self, agent: str, capability: str) -> list[str]:
        return self._loop.run(self._client.revoke(agent, capability))

    def grants(self, agent: str | None = None) -> list[dict[str, Any]]:
        return self._loop.run(self._client.grants(agent))

    def add_agent(self, agent: str, limits: Mapping[str, int] | None = None) -> str:
        return self._loop.run(self._client.add_agent(agent, limits))

    def agents(self) -> list[str]:
        return self._loop.run(self._client.agents())

    def tools(self, principal: str | None = None) -> list[dict[str, Any]]:
        return self._loop.run(self._client.tools(principal))

    def log(self, limit: int | None = None, *,
            principal: str | None = None) -> list[dict[str, Any]]:
        return self._loop.run(self._client.log(limit, principal=principal))

    def show(self, ref: str = "HEAD") -> dict[str, Any]:
        return self._loop.run(self._client.show(ref))

    def diff(self, a: str, b: str | None = None) -> dict[str, Any]:
        return self._loop.run(self._client.diff(a, b))

    def checkout(self, ref: str, *, progress: ProgressCallback | None = None) -> OpResult:
        return self._loop.run(self._client.checkout(ref, progress=progress))

    def fork(self, ref: str, dest: str) -> dict[str, Any]:
        return self._loop.run(self._client.fork(ref, dest))

    def events(self, *, since: int | None = None, op: int | None = None,
               topic: str | None = None, principal: str | None = None,
               limit: int | None = None) -> tuple[list[dict[str, Any]], int]:
        return self._loop.run(self._client.events(since=since, op=op, topic=topic,
                                                  principal=principal, limit=limit))

    def audit(self, *, principal: str | None = None, status: str | None = None,
              topic: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        return self._loop.run(self._client.audit(principal=principal, status=status,
                                                 topic=topic, limit=limit))

    def interrupt(self, *, op: int | None = None, key: str | None = None,
                  timeout: float = 30) -> dict[str, Any]:
        return self._loop.run(self._client.interrupt(op=op, key=key, timeout=timeout))

    def status(self) -> dict[str, Any]:
        return self._loop.run(self._client.status())

    def recall(self, query: str, *, principal: str | None = None, k: int | None = None,
               kinds: list[str] | None = None) -> list[dict[str, Any]]:
        return self._loop.run(self._client.recall(query, principal=principal, k=k,
                                                  kinds=kinds))

    def remember(self, fact: str, *, principal: str | None = None,
                 tags: list[str] | None = None) -> dict[str, Any]:
        return self._loop.run(self._client.remember(fact, principal=principal, tags=tags))

    @overload
    def read_file(self, path: str, *, principal: str | None = None,
                  binary: Literal[False] = False) -> str: ...

    @overload
    def read_file(self, path: str, *, principal: str | None = None,
                  binary: Literal[True]) -> bytes: ...

    def read_file(self, path: str, *, principal: str | None = None,
                  binary: bool = False) -> str | bytes:
        """See :meth:`AsyncKernosClient.read_file`."""
        if binary:
            return self._loop.run(self._client.read_file(path, principal=principal,
                                                         binary=True))
        return self._loop.run(self._client.read_file(path, principal=principal))

    def write_file(self, path: str, data: str | bytes, *, principal: str | None = None,
                   key: str | None = None) -> dict[str, Any]:
        return self._loop.run(self._client.write_file(path, data, principal=principal,
                                                      key=key))

    def append_file(self, path: str, data: str | bytes, *, principal: str | None = None,
                    key: str | None = None) -> dict[str, Any]:
        return self._loop.run(self._client.append_file(path, data, principal=principal,
                                                       key=key))

    def list_files(self, prefix: str = "", *, principal: str | None = None,
                   limit: int | None = None) -> list[str]:
        return self._loop.run(self._client.list_files(prefix, principal=principal,
                                                      limit=limit))

    def delete_file(self, path: str, *, principal: str | None = None,
                    key: str | None = None) -> dict[str, Any]:
        return self._loop.run(self._client.delete_file(path, principal=principal, key=key))

    def file_exists(self, path: str, *, principal: str | None = None) -> bool:
        return self._loop.run(self._client.file_exists(path, principal=principal))

    def session_items(self, session: str, *, principal: str | None = None,
                      limit: int | None = None) -> list[dict[str, Any]]:
        return self._loop.run(self._client.session_items(session, principal=principal,
                                                         limit=limit))

    def session_add(self, session: str, items: list[dict[str, Any]], *,
                    principal: str | None = None, key: str | None = None) -> dict[str, Any]:
        return self._loop.run(self._client.session_add(session, items, principal=principal,
                                                       key=key))

    def session_pop(self, session: str, *,
                    principal: str | None = None) -> dict[str, Any] | None:
        return self._loop.run(self._client.session_pop(session, principal=principal))

    def session_clear(self, session: str, *, principal: str | None = None) -> int:
        return self._loop.run(self._client.session_clear(session, principal=principal))

    def sessions(self, *, principal: str | None = None) -> list[dict[str, Any]]:
        return self._loop.run(self._client.sessions(principal=principal))

    def subscribe(self, *, since: int | None = None, op: int | None = None,
                  topic: str | None = None) -> EventStream:
        """Committed events, as a blocking iterator (see :meth:`AsyncKernosClient.subscribe`)."""
        return EventStream(self._loop, self._loop.run(
            self._client.subscribe(since=since, op=op, topic=topic)))

    def retry_on_conflict(self, attempt: Callable[[], OpResult], *, attempts: int = 5,
                          backoff: float = 0.005) -> OpResult:
        """:func:`kernos.client.retry.retry_on_conflict` for a blocking ``attempt``.

        ``attempt`` (read, think, act with a precondition, through this
        client) runs in a worker thread, so that its own blocking calls can
        use this facade's loop while the retry loop waits on it.
        """
        return self._loop.run(retry_on_conflict(lambda: asyncio.to_thread(attempt),
                                                attempts=attempts, backoff=backoff))

    # -- ending ------------------------------------------------------------------------

    def _follow(self, client: AsyncKernosClient) -> None:
        """After a restart, requests go to the new process."""
        self._client = client

    def close(self) -> None:
        """Close the client; shut the kernel down if this facade started it."""
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self._client.close())
            if self._manager is not None:
                self._loop.run(self._manager.async_manager.shutdown())
        finally:
            self._loop.stop()

    def __enter__(self) -> KernosClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class BlockingManager:
    """The lifecycle of a kernel that a :class:`KernosClient` started, blocking."""

    def __init__(self, owner: KernosClient, manager: KernosManager) -> None:
        self._owner = owner
        self.async_manager = manager

    @property
    def pid(self) -> int | None:
        return self.async_manager.pid

    def is_alive(self) -> bool:
        return self._owner._loop.run(self.async_manager.is_alive())

    def kill(self) -> None:
        """SIGKILL the kernel and wait until it is gone (requests then raise KernelDied)."""
        self._owner._loop.run(self.async_manager.kill())

    def restart(self, timeout: float = 120) -> None:
        """Start a new kernel process; the owning client then talks to it."""
        async def restart() -> AsyncKernosClient:
            await self.async_manager.restart(timeout=timeout)
            return await self.async_manager.client()

        self._owner._follow(self._owner._loop.run(restart()))


class EventStream:
    """A blocking iterator over an :class:`EventSubscription`."""

    def __init__(self, loop: _Loop, subscription: EventSubscription) -> None:
        self._loop = loop
        self.subscription = subscription

    @property
    def cursor(self) -> int | None:
        return self.subscription.cursor

    def get(self, timeout: float | None = None) -> dict[str, Any]:
        """The next event (``TimeoutError`` if none within ``timeout``)."""
        return self._loop.run(self.subscription.get(timeout))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        try:
            return self._loop.run(self.subscription.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        self._loop.run(self.subscription.close())
