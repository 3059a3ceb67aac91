"""Small real filesystems for the full-disk tests: a tmpfs, or an ext4 image on a loop device.

``mounted(kind, where, size)`` mounts one at ``where`` (as root), yields it,
and unmounts it afterwards (lazily if a process still holds it).  Where
mounting is impossible (not root, no loop devices) it skips the test and says
why.  ``Filler`` takes the free space away but for a chosen number of bytes,
so that the next write fails where the test wants it to.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["Filler", "free_bytes", "mounted"]

KINDS = ("tmpfs", "ext4")


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


@contextlib.contextmanager
def mounted(kind: str, where: Path, size: int) -> Iterator[Path]:
    """A ``kind`` filesystem of ``size`` bytes mounted at ``where`` (created) for the block."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {kind} needs root (euid {os.geteuid()}): the full-disk test "
                    "needs a real, small filesystem")
    where.mkdir(parents=True, exist_ok=True)
    if kind == "tmpfs":
        done = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where))
    else:
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("mkfs.ext4 is not installed: no ext4 image can be made")
        image = where.with_name(where.name + ".img")
        with open(image, "wb") as handle:
            handle.truncate(size)
        made = _run("mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", str(image))
        if made.returncode != 0:
            pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
        done = _run("mount", "-o", "loop", str(image), str(where))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {kind} at {where}: {done.stderr.strip()}")
    try:
        yield where
    finally:
        if _run("umount", str(where)).returncode != 0:
            _run("umount", "-l", str(where))  # still busy (a kernel's open file): detach it
        if kind == "ext4":
            where.with_name(where.name + ".img").unlink(missing_ok=True)


class Filler:
    """One file on the filesystem at ``root`` that holds all its free space but ``leave``."""

    def __init__(self, root: Path) -> None:
        self.path = root / "filler"

    def fill(self, leave: int) -> int:
        """Leave about ``leave`` bytes free (the filesystem's blocks decide); return them."""
        self.empty()
        target = max(0, free_bytes(self.path.parent) - leave)
        block = 1 << 20
        with open(self.path, "wb", buffering=0) as handle:
            while target > 0:
                try:
                    target -= handle.write(b"\xa5" * min(block, target))
                except OSError:  # full already: what is left is all there is
                    break
            os.fsync(handle.fileno())
            # Every last byte: ext4 hands back the blocks it over-reserved for delayed
            # allocation once the data is written out, so fill again until none come back.
            for _round in range(8 if leave == 0 else 0):
                written = 0
                for piece in (4096, 1):
                    with contextlib.suppress(OSError):
                        while count := handle.write(b"\xa5" * piece):
                            written += count
                os.fsync(handle.fileno())
                if not written:
                    break
        return free_bytes(self.path.parent)

    def empty(self) -> None:
        self.path.unlink(missing_ok=True)


def descriptors_of(path: Path) -> int:
    """How many of this process's descriptors are open on ``path`` (others come and go)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path.resolve())
        except FileNotFoundError:
            continue
    return count


class Syncs:
    """Records the paths ``os.fsync`` is called on (through ``/proc/self/fd``), in order.

    Made with a test's ``monkeypatch``, which puts ``os.fsync`` back at the end."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        self._lock = threading.Lock()
        real = os.fsync

        def fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            real(fd)
            with self._lock:
                self.paths.append(path)

        monkeypatch.setattr(os, "fsync", fsync)

    def take(self) -> list[str]:
        """The paths recorded so far, sorted; the record starts again empty."""
        taken, self.paths = sorted(self.paths), []
        return taken
