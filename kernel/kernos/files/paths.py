"""Which paths name a file in a tracked directory, and which are refused.

A path given to Kernos (``kernos.files.path(RELATIVE)``, and later an
agent's ``files.read(path)``) is refused, with a
:class:`~kernos.errors.PathRefused` that
says why and changes nothing, when it holds a NUL byte, is empty, has a
``..`` component, or is absolute and not inside the directory it is meant
for.  A path that passes is ``/``-separated, relative, without ``.``
components.  This checks the *words* of a path; what is on disk at the path
(a link to outside, a device) is :mod:`kernos.files.scan`'s.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from kernos.errors import PathRefused

__all__ = ["PathRefused", "relative_path", "tracked_directory"]


def relative_path(path: str | os.PathLike[str], root: Path) -> str:
    """``path`` relative to ``root``, checked; :class:`PathRefused` if it leaves ``root``."""
    text = os.fspath(path)
    if "\0" in text:
        raise PathRefused(text.replace("\0", "\\0"), "it holds a NUL byte")
    if not text.strip():
        raise PathRefused(text, "it is empty")
    if os.path.isabs(text):
        absolute = os.path.normpath(text)
        base = os.path.normpath(root)
        if absolute != base and not absolute.startswith(base.rstrip(os.sep) + os.sep):
            raise PathRefused(text, f"it is absolute and not inside {root}")
        text = os.path.relpath(absolute, base)
    parts = [part for part in PurePosixPath(text.replace(os.sep, "/")).parts if part != "."]
    if ".." in parts:
        raise PathRefused(text, "it has a '..' component")
    if not parts:
        raise PathRefused(text, "it names the tracked directory itself, not a file in it")
    return "/".join(parts)


def tracked_directory(path: str | os.PathLike[str], workspace: Path) -> Path:
    """The absolute directory ``path`` names, checked as a directory to track: not holding
    NUL, not the workspace's history or inside it (its own ``files`` aside)."""
    text = os.fspath(path)
    if "\0" in text:
        raise PathRefused(text.replace("\0", "\\0"), "it holds a NUL byte")
    absolute = Path(os.path.abspath(text))
    own = workspace.resolve() / "files"
    resolved = absolute.resolve()
    if resolved != own and (resolved == workspace.resolve()
                            or workspace.resolve() in resolved.parents
                            or resolved in workspace.resolve().parents):
        raise PathRefused(text, f"it holds, or is inside, the workspace {workspace} (its "
                          "history cannot be part of itself); its own files root is "
                          f"{own}")
    if resolved.exists() and not resolved.is_dir():
        raise PathRefused(text, "it is not a directory")
    return absolute
