"""Reading the tracked files a snapshot holds, for people: sizes, and text diffs.

``kernos show`` / ``diff`` (and ``%kernos show`` / ``diff``, the inspector)
list the files an op changed, or that differ between two snapshots, each
with its size on both sides and, for a small text file, a unified diff.
Everything here reads a snapshot's ``files/`` tree only
(:func:`kernos.files.contents.read_index` / ``read_contents``): it works on
a workspace whose kernel is not running, and never looks at the disk's
tracked directories.

A file gets a text diff when both sides are at most :data:`TEXT_LIMIT` bytes,
valid UTF-8 and free of NUL bytes; otherwise :attr:`FileChange.note` says
why not (``binary``, ``larger than 64 KiB``, ``a symbolic link``).  A diff is
cut at :data:`DIFF_LINES` lines (the cut says how many were left out), and
only the first :data:`MAX_DIFFS` files of one answer get one, so an op that
rewrote ten thousand small files answers with a list, not megabytes of diff.  The
size of a long file is found without reading it: it is stored in 1 MiB
chunks cut at fixed offsets, so only its last chunk is read.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from kernos.files.contents import LINK_MODE, OWN_ROOT, Stored, read_contents, read_index
from kernos.store.snapshots import CHUNK_BYTES
from kernos.store.workspace import Workspace

__all__ = ["DIFF_LINES", "MAX_DIFFS", "TEXT_LIMIT", "FileChange", "compare", "snapshot_files",
           "stored_size", "unified"]

TEXT_LIMIT = 64 * 1024
"""The largest file (each side) shown as a text diff."""
DIFF_LINES = 400
"""The most lines of one file's diff shown; the rest are counted."""
MAX_DIFFS = 50
"""The most files given a text diff in one answer; the rest are listed with their sizes."""
KINDS = ("added", "changed", "deleted")


@dataclass(frozen=True, kw_only=True)
class FileChange:
    """One tracked file that an op changed, or that differs between two snapshots."""

    path: str
    """As a person reads it: relative to the files root, or ``KEY:path`` in another
    tracked directory (as the manifest lists it)."""
    change: str
    """``added``, ``changed`` or ``deleted``."""
    before: int | None
    """Its size in bytes on the older side (None: it is not there)."""
    after: int | None
    """Its size in bytes on the newer side (None: it is not there)."""
    diff: str | None = None
    """The unified text diff, older to newer (None: see ``note``)."""
    note: str = ""
    """Why there is no text diff (``binary``, ``larger than 64 KiB``, ...), or a fact
    about the change (``mode 100644 -> 100755``)."""

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "change": self.change, "before": self.before,
                "after": self.after, "diff": self.diff, "note": self.note or None}


def snapshot_files(workspace: Workspace, files_tree: bytes | None) -> dict[str, Stored]:
    """Every file a snapshot's ``files/`` tree holds, by the path a person reads."""
    if files_tree is None:
        return {}
    _roots, trees = read_index(workspace, files_tree)
    found: dict[str, Stored] = {}
    for key, tree in sorted(trees.items()):
        for path, stored in read_contents(workspace, tree).files.items():
            found[path if key == OWN_ROOT else f"{key}:{path}"] = stored
    return found


def compare(workspace: Workspace, older: dict[str, Stored], newer: dict[str, Stored], *,
            listed: dict[str, Iterable[str]] | None = None) -> list[FileChange]:
    """The files that differ between ``older`` and ``newer`` (:func:`snapshot_files`), in
    path order within added, changed, deleted.  ``listed``: only these paths, by kind
    (an op's manifest ``"files"``), each looked up on both sides as it is."""
    if listed is None:
        listed = {
            "added": sorted(newer.keys() - older.keys()),
            "changed": sorted(path for path in older.keys() & newer.keys()
                              if older[path] != newer[path]),
            "deleted": sorted(older.keys() - newer.keys()),
        }
    changes: list[FileChange] = []
    diffs = 0
    for kind in KINDS:
        for path in sorted(listed.get(kind, ())):
            change = _change(workspace, path, kind, older.get(path), newer.get(path),
                             with_diff=diffs < MAX_DIFFS)
            diffs += change.diff is not None
            changes.append(change)
    return changes


def _change(workspace: Workspace, path: str, kind: str, old: Stored | None,
            new: Stored | None, *, with_diff: bool = True) -> FileChange:
    before = None if old is None else stored_size(workspace, old)
    after = None if new is None else stored_size(workspace, new)
    notes: list[str] = []
    if old is not None and new is not None and old.mode != new.mode:
        notes.append(f"mode {old.mode.decode()} -> {new.mode.decode()}")
    if LINK_MODE in (getattr(old, "mode", None), getattr(new, "mode", None)):
        targets = [_text(workspace, stored, before_or_after)
                   for stored, before_or_after in ((old, before), (new, after))]
        shown = " -> ".join(f"link to {target!r}" if target is not None else "(none)"
                            for target in targets)
        return FileChange(path=path, change=kind, before=before, after=after,
                          note="; ".join([*notes, f"a symbolic link: {shown}"]))
    if (before or 0) > TEXT_LIMIT or (after or 0) > TEXT_LIMIT:
        notes.append(f"larger than {TEXT_LIMIT // 1024} KiB: no text diff")
        return FileChange(path=path, change=kind, before=before, after=after,
                          note="; ".join(notes))
    if not with_diff:
        notes.append(f"no text diff: only the first {MAX_DIFFS} files get one")
        return FileChange(path=path, change=kind, before=before, after=after,
                          note="; ".join(notes))
    old_text = "" if old is None else _text(workspace, old, before)
    new_text = "" if new is None else _text(workspace, new, after)
    if old_text is None or new_text is None:
        notes.append("binary: no text diff")
        return FileChange(path=path, change=kind, before=before, after=after,
                          note="; ".join(notes))
    return FileChange(path=path, change=kind, before=before, after=after,
                      diff=unified(old_text, new_text, path, kind), note="; ".join(notes))


def unified(old: str, new: str, path: str, kind: str = "changed") -> str:
    """A unified diff of two texts (``/dev/null`` for the missing side), at most
    :data:`DIFF_LINES` lines; ``""`` when the texts are the same."""
    lines = list(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile="/dev/null" if kind == "added" else f"a/{path}",
        tofile="/dev/null" if kind == "deleted" else f"b/{path}"))
    shown = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
             for line in lines[:DIFF_LINES]]
    if len(lines) > DIFF_LINES:
        shown.append(f"... {len(lines) - DIFF_LINES} more diff lines not shown\n")
    return "".join(shown)


def stored_size(workspace: Workspace, stored: Stored) -> int:
    """A stored file's size in bytes (reads its last chunk only)."""
    # Chunks are cut at fixed 1 MiB offsets: all but the last are whole.
    last = workspace.read_object(stored.chunks[-1])[1]
    return (len(stored.chunks) - 1) * CHUNK_BYTES + len(last)


def _text(workspace: Workspace, stored: Stored | None, size: int | None) -> str | None:
    """The file's bytes as text, or None (not there, too long, not UTF-8, NUL bytes)."""
    if stored is None or size is None or size > TEXT_LIMIT or len(stored.chunks) != 1:
        return None
    data = workspace.read_object(stored.chunks[0])[1]
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
