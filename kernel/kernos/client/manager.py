"""KernosManager: the lifecycle of one Kernos kernel process, and ``run_kernel``.

The manager owns the process (start, restart, kill, shutdown, is_alive); a
client owns the requests.  ``await manager.client()`` joins them: each call
gives a new, independent client (its own identity on the kernel's shell
socket) tied to the current process.  After a restart the old process's
clients raise ``KernelDied``; ask the manager for a new one.

The kernel listens on ipc sockets in a private temporary directory (mode
0700, removed at shutdown), which also holds the connection file.  While it
runs, the kernel advertises that file in ``<workspace>/kernel.json``, so
other processes can ``AsyncKernosClient.connect(workspace)``.

With ``gateway=URL`` the kernel is started through a Jupyter Enterprise
Gateway instead (``kernos.client.gateway``): the workspace is then a name under
the gateway's workspace root, and the same methods act through the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import NoSuchKernel
from jupyter_client.manager import AsyncKernelManager

from kernos.client.client import AsyncKernosClient
from kernos.client.errors import ClientError, KernelDied, RequestTimeout
from kernos.client.gateway import GatewayKernel
from kernos.errors import UsageError

__all__ = ["KernosManager", "run_kernel"]

KILL_WAIT = 10.0
"""Seconds to wait for a SIGKILLed kernel to be gone."""


class KernosManager:
    """Starts, restarts, kills and shuts down one Kernos kernel on ``workspace``.

    ``env`` adds environment variables for the kernel (``KERNOS_DURABILITY``,
    ...); ``KERNOS_WORKSPACE`` is always ``workspace``.

    ``gateway`` (``http://HOST:PORT``) starts the kernel through that Jupyter
    Enterprise Gateway: ``workspace`` is then a name, ``token`` (default
    ``$KERNOS_GATEWAY_TOKEN``) the gateway's auth token, and only ``KERNEL_*``
    variables of ``env`` reach the kernel.
    """

    def __init__(self, workspace: str | Path, *, env: dict[str, str] | None = None,
                 kernel_name: str = "kernos", gateway: str | None = None,
                 token: str | None = None) -> None:
        self.gateway: GatewayKernel | None = None
        """The gateway path (None: a local process)."""
        if gateway is not None:
            self.gateway = GatewayKernel(gateway, str(workspace), kernel_name=kernel_name,
                                         token=token, env=env,
                                         open_client=AsyncKernosClient._attach_gateway)
            self.workspace = self.gateway.workspace
        else:
            self.workspace = str(Path(workspace).expanduser().absolute())
        self.kernel_name = kernel_name
        self._env = dict(env or {})
        self._km: AsyncKernelManager | None = None
        self._sockets: str | None = None
        self._clients: weakref.WeakSet[AsyncKernosClient] = weakref.WeakSet()

    # -- the process -----------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The kernel's process id (None when none was started or it was shut down)."""
        provisioner = self._km.provisioner if self._km is not None else None
        pid = getattr(provisioner, "pid", None)
        return pid if isinstance(pid, int) else None

    @property
    def connection_file(self) -> str | None:
        return self._km.connection_file if self._km is not None else None

    async def is_alive(self) -> bool:
        """Whether the kernel process runs (it may still be starting up)."""
        if self.gateway is not None:
            return await self.gateway.is_alive()
        return self._km is not None and bool(await self._km.is_alive())

    async def start(self, timeout: float = 120) -> None:
        """Start the kernel and wait until it answers (its image restored).

        If it does not answer within ``timeout`` seconds, or dies while
        starting, it is killed and the error raised.
        """
        if self.gateway is not None:
            return await self.gateway.start(timeout)
        if await self.is_alive():
            raise UsageError(f"a kernel (pid {self.pid}) is already running for this manager; "
                             "use restart(), or shutdown() first")
        await self._discard()
        environment = dict(os.environ)
        environment.update(self._env)
        environment["KERNOS_WORKSPACE"] = self.workspace
        # Jupyter's notebook name would choose another workspace when this one is unset.
        environment.pop("JPY_SESSION_NAME", None)
        self._sockets = tempfile.mkdtemp(prefix="kernos-ipc-")
        self._km = AsyncKernelManager(
            kernel_name=self.kernel_name, transport="ipc",
            ip=os.path.join(self._sockets, "kernel"),
            connection_file=os.path.join(self._sockets, "connection.json"))
        try:
            try:
                await self._km.start_kernel(env=environment)
            except NoSuchKernel:
                raise ClientError(
                    f"there is no Jupyter kernelspec named {self.kernel_name!r} in this "
                    "environment: install Kernos's with 'kernos install --sys-prefix' (or "
                    "pip install kernos), or pass kernel_name=...") from None
            probe = await self.client(timeout=timeout)
            await probe.close()
        except BaseException as error:
            code = await self._exit_code()
            self._kill_now()
            await self._discard()
            if isinstance(error, (KernelDied, RequestTimeout)):
                raise KernelDied(self._failed_start(error, code, timeout),
                                 pid=getattr(error, "pid", None)) from error
            raise

    def _failed_start(self, error: BaseException, code: int | None, timeout: float) -> str:
        if isinstance(error, RequestTimeout):
            return (f"the Kernos kernel for the workspace {self.workspace} did not answer "
                    f"within {timeout:g} s, so it was killed. A large image takes a while to "
                    "restore: give start() a larger timeout.")
        return (f"the Kernos kernel for the workspace {self.workspace} exited while starting "
                f"(exit code {code}). Its own error went to this process's stderr; fix what "
                "it names (a workspace path that is not a usable directory, ...) and start "
                "again.")

    async def _exit_code(self) -> int | None:
        if self._km is None or self._km.provisioner is None:
            return None
        with contextlib.suppress(Exception):
            return await self._km.provisioner.poll()
        return None

    async def client(self, *, timeout: float = 30) -> AsyncKernosClient:
        """A new client of the running kernel: connected, channels started, ready."""
        if self.gateway is not None:
            return await AsyncKernosClient._attach_gateway(self.gateway, timeout=timeout)
        if self._km is None or not self._km.has_kernel:
            raise UsageError("no kernel is running for this manager; call start() first")
        pid = self.pid
        manager = self._km

        async def same_process_runs() -> bool:
            return self._km is manager and self.pid == pid and bool(await manager.is_alive())

        info: dict[str, Any] = dict(self._km.get_connection_info(session=False))
        client = await AsyncKernosClient._open(info, timeout=timeout, pid=pid,
                                               process_check=same_process_runs,
                                               workspace=self.workspace)
        self._clients.add(client)
        return client

    async def kill(self) -> None:
        """SIGKILL the kernel (as a crash would) and wait until it is gone.

        Its clients raise ``KernelDied`` from then on.  ``restart()`` or
        ``start()`` brings a kernel back, restored to the last committed op.  Through a
        gateway the gateway is asked to stop the kernel now (``kernos.client.gateway``).
        """
        if self.gateway is not None:
            return await self.gateway.kill()
        pid = self.pid
        if self._km is None or pid is None or not await self.is_alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT
        while await self.is_alive():
            if time.monotonic() > deadline:
                raise KernelDied(f"the kernel (pid {pid}) survived SIGKILL for {KILL_WAIT:g} s "
                                 "(an uninterruptible wait in the operating system?)", pid=pid)
            await asyncio.sleep(0.02)

    async def shutdown(self) -> None:
        """Stop the kernel cleanly (killing it if it does not stop) and close its clients.

        Always leaves no process behind, even if cancelled halfway.
        """
        if self.gateway is not None:
            return await self.gateway.shutdown()
        for client in list(self._clients):
            await client.close(reason="the kernel was shut down by its manager")
        self._clients = weakref.WeakSet()
        if self._km is None:
            return
        try:
            if await self.is_alive():
                await self._km.shutdown_kernel(now=False)
        except BaseException:
            self._kill_now()
            raise
        finally:
            await self._discard()

    async def restart(self, timeout: float = 120) -> None:
        """Shut the kernel down (or clear up after its death) and start a new one.

        The new process restores the image to the last committed op.  Clients
        of the old process raise ``KernelDied``; get new ones with :meth:`client`.
        """
        if self.gateway is not None:
            return await self.gateway.restart(timeout)
        await self.shutdown()
        await self.start(timeout=timeout)

    # -- clearing up -----------------------------------------------------------------

    def _kill_now(self) -> None:
        """SIGKILL without waiting: the last resort, usable while being cancelled."""
        pid = self.pid
        if pid is not None and self._km is not None and self._km.has_kernel:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    async def _discard(self) -> None:
        """Forget a stopped (or dead) process: reap it, remove the sockets directory."""
        manager, sockets = self._km, self._sockets
        self._km, self._sockets = None, None
        if manager is not None:
            with contextlib.suppress(Exception):
                if manager.has_kernel and await manager.is_alive():
                    await manager.shutdown_kernel(now=True)
                else:
                    await manager.cleanup_resources()
            provisioner = manager.provisioner
            process = getattr(provisioner, "process", None)
            if process is not None:
                with contextlib.suppress(Exception):
                    process.wait(timeout=KILL_WAIT)
        if sockets is not None:
            shutil.rmtree(sockets, ignore_errors=True)


@asynccontextmanager
async def run_kernel(workspace: str | Path, *, env: dict[str, str] | None = None,
                     kernel_name: str = "kernos", timeout: float = 120,
                     gateway: str | None = None, token: str | None = None,
                     ) -> AsyncIterator[tuple[KernosManager, AsyncKernosClient]]:
    """Start a kernel on ``workspace``; yield ``(manager, client)``; always shut it down.

    The kernel is shut down however the block ends (an exception, a
    cancellation), and killed if it does not stop.  ``gateway``/``token``: see
    :class:`KernosManager`.
    """
    manager = KernosManager(workspace, env=env, kernel_name=kernel_name, gateway=gateway,
                            token=token)
    try:
        await manager.start(timeout=timeout)
        client = await manager.client()
        yield manager, client
    finally:
        await manager.shutdown()
