"""The parent of a background repack: it ends the repack's whole process tree with its kernel.

Run by path, not imported (``python -I -S _repack_watchdog.py KERNEL_PID LOCK_FD
COMMAND...``), so it starts in milliseconds and needs nothing but the
standard library.  The kernel starts it in a new session (its own process
group), and it runs COMMAND (``git repack``) in that group, where git's own
children (``git pack-objects``) stay too.  Killing ``git repack`` alone is not
enough: its ``pack-objects`` lives on, re-parented to init, still writing a
pack.  So when the kernel dies this ends the group:

* on Linux it asks for ``SIGUSR1`` when its parent dies (``prctl``
  ``PR_SET_PDEATHSIG``); the signal comes when the *thread* that started it
  ends, so it checks that the kernel itself is gone before it acts;
* everywhere, it looks at its parent every :data:`POLL` seconds while it
  waits (the only way where ``prctl`` does not exist).

The group gets ``SIGTERM`` (git removes its temporary files), then, if
anything is left after :data:`GRACE` seconds, ``SIGKILL``.  LOCK_FD, the
repack lock (``kernos.store.repack``), is passed down to COMMAND, so it stays
held until the last process of the tree is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from types import FrameType

POLL = 1.0
"""Seconds between two looks at the parent (where no death signal can be asked for)."""
GRACE = 5.0
"""Seconds the group has to end on ``SIGTERM`` before it is killed."""
_PR_SET_PDEATHSIG = 1


def _ask_for_death_signal() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGUSR1)`` on Linux; nothing elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGUSR1), 0, 0, 0)


def _end_group(child: subprocess.Popen[bytes] | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(0, signal.SIGTERM)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(GRACE)
    os.killpg(0, signal.SIGKILL)  # whatever is left, this process too


def main(argv: list[str]) -> int:
    parent, lock, command = int(argv[1]), int(argv[2]), argv[3:]
    if os.getpgrp() != os.getpid():  # the group it ends must be its own, never the kernel's
        os.setpgid(0, 0)
    child: subprocess.Popen[bytes] | None = None

    def parent_died(_signum: int, _frame: FrameType | None) -> None:
        if os.getppid() != parent:  # not just a thread of the kernel that ended
            _end_group(child)

    signal.signal(signal.SIGUSR1, parent_died)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: _end_group(child))
    _ask_for_death_signal()
    if os.getppid() != parent:  # it died before the signal was asked for
        _end_group(None)
    child = subprocess.Popen(command, pass_fds=(lock,))
    os.close(lock)
    while True:
        try:
            return child.wait(POLL)
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                _end_group(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
