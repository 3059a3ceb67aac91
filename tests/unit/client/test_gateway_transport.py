"""The gateway websocket's channels, against a scripted websocket (no gateway, no kernel).

Messages go to the channel they name; the gateway's own ``restarting``/``dead`` status
(no parent) marks the kernel gone, a kernel's ``busy``/``idle`` does not; once the
websocket closes every reader gets an error and sends are dropped; a URL that is not
``http(s)://HOST:PORT`` is refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import json
import queue
from typing import Any

import pytest

from kernos.client.errors import GatewayError
from kernos.client.gateway_transport import GatewayAPI, GatewayChannels


class ScriptedSocket:
    """Gives the frames it was handed, then ``None`` (closed); records what is written."""

    def __init__(self, frames: list[str | bytes]) -> None:
        self.frames: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        for frame in frames:
            self.frames.put_nowait(frame)
        self.written: list[dict[str, Any]] = []
        self.closed = False

    async def read_message(self) -> str | bytes | None:
        return await self.frames.get()

    def write_message(self, text: str) -> None:
        self.written.append(json.loads(text))

    def close(self) -> None:
        self.closed = True
        self.frames.put_nowait(None)


def frame(channel: str, msg_type: str, content: dict[str, Any], parent: str = "") -> str:
    return json.dumps({"channel": channel, "msg_type": msg_type, "content": content,
                       "header": {"msg_type": msg_type, "msg_id": "m"},
                       "parent_header": {"msg_id": parent} if parent else {},
                       "metadata": {}, "buffers": []})


def test_messages_reach_their_channel_and_the_gateways_dead_status_is_seen() -> None:
    async def scenario() -> None:
        socket = ScriptedSocket([
            frame("iopub", "status", {"execution_state": "starting"}),  # the kernel's, at start
            frame("iopub", "status", {"execution_state": "busy"}, parent="r1"),
            frame("shell", "kernos_reply", {"status": "ok"}, parent="r1"),
            b"\x00binary",  # dropped, not fatal
            "not json",     # dropped, not fatal
            frame("iopub", "status", {"execution_state": "idle"}, parent="r1"),
        ])
        channels = GatewayChannels(socket, "k1")  # type: ignore[arg-type]
        channels.start_reading()
        await channels.iopub_channel.get_msg(timeout=5)
        assert (await channels.iopub_channel.get_msg(timeout=5))["content"] == {
            "execution_state": "busy"}
        reply = await channels.shell_channel.get_msg(timeout=5)
        assert reply["msg_type"] == "kernos_reply" and "channel" not in reply
        await channels.iopub_channel.get_msg(timeout=5)
        assert channels.gone is None  # a kernel's own statuses are not a death
        with pytest.raises(queue.Empty):
            await channels.control_channel.get_msg(timeout=0.05)
        socket.frames.put_nowait(frame("iopub", "status", {"execution_state": "restarting"}))
        await channels.iopub_channel.get_msg(timeout=5)
        assert channels.gone == "restarting"
        # The websocket closes: readers fail (every time), sends are dropped quietly.
        socket.frames.put_nowait(None)
        for _ in range(2):
            with pytest.raises(ConnectionError):
                await channels.shell_channel.get_msg(timeout=5)
        assert channels.closed and channels.shell_channel.socket is None
        assert not channels.hb_channel.is_beating()
        channels.shell_channel.send(channels.session.msg("kernel_info_request", {}))
        assert socket.written == []

    asyncio.run(scenario())


def test_a_message_sent_names_its_channel_and_carries_a_json_header() -> None:
    async def scenario() -> None:
        socket = ScriptedSocket([])
        channels = GatewayChannels(socket, "k1")  # type: ignore[arg-type]
        channels.start_reading()
        channels.control_channel.send(channels.session.msg("interrupt_request", {"op": 3}))
        (sent,) = socket.written
        assert sent["channel"] == "control" and sent["content"] == {"op": 3}
        assert sent["header"]["msg_type"] == "interrupt_request"
        assert isinstance(sent["header"]["date"], str)
        channels.close()
        assert socket.closed

    asyncio.run(scenario())


@pytest.mark.parametrize("url", ["127.0.0.1:8888", "ftp://host:1", "http://", "gateway"])
def test_a_url_that_is_not_a_gateway_url_is_refused(url: str) -> None:
    with pytest.raises(GatewayError, match="is not a gateway URL"):
        GatewayAPI(url)
