"""``kernos mcp``: a workspace's image as an MCP server, for any MCP client.

Built on the official ``mcp`` SDK's low-level server, over the harness client
(``kernos.client``): the server is one more harness, acting as one principal
fixed at start (``--principal``, default ``human``).

Tools:

- ``kernos-op``: run code, or call a registry tool, as one op;
- ``kernos-objects`` and ``kernos-object``: list and describe the objects the
  principal may read (also the resources ``kernos://objects/{name}``);
- ``kernos-log``, ``kernos-show``, ``kernos-diff`` and ``kernos-checkout``: the
  history (only when the principal is ``human``);
- ``kernos-events``: committed events after a cursor or an op;
- every registry tool the principal may call, under its own name, with its
  JSON schema as the input schema.

Transports: stdio, and streamable HTTP on 127.0.0.1 only.  Modules:
``options`` (the command line; light, so that ``kernos --help`` does not
import the SDK), ``serve`` (transports and the kernel's life), ``server`` (the
MCP handlers), ``tools`` (the built-in tools), ``arguments`` (checking a
call's arguments).  Run it as ``kernos mcp`` or ``python -m kernos.mcp``.
"""

from __future__ import annotations

from kernos.mcp.options import add_arguments, main

__all__ = ["add_arguments", "main"]
