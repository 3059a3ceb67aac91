"""Finding workspaces: the ones Kernos made, and what a ``-w`` names.

Kernels open their workspaces under one root (:func:`~kernos.store.workspace.
workspaces_root`), each named after its notebook
(:func:`~kernos.store.workspace.notebook_workspace_name`: the notebook's
directories are part of the name, so ``/tmp/lab/Untitled.ipynb`` is
``tmp-lab-Untitled``).  :func:`list_workspaces` lists them, and the one
``$KERNOS_WORKSPACE`` names when it is set (``kernos workspaces``).

:func:`find_workspace` reads what a user gives as ``-w`` by one rule:

* text with a ``/`` (or ``~``, ``.``, ``..``) is a path, taken as it is;
* anything else is a name: the workspace of that name under the root; else,
  as before names existed, a workspace directory of that name in the current
  directory; else the one workspace under the root whose name is the notebook
  name given (``Untitled`` or ``Untitled.ipynb`` for ``tmp-lab-Untitled``).
  A name that could mean several workspaces, or none, is an
  :class:`~kernos.errors.UnknownWorkspace` that lists them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernos.errors import KernosError, UnknownWorkspace
from kernos.store.workspace import (
    Workspace,
    default_workspace,
    notebook_workspace_name,
    op_of,
    workspaces_root,
)

__all__ = ["WorkspaceInfo", "find_workspace", "is_path", "list_workspaces", "workspace_names"]

_USED_FILES = ("audit/chain.jsonl", "tail", "lock", "kernel.json",
               "history.git/refs/heads/main", "history.git/packed-refs", "workspace.json")
"""Files every op, fold or kernel start writes: the newest of their times is the last use."""


@dataclass(frozen=True, kw_only=True)
class WorkspaceInfo:
    """One workspace, as ``kernos workspaces`` lists it."""

    name: str
    """Its directory's name (what ``-w`` takes)."""
    path: str
    """Its absolute path."""
    head_op: int | None
    """The op that wrote its newest snapshot (None: no snapshot yet, or unreadable)."""
    commit: str | None
    """Its newest snapshot's commit id."""
    bytes: int
    """What its directory holds on disk (files shared with a fork by a hard link count once
    per workspace)."""
    last_used: str | None
    """When an op, a fold or a kernel last wrote it (UTC, ISO 8601)."""
    default: bool
    """Whether a command given no ``-w`` uses it."""
    where: str
    """``root`` (under the workspaces root) or ``KERNOS_WORKSPACE``."""
    problem: str | None = None
    """Why its history could not be read, if it could not."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "head_op": self.head_op,
                "commit": self.commit, "bytes": self.bytes, "last_used": self.last_used,
                "default": self.default, "where": self.where, "problem": self.problem}


def workspace_names(root: Path) -> list[str]:
    """The names of the workspaces under ``root``, sorted (a workspace holds
    ``workspace.json``; hidden directories, such as a fork being built, are skipped)."""
    try:
        found = [entry.name for entry in os.scandir(root)
                 if entry.is_dir() and not entry.name.startswith(".")
                 and (Path(entry.path) / "workspace.json").exists()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(found)


def list_workspaces(environ: Mapping[str, str] | None = None) -> list[WorkspaceInfo]:
    """Every workspace under the root, then ``$KERNOS_WORKSPACE`` if it is elsewhere."""
    environ = os.environ if environ is None else environ
    root = workspaces_root(environ)
    default = default_workspace(environ).absolute()
    paths = [(root / name, "root") for name in workspace_names(root)]
    explicit = environ.get("KERNOS_WORKSPACE")
    if explicit:
        path = Path(explicit).expanduser()
        if (path / "workspace.json").exists() and path.absolute().parent != root.absolute():
            paths.append((path, "KERNOS_WORKSPACE"))
    return [_describe(path.absolute(), where, default) for path, where in paths]


def is_path(text: str) -> bool:
    """Whether ``-w TEXT`` is a path (a ``/``, ``~``, ``.`` or ``..``) rather than a name."""
    return "/" in text or os.sep in text or text.startswith("~") or text in (".", "..")


def find_workspace(text: str, environ: Mapping[str, str] | None = None) -> Path:
    """The workspace ``-w TEXT`` names, by the rule in the module docstring."""
    if is_path(text):
        return Path(text).expanduser()
    root = workspaces_root(environ)
    known = workspace_names(root)
    if text in known:
        return root / text
    here = Path(text)
    if (here / "workspace.json").exists():
        return here
    wanted = notebook_workspace_name(text)
    candidates = [name for name in known
                  if name == wanted or name.endswith("-" + wanted)]
    if len(candidates) == 1:
        return root / candidates[0]
    if candidates:
        raise UnknownWorkspace.ambiguous(text, root=str(root), candidates=candidates)
    raise UnknownWorkspace.unknown(text, root=str(root), known=known)


def _describe(path: Path, where: str, default: Path) -> WorkspaceInfo:
    head_op: int | None = None
    commit: str | None = None
    problem: str | None = None
    try:
        with Workspace.open(path, writable=False, create=False) as workspace:
            head = workspace.head()
            if head is not None:
                commit = head.hex()
                head_op = op_of(workspace.read_commit(head))
    except (KernosError, OSError) as error:
        problem = " ".join(str(error).split())
    return WorkspaceInfo(name=path.name, path=str(path), head_op=head_op, commit=commit,
                         bytes=_disk_bytes(path), last_used=_last_used(path),
                         default=path == default, where=where, problem=problem)


def _disk_bytes(path: Path) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _subdirectories, names in os.walk(path):
        for name in names:
            try:
                stat = os.lstat(os.path.join(directory, name))
            except FileNotFoundError:
                continue  # deleted meanwhile (a fold, a repack)
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def _last_used(path: Path) -> str | None:
    times = []
    for name in _USED_FILES:
        try:
            times.append((path / name).stat().st_mtime)
        except OSError:
            continue
    if not times:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(max(times)))
