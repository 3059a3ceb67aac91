"""Real kernels: every test here starts ``kernos`` kernel processes with jupyter_client.

``kernel_factory`` starts a kernel on a workspace (a fresh one per test unless
given) and returns a :class:`Kernel`, whose ``run`` executes a cell and
returns its reply, its ``metadata["kernos"]`` report and its output.  Every
kernel is shut down at the end of the test, killed if need be.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from jupyter_client import KernelManager

from kernos.kernel.kernel import NOTICE_MIME

pytestmark = pytest.mark.kernel

START_TIMEOUT = 120
EXECUTE_TIMEOUT = 120


@dataclass
class Result:
    status: str
    """The reply's ``content["status"]``: ``ok`` or ``error``."""
    kernos: dict[str, Any]
    """The reply's ``metadata["kernos"]`` report (``status``: committed/rolled back/rejected)."""
    stdout: str
    stderr: str
    errors: list[dict[str, Any]] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)
    notices: str = ""
    """Kernos's notices that are not errors (``NOTICE_MIME`` displays), one per line."""

    @property
    def committed(self) -> bool:
        return self.kernos.get("status") == "committed"

    @property
    def rolled_back(self) -> bool:
        return self.kernos.get("status") == "rolled back"


class Kernel:
    def __init__(self, workspace: Path, env: dict[str, str] | None = None,
                 kernel_name: str = "kernos") -> None:
        self.workspace = workspace
        environment = dict(os.environ, KERNOS_WORKSPACE=str(workspace), **(env or {}))
        environment.pop("JPY_SESSION_NAME", None)
        # ipc sockets go in a directory of their own, not the current directory.
        self._sockets = tempfile.mkdtemp(prefix="kernos-ipc-")
        self.manager = KernelManager(kernel_name=kernel_name, transport="ipc",
                                     ip=os.path.join(self._sockets, "kernel"))
        self.manager.start_kernel(env=environment)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=START_TIMEOUT)

    @property
    def pid(self) -> int:
        return int(self.manager.provisioner.process.pid)  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = EXECUTE_TIMEOUT) -> Result:
        stdout: list[str] = []
        stderr: list[str] = []
        errors: list[dict[str, Any]] = []
        results: list[str] = []
        notices: list[str] = []

        def collect(message: dict[str, Any]) -> None:
            kind = message["msg_type"]
            content = message["content"]
            if kind == "stream":
                (stdout if content["name"] == "stdout" else stderr).append(content["text"])
            elif kind == "error":
                errors.append(content)
            elif kind == "display_data" and NOTICE_MIME in content["data"]:
                notices.append(content["data"]["text/plain"] + "\n")
            elif kind in ("execute_result", "display_data"):
                results.append(content["data"].get("text/plain", ""))

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=collect)
        return Result(
            status=reply["content"]["status"],
            kernos=reply["metadata"].get("kernos", {}),
            stdout="".join(stdout),
            stderr="".join(stderr),
            errors=errors,
            results=results,
            reply=reply,
            notices="".join(notices),
        )

    def value(self, expression: str) -> Any:
        """Evaluate ``expression`` in the kernel and return it (it must be a Python literal)."""
        import ast

        result = self.run(f"print(repr({expression}))")
        assert result.status == "ok", result.errors
        return ast.literal_eval(result.stdout.strip())

    def kill9(self) -> None:
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 10
        while self.manager.is_alive() and time.time() < deadline:
            time.sleep(0.02)
        assert not self.manager.is_alive(), f"kernel {pid} survived SIGKILL"
        self.client.stop_channels()

    def interrupt(self) -> None:
        self.manager.interrupt_kernel()

    def stop(self) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)
        shutil.rmtree(self._sockets, ignore_errors=True)


@pytest.fixture
def kernel_factory(tmp_path: Path) -> Iterator[Callable[..., Kernel]]:
    started: list[Kernel] = []

    def start(workspace: Path | None = None, env: dict[str, str] | None = None,
              kernel_name: str = "kernos") -> Kernel:
        kernel = Kernel(workspace or tmp_path / "workspace", env, kernel_name)
        started.append(kernel)
        return kernel

    yield start
    for kernel in started:
        with contextlib.suppress(Exception):
            kernel.stop()


@pytest.fixture
def kernel(kernel_factory: Callable[..., Kernel]) -> Kernel:
    return kernel_factory()
