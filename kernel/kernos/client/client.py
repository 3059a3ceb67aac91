"""AsyncKernosClient: the requests of the harness protocol, over a Jupyter kernel client.

One client talks to one kernel process.  It sends ``kernos_request`` shell
messages (``kernos.harness.protocol``) and turns the replies into typed
results.  Many requests may be in flight at once (``asyncio.gather`` of a
hundred ops is fine): one reader task takes every shell reply and hands it
to the request whose ``msg_id`` is its parent, and one reader task takes
the ``kernos.events`` comm messages from IOPub, and the ``kernos_progress``
messages of long requests (the start-up restore, a checkout), which it hands
to the ``progress`` callback of the request they belong to.  The kernel runs ops one at
a time, whoever sent them; several clients (in this process or others) may
be connected to the same kernel.

A watchdog checks that the kernel is still there: through its manager when
the client was made by :meth:`KernosManager.client`, through its pid (from
``<workspace>/kernel.json``) after :meth:`connect`, and through the
heartbeat in every case.  When the kernel dies, every waiting request
raises :class:`~kernos.client.errors.KernelDied` within a fraction of a
second, and so does every later request on this client: a client never
sends to the next kernel process what it meant for the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient

from kernos.client._liveness import process_exists
from kernos.client._subscription import EventSubscription
from kernos.client.errors import (
    BadReply,
    ClientClosed,
    KernelDied,
    NoKernelRunning,
    ProtocolMismatch,
    RequestError,
    RequestTimeout,
)
from kernos.harness.protocol import (
    INTERRUPT_REPLY,
    INTERRUPT_REQUEST,
    PROGRESS_TYPE,
    REPLY_TYPE,
    REQUEST_TYPE,
    VERSION,
)
from kernos.harness.results import ObjectInfo, OpResult

if TYPE_CHECKING:
    from kernos.client.gateway import GatewayKernel
    from kernos.client.gateway_transport import GatewayChannels

__all__ = ["EVENTS_TARGET", "KERNEL_FILE", "AsyncKernosClient", "EventSubscription",
           "ProgressCallback"]

log = logging.getLogger("kernos.client")

KERNEL_FILE = "kernel.json"
"""The file a running kernel keeps in its workspace: ``{"connection_file", "pid"}``."""
EVENTS_TARGET = "kernos.events"

Decoded = TypeVar("Decoded")
ProcessCheck = Callable[[], Awaitable[bool]]
"""Asks the owner of the process whether this client's kernel still runs."""
ProgressCallback = Callable[[str, int, int], None]
"""Told ``(what, done, total)`` in bytes while a request's long step runs; ``what`` is
``"restore"`` (the kernel's start-up restore, which the request waits for) or ``"checkout"``.
Called on the client's event loop: it must be quick and must not block."""


class AsyncKernosClient:
    """Requests to one Kernos kernel.  Make one with :meth:`connect`,
    :meth:`from_connection_file` or ``await manager.client()``."""

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
        self._tasks: list[asyncio.Task[None]] = []
        self._iopub_seen = asyncio.Event()
        self._last_beat = time.monotonic()
        self._dead: KernelDied | None = None
        self._closed = False

    # -- making one ------------------------------------------------------------------

    @classmethod
    async def connect(cls, workspace: str | Path, *, timeout: float = 30,
                      gateway: str | None = None, token: str | None = None
                      ) -> AsyncKernosClient:
        """Connect to the kernel running on ``workspace`` (found through its ``kernel.json``).

        ``gateway`` (``http://HOST:PORT``): the kernel runs under that Jupyter Enterprise
        Gateway and ``workspace`` is its name there (see :class:`KernosManager`);
        ``token`` defaults to ``$KERNOS_GATEWAY_TOKEN``.  The client never stops the
        kernel it connected to.

        Raises :class:`NoKernelRunning` if no live kernel owns the workspace.
        """
        if gateway is not None:
            return await cls._connect_gateway(str(workspace), gateway, token, timeout)
        root = Path(workspace).expanduser().absolute()
        marker = root / KERNEL_FILE
        try:
            found = json.loads(marker.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise NoKernelRunning.missing(str(root), str(marker)) from None
        except (OSError, ValueError) as error:
            raise NoKernelRunning.unreadable(str(root), str(marker), str(error)) from None
        pid = found.get("pid") if isinstance(found, dict) else None
        connection_file = found.get("connection_file") if isinstance(found, dict) else None
        if type(pid) is not int or not isinstance(connection_file, str):
            raise NoKernelRunning.unreadable(str(root), str(marker),
                                             'it should hold {"connection_file": PATH, '
                                             '"pid": INT}')
        if not process_exists(pid):
            raise NoKernelRunning.stale(str(root), str(marker), pid)
        try:
            info = json.loads(Path(connection_file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            if not process_exists(pid):
                raise NoKernelRunning.stale(str(root), str(marker), pid) from None
            raise NoKernelRunning.unreadable(str(root), str(marker),
                                             f"its connection file {connection_file} cannot "
                                             f"be read ({error})") from None
        return await cls._open(info, timeout=timeout, pid=pid, workspace=str(root))

    @classmethod
    async def _connect_gateway(cls, workspace: str, gateway: str, token: str | None,
                               timeout: float) -> AsyncKernosClient:
        from kernos.client.gateway import GatewayKernel

        kernel = GatewayKernel(gateway, workspace, open_client=cls._attach_gateway, token=token)
        if not await kernel.attach(timeout=min(timeout, 10)):
            raise NoKernelRunning(
                f"no Kernos kernel on the gateway {kernel.api.url} serves the workspace "
                f"{kernel.workspace!r} (or the one that does did not answer). Start one with "
                f"KernosClient.start({kernel.workspace!r}, gateway=...) or run_kernel.",
                workspace=kernel.workspace)
        return await cls._attach_gateway(kernel, timeout=timeout)

    @classmethod
    async def _attach_gateway(cls, kernel: GatewayKernel,
                              timeout: float = 30) -> AsyncKernosClient:
        """A new client over a websocket of its own to ``kernel`` (a gateway's kernel),
        closed by ``kernel`` when its manager shuts the kernel down or restarts it."""
        channels, same_process_runs = await kernel.open_channels()
        client = await cls._attach(channels, timeout=timeout, process_check=same_process_runs,
                                   workspace=kernel.workspace)
        kernel.adopt(client)
        return client

    @classmethod
    async def from_connection_file(cls, path: str | Path, *, timeout: float = 30,
                                   pid: int | None = None) -> AsyncKernosClient:
        """Connect through a Jupyter connection file (``pid``, if known, speeds up
        noticing the kernel's death; without it the heartbeat tells)."""
        info = json.loads(Path(path).read_text(encoding="utf-8"))
        return await cls._open(info, timeout=timeout, pid=pid)

    @classmethod
    async def _open(cls, connection_info: dict[str, Any], *, timeout: float,
                    pid: int | None = None, process_check: ProcessCheck | None = None,
                    workspace: str | None = None) -> AsyncKernosClient:
        kernel_client = AsyncKernelClient()
        # A fresh Session (its own identity on the shell socket), with the kernel's key.
        kernel_client.load_connection_info(connection_info)  # type: ignore[arg-type]
        return await cls._attach(kernel_client, timeout=timeout, pid=pid,
                                 process_check=process_check, workspace=workspace)

    @classmethod
    async def _attach(cls, kernel_client: AsyncKernelClient | GatewayChannels, *,
                      timeout: float, pid: int | None = None,
                      process_check: ProcessCheck | None = None,
                      workspace: str | None = None) -> AsyncKernosClient:
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
                        progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Send one shell message and return its reply (the whole message)."""
        self._ensure_usable()
        message = self._kc.session.msg(msg_type, content)
        msg_id = message["header"]["msg_id"]
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = (future, action)
        idle = asyncio.Event()
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

    async def send_raw(self, content: dict[str, Any], *, timeout: float | None = None,
                       progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Send ``content`` as a ``kernos_request`` as it is, and return the reply's content.

        The low-level door (for tests and tools that speak the protocol
        themselves): nothing is added or checked, and an error reply is
        returned, not raised.  ``progress`` is as in :meth:`request`.
        """
        action = content.get("action")
        reply = await self._exchange(REQUEST_TYPE, content,
                                     action=action if isinstance(action, str) else "request",
                                     timeout=timeout, progress=progress)
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
                      **fields: Any) -> dict[str, Any]:
        """Send one request of the protocol and return its ``result``.

        Fields that are None are left out (the protocol's "not given").
        Raises :class:`RequestError` for an error reply, with the protocol's
        ``kind``; :class:`KernelDied` if the kernel dies first;
        :class:`RequestTimeout` after ``timeout`` seconds (None: wait as
        long as the kernel lives; an op waits for the ops before it).
        ``progress`` (a :data:`ProgressCallback`) is told how far the kernel's
        restore (which the request may wait for) and a checkout have got.
        """
        content: dict[str, Any] = {"v": VERSION, "action": action}
        content.update((name, value) for name, value in fields.items() if value is not None)
        reply = await self.send_raw(content, timeout=timeout, progress=progress)
        status = reply.get("status")
        if status == "error":
            raise RequestError.from_reply(reply)
        result = reply.get("result")
        if status != "ok" or not isinstance(result, dict):
            raise BadReply(f"the reply to {action!r} is neither an ok reply with a result "
                           f"object nor an error reply (status {status!r}); this is a bug in "
                           "the kernel or the client: report it with both versions")
        return result

    # -- the actions -----------------------------------------------------------------

    async def hello(self) -> dict[str, Any]:
        """The kernel's protocol, version, workspace, head, principals, actions and limits."""
        return await self.request("hello")

    async def op(self, code: str | None = None, *, principal: str = "human",
                 tool: str | None = None, arguments: Mapping[str, Any] | None = None,
                 key: str | None = None,
                 expect_versions: Mapping[str, int | None] | None = None,
                 predicate: str | None = None, timeout: float | None = None,
                 progress: ProgressCallback | None = None,
                 on_error: str | None = None) -> OpResult:
        """Run ``code`` (or call ``tool`` with ``arguments``) as ``principal``, as one op.

        ``key`` makes it idempotent: a committed op with the same key answers
        instead (``duplicate``), and nothing runs again.  ``expect_versions``
        (what :meth:`versions` returned; None there means "no such name",
        sent as version 0) and ``predicate`` are preconditions: if one does
        not hold, nothing runs and the result's status is ``conflict``.
        A rolled-back op is a result, not an exception.  ``progress``: see
        :meth:`request`.  ``on_error="keep"``: human code that raises commits
        what it did before the error, as an op marked failed (``result.failed``).
        """
        expect: dict[str, Any] | None = None
        if expect_versions is not None or predicate is not None:
            expect = {"versions": {name: 0 if version is None else version
                                   for name, version in (expect_versions or {}).items()}}
            if predicate is not None:
                expect["predicate"] = predicate
        result = await self.request("op", timeout=timeout, progress=progress,
                                    principal=principal, code=code,
                                    tool=tool,
                                    arguments=None if arguments is None else dict(arguments),
                                    key=key, expect=expect, on_error=on_error)
        return _decode(OpResult.from_json, result, "op")

    async def call(self, tool: str, arguments: Mapping[str, Any] | None = None, *,
                   principal: str = "human", key: str | None = None,
                   expect_versions: Mapping[str, int | None] | None = None,
                   predicate: str | None = None) -> OpResult:
        """Call the registry tool ``tool`` as ``principal``, as one op (see :meth:`op`)."""
        return await self.op(tool=tool, arguments=arguments or {}, principal=principal,
                             key=key, expect_versions=expect_versions, predicate=predicate)

    async def versions(self, names: list[str], *,
                       principal: str | None = None) -> dict[str, int | None]:
        """Current versions of ``names`` (None: no such name); the read before an act."""
        result = await self.request("versions", names=list(names), principal=principal)
        return dict(result["versions"])

    async def objects(self, *, principal: str | None = None, prefix: str | None = None,
                      limit: int | None = None, offset: int | None = None) -> list[ObjectInfo]:
        """The names in the image (those ``principal`` may read), sorted by name."""
        result = await self.request("objects", principal=principal, prefix=prefix, limit=limit,
                                    offset=offset)
        return [_decode(ObjectInfo.from_json, item, "objects") for item in result["objects"]]

    async def object(self, name: str, *, principal: str | None = None,
                     preview_bytes: int | None = None) -> ObjectInfo:
        """One name, with a bounded preview of its value."""
        result = await self.request("object", name=name, principal=principal,
                                    preview_bytes=preview_bytes)
        return _decode(ObjectInfo.from_json, result, "object")

    async def grant(self, agent: str, capability: str,
                    limit: int | str | None = None) -> dict[str, Any]:
        """Grant ``capability`` to ``agent`` (an op by the human); returns the grant."""
        return await self.request("grant", agent=agent, capability=capability, limit=limit)

    async def revoke(self, agent: str, capability: str) -> list[str]:
        """Revoke a capability (or a grant id) and what was derived from it; the ids."""
        result = await self.request("revoke", agent=agent, capability=capability)
        return list(result["revoked"])

    async def grants(self, agent: str | None = None) -> list[dict[str, Any]]:
        return list((await self.request("grants", agent=agent))["grants"])

    async def add_agent(self, agent: str, limits: Mapping[str, int] | None = None) -> str:
        """Add an agent with no grants (an op by the human); returns its name."""
        result = await self.request("add_agent", agent=agent,
                                    limits=None if limits is None else dict(limits))
        return str(result["agent"])

    async def agents(self) -> list[str]:
        return list((await self.request("agents"))["agents"])

    async def tools(self, principal: str | None = None) -> list[dict[str, Any]]:
        """The tool registry (for an agent: the tools it may call)."""
        return list((await self.request("tools", principal=principal))["tools"])

    async def log(self, limit: int | None = None, *,
                  principal: str | None = None) -> list[dict[str, Any]]:
        """Snapshots, newest first (for an agent ``principal``: those its grants let it
        see, with only the names it may read, and the code only of its own ops)."""
        return list((await self.request("log", limit=limit, principal=principal))["snapshots"])

    async def show(self, ref: str = "HEAD") -> dict[str, Any]:
        return await self.request("show", ref=ref)

    async def diff(self, a: str, b: str | None = None) -> dict[str, Any]:
        return await self.request("diff", a=a, b=b)

    async def checkout(self, ref: str, *, progress: ProgressCallback | None = None) -> OpResult:
        """A new op whose image equals snapshot ``ref`` (history is never rewritten);
        ``progress`` is told the bytes loaded (see :meth:`request`)."""
        result = await self.request("checkout", ref=ref, progress=progress)
        return _decode(OpResult.from_json, result, "checkout")

    async def fork(self, ref: str, dest: str) -> dict[str, Any]:
        """A new workspace named ``dest`` (a name: letters, digits, ``._-``), made beside this
        kernel's workspace from its snapshot ``ref`` (``kernos.fork``); what was made, and
        ``open.env`` to start a kernel on it."""
        return await self.request("fork", ref=ref, dest=dest)

    async def events(self, *, since: int | None = None, op: int | None = None,
                     topic: str | None = None, principal: str | None = None,
                     limit: int | None = None) -> tuple[list[dict[str, Any]], int]:
        """Committed events from the durable log, oldest first, and the cursor after them."""
        result = await self.request("events", since=since, op=op, topic=topic,
                                    principal=principal, limit=limit)
        return list(result["events"]), int(result["cursor"])

    async def audit(self, *, principal: str | None = None, status: str | None = None,
                    topic: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        result = await self.request("audit", principal=principal, status=status, topic=topic,
                                    limit=limit)
        return list(result["records"])

    async def status(self) -> dict[str, Any]:
        return await self.request("status")

    async def recall(self, query: str, *, principal: str | None = None, k: int | None = None,
                     kinds: list[str] | None = None) -> list[dict[str, Any]]:
        """What ``principal`` (default the human) may recall for ``query``, best first."""
        result = await self.request("recall", query=query, principal=principal, k=k,
                                    kinds=kinds)
        return list(result["memories"])

    async def remember(self, fact: str, *, principal: str | None = None,
                       tags: list[str] | None = None) -> dict[str, Any]:
        """Store a fact in ``principal``'s memory (an op); ``{"fact", "op", "commit"}``."""
        return await self.request("remember", fact=fact, principal=principal, tags=tags)

    async def interrupt(self, *, op: int | None = None, key: str | None = None,
                        timeout: float = 30) -> dict[str, Any]:
        """Interrupt one running op, named by its id or its idempotency key, like a cell.

        Its body stops with ``KeyboardInterrupt`` and the op rolls back (its result's
        status is ``interrupted``); an op that is committing (or not running) is left
        alone.  Returns ``{"interrupted": True, "op": N}`` or ``{"interrupted": False,
        "reason": ...}``.  It goes on the control channel, which the kernel serves
        while the op runs; other clients' ops are never hit.
        """
        self._ensure_usable()
        content = {name: value for name, value in (("op", op), ("key", key))
                   if value is not None}
        async with self._control_lock:
            control = self._kc.control_channel  # connected on first use
            if not control.is_alive():
                control.start()
            message = self._kc.session.msg(INTERRUPT_REQUEST, content)
            self._send(control, message)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeout("interrupt", timeout)
                try:
                    reply: dict[str, Any] = await control.get_msg(timeout=left)
                except queue.Empty:
                    raise RequestTimeout("interrupt", timeout) from None
                parent = (reply.get("parent_header") or {}).get("msg_id")
                if parent == message["header"]["msg_id"]:
                    if reply.get("msg_type") != INTERRUPT_REPLY:
                        raise BadReply(f"the kernel answered {INTERRUPT_REQUEST} with a "
                                       f"{reply.get('msg_type')!r}: it is not a Kernos "
                                       "kernel of this version")
                    return dict(reply.get("content") or {})

    async def refused(self, *, principal: str, via: str, what: str,
                      problem: str) -> dict[str, Any]:
        """Record in the audit log that ``via`` (an adapter) refused ``what`` for
        ``principal`` before it reached the kernel, because of ``problem``."""
        return await self.request("refused", principal=principal, via=via, what=what,
                                  problem=problem)

    # -- events pushed -------------------------------------------------------------

    async def subscribe(self, *, since: int | None = None, op: int | None = None,
                        topic: str | None = None) -> EventSubscription:
        """Open a ``kernos.events`` comm; returns once the kernel has registered it.

        ``since`` is the last sequence number already seen (0: everything;
        None: only what commits from now on); ``op`` instead asks for the
        events of every op after op ``op``; ``topic`` is a pattern
        (``orders.*``).  Iterate the subscription for committed events; keep
        its ``cursor`` to resume later with ``since=cursor``.
        """
        self._ensure_usable()
        comm_id = uuid.uuid4().hex
        subscription = EventSubscription(comm_id, since, self._unsubscribe)
        self._subscriptions[comm_id] = subscription
        message = self._kc.session.msg("comm_open", {
            "comm_id": comm_id, "target_name": EVENTS_TARGET,
            "data": {"v": 1, "since": since, "op": op, "topic": topic}})
        self._send(self._kc.shell_channel, message)
        try:
            await subscription._ready
        except BaseException:
            self._subscriptions.pop(comm_id, None)
            raise
        return subscription

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

    async def __aenter__(self) -> AsyncKernosClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()


def _report_send_failure(sent: asyncio.Future[Any]) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.warning("kernos.client: a message to the kernel was not sent",
                    exc_info=sent.exception())


def _decode(build: Callable[[dict[str, Any]], Decoded], data: Any, action: str) -> Decoded:
    """Build a typed result, or say clearly that the reply does not fit it."""
    try:
        return build(data)
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise BadReply(f"the kernel's {action!r} result does not fit this client's types "
                       f"({error}); run a kernel and a client of the same Kernos "
                       "release") from None
