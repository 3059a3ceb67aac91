"""connect() refuses clearly when no live kernel owns the workspace (no kernel started)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernos.client import AsyncKernosClient, NoKernelRunning


def connect(workspace: Path) -> None:
    asyncio.run(AsyncKernosClient.connect(workspace, timeout=1))


def test_no_kernel_json(tmp_path: Path) -> None:
    with pytest.raises(NoKernelRunning, match="does not exist") as refused:
        connect(tmp_path)
    assert refused.value.workspace == str(tmp_path)


def test_a_kernel_json_left_by_a_dead_kernel(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / "kernel.json").write_text(json.dumps(
        {"connection_file": str(tmp_path / "missing.json"), "pid": gone.pid}))
    with pytest.raises(NoKernelRunning, match=f"process {gone.pid}, which is not running"):
        connect(tmp_path)


@pytest.mark.parametrize("content", ["{not json", '{"pid": "12"}', "[1, 2]"])
def test_an_unreadable_kernel_json(tmp_path: Path, content: str) -> None:
    (tmp_path / "kernel.json").write_text(content)
    with pytest.raises(NoKernelRunning, match="cannot be used to reach a kernel"):
        connect(tmp_path)
