"""A killed kernel's background repack dies with it (``kernos.store.repack``), through a real
kernel.

git's repack is fast on a small workspace, so the kernel is given a stand-in
``git`` first on its PATH: for ``repack`` it starts a child of its own (as
``git repack`` starts ``git pack-objects``), says who they are and waits; for
anything else it is git.  The workspace holds as many packs as start a
repack (``REPACK_PACKS``) before the kernel starts, so its first commit
starts one.  No timing: the test waits (bounded) for the repack to be there,
kills the kernel with SIGKILL, then waits (bounded) for every process of the
repack to be gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kernos.store.object_store import REPACK_PACKS
from kernos.store.repack import wait_for_repacks
from kernos.store.workspace import Workspace

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

BOUND = 60.0
"""Seconds a wait may take at most before the test gives up (not a speed claim)."""

STAND_IN = """#!/bin/sh
for argument in "$@"; do
    if [ "$argument" = repack ]; then
        sleep 3600 &
        echo "$$ $!" > "$KERNOS_TEST_REPACK_PIDS.tmp"
        mv "$KERNOS_TEST_REPACK_PIDS.tmp" "$KERNOS_TEST_REPACK_PIDS"
        wait
        exit 0
    fi
done
exec {git} "$@"
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _many_packs(workspace: Path, count: int) -> None:
    """A workspace whose objects are in ``count`` packs (one blob each)."""
    Workspace.open(workspace).close()
    git_dir = workspace / "history.git"
    for number in range(count):
        blob = subprocess.run(["git", f"--git-dir={git_dir}", "hash-object", "-w", "--stdin"],
                              input=f"blob {number}\n", capture_output=True, text=True,
                              check=True).stdout
        subprocess.run(["git", f"--git-dir={git_dir}", "pack-objects", "-q",
                        str(git_dir / "objects" / "pack" / "pack")], input=blob,
                       capture_output=True, text=True, check=True)
    subprocess.run(["git", f"--git-dir={git_dir}", "prune-packed"], check=True)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_a_killed_kernels_repack_dies_with_it(kernel_factory: Callable[..., Kernel],
                                              tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    _many_packs(workspace, REPACK_PACKS)
    real_git = shutil.which("git")
    assert real_git is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(STAND_IN.format(git=real_git))
    (bin_dir / "git").chmod(0o755)
    pids_file = tmp_path / "repack.pids"
    kernel = kernel_factory(workspace, env={
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "KERNOS_TEST_REPACK_PIDS": str(pids_file)})
    assert kernel.run("x = 1").committed  # its commit finds the packs and starts a repack

    _wait_for(pids_file.exists, "the kernel started no repack")
    repack, child = (int(pid) for pid in pids_file.read_text().split())
    assert _alive(repack) and _alive(child) and _parent(child) == repack
    assert not wait_for_repacks(workspace / "history.git", timeout=0)  # it holds the lock

    kernel.kill9()
    _wait_for(lambda: not _alive(repack) and not _alive(child),
              f"the repack (pid {repack}) or its child (pid {child}) outlived its kernel")
    assert wait_for_repacks(workspace / "history.git", timeout=BOUND)

    # The next kernel on the workspace starts its own repack, alone.
    pids_file.unlink()
    kernel = kernel_factory(workspace, env={
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "KERNOS_TEST_REPACK_PIDS": str(pids_file)})
    assert kernel.value("x") == 1
    assert kernel.run("x = 2").committed
    _wait_for(pids_file.exists, "the next kernel started no repack")
    kernel.stop()
