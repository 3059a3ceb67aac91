"""An in-process image served by a ServiceBackend, and widgets whose comms record what they send.

``Env`` is a workspace with an image (a ``__main__``-like namespace with an
event bus bound to ``events``), an agent runtime and a HarnessService;
``env.op(code)`` runs code as a harness op and tells the backend's watchers,
as the kernel does after every op.  The ``comms`` fixture replaces the comm
that ipywidgets opens with one that records every message, so that a test
can read what the frontend would have been sent.
"""

from __future__ import annotations

import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ipywidgets
import pytest

from kernos import Image, Workspace
from kernos.agents import AgentRuntime, Limits
from kernos.events.bus import EventBus
from kernos.harness.service import HarnessService
from kernos.image import default_is_persistent
from kernos.inspector.backend import ServiceBackend, notice_of

LIMITS = Limits(seconds=5, hard_seconds=600, memory_mb=4096)


class Env:
    def __init__(self, path: Path) -> None:
        self.workspace = Workspace.open(path, purpose="test")
        self.module = types.ModuleType("__main__")
        self.ns: dict[str, Any] = self.module.__dict__
        self.image = Image(self.workspace, self.ns, module=self.module,
                           is_persistent=lambda name: default_is_persistent(name)
                           and name != "events")
        self.image.restore()
        self.ns["events"] = EventBus(self.image)
        self.runtime = AgentRuntime(self.image, default_limits=LIMITS)
        self.service = HarnessService(self.image, self.runtime)
        self.backend = ServiceBackend(self.service)

    def send(self, **content: Any) -> dict[str, Any]:
        """A harness request (any action: ops too), its notice given to the watchers."""
        reply: dict[str, Any] = self.service.handle({"v": 1, **content}).reply
        notice = notice_of(reply)
        result = reply.get("result") or {}
        if notice is None and "commit" in result and "status" not in result:
            # grant, revoke, add_agent: an op whose result is not an OP-RESULT.  The kernel
            # tells its watchers after every op, so this does too.
            notice = {"type": "committed", "op": result["op"], "commit": result["commit"],
                      "principal": "human", "added": [], "changed": [], "deleted": [],
                      "events": 0}
        if notice is not None:
            self.backend.notify(notice)
        return reply

    def op(self, code: str, principal: str = "human") -> dict[str, Any]:
        reply = self.send(action="op", principal=principal, code=code)
        assert reply["status"] == "ok", reply
        result: dict[str, Any] = reply["result"]
        return result

    def close(self) -> None:
        self.workspace.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    opened = Env(tmp_path / "workspace")
    yield opened
    opened.close()


class RecordingComm:
    """Stands in for a kernel comm: keeps the open data and every message sent."""

    kernel = "in-process"

    def __init__(self, log: list[tuple[str, Any]], **args: Any) -> None:
        self.comm_id = args.get("comm_id") or uuid.uuid4().hex
        self.target_name = args.get("target_name")
        self.open_data = args.get("data")
        self.log = log
        self.closed = False
        self.handler: Callable[[dict[str, Any]], None] | None = None

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self.log.append((self.comm_id, data))

    def on_msg(self, callback: Callable[[dict[str, Any]], None]) -> None:
        self.handler = callback

    def on_close(self, callback: Any) -> None:
        pass

    def open(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self, *args: Any, **kwargs: Any) -> None:
        self.closed = True
        self.handler = None  # a closed comm lets go of its widget


class Comms:
    def __init__(self) -> None:
        self.opened: list[RecordingComm] = []
        self.log: list[tuple[str, Any]] = []
        """Every message sent on any comm, in order: (comm id, data)."""

    def create(self, **args: Any) -> RecordingComm:
        comm = RecordingComm(self.log, **args)
        self.opened.append(comm)
        return comm


@pytest.fixture
def comms(monkeypatch: pytest.MonkeyPatch) -> Iterator[Comms]:
    recorder = Comms()
    monkeypatch.setattr(ipywidgets.comm, "create_comm", recorder.create)
    yield recorder
    ipywidgets.Widget.close_all()
