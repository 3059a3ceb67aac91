"""A kernel shut down while its idle fold moves the branch: one fold waits for the other.

The bench of 8 local kernels logged "folding the commit tail into git failed:
... refs/heads/main.lock: No such file": the idle fold (``FOLD_IDLE`` after the
last request, on the kernel's event loop) and the shutdown's ``Workspace.close``
(on ipykernel's control thread) both wrote the ref's lock file, and one renamed
the other's away.  Here ``KERNOS_PAUSE_AT=ref.locked@1:SECONDS`` holds the first
move of the branch (the idle fold after the only op) with its lock file written,
and the test asks the kernel to shut down meanwhile.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from support import raw_kernel

pytestmark = pytest.mark.kernel

HOLD = 5.0
"""How long the idle fold is held with the ref's lock file written."""


def test_shutdown_during_the_idle_fold_waits_for_it_and_loses_nothing(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    env = {"KERNOS_WORKSPACE": str(workspace), "KERNOS_PAUSE_AT": f"ref.locked@1:{HOLD}"}
    with raw_kernel(tmp_path, env) as (process, client):
        reply = client.execute("import kernos; x = 41; x += 1", reply=True, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        lock = workspace / "history.git" / "refs" / "heads" / "main.lock"
        deadline = time.monotonic() + 60  # sequencing, not a timed assertion
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lock.exists(), "the idle fold never reached ref.locked"
        client.shutdown()  # its close folds too, while the idle fold holds the lock file
        stderr = process.communicate(timeout=120)[1]
    assert process.returncode == 0, (process.returncode, stderr)
    assert "folding the commit tail into git failed" not in stderr, stderr
    assert "Traceback" not in stderr, stderr
    git_dir = workspace / "history.git"
    assert not (git_dir / "refs" / "heads" / "main.lock").exists()
    assert (workspace / "tail").stat().st_size == 0  # folded: git sees every commit
    log = subprocess.run(["git", f"--git-dir={git_dir}", "log", "--format=%s%n%b", "main"],
                         capture_output=True, text=True, check=True).stdout
    assert "x += 1" in log or "Kernos-Op" in log, log
    from kernos import Workspace

    with Workspace.open(workspace, writable=False) as reader:
        assert reader.git_ref() == reader.head() is not None
