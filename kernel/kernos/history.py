"""Reading the history: log, show, diff.

Everything here works on a workspace directory alone, so the CLI can browse
the history of a workspace whose kernel is not running.  It reads the small
per-commit manifests only; no value is unpickled.  Browsing goes through
GitPython.  A checkout without a kernel writes an audit record too, so it is
the audit's (:func:`kernos.audit.offline.checkout_offline`).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kernos.files.reading import FileChange, compare, snapshot_files
from kernos.store.objects import CommitData, decode_tree
from kernos.store.snapshots import (
    MANIFEST,
    Snapshot,
    read_group,
    read_snapshot,
)
from kernos.store.workspace import Workspace

__all__ = [
    "Diff",
    "FileChange",
    "LogEntry",
    "changed_value",
    "diff",
    "field_changes",
    "format_diff",
    "format_log",
    "format_show",
    "format_table",
    "human_size",
    "log",
    "show",
]


@dataclass(kw_only=True, frozen=True)
class LogEntry:
    commit: str
    op: int | None
    principal: str
    kind: str
    committed_at: str
    headline: str
    changes: dict[str, list[str]] = field(default_factory=dict)
    bytes: int = 0
    """The image's size at this snapshot: the sum of its objects' sizes."""
    outcome: str = "committed"
    """``committed`` for a snapshot; in a log of every op (``kernos.audit.oplog``), what
    became of an op that wrote none: ``read-only``, ``failed``, ``denied``, ..."""
    error: str = ""
    """Why such an op did not commit (``kind: message``)."""
    files: dict[str, list[str]] = field(default_factory=dict)
    """The tracked files the op added, changed and deleted (its manifest's ``"files"``)."""


_ENTRIES: OrderedDict[str, LogEntry] = OrderedDict()
"""Log entries by commit id: a commit never changes, and its manifest (every name's
metadata) is the costly part of the log to read.  Least recently used go first."""
_MAX_ENTRIES = 20_000


def log(workspace: Workspace, *, limit: int | None = None) -> list[LogEntry]:
    """The history, newest first, from the manifests of the commits."""
    if workspace.head() is None:
        return []
    entries: list[LogEntry] = []
    # Kernos's own reader, not git's: it reads the commits of the tail too.
    for sha, commit in workspace.history():
        if limit is not None and len(entries) >= limit:
            break
        hexsha = sha.hex()
        known = _ENTRIES.get(hexsha)
        if known is not None:
            _ENTRIES.move_to_end(hexsha)
            entries.append(known)
            continue
        entries.append(_entry(workspace, hexsha, commit))
        _ENTRIES[hexsha] = entries[-1]
        if len(_ENTRIES) > _MAX_ENTRIES:
            _ENTRIES.popitem(last=False)
    return entries


def _entry(workspace: Workspace, hexsha: str, commit: CommitData) -> LogEntry:
    root = decode_tree(workspace.read_object(commit.tree)[1])
    found = [entry.sha for entry in root if entry.name == MANIFEST]
    manifest = json.loads(workspace.read_object(found[0])[1]) if found else {}
    return LogEntry(
        commit=hexsha,
        op=manifest.get("op"),
        principal=manifest.get("principal", "?"),
        kind=manifest.get("kind", "?"),
        committed_at=manifest.get("committed_at", ""),
        headline=commit.message.split("\n", 1)[0].partition(": ")[2],
        changes=manifest.get("changes", {}),
        files={kind: sorted(paths) for kind, paths in manifest.get("files", {}).items()
               if kind in FILE_KINDS},
        bytes=sum(int(meta.get("size") or 0) for meta in manifest.get("names", {}).values()
                  if isinstance(meta, dict)),
    )


INTERNAL = "kernos:"
"""The prefix of the image's own names (the agents, their namespaces, the random state):
the text a person reads leaves them out unless asked (``internal=True``); JSON keeps them."""


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL)


def format_log(entries: list[LogEntry], *, internal: bool = False) -> str:
    """The log as a table; an op that wrote no snapshot shows what became of it (``read-only``,
    ``failed``, ...) where a snapshot shows its commit, and its error after what it ran.
    ``internal``: the changes column shows the image's own names too."""
    if not entries:
        return "The history is empty: no op has been committed yet."
    rows = [("op", "commit", "when (UTC)", "who", "changes", "what")]
    for entry in entries:
        snapshot = entry.outcome == "committed"
        error = entry.error if len(entry.error) <= 60 else entry.error[:57] + "..."
        what = entry.headline + (f" [{error}]" if error else "")
        rows.append((
            str(entry.op), entry.commit[:12] if snapshot else f"({entry.outcome})",
            entry.committed_at.replace("T", " ")[:19], entry.principal,
            _changes_and_files(entry, internal) if snapshot else "", what,
        ))
    return format_table(rows)


def _changes_and_files(entry: LogEntry, internal: bool) -> str:
    """The log's changes column: the names, then how many tracked files (``files: +1 ~0 -0``)."""
    names, files = _changes(entry.changes, internal), file_counts(entry.files)
    if not files:
        return names
    return files if names == "(none)" else f"{names} | {files}"


def _changes(changes: dict[str, list[str]], internal: bool = False) -> str:
    parts = [f"{mark}{name}" for mark, key in (("+", "added"), ("~", "changed"),
                                               ("-", "deleted"))
             for name in changes.get(key, []) if internal or not is_internal(name)]
    text = " ".join(parts) or "(none)"
    return text if len(text) <= 40 else text[:37] + "..."


FILE_KINDS = ("added", "changed", "deleted")


def file_counts(files: dict[str, list[str]], label: str = "files: ") -> str:
    """``files: +2 ~1 -0`` for an op that changed tracked files, else ``""``."""
    if not any(files.get(kind) for kind in FILE_KINDS):
        return ""
    return (f"{label}+{len(files.get('added', []))} ~{len(files.get('changed', []))} "
            f"-{len(files.get('deleted', []))}")


@dataclass(kw_only=True)
class Diff:
    a: str
    b: str
    added: dict[str, dict[str, Any]]
    deleted: dict[str, dict[str, Any]]
    changed: dict[str, tuple[dict[str, Any], dict[str, Any]]]
    files: list[FileChange] = field(default_factory=list)
    """The tracked files that differ, with sizes and text diffs (``kernos.files.reading``)."""

    @property
    def empty(self) -> bool:
        return not (self.added or self.deleted or self.changed or self.files)


def diff(workspace: Workspace, ref_a: str, ref_b: str = "HEAD") -> Diff:
    """Which names and tracked files differ between two snapshots, with their summaries
    (and, for small text files, a text diff)."""
    a = read_snapshot(workspace, workspace.resolve(ref_a))
    b = read_snapshot(workspace, workspace.resolve(ref_b))
    files = compare(workspace, snapshot_files(workspace, a.files_tree),
                    snapshot_files(workspace, b.files_tree))
    names_a = a.manifest.get("names", {})
    names_b = b.manifest.get("names", {})
    return Diff(
        a=a.commit.hex(),
        b=b.commit.hex(),
        added={n: names_b[n] for n in sorted(names_b.keys() - names_a.keys())},
        deleted={n: names_a[n] for n in sorted(names_a.keys() - names_b.keys())},
        changed={n: (names_a[n], names_b[n]) for n in sorted(names_a.keys() & names_b.keys())
                 if names_a[n]["hash"] != names_b[n]["hash"]},
        files=files,
    )


def format_diff(result: Diff, ref_a: str = "", ref_b: str = "", *,
                internal: bool = False) -> str:
    """The diff as a table; the image's own names (``kernos:...``) only with ``internal``,
    else a line counts them."""
    title = f"diff {ref_a or result.a[:12]} ({result.a[:12]}) -> {ref_b or result.b[:12]} " \
            f"({result.b[:12]})"
    if result.empty:
        return title + "\n  no names differ; no tracked file differs"
    rows = [("", "name", "type", "value")]
    for name, meta in result.added.items():
        rows.append(("+", name, meta["type"], meta["summary"]))
    for name, meta in result.deleted.items():
        rows.append(("-", name, meta["type"], meta["summary"]))
    for name, (old, new) in result.changed.items():
        kind = old["type"] if old["type"] == new["type"] else f"{old['type']} -> {new['type']}"
        rows.append(("~", name, kind, changed_value(old["summary"], new["summary"])))
    hidden: list[str] = []
    if not internal:
        hidden = [row[1] for row in rows[1:] if is_internal(row[1])]
        rows = [row for row in rows if not is_internal(row[1])]
    lines = [title]
    if len(rows) > 1:
        lines.append(format_table(rows, indent="  "))
    elif not hidden:
        lines.append("  no names differ")
    if hidden:
        lines.append(f"  (also {internal_note(hidden)}; --internal shows "
                     f"{'it' if len(hidden) == 1 else 'them'})")
    if result.files:
        lines.append("files:")
        lines += format_files(result.files)
    return "\n".join(lines)


def format_files(changes: list[FileChange], indent: str = "    ") -> list[str]:
    """Tracked file changes, one line each (``+ out.csv  (120 B)``), each followed by its
    text diff, indented, or what stands in for one (binary, too large)."""
    lines: list[str] = []
    for change in changes:
        mark = {"added": "+", "changed": "~", "deleted": "-"}[change.change]
        if change.change == "added":
            size = _size_or_unknown(change.after)
        elif change.change == "deleted":
            size = f"was {_size_or_unknown(change.before)}"
        else:
            size = f"{_size_or_unknown(change.before)} -> {_size_or_unknown(change.after)}"
        lines.append(f"{indent}{mark} {change.path}  ({size})"
                     + (f"  {change.note}" if change.note else ""))
        if change.diff:
            lines += [indent + "    " + line for line in change.diff.splitlines()]
    return lines


def _size_or_unknown(size: int | None) -> str:
    return "?" if size is None else human_size(size)


def internal_note(names: list[str]) -> str:
    """``kernos:random, the image's own`` (or how many, past three)."""
    if len(names) > 3:
        return f"{len(names)} of the image's own names"
    return ", ".join(names) + ", the image's own"


def changed_value(before: str, after: str) -> str:
    """How a changed name's value changed, from its two summaries: the attributes that
    differ (``balance: 100 -> 70``) when both read ``Type(key=value, ...)``, else
    ``before -> after``, or a note when the summaries are the same."""
    fields = field_changes(before, after)
    if fields:
        return "; ".join(f"{key}: {'(none)' if old is None else old} -> "
                         f"{'(none)' if new is None else new}"
                         for key, (old, new) in fields.items())
    if before == after:
        # Written by an older Kernos, say: `<__main__.Account object at 0x...>` twice.
        return (re.sub(r" at 0x[0-9a-fA-F]+", "", before) + "  (changed; its summary "
                "does not show how)")
    return f"{before}  ->  {after}"


def field_changes(before: str, after: str) -> dict[str, tuple[str | None, str | None]] | None:
    """The fields that differ between two ``Type(key=value, ...)`` summaries of the same
    type (an instance, a dataclass, a named tuple), as (before, after), None for a field
    one side lacks; None if they are not both such summaries."""
    old, new = _fields(before), _fields(after)
    if old is None or new is None or old[0] != new[0]:
        return None
    keys = list(old[1]) + [key for key in new[1] if key not in old[1]]
    return {key: (old[1].get(key), new[1].get(key)) for key in keys
            if old[1].get(key) != new[1].get(key)}


def _fields(summary: str) -> tuple[str, dict[str, str]] | None:
    """``Type(a=1, b='x, y')`` as (``Type``, {a: 1, b: 'x, y'}); None for anything else
    (a summary cut short, a positional part)."""
    match = re.fullmatch(r"([A-Za-z_][\w.]*)\((.*)\)", summary)
    if match is None:
        return None
    parts: list[str] = []
    depth, quote = 0, ""
    current: list[str] = []
    for char in match.group(2):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if quote or depth:
        return None
    parts.append("".join(current).strip())
    found: dict[str, str] = {}
    for part in parts:
        if part in ("", "..."):
            continue  # an empty Type(), or the fields a summary leaves out
        key, sep, value = part.partition("=")
        if not sep or not key.isidentifier():
            return None
        found[key] = value
    return match.group(1), found


def show(workspace: Workspace, ref: str = "HEAD") -> dict[str, Any]:
    """One snapshot: its op, its source, its names, what it could not persist, and the
    tracked files it changed (``files``: :class:`FileChange`, against its parent)."""
    snapshot = read_snapshot(workspace, workspace.resolve(ref), with_source=True)
    return {
        "commit": snapshot.commit.hex(),
        "message": snapshot.data.message,
        "manifest": snapshot.manifest,
        "source": snapshot.source,
        "unpersisted": _unpersisted(workspace, snapshot.group_trees),
        "files": op_files(workspace, snapshot),
    }


def op_files(workspace: Workspace, snapshot: Snapshot) -> list[FileChange]:
    """The tracked files a snapshot's op changed (its manifest's ``"files"``), compared
    with the snapshot's parent."""
    listed = snapshot.manifest.get("files") or {}
    if not any(listed.get(kind) for kind in FILE_KINDS):
        return []
    parents = snapshot.data.parents
    older = snapshot_files(workspace, read_snapshot(workspace, parents[0]).files_tree
                           if parents else None)
    return compare(workspace, older, snapshot_files(workspace, snapshot.files_tree),
                   listed={kind: listed.get(kind, []) for kind in FILE_KINDS})


def _unpersisted(workspace: Workspace, groups: dict[str, bytes]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for key, tree in groups.items():
        found.extend(read_group(workspace, key, tree).unpersisted)
    return found


def format_show(shown: dict[str, Any]) -> str:
    manifest = shown["manifest"]
    lines = [
        f"commit {shown['commit']}",
        f"op {manifest.get('op')} by {manifest.get('principal')} ({manifest.get('kind')}) "
        f"at {manifest.get('committed_at')}",
    ]
    if manifest.get("note"):
        lines.append(manifest["note"])
    changes = _changes(manifest.get("changes", {}))
    lines.append(f"changes: {changes}")
    tools = manifest.get("facts", {}).get("tools", {})
    if tools:
        lines.append("tools: " + ", ".join(f"{name} v{version}"
                                           for name, version in sorted(tools.items())))
    if shown["source"]:
        lines.append("source:")
        lines += ["    " + line for line in shown["source"].splitlines()]
    rows = [("name", "type", "size", "ver", "op", "value")]
    for name, meta in sorted(manifest.get("names", {}).items()):
        rows.append((name, meta["type"], human_size(meta["size"]), str(meta["version"]),
                     str(meta["op"]), meta["summary"]))
    lines.append("names:")
    lines.append(format_table(rows, indent="    "))
    if shown["unpersisted"]:
        lines.append("not persisted (a restore puts a placeholder here):")
        for info in shown["unpersisted"]:
            lines.append(f"    {info['path']}: {info['type_name']}: {info['reason']}")
    files = shown.get("files") or []
    if files:
        lines.append(f"files ({file_counts(manifest.get('files', {}), label='')}):")
        lines += format_files(files)
    return "\n".join(lines)


def human_size(size: float) -> str:
    """``1.5 MB`` and the like (powers of 1000, as disk tools print them)."""
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def format_table(rows: Sequence[tuple[str, ...]], indent: str = "") -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append(indent + "  ".join(cells).rstrip())
    return "\n".join(lines)

