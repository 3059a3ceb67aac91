"""``kernos mcp``: serve a workspace over MCP, on stdio or streamable HTTP (127.0.0.1 only).

The server uses the kernel already running on the workspace if there is one;
otherwise it starts its own (``kernos.client.KernosManager``) and shuts it
down when it exits.  The principal is fixed here, for the life of the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import uvicorn

from kernos.client import AsyncKernosClient, KernosManager
from kernos.client.errors import ClientError, NoKernelRunning
from kernos.mcp.constants import HOST, HUMAN, NO_KERNEL, OK, USAGE, Stop
from kernos.mcp.server import KernosMCP

__all__ = ["PATH", "run_http", "run_stdio"]

PATH = "/mcp"


def run_stdio(workspace: Path, principal: str, gateway: str | None = None) -> None:
    """Serve on stdin and stdout until the client closes them (or SIGTERM).

    ``gateway``: the kernel runs under that Jupyter Enterprise Gateway, and
    ``workspace`` is its name there."""
    _run(_serve_stdio(workspace, principal, gateway))


def run_http(workspace: Path, principal: str, port: int, gateway: str | None = None) -> None:
    """Serve streamable HTTP on 127.0.0.1 until SIGINT or SIGTERM (``gateway``: as above)."""
    _run(_serve_http(workspace, principal, port, gateway))


def _run(serving: Coroutine[Any, Any, None]) -> None:
    try:
        asyncio.run(serving)
    except BaseExceptionGroup as group:
        # The SDK's task groups wrap what the body raised; show it as it was.
        for wanted in (Stop, KeyboardInterrupt):
            found = _first(group, wanted)
            if found is not None:
                raise found from None
        raise


def _first(group: BaseExceptionGroup[BaseException], wanted: type[BaseException]
           ) -> BaseException | None:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            inner = _first(error, wanted)
            if inner is not None:
                return inner
        elif isinstance(error, wanted):
            return error
    return None


@contextlib.asynccontextmanager
async def _kernel(workspace: Path, gateway: str | None = None
                  ) -> AsyncIterator[AsyncKernosClient]:
    """A client of the workspace's kernel: the running one, else one started (and stopped) here.

    Through a ``gateway``, the running one is the gateway's kernel serving the
    workspace's name, and one started here is started through the gateway."""
    where = f"{workspace} through the gateway {gateway}" if gateway else str(workspace)
    try:
        client = await AsyncKernosClient.connect(str(workspace) if gateway else workspace,
                                                 gateway=gateway)
    except NoKernelRunning:
        client = None
    except ClientError as error:
        raise Stop(f"cannot use the kernel running on {where}: {error}", NO_KERNEL) from None
    if client is not None:
        try:
            yield client
        finally:
            await client.close()
        return
    _log(f"no kernel runs on {where}; starting one (it stops with this server)")
    manager = KernosManager(str(workspace) if gateway else workspace, gateway=gateway)
    try:
        try:
            await manager.start()
            client = await manager.client()
        except Exception as error:  # a missing kernelspec, a kernel that died starting, ...
            raise Stop(f"cannot start a kernel on {where}: {error}", NO_KERNEL) from None
        yield client
    finally:
        with contextlib.suppress(Exception):
            await manager.shutdown()


async def _checked(client: AsyncKernosClient, workspace: Path, principal: str) -> KernosMCP:
    """The MCP face of the workspace, once the principal is known to exist."""
    try:
        hello = await client.hello()
    except ClientError as error:
        raise Stop(f"cannot use the kernel on {workspace}: {error}", NO_KERNEL) from None
    principals = [str(name) for name in hello.get("principals") or [HUMAN]]
    if principal not in principals:
        raise Stop(
            f"there is no principal {principal!r} in the workspace {workspace}; its principals "
            f"are {', '.join(principals)}. Add the agent first (in a notebook: %kernos agent add "
            f"{principal}), or pass one of those to --principal.", USAGE)
    return KernosMCP(client, principal=principal, workspace=str(workspace))


async def _serve_stdio(workspace: Path, principal: str, gateway: str | None) -> None:
    from mcp.server.stdio import stdio_server

    signalled = False
    loop = asyncio.get_running_loop()
    # Claim stdin and stdout first: while they are claimed, fd 1 points at stderr, so a
    # kernel started below cannot write into the MCP stream.
    async with stdio_server() as (read_stream, write_stream):
        async with _kernel(workspace, gateway) as client:
            face = await _checked(client, workspace, principal)
            server = face.server()
            _log(f"serving {workspace} as {principal!r} on stdio")
            serving = asyncio.ensure_future(server.run(
                read_stream, write_stream, server.create_initialization_options()))

            def stop() -> None:
                nonlocal signalled
                signalled = True
                serving.cancel()

            # SIGINT and SIGTERM end the session like the end of input does, so that a
            # kernel started here is stopped.
            for number in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(number, stop)
            try:
                await serving
            except asyncio.CancelledError:
                if not serving.cancelled():
                    raise
            finally:
                for number in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(number)
        if signalled:
            # The kernel is stopped.  The SDK reads stdin in a worker thread that nothing
            # can interrupt until the input ends, and a client that signals us may keep
            # it open: leave now rather than hang.
            _log("stopped")
            os._exit(OK)
        _log("stopped")


async def _serve_http(workspace: Path, principal: str, port: int, gateway: str | None
                      ) -> None:
    async with _kernel(workspace, gateway) as client:
        face = await _checked(client, workspace, principal)
        app = face.server().streamable_http_app(streamable_http_path=PATH, host=HOST)
        listener = _bind(port)
        url = f"http://{HOST}:{listener.getsockname()[1]}{PATH}"
        server = _Uvicorn(uvicorn.Config(app, log_level="warning", lifespan="on"))
        loop = asyncio.get_running_loop()
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(number, server.stop)
        # Connections wait in the listen backlog until uvicorn accepts them.
        _log(f"serving {workspace} as {principal!r} on {url}")
        try:
            await server.serve(sockets=[listener])
        finally:
            listener.close()
            for number in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(number)
        _log("stopped")


class _Uvicorn(uvicorn.Server):
    """uvicorn, minus its signal handling: it re-raises a SIGTERM once it has stopped, which
    would kill this process before it shuts down the kernel it started."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop(self) -> None:
        if self.should_exit:  # a second signal: stop waiting for open connections
            self.force_exit = True
        self.should_exit = True


def _bind(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((HOST, port))
    except OSError as error:
        listener.close()
        raise Stop(f"cannot listen on {HOST}:{port}: {error.strerror}; pick another --port, "
                    "or 0 for a free one", USAGE) from None
    listener.listen(128)
    listener.set_inheritable(False)
    return listener


def _log(message: str) -> None:
    print(f"kernos mcp: {message}", file=sys.stderr, flush=True)
