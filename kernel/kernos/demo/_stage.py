"""The demonstration's stage: its kernel, its harness client, and what every scene uses.

:class:`Stage` owns the ``KernosManager`` and the current client (a new one
after each restart), and offers the scenes their common moves: run an op and
show it, read a value, restart the kernel, take the workspace's state.  The
scenes (``_state_scenes``, ``_durability_scenes``, ``_agent_scenes``) are
subclasses of it; ``kernos.demo.Demo`` joins them and runs them in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernos.client import AsyncKernosClient, KernosManager, ObjectInfo, OpResult
from kernos.demo._report import DemoFailure, _outcome, _show
from kernos.demo._scripts import WAIT

KERNEL = "kernos"
"""The kernelspec the demonstration starts."""


class Stage:
    """The demonstration's kernel, its harness client, and the moves its scenes share."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.manager = KernosManager(workspace, kernel_name=KERNEL)
        self._client: AsyncKernosClient | None = None
        self._bob: AsyncKernosClient | None = None
        """bob's own client from the race, kept open to see the kernel die."""
        self._loser = ""
        """The agent whose first spend conflicted in the race."""

    @property
    def client(self) -> AsyncKernosClient:
        assert self._client is not None, "the kernel is not started"
        return self._client

    async def op(self, code: str, principal: str = "human") -> OpResult:
        result = await self.client.op(code, principal=principal)
        _show(code, principal, result)
        return result

    async def value(self, code: str) -> Any:
        """The JSON value of a human expression (a read that runs as a committed op)."""
        result = await self.op(code)
        if not (result.committed and result.value is not None and result.value.has_json):
            raise DemoFailure(f"{code!r} did not give a JSON value: {_outcome(result)}")
        return result.value.json

    async def budget(self, principal: str = "human",
                     client: AsyncKernosClient | None = None) -> Any:
        """The racing agents' shared account, read without running an op."""
        account = await (client or self.client).object("account", principal=principal)
        assert account.preview is not None
        return account.preview.json["budget"] if account.preview.has_json else None


    async def start(self) -> None:
        print("0. Start a Kernos kernel: KernosManager (jupyter_client underneath), and a "
              "client.\n")
        await self.manager.start()
        self._client = await self.manager.client()
        hello = await self.client.hello()
        print(f"    kernel pid {self.manager.pid}, harness protocol v{hello['protocol']}, "
              f"Kernos {hello['kernos']}\n")

    async def _loop_state(self, until: Callable[[dict[str, Any]], bool] | None = None
                          ) -> dict[str, Any]:
        """bob's loop as the harness sees it; with ``until``, once that holds of it."""
        deadline = time.monotonic() + WAIT
        while True:
            state: dict[str, Any] = (await self.client.request(
                "loop", do="status", agent="bob"))["loops"][0]
            if until is None or until(state) or time.monotonic() > deadline:
                return state
            await asyncio.sleep(0.02)

    async def _restart(self) -> None:
        await self.client.close()
        await self.manager.restart()
        self._client = await self.manager.client()

    @property
    def payments(self) -> Path:
        return self.workspace.with_name(self.workspace.name + "-payments.jsonl")

    async def _workspace_state(self) -> dict[str, Any]:
        """What the harness can see of the workspace, for comparing across the kill."""
        status = await self.client.status()

        def row(info: ObjectInfo) -> tuple[Any, ...]:
            return (info.name, info.type, info.version, info.summary, info.op, info.principal)

        return {"objects": [row(info) for info in await self.client.objects()],
                "head": status["head"], "agents": await self.client.agents(),
                "grants": await self.client.grants(), "tools": await self.client.tools()}

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.manager.shutdown()
