"""Files in the transaction: tracked directories that commit and roll back with each op.

The contract
------------
A *tracked directory* is part of the image.  Every workspace has its own
files root, ``<workspace>/files`` (:func:`root`), tracked from the start;
more directories can be tracked (:meth:`TrackedFiles.track`, from the op
that tracks them on).  The list is image state: it is stored in every
snapshot that has files (``files/index.json``), so it survives restarts,
checkouts and clones, and it rolls back with the op that changed it.

Per op, the same as for names:

* **Commit.**  The op's changes to tracked files (created, changed,
  deleted; a rename is a deletion and a creation) are stored in the same
  snapshot as its namespace, in its ``files/`` tree
  (:mod:`kernos.files.contents` draws it), through the store's chunk path:
  an edit in place or an append stores only the 1 MiB chunks it touched.
  The snapshot's manifest lists them under ``"files"``.
* **Rollback.**  Files the op created are removed; files it changed or
  deleted are back byte for byte (each written whole to a temporary file and
  renamed into place); directories it made are removed if empty.
* **Restore at open.**  Before the first op of a process, every tracked
  directory is made to hold what the head snapshot holds: this is what makes
  ``kill -9`` in the middle of an op safe.  It also means a change made to a
  tracked file while no kernel runs is undone at the next start: make such
  changes while a kernel runs (its next op commits them).  A workspace with
  no snapshot yet keeps what its files root holds, and its first commit
  stores it; a rollback before that leaves those files alone while they are
  unchanged (no commit holds their bytes to put back).
* **Checkout** of an older snapshot makes the tracked directories hold that
  snapshot's files, as part of the checkout's op.

Travel, and a snapshot from elsewhere
-------------------------------------
A snapshot carries its tracked files: ``kernos fork``, ``push``/``pull``/
``clone`` move the history, and the next kernel on the new workspace puts
the files root's files on disk (restore at open); ``kernos replay``
reproduces them hash for hash in its own workspace (``kernos.replay.files``).

Everything a snapshot says of files is checked whole before a byte is
written (:func:`kernos.files.contents.read_index`, ``read_contents``,
``check_links``), at open, at checkout, and already when a pull or clone
takes new snapshots (``kernos.remote.pull``): the index holds exactly its
keys and types; every name is one path component (no ``..``, ``.``, empty
name, ``/`` or NUL); modes are a directory, a file (``100644``), an
executable (``100755``) or a link (``120000``, Kernos's own ``l`` entries
only), never a submodule; a long file's chunks are numbered without a gap;
a link must stay inside its tracked directory, followed through the
snapshot's own links.  A bad tree is refused with a
:class:`~kernos.errors.WorkspaceCorrupt` naming the snapshot and the
problem, and nothing is changed.  A link on disk where the snapshot wants a
directory is replaced, never followed.

*Which directories may be written.*  A snapshot's index may name absolute
directories, and one from elsewhere (a pull, a clone, a fork, a replay's
history) must never make this machine write outside the workspace.  So the
workspace's own files root is always written, and an absolute tracked
directory only if ``<workspace>/files-here.json`` names it: a record kept on
this machine, outside the history, written when an op that ran
``%kernos track PATH`` here commits, and never carried by push, pull, clone
or fork (:mod:`kernos.files.here`).  Any other tracked directory is left
alone: not restored, checked out, rolled back or looked at; reported once,
in the next commit's ``files["notices"]`` ("tracked in another workspace or
on another machine ... run ``%kernos track PATH`` to track it here"); and
kept in every snapshot as the history has it.  ``%kernos track PATH``
accepts it: that op commits what the directory holds here (the history
keeps the other machine's version, for ``checkout``), and from then on it
moves with the ops.

Detecting changes reads no unchanged file: a file's stat key (size, mtime,
ctime, inode, mode) is compared with the one taken when its bytes were last
read, and only a file whose key changed is read and hashed
(:mod:`kernos.files.scan`; files written within 0.1 s of the look are read
once more by the next op, since timestamps are coarse).

What is refused (:mod:`kernos.files.paths`, :mod:`kernos.files.scan`):
a path with a NUL byte, a ``..`` component, or absolute outside the tracked
directory raises :class:`PathRefused`, changing nothing.  On disk, symbolic
links and hard links that reach outside a tracked directory, devices,
FIFOs, sockets and names that are not UTF-8 are reported once (in the
commit report's ``files["notices"]``) and left untracked, for the human to
deal with.  A tracked directory that vanished or became unreadable is
reported, and the snapshot keeps it as the last commit had it: it is never
silently dropped from the history.

A file written by a background thread while an op commits: the commit reads
a changed file with its stat taken before and after, and reads it again if
they differ.  A file that never holds still over three reads keeps its last
committed version (or stays out, if it is new) and is reported as still being
written; the next op looks at it again.  So a thread that writes a file
between ops has it committed by the next op; one that must never be seen
half written should write a temporary file and ``os.replace`` it into place.

A full disk while the commit stores file contents fails the commit like any
other write of its objects: nothing of the batch is kept, and the op rolls
back, its files included.

Floor: above the store (it writes through ``SnapshotWriter``), below the
history and the image, which drives it: ``Image.begin`` joins a
:class:`FilesParticipant` to every op, and the image's own participant calls
its ``prepare`` while it writes the snapshot and its ``published`` once the
branch moved.
"""

from __future__ import annotations

import os
from pathlib import Path

from kernos.errors import UsageError
from kernos.files.paths import PathRefused, relative_path
from kernos.files.tracker import OWN_ROOT, FilesParticipant, TrackedFiles, current

__all__ = ["OWN_ROOT", "FilesParticipant", "PathRefused", "TrackedFiles", "path", "root"]


def _tracked() -> TrackedFiles:
    tracked = current()
    if tracked is None:
        raise UsageError("kernos.files needs an open image in this process: run it in a "
                         "Kernos kernel, or make an Image on a workspace first")
    return tracked


def root() -> Path:
    """The workspace's own files root, ``<workspace>/files`` (made if missing): tracked."""
    return _tracked().root()


def path(relative: str | os.PathLike[str]) -> Path:
    """The absolute path of ``relative`` in the files root (checked; see PathRefused)."""
    base = root()
    return base / relative_path(relative, base)
