"""What the tests that talk to ``kernos.mcp`` over stdio share: how to start it, how to read it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mcp import StdioServerParameters

__all__ = ["ENV", "server", "text"]

ENV = {"KERNOS_DURABILITY": "process"}
"""Process durability: the tests kill processes, not the machine."""


def server(workspace: Path, principal: str) -> StdioServerParameters:
    """``python -m kernos.mcp`` on ``workspace``, bound to ``principal``."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernos.mcp", "--workspace", str(workspace), "--principal", principal],
        env={**os.environ, **ENV})


def text(result: Any) -> str:
    """The text blocks of a tool's result, one per line."""
    return "\n".join(block.text for block in result.content if block.type == "text")
