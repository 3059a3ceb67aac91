"""``kernos mcp``'s options and entry point.

Light on purpose: ``kernos`` imports this for its ``--help``, and the MCP SDK
takes seconds to import, so ``serve`` (and the SDK) is imported only when the
server runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kernos.mcp.constants import HOST, HUMAN, OK, USAGE, Stop
from kernos.store.catalog import find_workspace
from kernos.store.workspace import default_workspace

__all__ = ["HOST", "HUMAN", "Stop", "add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``kernos mcp`` to ``parser``."""
    parser.add_argument(
        "--workspace", "-w", metavar="NAME|PATH",
        help="the workspace to serve: a name (`kernos workspaces` lists them) or a path with a "
             "'/' (default: $KERNOS_WORKSPACE, else the default workspace)")
    parser.add_argument(
        "--gateway", metavar="URL", default=os.environ.get("KERNOS_GATEWAY_URL") or None,
        help="the kernel runs under this Jupyter Enterprise Gateway (http://HOST:PORT; "
             "default $KERNOS_GATEWAY_URL), and --workspace is its name there; the token "
             "is $KERNOS_GATEWAY_TOKEN")
    parser.add_argument(
        "--principal", default=HUMAN, metavar="NAME",
        help="who every MCP request runs as, fixed for the life of the server: 'human' "
             "(default) or an agent of the workspace; clients cannot choose another")
    parser.add_argument(
        "--transport", choices=("stdio", "http"), default="stdio",
        help="stdio (default: the MCP client starts this command) or streamable HTTP")
    parser.add_argument(
        "--port", type=int, default=0, metavar="PORT",
        help="the HTTP port (default 0: pick a free one); the URL is printed on stderr")
    parser.add_argument(
        "--host", choices=(HOST,), default=HOST,
        help="the HTTP address: only 127.0.0.1, because the server has no authentication")


def main(args: argparse.Namespace) -> int:
    """Serve until the client disconnects (stdio) or SIGINT/SIGTERM (HTTP); the exit status."""
    try:
        gateway = getattr(args, "gateway", None)
        if gateway:
            workspace = Path(args.workspace or "default")
        else:
            workspace = find_workspace(args.workspace) if args.workspace \
                else default_workspace()
        principal = str(args.principal)
        if args.host != HOST:
            raise Stop(f"--host must be {HOST}: the server has no authentication", USAGE)
        if args.transport == "stdio" and args.port:
            raise Stop("--port applies to --transport http only", USAGE)
        if not 0 <= args.port <= 65535:
            raise Stop(f"--port must be 0 to 65535, not {args.port}", USAGE)
        from kernos.mcp import serve

        if args.transport == "stdio":
            serve.run_stdio(workspace, principal, gateway)
        else:
            serve.run_http(workspace, principal, args.port, gateway)
    except Stop as stop:
        print(f"kernos mcp: {stop}", file=sys.stderr, flush=True)
        return stop.status
    except KeyboardInterrupt:  # Ctrl-C is how a server ends
        return OK
    return OK
