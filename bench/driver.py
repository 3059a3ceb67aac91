"""A real kernel process, driven through jupyter_client, with per-cell measurements.

Only public behaviour is used: the messaging protocol (``execute_request`` /
``execute_reply`` and IOPub), the ``metadata["kernos"]`` report of each reply,
the kernel's process id (for ``kill -9`` and ``/proc/<pid>/status``) and the
workspace directory on disk.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CellResult", "KernelError", "KernelProcess", "directory_bytes", "peak_rss_bytes"]

CELL_TIMEOUT_S = 900.0
START_TIMEOUT_S = 300.0
TIMING_KEYS = ("analyze", "serialize", "write", "publish")


class KernelError(RuntimeError):
    """The kernel did not answer, or answered with an error where none was expected."""


@dataclass
class CellResult:
    """What one cell cost, as seen by the client and as reported by the kernel."""

    label: str
    code: str
    status: str
    """The reply's status (``ok`` / ``error``)."""
    round_trip_ms: float
    """From sending the execute_request to receiving its execute_reply."""
    output: str
    kernos: dict[str, Any] = field(default_factory=dict)
    """The reply's ``metadata["kernos"]`` (empty for a stock kernel)."""
    history_added: int | None = None
    """Growth of ``<workspace>/history.git`` on disk across the cell, in bytes."""

    @property
    def timings(self) -> dict[str, float]:
        return dict(self.kernos.get("timings_ms", {}))

    @property
    def commit_ms(self) -> float | None:
        """The op's commit work (analyze + serialize + write + publish), or None.

        An op that changed nothing writes no snapshot and reports no ``write``.
        """
        timings = self.timings
        if not all(key in timings for key in TIMING_KEYS if key != "write"):
            return None
        return sum(timings.get(key, 0.0) for key in TIMING_KEYS)

    @property
    def total_ms(self) -> float | None:
        value = self.timings.get("total")
        return None if value is None else float(value)

    @property
    def bytes_written(self) -> int | None:
        value = self.kernos.get("bytes_written")
        return None if value is None else int(value)

    @property
    def op_status(self) -> str:
        return str(self.kernos.get("status", self.status))


def directory_bytes(path: Path) -> int:
    """The sum of the sizes (``lstat``) of every file under ``path``."""
    total = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue
    return total


def peak_rss_bytes(pid: int) -> int | None:
    """The peak resident set size (``VmHWM``) of a live process, if /proc tells it."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class KernelProcess:
    """One kernel (``kernos`` or stock ``python3``) and a blocking client for it.

    ``launched_at`` / ``ready_at`` are ``time.perf_counter()`` readings taken
    just before the process is spawned and when it first answers
    ``kernel_info``, so a caller can time start-up and restore.
    """

    def __init__(self, kernel_name: str, *, run_dir: Path, tag: str,
                 workspace: Path | None = None) -> None:
        from jupyter_client.manager import KernelManager

        env = dict(os.environ)
        env.pop("JPY_SESSION_NAME", None)
        if workspace is not None:
            env["KERNOS_WORKSPACE"] = str(workspace)
        self.kernel_name = kernel_name
        self.workspace = workspace
        # ipc sockets are files: keep them in the run's temporary directory.
        self.manager = KernelManager(kernel_name=kernel_name, transport="ipc",
                                     ip=str(run_dir / f"ipc-{tag}"),
                                     connection_file=str(run_dir / f"kernel-{tag}.json"))
        self._killed = False
        self.launched_at = time.perf_counter()
        self.manager.start_kernel(env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=START_TIMEOUT_S)
        except BaseException as error:
            self.stop(now=True)
            if isinstance(error, RuntimeError):
                raise KernelError(f"the {kernel_name} kernel did not start: {error}") from error
            raise
        self.ready_at = time.perf_counter()

    @property
    def pid(self) -> int:
        process = self.manager.provisioner.process  # type: ignore[union-attr]
        return int(process.pid)

    def peak_rss(self) -> int | None:
        return peak_rss_bytes(self.pid)

    def history_bytes(self) -> int | None:
        """The history on disk: ``history.git`` and the commit tail not yet folded into it."""
        if self.workspace is None:
            return None
        tail = self.workspace / "tail"
        return directory_bytes(self.workspace / "history.git") + (
            tail.stat().st_size if tail.exists() else 0)

    def run(self, code: str, *, label: str = "", expect_ok: bool = True) -> CellResult:
        """Run one cell; measure its round trip and the history's growth across it."""
        before = self.history_bytes()
        client = self.client
        started = time.perf_counter()
        msg_id = client.execute(code, store_history=True, allow_stdin=False)
        deadline = started + CELL_TIMEOUT_S
        while True:
            reply = self._next(client.get_shell_msg, deadline, code)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        round_trip_ms = (time.perf_counter() - started) * 1000
        output = self._drain_iopub(msg_id, deadline, code)
        after = self.history_bytes()
        result = CellResult(
            label=label or code.splitlines()[0],
            code=code,
            status=reply["content"]["status"],
            round_trip_ms=round_trip_ms,
            output=output,
            kernos=dict(reply["metadata"].get("kernos", {})),
            history_added=None if before is None or after is None else after - before,
        )
        if expect_ok and (result.status != "ok" or result.op_status == "rolled back"):
            raise KernelError(f"cell {code!r} failed ({result.op_status}): {output.strip()}")
        return result

    def _next(self, get: Any, deadline: float, code: str) -> dict[str, Any]:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise KernelError(f"no reply to {code!r} within {CELL_TIMEOUT_S:.0f} s")
        try:
            message: dict[str, Any] = get(timeout=remaining)
        except queue.Empty:
            raise KernelError(f"no reply to {code!r} within {CELL_TIMEOUT_S:.0f} s") from None
        return message

    def _drain_iopub(self, msg_id: str, deadline: float, code: str) -> str:
        """Collect the cell's output up to its ``idle`` status message."""
        parts: list[str] = []
        while True:
            message = self._next(self.client.get_iopub_msg, deadline, code)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            content = message["content"]
            if kind == "stream":
                parts.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                parts.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                parts.append(f"{content['ename']}: {content['evalue']}\n")
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(parts)

    def kill(self) -> None:
        """``kill -9`` the kernel process and wait until it is gone."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.manager.is_alive():
            if time.monotonic() > deadline:
                raise KernelError(f"kernel pid {pid} survived SIGKILL")
            time.sleep(0.02)
        self._killed = True
        self.client.stop_channels()
        self.manager.cleanup_resources()

    def stop(self, *, now: bool = False) -> None:
        """Shut the kernel down (politely unless ``now``); safe to call more than once."""
        self.client.stop_channels()
        if self._killed or not self.manager.has_kernel:
            return
        try:
            self.manager.shutdown_kernel(now=now)
        except Exception:
            self.manager.shutdown_kernel(now=True)
        self._killed = True
