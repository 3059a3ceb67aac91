"""Comparing a replay's tracked files with the source's, file by file.

Each committed op's snapshot holds its tracked files as a ``files/`` tree
(:mod:`kernos.files.contents`), whose id is a hash of every tracked path,
mode and byte, and of the list of tracked directories.  A replay reproduces
the files when each replayed snapshot's ``files/`` tree is the very same id
as the source's; when it is not, :func:`file_differences` names each file
that differs (``files/PATH`` in the workspace's files root, ``files:KEY/PATH``
in another tracked directory) and how, as :mod:`kernos.replay.difference`
names the values that differ.

Where replayed file writes land: the replay is its own workspace, and
``kernos.files.root()`` / ``kernos.files.path()`` in a replayed op name *its*
files root, never the source's.  A directory tracked by absolute path is
never the replay's: its image refuses to track one
(``TrackedFiles.outside_allowed``), so an op that tracked one originally
fails in the replay and is reported as a divergence, and one the history
already tracks is left alone (``kernos.files.here``): never restored,
checked out, rolled back or looked at, each replayed snapshot keeping it as
the history has it.  An op that wrote into such a directory writes there
again when it is replayed (its code runs as it did), but the replay neither
stores nor compares what it wrote; a file an op writes by an absolute path
into the *source's* files root is likewise outside the replay's.  Write
through ``kernos.files.path`` for files a replay must reproduce.
"""

from __future__ import annotations

from kernos.errors import WorkspaceCorrupt
from kernos.files import contents as stored_files
from kernos.files.contents import OWN_ROOT, Contents, Stored
from kernos.store.workspace import Workspace

__all__ = ["file_differences"]

_EMPTY: tuple[dict[str, dict[str, str]], dict[str, Contents]] = (
    {OWN_ROOT: {"path": OWN_ROOT, "base": "workspace"}}, {})


def file_differences(workspace: Workspace, original: bytes | None,
                     replayed: bytes | None) -> dict[str, str]:
    """What differs between two ``files/`` trees (None: a snapshot without one), by file."""
    if original == replayed:
        return {}
    try:
        theirs_roots, theirs = _read(workspace, original)
        ours_roots, ours = _read(workspace, replayed)
    except WorkspaceCorrupt as error:
        return {"files": f"cannot be compared: {error.problem}"}
    found: dict[str, str] = {}
    for key in sorted(set(theirs_roots) | set(ours_roots)):
        label = "files/" if key == OWN_ROOT else f"files:{key}/"
        if theirs_roots.get(key) != ours_roots.get(key):
            found[label] = (f"tracked as {_where(theirs_roots.get(key))} originally, "
                            f"{_where(ours_roots.get(key))} in the replay")
            continue
        first, second = theirs.get(key, Contents()), ours.get(key, Contents())
        for path in sorted(set(first.files) | set(second.files)):
            what = _file_difference(first.files.get(path), second.files.get(path))
            if what is not None:
                found[label + path] = what
        for path in sorted(first.dirs ^ second.dirs):
            if path not in first.files and path not in second.files:
                found[label + path + "/"] = ("a directory missing from the replay"
                                             if path in first.dirs else
                                             "a directory only in the replay")
    return found or {"files": "the tracked files' trees differ"}


def _read(workspace: Workspace, tree: bytes | None
          ) -> tuple[dict[str, dict[str, str]], dict[str, Contents]]:
    if tree is None:
        return _EMPTY
    roots, trees = stored_files.read_index(workspace, tree)
    return roots, {key: stored_files.read_contents(workspace, sha) for key, sha in trees.items()}


def _where(spec: dict[str, str] | None) -> str:
    return "nothing" if spec is None else repr(spec["path"])


def _file_difference(original: Stored | None, replayed: Stored | None) -> str | None:
    if original is None:
        return "only in the replay"
    if replayed is None:
        return "missing from the replay"
    if original.mode != replayed.mode:
        return (f"its mode is {replayed.mode.decode()} in the replay, "
                f"{original.mode.decode()} originally")
    if original.chunks != replayed.chunks:
        if len(original.chunks) != len(replayed.chunks):
            return (f"its bytes differ ({len(replayed.chunks)} chunks in the replay, "
                    f"{len(original.chunks)} originally)")
        first = next(number for number, (a, b) in enumerate(
            zip(original.chunks, replayed.chunks, strict=True)) if a != b)
        return (f"its bytes differ (from chunk {first}: blob {replayed.chunks[first].hex()[:12]}"
                f" in the replay, {original.chunks[first].hex()[:12]} originally)")
    return None
