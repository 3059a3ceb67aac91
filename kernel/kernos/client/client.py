"""AsyncKernosClient: the requests of the harness protocol, over a Jupyter kernel client.

One client talks to one kernel process.  It finds the kernel (:meth:`connect`
through ``<workspace>/kernel.json``, :meth:`from_connection_file`, or a
gateway's), sends ``kernos_request`` shell messages
(``kernos.harness.protocol``) and turns the replies into typed results.  Many
requests may be in flight at once (``asyncio.gather`` of a hundred ops is
fine); the kernel runs ops one at a time, whoever sent them; several clients
(in this process or others) may be connected to the same kernel.

The connection it sends through, the reader tasks and the watchdog live in
``kernos.client._connection`` (:class:`KernelConnection`, its base class).  The
watchdog checks that the kernel is still there: through its manager when the
client was made by :meth:`KernosManager.client`, through its pid (from
``<workspace>/kernel.json``) after :meth:`connect`, and through the heartbeat
in every case.  When the kernel dies, every waiting request raises
:class:`~kernos.client.errors.KernelDied` within a fraction of a second, and
so does every later request on this client: a client never sends to the next
kernel process what it meant for the last one.
"""

from __future__ import annotations

import base64
import binascii
import json
import queue
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from jupyter_client.asynchronous.client import AsyncKernelClient

from kernos.client._connection import KernelConnection, ProcessCheck, ProgressCallback
from kernos.client._liveness import process_exists
from kernos.client._subscription import EventSubscription
from kernos.client.errors import BadReply, NoKernelRunning, RequestTimeout
from kernos.harness.protocol import INTERRUPT_REPLY, INTERRUPT_REQUEST
from kernos.harness.results import ObjectInfo, OpResult

if TYPE_CHECKING:
    from kernos.client.gateway import GatewayKernel

__all__ = ["EVENTS_TARGET", "KERNEL_FILE", "AsyncKernosClient", "EventSubscription",
           "ProgressCallback"]

KERNEL_FILE = "kernel.json"
"""The file a running kernel keeps in its workspace: ``{"connection_file", "pid"}``."""
EVENTS_TARGET = "kernos.events"

Decoded = TypeVar("Decoded")


class AsyncKernosClient(KernelConnection):
    """Requests to one Kernos kernel.  Make one with :meth:`connect`,
    :meth:`from_connection_file` or ``await manager.client()``.

    Its connection (channels, readers, watchdog, :meth:`request`, :meth:`close`) is
    :class:`~kernos.client._connection.KernelConnection`'s; this class finds the
    kernel and holds the protocol's actions."""

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

    # -- files (kernos.harness.file_requests): each request is one op of ``principal`` -----

    @overload
    async def read_file(self, path: str, *, principal: str | None = None,
                        binary: Literal[False] = False) -> str: ...

    @overload
    async def read_file(self, path: str, *, principal: str | None = None,
                        binary: Literal[True]) -> bytes: ...

    async def read_file(self, path: str, *, principal: str | None = None,
                        binary: bool = False) -> str | bytes:
        """The file at ``path`` (relative to the files root) as text, or as bytes with
        ``binary=True`` (sent as base64); a file that is not UTF-8 text needs ``binary``.

        ``principal`` needs a ``file:read:GLOB`` grant that covers ``path`` (or it is in its
        own ``agents/NAME/``); a refusal raises :class:`RequestError` (``denied``,
        ``invalid`` for a bad path, ``unknown_file``)."""
        result = await self.request("files_read", path=path, principal=principal,
                                    encoding="base64" if binary else "utf-8")
        data = result.get("data")
        if not isinstance(data, str):
            raise BadReply("the kernel's 'files_read' result has no data string")
        if not binary:
            return data
        try:
            return base64.b64decode(data.encode("ascii"), validate=True)
        except (ValueError, binascii.Error) as error:
            raise BadReply(f"the kernel's 'files_read' data is not base64 ({error})") from None

    async def write_file(self, path: str, data: str | bytes, *, principal: str | None = None,
                         key: str | None = None) -> dict[str, Any]:
        """Write ``data`` (text as UTF-8, or bytes) to ``path``, as one op of ``principal``
        (a ``file:write:GLOB`` grant); ``{"path", "bytes", "files", "op", "commit"}``.
        ``key`` makes it idempotent, as for :meth:`op`."""
        return await self._put_file("files_write", path, data, principal, key)

    async def append_file(self, path: str, data: str | bytes, *, principal: str | None = None,
                          key: str | None = None) -> dict[str, Any]:
        """Append ``data`` to ``path`` (made if missing), as one op; see :meth:`write_file`."""
        return await self._put_file("files_append", path, data, principal, key)

    async def _put_file(self, action: str, path: str, data: str | bytes,
                        principal: str | None, key: str | None) -> dict[str, Any]:
        if isinstance(data, str):
            return await self.request(action, path=path, data=data, encoding="utf-8",
                                      principal=principal, key=key)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"{action}: data is str or bytes, not {type(data).__name__}")
        return await self.request(action, path=path, principal=principal, key=key,
                                  data=base64.b64encode(data).decode("ascii"),
                                  encoding="base64")

    async def list_files(self, prefix: str = "", *, principal: str | None = None,
                         limit: int | None = None) -> list[str]:
        """The paths under ``prefix`` in the files root that ``principal`` may read, sorted."""
        result = await self.request("files_list", prefix=prefix or None, principal=principal,
                                    limit=limit)
        return [str(path) for path in result["paths"]]

    async def delete_file(self, path: str, *, principal: str | None = None,
                          key: str | None = None) -> dict[str, Any]:
        """Delete the file at ``path``, as one op of ``principal`` (``file:write:GLOB``);
        ``{"path", "deleted", "files", "op", "commit"}``."""
        return await self.request("files_delete", path=path, principal=principal, key=key)

    async def file_exists(self, path: str, *, principal: str | None = None) -> bool:
        """Whether a file is at ``path`` (``principal`` needs to be allowed to read it)."""
        result = await self.request("files_exists", path=path, principal=principal)
        return bool(result["exists"])

    # -- sessions (kernos.harness.session_requests): a principal's conversation items -----

    async def session_items(self, session: str, *, principal: str | None = None,
                            limit: int | None = None) -> list[dict[str, Any]]:
        """The last ``limit`` items (all without it) of ``principal``'s session, oldest
        first; none for a session that does not exist.  A read: no op."""
        result = await self.request("session_items", session=session, principal=principal,
                                    limit=limit)
        return list(result["items"])

    async def session_add(self, session: str, items: list[dict[str, Any]], *,
                          principal: str | None = None, key: str | None = None
                          ) -> dict[str, Any]:
        """Append ``items`` (JSON objects) to the session, all in one op of ``principal``;
        ``{"added", "total", "op", "commit"}``.  ``key`` makes it idempotent."""
        return await self.request("session_add", session=session, items=list(items),
                                  principal=principal, key=key)

    async def session_pop(self, session: str, *,
                          principal: str | None = None) -> dict[str, Any] | None:
        """Remove and return the session's newest item (one op); None when it is empty."""
        result = await self.request("session_pop", session=session, principal=principal)
        item = result.get("item")
        return None if item is None else dict(item)

    async def session_clear(self, session: str, *, principal: str | None = None) -> int:
        """Remove every item of the session (one op); how many there were."""
        result = await self.request("session_clear", session=session, principal=principal)
        return int(result["cleared"])

    async def sessions(self, *, principal: str | None = None) -> list[dict[str, Any]]:
        """``principal``'s sessions, ``[{"session", "items"}]``, sorted by id.  A read."""
        result = await self.request("session_list", principal=principal)
        return list(result["sessions"])

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


def _decode(build: Callable[[dict[str, Any]], Decoded], data: Any, action: str) -> Decoded:
    """Build a typed result, or say clearly that the reply does not fit it."""
    try:
        return build(data)
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise BadReply(f"the kernel's {action!r} result does not fit this client's types "
                       f"({error}); run a kernel and a client of the same Kernos "
                       "release") from None
