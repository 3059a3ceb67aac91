"""External event subscribers for the integration tests: ``kernos.events`` comms.

:class:`Feed` drives one real kernel (the ``Kernel`` of tests/integration/conftest.py)
and reads IOPub itself, so that no comm message is lost: ``Kernel.run`` uses
``execute_interactive``, which drops comm messages (the backlog has the
comm_open as parent, live events the execute_request).  While a comm is open,
run cells with :meth:`Feed.run`, not ``Kernel.run``::

    feed = Feed(kernel)
    comm = feed.open(since=0)                 # backlog, then "ready"
    cell = feed.run("events.emit('a.b', 1)")   # live events are collected too
    feed.events(comm)                         # every event the comm received, in order
    feed.close(comm)

Every message the kernel sends on a comm is kept in ``feed.messages[comm_id]``
(the ``data`` of each ``comm_msg``); ``feed.closed`` holds the ids of the comms
the kernel closed.
"""

from __future__ import annotations

import ast
import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TARGET", "Cell", "Feed", "KernelDied"]

TARGET = "kernos.events"
TIMEOUT = 120.0


@dataclass
class Cell:
    """A cell's reply, its ``metadata["kernos"]`` report and its output (None if it died)."""

    status: str
    kernos: dict[str, Any]
    stdout: str = ""
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.kernos.get("status") == "committed"

    @property
    def rolled_back(self) -> bool:
        return self.kernos.get("status") == "rolled back"


class KernelDied(Exception):
    """The kernel process exited while a request was outstanding."""


class Feed:
    """The comms of one kernel client, and every comm message it received."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.client = kernel.client
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.closed: set[str] = set()
        self.progress: list[dict[str, Any]] = []
        """Every ``kernos_progress`` IOPub message's content, whatever its parent."""

    # -- comms -------------------------------------------------------------------------

    def open(self, since: int | None = 0, topic: str | None = None, *,
             data: Any = None, target: str = TARGET) -> str:
        """Open a comm (``data`` replaces the usual open data) and read its whole answer."""
        comm_id = uuid.uuid4().hex
        self.messages[comm_id] = []
        content = {"comm_id": comm_id, "target_name": target,
                   "data": {"v": 1, "since": since, "topic": topic} if data is None else data}
        self._send("comm_open", content)
        return comm_id

    def send(self, comm_id: str, data: Any) -> None:
        """Send a message on a comm; returns once the kernel has handled it."""
        self._send("comm_msg", {"comm_id": comm_id, "data": data})

    def close(self, comm_id: str) -> None:
        """Close a comm from this side; returns once the kernel has handled it."""
        self._send("comm_close", {"comm_id": comm_id, "data": {}})
        self.closed.add(comm_id)

    def _send(self, kind: str, content: dict[str, Any]) -> None:
        message = self.client.session.msg(kind, content)
        self.client.shell_channel.send(message)
        # The kernel reports busy/idle around every shell message: idle means handled.
        self._drain(message["header"]["msg_id"])

    def events(self, comm_id: str) -> list[dict[str, Any]]:
        """Every event the comm received, in the order received."""
        return [event for data in self.messages[comm_id] if data.get("type") == "events"
                for event in data["events"]]

    def of_type(self, comm_id: str, kind: str) -> list[dict[str, Any]]:
        """The comm's messages of one type (``events``, ``ready``, ``error``)."""
        return [data for data in self.messages[comm_id] if data.get("type") == kind]

    def cursor(self, comm_id: str) -> int:
        """The last cursor the kernel reported on this comm."""
        cursors = [data["cursor"] for data in self.messages[comm_id] if "cursor" in data]
        assert cursors, self.messages[comm_id]
        return int(cursors[-1])

    # -- cells -------------------------------------------------------------------------

    def run(self, code: str) -> Cell:
        """Execute a cell, collecting comm messages until it is idle; then its reply.

        Raises :class:`KernelDied` if the kernel exits first.
        """
        msg_id = self.client.execute(code)
        stdout, errors = self._drain(msg_id)
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                reply = self.client.get_shell_msg(timeout=0.2)
            except queue.Empty:
                self._check_alive(deadline)
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        return Cell(status=reply["content"]["status"],
                    kernos=reply["metadata"].get("kernos", {}),
                    stdout="".join(stdout), errors=errors)

    def value(self, expression: str) -> Any:
        """Evaluate ``expression`` (its repr must be a Python literal) in a cell of its own."""
        cell = self.run(f"print(repr({expression}))")
        assert cell.status == "ok", cell.errors
        return ast.literal_eval(cell.stdout.strip())

    def _drain(self, parent_id: str) -> tuple[list[str], list[dict[str, Any]]]:
        """Read IOPub until the request ``parent_id`` is idle, keeping comm messages."""
        stdout: list[str] = []
        errors: list[dict[str, Any]] = []
        deadline = time.monotonic() + TIMEOUT
        while True:
            message = self._next(deadline)
            if message is None or self._kept(message):
                continue
            kind, content = message["msg_type"], message["content"]
            if message["parent_header"].get("msg_id") != parent_id:
                continue
            if kind == "stream" and content["name"] == "stdout":
                stdout.append(content["text"])
            elif kind == "error":
                errors.append(content)
            elif kind == "status" and content["execution_state"] == "idle":
                return stdout, errors

    def pump(self, until: Callable[[], bool], seconds: float = TIMEOUT) -> None:
        """Read IOPub, keeping comm messages, until ``until()`` holds.

        A harness request's reply, and what it tells comm subscribers, come once
        its op is durable (group commit): possibly after the request's idle.
        """
        deadline = time.monotonic() + seconds
        while not until():
            message = self._next(deadline)
            if message is not None:
                self._kept(message)

    def _next(self, deadline: float) -> dict[str, Any] | None:
        try:
            message: dict[str, Any] = self.client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            self._check_alive(deadline)
            return None
        return message

    def _kept(self, message: dict[str, Any]) -> bool:
        """Keep a comm message or a progress report; whether it was one."""
        kind, content = message["msg_type"], message["content"]
        if kind == "comm_msg" and content.get("comm_id") in self.messages:
            self.messages[content["comm_id"]].append(content["data"])
        elif kind == "kernos_progress":
            self.progress.append(content)
        elif kind == "comm_close" and content.get("comm_id") in self.messages:
            self.closed.add(content["comm_id"])
        else:
            return False
        return True

    def _check_alive(self, deadline: float) -> None:
        if not self.kernel.manager.is_alive():
            raise KernelDied("the kernel exited")
        assert time.monotonic() < deadline, "the kernel did not answer in time"
