"""process_exists: a killed kernel counts as gone even before anyone reaps it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from kernos.client._liveness import process_exists


def test_running_zombie_and_reaped_processes() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_exists(child.pid)
        child.kill()
        # Not waited for yet: a zombie, which still has its pid.
        deadline = time.monotonic() + 10
        while process_exists(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not process_exists(child.pid)
        assert os.waitpid(child.pid, os.WNOHANG)[0] in (0, child.pid)
    finally:
        child.kill()
        child.wait()
    assert not process_exists(child.pid)
    assert process_exists(os.getpid())
