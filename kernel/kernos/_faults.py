"""Crash points for the durability tests.

``KERNOS_CRASH_AT=<point>`` makes the process kill itself with SIGKILL when
it reaches that point of a commit, which is how the tests prove that a crash
at *that* instant leaves the workspace restorable to the last acknowledged op.
Unset (always, outside tests), a point costs one dictionary lookup.

Points, in the order a commit passes them: ``serialize`` (values pickled,
nothing written), ``objects`` (the values' chunks and trees written, not yet
the manifest, root tree and commit), ``sealed`` (all objects and the op's
audit record written, ref not moved), ``published`` (ref moved, journal not
yet removed, reply not sent), ``notify`` (in the kernel: committed, its
events not yet sent to external subscribers).
"""

from __future__ import annotations

import os
import signal

_armed = os.environ.get("KERNOS_CRASH_AT", "")


def point(name: str) -> None:
    if _armed and _armed == name:
        os.kill(os.getpid(), signal.SIGKILL)
