"""The ``kernos.inspector`` comm target, and the kernel's inspector backend.

The JupyterLab panel (and any frontend) opens a comm on the target
``kernos.inspector`` with open data ``{"v": 1}``.  The kernel answers on
the comm with::

    {"v": 1, "type": "hello", "hello": HELLO}

where HELLO is the result of the harness ``hello`` action.  Then the
frontend sends requests, each with an id of its choosing::

    {"v": 1, "id": INT, "request": REQUEST}

REQUEST is a harness protocol request (``kernos.harness.protocol``), run as
``human``; only the actions in ``kernos.inspector.backend.ALLOWED`` (reads,
``checkout``, ``fork`` and the loop and circuit controls) are served.  The answer is::

    {"v": 1, "type": "reply", "id": INT, "reply": REPLY}

with REPLY exactly as a ``kernos_reply`` carries it.  The kernel also pushes
the notices of ``kernos.inspector.backend`` (``committed``, ``rolled_back``,
``progress``) to every open inspector comm, as ``{"v": 1, **NOTICE}``:
after every op that finishes, whoever ran it (a cell, a harness request,
the widget, the panel), and never while an op runs, except ``progress``
during a checkout.  A message that is not a valid envelope gets::

    {"v": 1, "type": "error", "error": TEXT}

Comm messages are handled after the running op (the kernel serializes them
against ops), so a request never sees a half-done op.

While the kernel restores its image at start-up, a request that waits for
the restore (a cell, a comm open, a harness request) gets ``kernos_progress``
IOPub messages (``{"v": 1, "what": "restore", "done", "total"}``, parent =
the waiting request), so a frontend can show progress before any comm opens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernos.errors import KernosError
from kernos.harness.protocol import VERSION, ProtocolError, error_reply
from kernos.inspector.backend import CHANGES, Notice, Watchers, refuse
from kernos.kernel.host import KernelHost

__all__ = ["TARGET", "KernelBackend"]

TARGET = "kernos.inspector"
MAX_ID = 2**53
"""Request ids are JSON numbers a browser can hold exactly."""


class KernelBackend:
    """The kernel's inspector backend (``kernel.inspection``) and its comm target.

    :meth:`request` must run where ops cannot: a comm message handler (the
    kernel runs those after the running op, holding its op lock) or code
    that holds the lock itself.  A cell that calls it gets reads, but not a
    checkout (the cell is itself an op; ``%kernos checkout`` is the way).
    """

    def __init__(self, kernel: KernelHost) -> None:
        self.kernel = kernel
        self.watchers = Watchers()
        self.comms: dict[str, Any] = {}

    # -- the Backend protocol -----------------------------------------------------

    def request(self, content: dict[str, Any]) -> dict[str, Any]:
        refused = refuse(content)
        if refused is not None:
            return refused
        kernel = self.kernel
        action = content.get("action")
        if action in CHANGES and kernel.current_op is not None:  # `loop` status too: the
            # harness settles effects after every `loop` request, which a cell's op forbids
            return error_reply(action, ProtocolError(
                "invalid", f"{action} cannot run from inside a cell (the cell is an op "
                "already); use the inspector's button, or in a cell `%kernos checkout REF`, "
                "`agents.pause(NAME)` / `resume` / `stop`, `agents.reset(NAME)`"))
        try:
            handled = kernel.serve(content, progress=kernel.progress_reporter(None))
        except KernosError as error:  # no usable workspace
            return error_reply(content.get("action") if isinstance(
                content.get("action"), str) else None, ProtocolError("workspace", str(error)))
        return handled.reply

    def watch(self, callback: Callable[[Notice], None]) -> Callable[[], None]:
        return self.watchers.watch(callback)

    def notify(self, notice: Notice) -> None:
        """Tell every watcher and every open inspector comm (after an op, or progress)."""
        self.watchers.notify(notice)
        for comm in list(self.comms.values()):
            try:
                comm.send({"v": VERSION, **notice})
            except Exception:  # a comm that went away mid-send: forget it
                self.kernel.log.warning("Kernos: dropping inspector comm %s", comm.comm_id)
                self.comms.pop(comm.comm_id, None)

    # -- the comm target --------------------------------------------------------------

    def open(self, comm: Any, message: dict[str, Any]) -> None:
        data = (message.get("content") or {}).get("data")
        if data is None:
            data = {}
        if type(data) is not dict or set(data) - {"v"} or data.get("v", VERSION) != VERSION:
            comm.send({"v": VERSION, "type": "error",
                       "error": f"open {TARGET} with {{\"v\": {VERSION}}}; this kernel speaks "
                                f"version {VERSION} and takes no other open fields"})
            comm.close()
            return
        self.comms[comm.comm_id] = comm
        comm.on_close(lambda _message: self.comms.pop(comm.comm_id, None))
        comm.on_msg(lambda msg: self._message(comm, msg))
        hello = self.request({"v": VERSION, "action": "hello"})
        comm.send({"v": VERSION, "type": "hello", "hello": hello.get("result"),
                   "error": hello.get("error")})

    def _message(self, comm: Any, message: dict[str, Any]) -> None:
        data = (message.get("content") or {}).get("data")
        problem = _envelope_problem(data)
        if problem is not None:
            comm.send({"v": VERSION, "type": "error", "error": problem})
            return
        assert isinstance(data, dict)
        reply = self.request(data["request"])
        comm.send({"v": VERSION, "type": "reply", "id": data["id"], "reply": reply})


def _envelope_problem(data: object) -> str | None:
    shape = f'send {{"v": {VERSION}, "id": INT, "request": {{"v": {VERSION}, "action": ...}}}}'
    if type(data) is not dict:
        return f"an inspector message is a JSON object; {shape}"
    assert isinstance(data, dict)
    unknown = sorted(str(key)[:40] for key in data if key not in ("v", "id", "request"))
    if unknown:
        return f"unknown fields {unknown[:5]}; {shape}"
    if data.get("v") != VERSION:
        return f"this kernel speaks version {VERSION} of {TARGET}; {shape}"
    ident = data.get("id")
    if type(ident) is not int or not 0 <= ident < MAX_ID:
        return f"'id' must be an int from 0 to 2**53; {shape}"
    if type(data.get("request")) is not dict:
        return f"'request' must be a harness request object; {shape}"
    return None
