"""An in-process harness service on a temp workspace, for the harness and inspector tests."""

from __future__ import annotations

import contextlib
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kernos import Image, Workspace
from kernos.agents import AgentRuntime, Agents, Limits
from kernos.client import KernosClient, RequestError
from kernos.harness.service import HarnessService
from kernos.op import Op

# Short limits, but the watchdog (which kills the process: pytest here) far away.
LIMITS = Limits(seconds=2, hard_seconds=600, memory_mb=4096)


class Env:
    """A workspace, its image (a ``__main__``-like namespace) and an agent runtime."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.workspace: Workspace | None = None
        self.reopen()

    def reopen(self) -> None:
        self.close()
        self.workspace = Workspace.open(self.path, purpose="test")
        self.module = types.ModuleType("__main__")
        self.ns: dict[str, Any] = self.module.__dict__
        self.image = Image(self.workspace, self.ns, module=self.module)
        self.image.restore()
        self.runtime = AgentRuntime(self.image, default_limits=LIMITS)
        self.agents = Agents(lambda: self.runtime)

    def close(self) -> None:
        if self.workspace is not None:
            self.workspace.close()
            self.workspace = None

    @contextlib.contextmanager
    def op(self, source: str) -> Iterator[Op]:
        op = self.image.begin(source=source)
        yield op
        op.commit()

    def ns_of(self, agent: str) -> dict[str, Any]:
        return self.runtime.namespace(agent).user_items()


class Harness:
    def __init__(self, path: Path) -> None:
        self.env = Env(path)
        self.service = HarnessService(self.env.image, self.env.runtime, max_request_bytes=10_000)

    def reopen(self) -> None:
        self.env.reopen()
        self.service = HarnessService(self.env.image, self.env.runtime, max_request_bytes=10_000)

    def send(self, **content: Any) -> dict[str, Any]:
        reply = self.service.handle({"v": 1, **content}).reply
        json.dumps(reply)  # every reply is JSON
        return reply

    def ok(self, **content: Any) -> dict[str, Any]:
        reply = self.send(**content)
        assert reply["status"] == "ok", reply
        result: dict[str, Any] = reply["result"]
        return result

    def op(self, code: str, **content: Any) -> dict[str, Any]:
        content.setdefault("principal", "human")
        return self.ok(action="op", code=code, **content)

    def error(self, **content: Any) -> dict[str, Any]:
        reply = self.send(**content)
        assert reply["status"] == "error", reply
        error: dict[str, Any] = reply["error"]
        return error

    def records(self) -> list[dict[str, Any]]:
        return [record for record in self.env.image.audit.records() if record["type"] == "op"]


class LocalClient(KernosClient):
    """A KernosClient whose requests go, as JSON, to an in-process HarnessService
    (``sent`` lists their actions)."""

    def __init__(self, harness: Harness) -> None:  # no kernel, no loop
        self.harness = harness
        self.sent: list[str] = []

    def request(self, action: str, *, timeout: float | None = None,
                progress: Any = None, **fields: Any) -> dict[str, Any]:
        content = {"v": 1, "action": action,
                   **{name: value for name, value in fields.items() if value is not None}}
        encoded = json.dumps(content)
        self.sent.append(action)
        reply = self.harness.service.handle(json.loads(encoded), size=len(encoded)).reply
        reply = json.loads(json.dumps(reply))
        if reply["status"] == "error":
            raise RequestError.from_reply(reply)
        result: dict[str, Any] = reply["result"]
        return result
