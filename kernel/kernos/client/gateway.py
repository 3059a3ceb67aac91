"""Kernos kernels through Jupyter Enterprise Gateway: the manager's gateway path.

``KernosManager("analysis", gateway="http://127.0.0.1:8888")`` starts the
kernel through the gateway instead of as a local process.  The workspace is
then a *name* (checked here against the same allowlist the kernel applies,
``kernos.store.workspace.WORKSPACE_NAME``): the gateway's kernelspec sets
``KERNOS_WORKSPACE_ROOT`` and the kernel opens ``$KERNOS_WORKSPACE_ROOT/<name>``,
the name travelling as ``KERNEL_WORKSPACE`` (the gateway forwards ``KERNEL_*``
variables only).  ``KERNEL_USERNAME`` is sent too, since the gateway refuses a
start request without a user.  See deploy/README.md for the gateway's side.

The API, the errors and the ``KernelDied`` behaviour are the local path's:
``start`` waits until the kernel answers (its image restored), the manager's
``client()`` gives a new :class:`~kernos.client.AsyncKernosClient` (over a websocket of
its own), and a client raises ``KernelDied`` once its kernel process is gone,
which it learns from the gateway (``restarting``/``dead`` on IOPub when the
gateway's restarter finds the process dead, the websocket closing, or the
kernel missing from the gateway's list).  What differs: the gateway, not this
process, owns the kernel process, so ``pid`` is None and ``kill()`` asks the
gateway to stop the kernel now (there is no SIGKILL over HTTP; on the gateway's
host, ``kill -9`` of the kernel process is the crash test).
"""

from __future__ import annotations

import getpass
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from pathlib import PurePath
from typing import Any, Protocol

from kernos.client.errors import ClientError, GatewayError, KernelDied, RequestTimeout
from kernos.client.gateway_transport import GatewayAPI, GatewayChannels
from kernos.errors import KernosError, UsageError
from kernos.store.workspace import check_workspace_name

__all__ = ["TOKEN_VARIABLE", "GatewayKernel"]

TOKEN_VARIABLE = "KERNOS_GATEWAY_TOKEN"
"""Where the gateway's token is read from when none is passed."""
LIST_EVERY = 1.0
"""Seconds between two looks at the gateway's kernel list by a client's watchdog."""


class GatewayClient(Protocol):
    """What the gateway needs of a client of its kernel: asking it which workspace it
    serves, and closing it when the kernel stops.  (:class:`~kernos.client.AsyncKernosClient`
    is one; this module does not import it.)"""

    async def hello(self) -> dict[str, Any]: ...

    async def close(self, *, reason: str = ...) -> None: ...


OpenClient = Callable[["GatewayKernel", float], Awaitable[GatewayClient]]
"""Builds a client of a gateway kernel on :meth:`GatewayKernel.open_channels` (with its
timeout); the manager passes :meth:`kernos.client.AsyncKernosClient._attach_gateway`."""


class GatewayKernel:
    """One Kernos kernel on a workspace name, started and stopped through a gateway."""

    def __init__(self, url: str, workspace: str, *, open_client: OpenClient,
                 kernel_name: str = "kernos", token: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self._open_client = open_client
        try:
            self.workspace = check_workspace_name(workspace)
        except KernosError as error:
            raise UsageError(f"through a gateway the workspace is a name, not a path: "
                             f"{error}") from None
        self.kernel_name = kernel_name
        self.api = GatewayAPI(url, token=token if token is not None
                              else os.environ.get(TOKEN_VARIABLE))
        self._env = dict(env or {})
        self.kernel_id: str | None = None
        """The gateway's id of the running kernel (None when none was started)."""
        self._clients: weakref.WeakSet[GatewayClient] = weakref.WeakSet()

    def _start_env(self) -> dict[str, str]:
        env = dict(self._env)
        env["KERNEL_WORKSPACE"] = self.workspace
        env.setdefault("KERNEL_USERNAME", os.environ.get("KERNEL_USERNAME") or getpass.getuser())
        return env

    async def is_alive(self) -> bool:
        if self.kernel_id is None:
            return False
        model = await self.api.kernel(self.kernel_id)
        return model is not None and model.get("execution_state") != "dead"

    async def start(self, timeout: float) -> None:
        if await self.is_alive():
            raise UsageError(f"a kernel ({self.kernel_id}) is already running for this "
                             "manager; use restart(), or shutdown() first")
        specs = await self.api.kernelspecs()
        if self.kernel_name not in specs:
            raise ClientError(
                f"the gateway at {self.api.url} offers no kernelspec named "
                f"{self.kernel_name!r} (it offers {', '.join(sorted(specs)) or 'none'}): "
                "install Kernos's there (deploy/gateway/install), allow it "
                "(deploy/gateway/start --allowed-kernels), or pass kernel_name=...")
        self.kernel_id = await self.api.start(self.kernel_name, self._start_env())
        await self._wait_ready(timeout)

    async def _wait_ready(self, timeout: float) -> None:
        """Wait until the kernel answers; if it does not, stop it and say why."""
        try:
            probe = await self._open_client(self, timeout)
            await probe.close()
        except BaseException as error:
            kernel_id = self.kernel_id
            await self._delete()
            if isinstance(error, RequestTimeout):
                raise KernelDied(
                    f"the Kernos kernel {kernel_id} for the workspace {self.workspace!r} did "
                    f"not answer within {timeout:g} s through the gateway {self.api.url}, so "
                    "it was stopped. A large image takes a while to restore: give start() a "
                    "larger timeout.") from error
            if isinstance(error, KernelDied):
                raise KernelDied(
                    f"the Kernos kernel {kernel_id} for the workspace {self.workspace!r} "
                    f"exited while starting through the gateway {self.api.url}. Its error is "
                    "in the gateway's log; fix what it names (the kernelspec's Python, "
                    "KERNOS_WORKSPACE_ROOT) and start again.") from error
            raise

    async def open_channels(self) -> tuple[GatewayChannels, Callable[[], Awaitable[bool]]]:
        """A websocket of its own to the running kernel, and the check a client's
        watchdog asks whether the same kernel process still runs.

        :meth:`kernos.client.AsyncKernosClient._attach_gateway` builds a client on
        them and hands it back through :meth:`adopt`.
        """
        if self.kernel_id is None:
            raise UsageError("no kernel is running for this manager; call start() first")
        kernel_id = self.kernel_id
        channels = await self.api.channels(kernel_id)
        checked = [time.monotonic()]

        async def same_process_runs() -> bool:
            if self.kernel_id != kernel_id or channels.closed or channels.gone is not None:
                return False
            if time.monotonic() - checked[0] < LIST_EVERY:
                return True
            checked[0] = time.monotonic()
            try:
                model = await self.api.kernel(kernel_id)
            except GatewayError:
                return not channels.closed  # the gateway blinked; the websocket decides
            return model is not None and model.get("execution_state") != "dead"

        return channels, same_process_runs

    def adopt(self, client: GatewayClient) -> None:
        """Close ``client`` when this manager shuts the kernel down or restarts it."""
        self._clients.add(client)

    async def attach(self, *, timeout: float = 10) -> bool:
        """Find the gateway kernel already serving this workspace and adopt it.

        The gateway's kernel list does not say which workspace a kernel opened, so
        each Kernos kernel listed is asked (``hello``) over a websocket of its own;
        a kernel that does not answer within ``timeout`` (busy with a long op) is
        passed over.  True when one was found: ``client()`` then talks to it, and
        ``shutdown()`` would stop it, so a caller that only borrows it closes its
        clients and leaves the kernel running.
        """
        for model in await self.api.kernels():
            kernel_id = model.get("id")
            if model.get("name") != self.kernel_name or not isinstance(kernel_id, str) \
                    or model.get("execution_state") == "dead":
                continue
            self.kernel_id = kernel_id
            try:
                probe = await self._open_client(self, timeout)
            except (ClientError, OSError):
                self.kernel_id = None
                continue
            try:
                served = (await probe.hello()).get("workspace")
            except (ClientError, OSError):
                served = None
            finally:
                await probe.close(reason="a probe for the workspace's kernel")
            if isinstance(served, str) and PurePath(served).name == self.workspace:
                return True
            self.kernel_id = None
        return False

    async def _close_clients(self, reason: str) -> None:
        for client in list(self._clients):
            await client.close(reason=reason)
        self._clients = weakref.WeakSet()

    async def _delete(self) -> None:
        kernel_id, self.kernel_id = self.kernel_id, None
        if kernel_id is not None:
            await self.api.delete(kernel_id)

    async def kill(self) -> None:
        """Ask the gateway to stop the kernel now; its clients raise ``KernelDied``."""
        await self._delete()

    async def shutdown(self) -> None:
        await self._close_clients("the kernel was shut down by its manager")
        await self._delete()

    async def restart(self, timeout: float) -> None:
        """Restart through the gateway (the same kernel id); a new kernel if it is gone."""
        await self._close_clients("the kernel was restarted by its manager")
        if self.kernel_id is not None and await self.api.restart(self.kernel_id):
            await self._wait_ready(timeout)
            return
        self.kernel_id = None
        await self.start(timeout)
