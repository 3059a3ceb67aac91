"""A ``kernos`` kernel process for the security tests (the integration fixtures are not
importable from here): started with jupyter_client on a workspace, over ipc."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


class RealKernel:
    """A ``kernos`` kernel process on a workspace, driven through jupyter_client."""

    def __init__(self, workspace: Path) -> None:
        from jupyter_client import KernelManager

        environment = dict(os.environ, KERNOS_WORKSPACE=str(workspace))
        environment.pop("JPY_SESSION_NAME", None)
        self._sockets = tempfile.mkdtemp(prefix="kernos-sec-")
        self.manager = KernelManager(kernel_name="kernos", transport="ipc",
                                     ip=os.path.join(self._sockets, "kernel"))
        self.manager.start_kernel(env=environment)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 60) -> dict[str, Any]:
        """Execute a cell: status, metadata["kernos"], stdout, stderr and errors."""
        out: dict[str, Any] = {"stdout": "", "stderr": "", "errors": []}

        def collect(message: dict[str, Any]) -> None:
            content = message["content"]
            if message["msg_type"] == "stream":
                out[content["name"]] += content["text"]
            elif message["msg_type"] == "error":
                out["errors"].append(f"{content['ename']}: {content['evalue']}")

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=collect)
        out["status"] = reply["content"]["status"]
        out["kernos"] = reply["metadata"].get("kernos", {})
        return out

    def alive(self) -> bool:
        return bool(self.manager.is_alive())

    def stop(self) -> None:
        self.client.stop_channels()
        with contextlib.suppress(Exception):
            if self.manager.has_kernel:
                self.manager.shutdown_kernel(now=True)
        shutil.rmtree(self._sockets, ignore_errors=True)
