"""Which absolute directories this workspace's owner tracked *here*: the one record that lets
a snapshot write outside the workspace.

A snapshot's ``files/index.json`` lists its tracked directories, and an
absolute one names a directory anywhere on a machine.  A snapshot that came
from somewhere else (a pull, a clone, a fork, a replay's fetched history)
is another writer's word, and must never make this machine write outside
the workspace by itself.  So an absolute tracked directory is restored,
checked out, rolled back and looked at only if this file names it:

    <workspace>/files-here.json   {"format": 1, "directories": ["/abs/path", ...]}

It is written on this machine only, when an op that ran
``%kernos track PATH`` (:meth:`kernos.files.TrackedFiles.track`) commits.
It is outside the history: push, pull and clone never carry it, and
``kernos fork`` does not copy it.  Untracking leaves the path in it (a
checkout of a snapshot from before the untrack tracks it again here, as the
owner once chose).  Deleting the file withdraws every grant; a copy of the
whole workspace directory (``cp -r``) carries it, as it carries the keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kernos._durable import replace_file

__all__ = ["RECORD", "add_here", "read_here"]

RECORD = "files-here.json"


def read_here(workspace: Path) -> set[str]:
    """The absolute directories tracked here (an unreadable record grants nothing)."""
    try:
        data = json.loads((workspace / RECORD).read_bytes())
    except (OSError, ValueError):
        return set()
    if not isinstance(data, dict) or data.get("format") != 1:
        return set()
    listed = data.get("directories")
    if not isinstance(listed, list):
        return set()
    return {path for path in listed
            if isinstance(path, str) and path.startswith("/")
            and os.path.normpath(path) == path}


def add_here(workspace: Path, paths: set[str], *, durable: bool) -> set[str]:
    """Add ``paths`` to the record; all it names now."""
    known = read_here(workspace)
    if paths <= known:
        return known
    known |= paths
    data = json.dumps({"format": 1, "directories": sorted(known)}, indent=1).encode()
    replace_file(workspace / RECORD, data + b"\n", durable=durable)
    return known
