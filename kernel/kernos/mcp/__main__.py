"""``python -m kernos.mcp``: the same as ``kernos mcp``."""

from __future__ import annotations

import argparse
import sys

from kernos.mcp import add_arguments, main


def run() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernos.mcp",
        description="Serve a Kernos workspace over MCP (stdio, or streamable HTTP on "
                    "127.0.0.1).")
    add_arguments(parser)
    return main(parser.parse_args())


if __name__ == "__main__":
    sys.exit(run())
