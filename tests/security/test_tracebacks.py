"""A failing ``%%agent`` cell shows the agent its own frames only, in a real kernel.

The host's frames (the runtime, the kernel, host tools) carry file names,
source lines and values that are not the agent's to see; the agent's cell
and the tools agents wrote keep their frames and lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from security.kernels import RealKernel

pytestmark = pytest.mark.kernel


def traceback_of(kernel: RealKernel, code: str) -> list[str]:
    errors: list[dict[str, Any]] = []

    def collect(message: dict[str, Any]) -> None:
        if message["msg_type"] == "error":
            errors.append(message["content"])

    reply = kernel.client.execute_interactive(code, timeout=60, output_hook=collect)
    assert reply["content"]["status"] == "error", code
    [error] = errors
    assert reply["content"]["traceback"] == error["traceback"]
    return [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in error["traceback"]]


def test_an_agent_cell_shows_only_agent_frames(
        tmp_path: Path, real_kernel: Callable[[Path], RealKernel]) -> None:
    kernel = real_kernel(tmp_path / "ws")
    setup = kernel.run("HOST_ONLY_MARKER = 'h0st-s3cret'\n"
                       "def check(x):\n    assert x == HOST_ONLY_MARKER, 'host check failed'\n"
                       "    return x\n"
                       "%kernos agent add mallory\n%kernos grant mallory call:check")
    assert setup["status"] == "ok", setup
    setup = kernel.run("agents.register_tool('check', check, schema={'type': 'object', "
                       "'properties': {'x': {'type': 'string'}}}, description='checks')")
    assert setup["status"] == "ok", setup
    # An error inside host code the agent called (a trusted tool, then the runtime).
    shown = "\n".join(traceback_of(kernel, "%%agent mallory\n\ndef go():\n"
                                           "    return call('check', x='guess')\ngo()"))
    assert "<agent:mallory>" in shown
    assert "return call('check', x='guess')" in shown  # the agent's own lines stay
    assert "AssertionError: host check failed" in shown
    for host in ("HOST_ONLY_MARKER", "assert x ==", "kernos/", ".py", "site-packages",
                 "runtime.run", "magics"):
        assert host not in shown, (host, shown)
    # An error the runtime raises (a bad argument) shows no runtime frame either.
    shown = "\n".join(traceback_of(kernel, "%%agent mallory\ncall('check', x=5)"))
    assert "TypeError" in shown and "<agent:mallory>" in shown
    assert ".py" not in shown and "check_arguments" not in shown, shown
