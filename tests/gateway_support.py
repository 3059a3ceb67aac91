"""A real Jupyter Enterprise Gateway on 127.0.0.1, started with deploy/gateway's own scripts.

``running_gateway(base)`` makes sure ``.venv-gateway`` exists (``scripts/gateway-env``,
which is quick when it does), installs the Kernos kernelspec with
``deploy/gateway/install`` (argv: this interpreter; ``KERNOS_WORKSPACE_ROOT``: a
temporary root; ``PYTHONPATH``: this tree's ``kernel/``, so the kernels run the code
under test), starts the gateway with ``deploy/gateway/start`` on a free port with a
random token and a short idle cull, waits until it answers, and at the end stops it
and kills any kernel process it left (found by the private runtime directory in
their command line).  The guide's commands are the ones tested.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import token_api

CHECKOUT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 60.0
USERNAME = "kernos-test"
"""The gateway refuses to start kernels for root (its ``unauthorized_users``)."""
CULL_IDLE_SECONDS = 6
"""A kernel with no client connected and idle this long is culled (the culling test)."""


@dataclass
class Gateway:
    url: str
    token: str
    root: Path
    """``KERNOS_WORKSPACE_ROOT``: workspace ``NAME`` is ``root / NAME``."""
    runtime: Path
    """The gateway's Jupyter runtime directory: every kernel's connection file is here."""
    log: Path
    pid: int

    def api(self, path: str, method: str = "GET", body: object = None) -> Any:
        return token_api(self.url, self.token, path, method, body)

    def kernel_pid(self, kernel_id: str) -> int:
        """The pid of the kernel process the gateway runs as ``kernel_id`` (on this host)."""
        pids = kernel_pids(f"kernel-{kernel_id}.json")
        assert len(pids) == 1, (kernel_id, pids)
        return pids[0]

    def log_tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no gateway log)"


def kernos_cli(*args: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """Run this tree's ``kernos`` CLI with no ``KERNOS_*`` variable of the test's own
    (``env`` adds some)."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("KERNOS_")}
    return subprocess.run([sys.executable, "-m", "kernos.cli", *args], capture_output=True,
                          text=True, env={**clean, **(env or {})}, timeout=120)


def through(gateway: Gateway, *args: str, token: str | None = None, url: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    """``kernos_cli`` through ``gateway`` (``--gateway``; its token unless ``token``)."""
    return kernos_cli(*args, "--gateway", url or gateway.url,
                      env={"KERNOS_GATEWAY_TOKEN": gateway.token if token is None else token})


def kernel_pids(marker: str) -> list[int]:
    """Processes (not zombies) whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker in command and stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def gateway_venv() -> Path:
    """``.venv-gateway`` (made by ``scripts/gateway-env`` if missing: never a skip)."""
    done = subprocess.run([str(CHECKOUT / "scripts" / "gateway-env")], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, f"scripts/gateway-env failed:\n{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def running_gateway(base: Path, *, cull_idle: int = CULL_IDLE_SECONDS,
                    install: Sequence[str] = ()) -> Iterator[Gateway]:
    """``install``: more arguments for deploy/gateway/install (``--remote TEMPLATE``...)."""
    venv = gateway_venv()
    root, runtime, log = base / "workspaces", base / "runtime", base / "gateway.log"
    runtime.mkdir(parents=True)
    installed = subprocess.run(
        [str(CHECKOUT / "deploy" / "gateway" / "install"), "--python", sys.executable,
         "--workspace-root", str(root), "--dest", str(base / "kernels"),
         "--env", f"PYTHONPATH={CHECKOUT / 'kernel'}", *install],
        capture_output=True, text=True, check=False)
    assert installed.returncode == 0, installed.stderr
    kernels = installed.stdout.strip()
    token, port = secrets.token_hex(16), free_port()
    # The gateway's own venv, clean: the kernels get this tree through the kernelspec.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("JUPYTER", "KERNOS_", "KERNEL_", "JPY_", "PYTHON"))}
    env.update(JUPYTER_RUNTIME_DIR=str(runtime), JUPYTER_DATA_DIR=str(base / "data"),
               JUPYTER_CONFIG_DIR=str(base / "config"))
    command = [str(CHECKOUT / "deploy" / "gateway" / "start"), "--kernels", kernels,
               "--port", str(port), "--token", token, "--venv", str(venv),
               "--cull-idle-timeout", str(cull_idle), "--cull-interval", "1"]
    with log.open("ab") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    gateway = Gateway(url=f"http://127.0.0.1:{port}", token=token, root=root,
                      runtime=runtime, log=log, pid=process.pid)
    try:
        _wait_until_up(gateway, process)
        yield gateway
    finally:
        _stop(gateway, process)


def _wait_until_up(gateway: Gateway, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the gateway exited ({process.returncode}) while starting:\n"
                                 f"{gateway.log_tail()}")
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            gateway.api("/api/kernelspecs")
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the gateway did not answer in {START_TIMEOUT:g} s:\n"
                                 f"{gateway.log_tail()}")
        time.sleep(0.2)


def _stop(gateway: Gateway, process: subprocess.Popen[bytes]) -> None:
    """Stop the gateway (it stops its kernels); kill whatever survives, kernels included."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    for pid in kernel_pids(str(gateway.runtime)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def execute(channels: Any, code: str) -> dict[str, Any]:
    """Run a notebook cell over a gateway websocket (``GatewayChannels``), as JupyterLab
    sends it; its execute_reply."""
    message = channels.session.msg("execute_request", {
        "code": code, "silent": False, "store_history": True, "user_expressions": {},
        "allow_stdin": False, "stop_on_error": True})
    channels.shell_channel.send(message)
    while True:
        reply: dict[str, Any] = await channels.shell_channel.get_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == message["header"]["msg_id"]:
            return reply
