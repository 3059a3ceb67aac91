"""A jupyter_server kernel websocket class for JupyterLab started with ``--gateway-url``.

    jupyter lab --gateway-url=http://127.0.0.1:8888 \\
        --ServerApp.kernel_websocket_connection_class=kernos.client.gateway_lab.GatewayConnection

Why: JupyterLab 4 first opens a kernel websocket asking for the
``v1.kernel.websocket.jupyter.org`` subprotocol.  A server that proxies to a
gateway answers with no subprotocol (the gateway speaks the legacy JSON one),
so chromium aborts that handshake and JupyterLab retries without one, at once.
jupyter_server's ``GatewayWebSocketConnection`` has by then begun a websocket to
the gateway for the aborted attempt, and when that one completes it never
closes it: the gateway holds two websockets with the same ``session_id``, which
it uses as the zmq identity of the kernel sockets.  It drops one as stale and
keeps its sockets buffering under that identity, and the kernel's replies to the
browser's requests can go there: the notebook waits forever for its kernel.
Seen with jupyter_server 2.x and Enterprise Gateway 3.3 (jupyter_server 1.24),
on a kernel that is still starting when the notebook opens.

This class closes the orphan websocket as soon as it connects, and gives each
websocket to the gateway a session id of its own, so that no two share an
identity.  (What that costs: the gateway's replay of messages buffered while a
browser was briefly disconnected, which is keyed by session id.)
"""

from __future__ import annotations

import uuid
from asyncio import Future
from typing import Any

from jupyter_server.gateway.connections import GatewayWebSocketConnection

__all__ = ["GatewayConnection"]


class GatewayConnection(GatewayWebSocketConnection):
    """``GatewayWebSocketConnection`` without the orphan websocket (see the module doc)."""

    _gateway_session = ""

    @property
    def session_id(self) -> str:
        """The id sent to the gateway (its zmq identity): a fresh one per websocket."""
        return self._gateway_session

    async def connect(self) -> None:
        self._gateway_session = uuid.uuid4().hex
        await super().connect()  # type: ignore[no-untyped-call]

    def _connection_done(self, fut: Future[Any]) -> None:
        if self.disconnected and not fut.cancelled() and fut.exception() is None:
            fut.result().close()  # the browser left while this connected: let go of it
        super()._connection_done(fut)  # type: ignore[no-untyped-call]
