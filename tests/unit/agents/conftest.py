"""An in-process image with an agent runtime on it, reopenable like a restarted kernel.

The default limits are short (2 s) but keep the watchdog far away: its hard
deadline and memory cap kill the *process*, which here is pytest itself.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernos import Image, Workspace
from kernos.agents import AgentRuntime, Agents, Limits
from kernos.op import Op

TEST_LIMITS = Limits(seconds=2, hard_seconds=600, memory_mb=4096)


class AgentEnv:
    """A workspace, an image on it (a ``__main__``-like namespace) and an agent runtime."""

    def __init__(self, path: Path, limits: Limits = TEST_LIMITS) -> None:
        self.path = path
        self.limits = limits
        self.workspace: Workspace | None = None
        self.reopen()

    def reopen(self) -> AgentEnv:
        """Close the workspace and open it again: a new Image, restored, a new runtime."""
        if self.workspace is not None:
            self.workspace.close()
        self.workspace = Workspace.open(self.path, purpose="test")
        self.module = types.ModuleType("__main__")
        self.ns: dict[str, Any] = self.module.__dict__
        self.image = Image(self.workspace, self.ns, module=self.module)
        self.restore_report = self.image.restore()
        self.runtime = AgentRuntime(self.image, default_limits=self.limits)
        self.agents = Agents(lambda: self.runtime)
        return self

    def close(self) -> None:
        if self.workspace is not None:
            self.workspace.close()
            self.workspace = None

    @contextlib.contextmanager
    def op(self, source: str = "") -> Iterator[Op]:
        """An op that commits at the end of the block (aborts if the block raises)."""
        op = self.image.begin(source=source)
        try:
            yield op
        except BaseException:
            if self.image.current is op:
                op.abort()
            raise
        if self.image.current is op:
            self.report = op.commit()

    def cell(self, source: str) -> None:
        """Run human code as one committed op (like a notebook cell)."""
        with self.op(source):
            exec(compile(source, "<cell>", "exec"), self.ns)

    def run(self, agent: str, source: str) -> str:
        """Run agent code in its own op and commit it; returns what it printed."""
        with self.op():
            return self.runtime.run(agent, source).output

    def ns_of(self, agent: str) -> dict[str, Any]:
        return self.runtime.namespace(agent).user_items()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[AgentEnv]:
    opened = AgentEnv(tmp_path / "ws")
    yield opened
    opened.close()
