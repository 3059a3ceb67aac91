"""Whether a kernel process is still there: pure helpers, no Jupyter."""

from __future__ import annotations

import os

__all__ = ["process_exists"]


def process_exists(pid: int) -> bool:
    """True while process ``pid`` runs; False once it exited, even if not yet reaped.

    A killed kernel whose parent has not waited for it is a zombie: it still
    has a pid (``os.kill(pid, 0)`` succeeds) but will never answer again.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return True  # no /proc (macOS): the signal check is all there is
    # The state follows the command name, which is in parentheses and may hold spaces.
    state = text.rpartition(")")[2].split()[:1]
    return state not in (["Z"], ["X"])
