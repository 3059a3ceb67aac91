"""Crash points for the durability tests.

``KERNOS_CRASH_AT=<point>`` makes the process kill itself with SIGKILL when
it reaches that point of a commit, which is how the tests prove that a crash
at *that* instant leaves the workspace restorable to the last acknowledged op.
Unset (always, outside tests), a point costs one dictionary lookup.

Points, in the order a commit passes them: ``serialize`` (values pickled,
nothing written), ``objects`` (the values' chunks and trees added to the
batch, not yet the manifest, root tree and commit), ``pack`` (a pack renamed
into place, its index not: a pack half there; reached by a commit too big for
the tail and by a fold), ``sealed`` (all objects and the op's audit record
written, nothing synced; before it, ``pack.index``: a pack's index half written
under its temporary name), ``frame`` (a small commit: its audit record synced,
its frame not yet written to the tail), ``published`` (the commit point
passed: the frame synced or the ref moved; reply not sent), ``notify`` (in
the kernel: committed, its events not yet sent to external subscribers).

A fold of the tail (``Workspace.fold``) adds ``fold.packed`` (its pack
durable, the ref not moved) and ``fold.published`` (the ref moved, the tail
not yet emptied).  Every move of the branch (a commit too big
for the tail, a fold) passes ``ref.locked``: the ref's lock file written and
synced, not yet renamed over the ref (``Workspace._move_ref``).

Effects (``kernos.effects``) add, in order: ``effect.before`` (nothing
journaled), ``effect.started`` (journaled as started, not executed),
``effect.executed`` (executed, the result not journaled), ``effect.journaled``
(journaled as done, not in the image) and ``effect.record`` (the follow-up
op begun, not committed).

``kernos prune`` (``kernos.store.retention``) adds, in order:
``prune.written`` (the new commits written and sealed, nothing else),
``prune.intent`` (the intent file written), ``prune.recorded`` (the audit
record appended, the branch not moved), ``prune.published`` (the branch
moved: the commit point), ``prune.tags`` (the tags moved, nothing deleted
yet) and ``prune.repacked`` (the packs rewritten, loose objects not yet
pruned).

The memory index (``kernos.memory``) adds ``memory.erased``: an erased
subject's entries deleted and committed, the file not yet vacuumed.

``<point>@N`` crashes the Nth time the point is reached (``sealed@2``: in
the second commit), so a test can crash a later op of the same process.

``KERNOS_PAUSE_AT=<point>:<seconds>`` makes the process sleep there instead
(``restore.background``: before a background restore loads the big values),
so a test can act while it waits.  Every crash point is a pause point too, and
``<point>@N:<seconds>`` sleeps only the Nth time (``ref.locked@1:3``: the
first move of the branch).
"""

from __future__ import annotations

import os
import signal
import time

_armed, _, _nth = os.environ.get("KERNOS_CRASH_AT", "").partition("@")
_left = int(_nth) if _nth.isdigit() else 1
_pause_spec, _, _seconds = os.environ.get("KERNOS_PAUSE_AT", "").partition(":")
_paused, _, _pause_nth = _pause_spec.partition("@")
_pauses = 0


def armed(name: str) -> bool:
    """Whether ``KERNOS_CRASH_AT`` names this point (to set up what it needs first)."""
    return bool(_armed) and _armed == name


def point(name: str) -> None:
    global _left
    if _paused and _paused == name:
        pause(name)
    if _armed and _armed == name:
        _left -= 1
        if _left <= 0:
            os.kill(os.getpid(), signal.SIGKILL)


def pause(name: str) -> None:
    global _pauses
    if _paused and _paused == name:
        if _pause_nth.isdigit():  # <point>@N: only the Nth time
            _pauses += 1
            if _pauses != int(_pause_nth):
                return
        time.sleep(float(_seconds or 1))
