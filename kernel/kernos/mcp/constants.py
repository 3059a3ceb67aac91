"""What ``kernos mcp``'s options, server and transports share: the bind address,
the default principal, the exit statuses, and :class:`Stop`.

A module of its own below ``options`` (which imports ``serve`` when the server
runs) and ``serve``/``server`` (which read these), so the arrows point one way.
"""

from __future__ import annotations

__all__ = ["HOST", "HUMAN", "NO_KERNEL", "OK", "USAGE", "Stop"]

HOST = "127.0.0.1"
"""The only address the HTTP transport binds: the server has no authentication of its own."""
HUMAN = "human"

OK, USAGE, NO_KERNEL = 0, 2, 4
"""Exit statuses, as ``kernos``'s other commands use them."""


class Stop(Exception):
    """End ``kernos mcp`` with a message on stderr and an exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
