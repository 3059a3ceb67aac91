"""Jupyter Enterprise Gateway's wire: its REST API and the kernel websocket.

:class:`GatewayAPI` speaks the REST API (kernelspecs; start, list, get,
interrupt, restart and delete kernels) with ``Authorization: token ...``.
:class:`GatewayChannels` is one websocket (``/api/kernels/ID/channels``,
Jupyter's JSON message format, each message naming its ``channel``) shaped
like the jupyter_client kernel client that :class:`~kernos.client.AsyncKernosClient`
wraps: ``shell_channel``, ``iopub_channel``, ``control_channel`` and
``hb_channel``, and ``session.msg``.  So the harness client runs unchanged
over a gateway; only how it learns that the kernel died differs (the gateway
tells every websocket ``restarting`` or ``dead`` on IOPub when its restarter
finds the process gone, and the websocket closes when the kernel is deleted).

No Kernos semantics here: that is ``kernos.client.gateway``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import uuid
from typing import Any
from urllib.parse import quote, urlsplit

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, websocket_connect

from kernos.client.errors import GatewayError

__all__ = ["GatewayAPI", "GatewayChannels"]

log = logging.getLogger("kernos.client.gateway")

DEAD_STATES = ("restarting", "dead")
"""The statuses the gateway itself sends on IOPub when its kernel process is gone."""


class GatewayAPI:
    """The REST API of an Enterprise Gateway at ``url`` (``http://host:port``)."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 60) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise GatewayError(f"{url!r} is not a gateway URL: give http://HOST:PORT (or "
                               "https://...), where Enterprise Gateway listens", url=url)
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        return headers

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None,
                   *, missing_ok: bool = False) -> Any:
        """One request; its JSON answer (None for 204, or for 404 when ``missing_ok``)."""
        request = HTTPRequest(self.url + path, method=method, headers=self._headers(),
                              body=None if body is None and method != "POST"
                              else json.dumps(body or {}),
                              request_timeout=self.timeout, connect_timeout=min(10, self.timeout))
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as error:
            if error.code == 404 and missing_ok:
                return None
            raise self._refused(method, path, error) from None
        except OSError as error:
            raise GatewayError.unreachable(self.url, str(error)) from None
        if response.code == 204 or not response.body:
            return None
        return json.loads(response.body)

    def _refused(self, method: str, path: str, error: HTTPClientError) -> GatewayError:
        code = error.code
        if code == 599:  # tornado's code for a connection that failed or timed out
            return GatewayError.unreachable(self.url, str(error))
        reason = ""
        if error.response is not None and error.response.body:
            with contextlib.suppress(ValueError, AttributeError):
                reason = str(json.loads(error.response.body).get("reason") or "")
        if code == 401:
            return GatewayError(
                f"the gateway at {self.url} refused {method} {path} ({code}): "
                + ("no token was sent; set KERNOS_GATEWAY_TOKEN (or pass token=...) to the "
                   "gateway's auth_token" if not self.token else
                   "the token is not the gateway's; check KERNOS_GATEWAY_TOKEN (or token=...)"),
                url=self.url, status=code)
        advice = ""
        if reason.startswith("User "):  # its unauthorized_users (root by default)
            advice = (" Set KERNEL_USERNAME (in this environment, or in env=) to the user "
                      "the gateway should run the kernel for.")
        return GatewayError(f"the gateway at {self.url} refused {method} {path} ({code}"
                            f"{': ' + reason if reason else ''}).{advice}", url=self.url,
                            status=code)

    # -- the API -----------------------------------------------------------------------

    async def kernelspecs(self) -> dict[str, Any]:
        answer = await self.call("GET", "/api/kernelspecs")
        return dict(answer.get("kernelspecs") or {}) if isinstance(answer, dict) else {}

    async def start(self, kernel_name: str, env: dict[str, str]) -> str:
        """Start a kernel; its id.  ``env``: only ``KERNEL_*`` (and the gateway's
        ``client_envs``) reach the kernel."""
        answer = await self.call("POST", "/api/kernels", {"name": kernel_name, "env": env})
        return str(answer["id"])

    async def kernels(self) -> list[dict[str, Any]]:
        return list(await self.call("GET", "/api/kernels") or [])

    async def kernel(self, kernel_id: str) -> dict[str, Any] | None:
        """The kernel's model, or None when the gateway has no such kernel."""
        answer = await self.call("GET", f"/api/kernels/{quote(kernel_id)}", missing_ok=True)
        return answer if isinstance(answer, dict) else None

    async def interrupt(self, kernel_id: str) -> None:
        await self.call("POST", f"/api/kernels/{quote(kernel_id)}/interrupt")

    async def restart(self, kernel_id: str) -> bool:
        """Restart the kernel; False when the gateway has no such kernel."""
        answer = await self.call("POST", f"/api/kernels/{quote(kernel_id)}/restart",
                                 missing_ok=True)
        return answer is not None

    async def delete(self, kernel_id: str) -> None:
        """Stop the kernel (nothing to do when the gateway has no such kernel)."""
        await self.call("DELETE", f"/api/kernels/{quote(kernel_id)}", missing_ok=True)

    async def channels(self, kernel_id: str) -> GatewayChannels:
        """A websocket to the kernel's channels, connected."""
        url = self.url.replace("http", "ws", 1) + f"/api/kernels/{quote(kernel_id)}/channels"
        request = HTTPRequest(url, headers=self._headers(), connect_timeout=min(10, self.timeout),
                              request_timeout=self.timeout)
        try:
            socket = await websocket_connect(request, max_message_size=1 << 30)
        except HTTPClientError as error:
            if error.code == 404:
                raise GatewayError(f"the gateway at {self.url} has no kernel {kernel_id} (it "
                                   "was shut down, culled or never started)", url=self.url,
                                   status=404) from None
            raise self._refused("GET", f"/api/kernels/{kernel_id}/channels", error) from None
        except OSError as error:
            raise GatewayError.unreachable(self.url, str(error)) from None
        if socket.protocol is not None:  # small requests go out at once (no Nagle)
            socket.protocol.set_nodelay(True)
        channels = GatewayChannels(socket, kernel_id)
        channels.start_reading()
        return channels


class _Channel:
    """One Jupyter channel multiplexed on the websocket, shaped like jupyter_client's."""

    def __init__(self, name: str, owner: GatewayChannels) -> None:
        self.name = name
        self._owner = owner
        self._inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    @property
    def socket(self) -> object | None:
        """Not None while the websocket is open (jupyter_client's channels have a zmq socket)."""
        return None if self._owner.closed else self._owner

    def is_alive(self) -> bool:
        return not self._owner.closed

    def start(self) -> None:
        """Nothing to start: every channel shares the open websocket."""

    def send(self, message: dict[str, Any]) -> None:
        self._owner.send(self.name, message)

    def _deliver(self, message: dict[str, Any] | None) -> None:
        self._inbox.put_nowait(message)

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next message; ``queue.Empty`` after ``timeout``; an error once closed."""
        try:
            message = await asyncio.wait_for(self._inbox.get(), timeout)
        except TimeoutError:
            raise queue.Empty from None
        if message is None:
            self._inbox.put_nowait(None)  # every later reader sees the end too
            raise ConnectionError(f"the gateway websocket of kernel {self._owner.kernel_id} "
                                  "is closed")
        return message

    def close(self) -> None:
        self._owner.close()


class _Heartbeat:
    """The websocket stands for the heartbeat: the gateway watches the process."""

    def __init__(self, owner: GatewayChannels) -> None:
        self._owner = owner

    def is_beating(self) -> bool:
        return not self._owner.closed


class GatewayChannels:
    """A kernel's channels over one gateway websocket (see the module docstring)."""

    def __init__(self, socket: WebSocketClientConnection, kernel_id: str) -> None:
        self._socket = socket
        self.kernel_id = kernel_id
        # The gateway signs what it forwards with the kernel's key; this key signs nothing.
        self.session = Session(key=uuid.uuid4().hex.encode())
        self.shell_channel = _Channel("shell", self)
        self.iopub_channel = _Channel("iopub", self)
        self.control_channel = _Channel("control", self)
        self.hb_channel = _Heartbeat(self)
        self.closed = False
        self.gone: str | None = None
        """``restarting`` or ``dead`` once the gateway said the kernel process is gone."""
        self._reader: asyncio.Task[None] | None = None

    def start_reading(self) -> None:
        self._reader = asyncio.ensure_future(self._read())

    def start_channels(self, **_: bool) -> None:
        """Nothing to start: the websocket is open (jupyter_client's signature)."""

    def stop_channels(self) -> None:
        self.close()

    def send(self, channel: str, message: dict[str, Any]) -> None:
        """Send ``message`` on ``channel``.  On a closed websocket it is dropped, as zmq
        drops what a dead kernel never reads: the client's watchdog then raises
        ``KernelDied`` for the request that waits for it."""
        if self.closed:
            return
        wire = {"channel": channel, "header": message["header"],
                "parent_header": message.get("parent_header") or {},
                "metadata": message.get("metadata") or {}, "content": message["content"],
                "buffers": []}
        try:
            self._socket.write_message(json.dumps(wire, default=json_default))
        except WebSocketClosedError:
            self._end()

    async def _read(self) -> None:
        channels = {"shell": self.shell_channel, "iopub": self.iopub_channel,
                    "control": self.control_channel}
        try:
            while True:
                frame = await self._socket.read_message()
                if frame is None:
                    return
                if isinstance(frame, bytes):  # a message with binary buffers: none in Kernos
                    log.warning("kernos.client: a binary gateway frame was dropped")
                    continue
                try:
                    message = json.loads(frame)
                except ValueError:
                    log.warning("kernos.client: an unreadable gateway frame was dropped")
                    continue
                channel = channels.get(message.pop("channel", None))
                if channel is None:
                    continue
                if (channel is self.iopub_channel and message.get("msg_type") == "status"
                        and not (message.get("parent_header") or {}).get("msg_id")
                        and (message.get("content") or {}).get("execution_state")
                        in DEAD_STATES):
                    self.gone = message["content"]["execution_state"]
                channel._deliver(message)
        finally:
            self._end()

    def _end(self) -> None:
        if self.closed:
            return
        self.closed = True
        for channel in (self.shell_channel, self.iopub_channel, self.control_channel):
            channel._deliver(None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._socket.close()
        self._end()
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
