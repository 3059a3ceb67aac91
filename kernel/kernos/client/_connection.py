"""The connection under :class:`~kernos.client.AsyncKernosClient`: one kernel process's
channels, the tasks that read them, the watchdog, and one request's exchange.

:class:`KernelConnection` owns everything a request travels through and nothing
of what a request means (the protocol's actions are :class:`AsyncKernosClient`'s,
which subclasses it).  Many requests may be in flight at once: one reader task
takes every shell reply and hands it to the request whose ``msg_id`` is its
parent, and one reader task takes the ``kernos.events`` comm messages from IOPub
(each to its :class:`EventSubscription`), the ``kernos_progress`` messages of
long requests, which it hands to the ``progress`` callback of the request they
belong to, and the outputs a request's code published (``display_data``,
``execute_result``, ``stream``, ``error``), which it hands to that request's
``output`` callback.

The watchdog asks whether the kernel is still there: through ``process_check``
(its manager's), else through its pid, and through the heartbeat in every case.
When the kernel dies, every waiting request raises :class:`KernelDied` at once,
and so does every later request: a connection never sends to the next kernel
process what it meant for the last one.  :meth:`request` is the one door every
action goes through; :meth:`send_raw` is the low-level one below it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient

from kernos.client._liveness import process_exists
from kernos.client._subscription import EventSubscription
from kernos.client.errors import (
    BadReply,
    ClientClosed,
    KernelDied,
    ProtocolMismatch,
    RequestError,
    RequestTimeout,
)
from kernos.harness.protocol import PROGRESS_TYPE, REPLY_TYPE, REQUEST_TYPE, VERSION

if TYPE_CHECKING:
    from kernos.client.gateway_transport import GatewayChannels

__all__ = ["OUTPUT_TYPES", "KernelConnection", "OutputCallback", "ProcessCheck",
           "ProgressCallback"]

log = logging.getLogger("kernos.client")

ProcessCheck = Callable[[], Awaitable[bool]]
"""Asks the owner of the process whether this client's kernel still runs."""
ProgressCallback = Callable[[str, int, int], None]
"""Told ``(what, done, total)`` in bytes while a request's long step runs; ``what`` is
``"restore"`` (the kernel's start-up restore, which the request waits for) or ``"checkout"``.
Called on the client's event loop: it must be quick and must not block."""
OutputCallback = Callable[[str, dict[str, Any]], None]
"""Told ``(msg_type, content)`` for each output the request's code published on IOPub
(``display_data`` from ``IPython.display.display``, ...), in order; called on the
client's event loop, like a :data:`ProgressCallback`."""
OUTPUT_TYPES = frozenset({"display_data", "update_display_data", "execute_result", "stream",
                          "error"})


class KernelConnection:
    """The channels to one Kernos kernel process, their readers and its watchdog.

    Not made directly: :class:`~kernos.client.AsyncKernosClient` (its subclass) is."""

    poll_interval = 0.2
    """Seconds between two liveness checks."""
    heartbeat_grace = 10.0
    """Seconds of heartbeat silence after which a kernel whose process exists counts as hung."""
    progress_drain = 1.0
    """Seconds a request with a ``progress`` callback waits, after its reply, for its last
    progress messages (they come on IOPub, which is not ordered with the shell reply)."""

    def __init__(self, kernel_client: AsyncKernelClient | GatewayChannels, *,
                 pid: int | None = None,
                 process_check: ProcessCheck | None = None,
                 workspace: str | None = None) -> None:
        """Wrap a jupyter_client ``AsyncKernelClient`` whose channels are not started yet
        (or a gateway's websocket, which has the same channels).

        Use the classmethods instead: they also start the channels and check
        that the kernel speaks this client's protocol.
        """
        self._kc = kernel_client
        self.pid = pid
        """The kernel's process id, when known."""
        self.workspace = workspace
        """The workspace, when known."""
        self.kernel_info: dict[str, Any] = {}
        """The ``kernos`` part of the kernel's ``kernel_info_reply``: protocol, version."""
        self._process_check = process_check
        self._pending: dict[str, tuple[asyncio.Future[dict[str, Any]], str]] = {}
        self._subscriptions: dict[str, EventSubscription] = {}
        self._control_lock = asyncio.Lock()
        """One control exchange (an interrupt) at a time: its reply is read right there."""
        self._progress: dict[str, tuple[ProgressCallback, asyncio.Event]] = {}
        """Per request msg_id: its progress callback, and set at its IOPub ``idle``."""
        self._outputs: dict[str, OutputCallback] = {}
        """Per request msg_id: its output callback."""
        self._tasks: list[asyncio.Task[None]] = []
        self._iopub_seen = asyncio.Event()
        self._last_beat = time.monotonic()
        self._dead: KernelDied | None = None
        self._closed = False


    @classmethod
    async def _attach(cls, kernel_client: AsyncKernelClient | GatewayChannels, *,
                      timeout: float, pid: int | None = None,
                      process_check: ProcessCheck | None = None,
                      workspace: str | None = None) -> Self:
        """Start the channels of ``kernel_client`` (local zmq, or a gateway websocket),
        the reader tasks, and the handshake."""
        client = cls(kernel_client, pid=pid, process_check=process_check, workspace=workspace)
        try:
            kernel_client.start_channels(shell=True, iopub=True, stdin=False, hb=True,
                                         control=False)
            client._start_tasks()
            await client._handshake(timeout)
        except BaseException:
            await client.close()
            raise
        return client

    def _start_tasks(self) -> None:
        for work in (self._read_shell(), self._read_iopub(), self._watch()):
            self._tasks.append(asyncio.ensure_future(work))

    async def _handshake(self, timeout: float) -> None:
        """Wait until the kernel answers on shell and IOPub, and check its protocol."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimeout("kernel_info", timeout)
            try:
                reply = await self._exchange("kernel_info_request", {}, action="kernel_info",
                                             timeout=min(1.0, remaining))
            except RequestTimeout:
                continue
            # IOPub is a subscription that takes a moment to connect: until the
            # kernel's busy/idle for a request arrives there, events could be lost.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._iopub_seen.wait(), 0.2)
            if self._iopub_seen.is_set():
                break
        kernos = reply["content"].get("kernos")
        protocol = kernos.get("protocol") if isinstance(kernos, dict) else None
        if protocol != VERSION:
            what = ("does not say it is a Kernos kernel (no 'kernos' in its kernel_info)"
                    if protocol is None else f"speaks version {protocol!r} of the harness "
                    "protocol")
            raise ProtocolMismatch(
                f"this client speaks version {VERSION} of the Kernos harness protocol, and the "
                f"kernel {what}. Run a kernel and a client of the same Kernos release "
                "(pip install -U kernos in both environments).", kernel_protocol=protocol)
        assert isinstance(kernos, dict)
        self.kernel_info = dict(kernos)

    # -- the tasks -------------------------------------------------------------------

    @staticmethod
    async def _messages(channel: Any, name: str) -> AsyncIterator[dict[str, Any]]:
        """The channel's messages until its socket is closed; unreadable ones are dropped."""
        while True:
            try:
                message: dict[str, Any] = await channel.get_msg()
            except asyncio.CancelledError:
                raise
            except Exception:
                if channel.socket is None:
                    return
                log.warning("kernos.client: unreadable %s message dropped", name, exc_info=True)
                continue
            yield message

    async def _read_shell(self) -> None:
        async for message in self._messages(self._kc.shell_channel, "shell"):
            parent = (message.get("parent_header") or {}).get("msg_id")
            waiting = self._pending.pop(parent, None) if parent else None
            if waiting is not None and not waiting[0].done():
                waiting[0].set_result(message)

    async def _read_iopub(self) -> None:
        async for message in self._messages(self._kc.iopub_channel, "IOPub"):
            self._iopub_seen.set()
            kind = message.get("msg_type")
            if kind in (PROGRESS_TYPE, "status"):
                self._route_progress(message)
                continue
            if kind in OUTPUT_TYPES:
                self._route_output(str(kind), message)
                continue
            if kind not in ("comm_msg", "comm_close"):
                continue
            content = message.get("content") or {}
            subscription = self._subscriptions.get(str(content.get("comm_id")))
            if subscription is not None:
                if kind == "comm_close":
                    self._subscriptions.pop(subscription.comm_id, None)
                subscription._receive(kind, content.get("data") or {})

    def _route_progress(self, message: dict[str, Any]) -> None:
        """A progress message to its request's callback; its ``idle`` ends the request's."""
        parent = (message.get("parent_header") or {}).get("msg_id")
        waiting = self._progress.get(parent) if isinstance(parent, str) else None
        if waiting is None:
            return
        callback, idle = waiting
        content = message.get("content") or {}
        if message.get("msg_type") == "status":
            if content.get("execution_state") == "idle":
                idle.set()
            return
        what, done, total = content.get("what"), content.get("done"), content.get("total")
        if not isinstance(what, str) or type(done) is not int or type(total) is not int:
            log.warning("kernos.client: malformed %s message dropped", PROGRESS_TYPE)
            return
        try:
            callback(what, done, total)
        except Exception:  # a display's bug must not stop the reader
            log.warning("kernos.client: the progress callback failed", exc_info=True)

    def _route_output(self, kind: str, message: dict[str, Any]) -> None:
        """An output to the callback of the request whose code published it."""
        parent = (message.get("parent_header") or {}).get("msg_id")
        callback = self._outputs.get(parent) if isinstance(parent, str) else None
        if callback is None:
            return
        try:
            callback(kind, dict(message.get("content") or {}))
        except Exception:  # a caller's bug must not stop the reader
            log.warning("kernos.client: the output callback failed", exc_info=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            death = await self._check_alive()
            if death is not None:
                self._die(death)
                return

    async def _check_alive(self) -> KernelDied | None:
        """None while the kernel is there; else why it is not."""
        if self._process_check is not None:
            if not await self._process_check():
                return KernelDied.exited(self.pid)
        elif self.pid is not None and not process_exists(self.pid):
            return KernelDied.exited(self.pid)
        now = time.monotonic()
        if self._kc.hb_channel.is_beating():
            self._last_beat = now
        elif now - self._last_beat > self.heartbeat_grace:
            return KernelDied.silent(self.pid, now - self._last_beat)
        return None

    def _die(self, death: KernelDied) -> None:
        """The kernel is gone: fail what waits, and drop what was queued for it."""
        if self._dead is not None or self._closed:
            return
        self._dead = death
        for future, action in list(self._pending.values()):
            if not future.done():
                future.set_exception(death.during(action))
        self._pending.clear()
        for subscription in list(self._subscriptions.values()):
            subscription._fail(death)
        # Closing the sockets now (linger 0) discards requests still queued for
        # the dead process, so that a restarted kernel never receives them.
        self._stop(current=asyncio.current_task())

    def _stop(self, current: asyncio.Task[Any] | None = None) -> None:
        for task in self._tasks:
            if task is not current:
                task.cancel()
        for name in ("shell_channel", "iopub_channel"):
            with contextlib.suppress(Exception):
                getattr(self._kc, name).close()
        with contextlib.suppress(Exception):
            self._kc.stop_channels()

    # -- sending ---------------------------------------------------------------------

    def _ensure_usable(self) -> None:
        if self._dead is not None:
            raise self._dead.during(None)
        if self._closed:
            raise ClientClosed("this client is closed; connect again "
                               "(AsyncKernosClient.connect(workspace) or manager.client())")

    def _send(self, channel: Any, message: dict[str, Any]) -> None:
        """Send ``message`` on ``channel`` through its asyncio socket, never around it.

        jupyter_client's ``channel.send`` (``Session.send``) sends on a blocking
        shadow of the asyncio socket.  That send processes the socket's pending
        zmq commands, a reply's arrival among them, which clears the edge of the
        socket's file descriptor; the asyncio socket never hears of that send,
        so its reader, parked on the descriptor, sleeps on with the reply (and
        every later one) unread: a client that sends while a reply is arriving
        hangs.  Sent through the asyncio socket, the send makes it look again
        for what arrived.  (A gateway's channels have no zmq socket.)
        """
        socket = getattr(channel, "socket", None)
        if not isinstance(socket, zmq.asyncio.Socket):
            channel.send(message)
            return
        session = self._kc.session
        sent = asyncio.ensure_future(socket.send_multipart(session.serialize(message)))
        # Sent at once unless the socket's queue is full; a failure shows in the log.
        sent.add_done_callback(_report_send_failure)

    async def _exchange(self, msg_type: str, content: dict[str, Any], *, action: str,
                        timeout: float | None,
                        progress: ProgressCallback | None = None,
                        output: OutputCallback | None = None) -> dict[str, Any]:
        """Send one shell message and return its reply (the whole message)."""
        self._ensure_usable()
        message = self._kc.session.msg(msg_type, content)
        msg_id = message["header"]["msg_id"]
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = (future, action)
        idle = asyncio.Event()
        if output is not None:
            self._outputs[msg_id] = output
            progress = progress or _ignore_progress  # to wait for the IOPub idle too
        if progress is not None:
            self._progress[msg_id] = (progress, idle)
        try:
            self._send(self._kc.shell_channel, message)
            if timeout is None:
                reply = await future
            else:
                try:
                    reply = await asyncio.wait_for(future, timeout)
                except TimeoutError:
                    raise RequestTimeout(action, timeout) from None
            if progress is not None:  # IOPub has the last progress before the idle
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(idle.wait(), self.progress_drain)
            return reply
        finally:
            self._pending.pop(msg_id, None)
            self._progress.pop(msg_id, None)
            self._outputs.pop(msg_id, None)

    async def send_raw(self, content: dict[str, Any], *, timeout: float | None = None,
                       progress: ProgressCallback | None = None,
                       output: OutputCallback | None = None) -> dict[str, Any]:
        """Send ``content`` as a ``kernos_request`` as it is, and return the reply's content.

        The low-level door (for tests and tools that speak the protocol
        themselves): nothing is added or checked, and an error reply is
        returned, not raised.  ``progress`` and ``output`` are as in :meth:`request`.
        """
        action = content.get("action")
        reply = await self._exchange(REQUEST_TYPE, content,
                                     action=action if isinstance(action, str) else "request",
                                     timeout=timeout, progress=progress, output=output)
        if reply.get("msg_type") != REPLY_TYPE:
            raise BadReply(f"the kernel answered a {REQUEST_TYPE} with a "
                           f"{reply.get('msg_type')!r} message, not a {REPLY_TYPE}: it does not "
                           "serve the harness protocol; run a Kernos kernel")
        body = reply.get("content")
        if not isinstance(body, dict):
            raise BadReply(f"a {REPLY_TYPE} whose content is not an object")
        return body

    async def request(self, action: str, *, timeout: float | None = None,
                      progress: ProgressCallback | None = None,
                      output: OutputCallback | None = None,
                      **fields: Any) -> dict[str, Any]:
        """Send one request of the protocol and return its ``result``.

        Fields that are None are left out (the protocol's "not given").
        Raises :class:`RequestError` for an error reply, with the protocol's
        ``kind``; :class:`KernelDied` if the kernel dies first;
        :class:`RequestTimeout` after ``timeout`` seconds (None: wait as
        long as the kernel lives; an op waits for the ops before it).
        ``progress`` (a :data:`ProgressCallback`) is told how far the kernel's
        restore (which the request may wait for) and a checkout have got.
        ``output`` (an :data:`OutputCallback`) is told what the request's code
        displayed (a human op's ``IPython.display.display``); the request returns after
        the kernel's IOPub ``idle`` for it (or :attr:`progress_drain`), so that every
        output has been told.
        """
        content: dict[str, Any] = {"v": VERSION, "action": action}
        content.update((name, value) for name, value in fields.items() if value is not None)
        reply = await self.send_raw(content, timeout=timeout, progress=progress,
                                    output=output)
        status = reply.get("status")
        if status == "error":
            raise RequestError.from_reply(reply)
        result = reply.get("result")
        if status != "ok" or not isinstance(result, dict):
            raise BadReply(f"the reply to {action!r} is neither an ok reply with a result "
                           f"object nor an error reply (status {status!r}); this is a bug in "
                           "the kernel or the client: report it with both versions")
        return result

    def _unsubscribe(self, comm_id: str) -> None:
        if self._subscriptions.pop(comm_id, None) is None:
            return
        if self._dead is None and not self._closed:
            with contextlib.suppress(Exception):
                self._send(self._kc.shell_channel,
                           self._kc.session.msg("comm_close", {"comm_id": comm_id, "data": {}}))

    # -- ending ----------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """False once this client saw its kernel die (or was closed)."""
        return self._dead is None and not self._closed

    async def close(self, *, reason: str = "this client was closed") -> None:
        """Stop the channels; requests still waiting raise :class:`ClientClosed`."""
        if self._closed:
            return
        for comm_id in list(self._subscriptions):
            subscription = self._subscriptions[comm_id]
            self._unsubscribe(comm_id)
            subscription._fail(ClientClosed(f"{reason}; the subscription ended"))
        self._closed = True
        for future, action in list(self._pending.values()):
            if not future.done():
                future.set_exception(ClientClosed(f"{reason} while the {action!r} request "
                                                  "was waiting for its reply"))
        self._pending.clear()
        current = asyncio.current_task()
        self._stop(current=current)
        tasks = [task for task in self._tasks if task is not current]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()



def _ignore_progress(what: str, done: int, total: int) -> None:
    """The progress callback of a request that only wants its outputs."""


def _report_send_failure(sent: asyncio.Future[Any]) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.warning("kernos.client: a message to the kernel was not sent",
                    exc_info=sent.exception())
