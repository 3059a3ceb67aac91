"""A notebook bound to a workspace: ``metadata.kernos.workspace`` in its ``.ipynb``.

A notebook opened on a fork (the Kernos sidebar's *Open* on a fork, the
``kernos:open-fork`` command of the JupyterLab extension) carries::

    "metadata": {"kernos": {"workspace": "/absolute/path/of/the/fork"}, ...}

and its kernel uses that workspace instead of the one it would get otherwise.
The kernel finds its notebook through ``$JPY_SESSION_NAME``, which
jupyter_server sets to the notebook's absolute path (a relative one, without a
session name, is taken in the kernel's directory, which jupyter_server makes
the notebook's).  A notebook that says nothing binds nothing.

The notebook is untrusted input: anybody can write that metadata.  A binding
is honoured only when it names, by an absolute path, an existing directory
owned by this user that has the shape of a Kernos workspace (``workspace.json``
and ``history.git/``).  Anything else is refused with a
:class:`~kernos.errors.WorkspaceError` saying why and what to do, before any
workspace is opened or created.  (A workspace cloned from elsewhere is still
refused by the trust gate, ``kernos.store.trust``, when it is opened.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from kernos.errors import WorkspaceError

__all__ = ["MAX_NOTEBOOK_BYTES", "notebook_binding", "notebook_path"]

MAX_NOTEBOOK_BYTES = 256 * 1024 * 1024
"""A bigger notebook is not parsed; it binds nothing unless it mentions a workspace."""
MAX_PATH_CHARS = 4096
_CHUNK = 1024 * 1024


def notebook_path(environ: Mapping[str, str]) -> Path | None:
    """The notebook file the kernel runs for (``$JPY_SESSION_NAME``), if it is one."""
    session = environ.get("JPY_SESSION_NAME", "")
    if not session.endswith(".ipynb") or "\x00" in session:
        return None
    path = Path(session)
    if not path.is_absolute():  # an API path: the kernel runs in the notebook's directory
        path = Path.cwd() / path.name
    return path if path.is_file() else None


def notebook_binding(environ: Mapping[str, str]) -> Path | None:
    """The workspace the kernel's notebook binds it to, or None if it binds none.

    Raises :class:`~kernos.errors.WorkspaceError` when the notebook names a
    workspace that is not acceptable (see the module's docstring); nothing is
    opened or changed then.
    """
    notebook = notebook_path(environ)
    if notebook is None:
        return None
    try:
        size = notebook.stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            if _mentions_workspace(notebook):
                raise _refused(notebook, "its file is too big to read its metadata "
                               f"({size // 2**20} MiB)")
            return None
        document = json.loads(notebook.read_bytes())
    except (OSError, ValueError):  # not a notebook JupyterLab could have opened either
        return None
    metadata = document.get("metadata") if isinstance(document, dict) else None
    kernos = metadata.get("kernos") if isinstance(metadata, dict) else None
    if kernos is None:
        return None
    if not isinstance(kernos, dict):
        raise _refused(notebook, "metadata.kernos is not an object")
    named = kernos.get("workspace")
    if named is None:
        return None
    if not isinstance(named, str) or not named or len(named) > MAX_PATH_CHARS \
            or "\x00" in named:
        raise _refused(notebook, "metadata.kernos.workspace is not a path")
    path = Path(named)
    if not path.is_absolute():
        raise _refused(notebook, f"metadata.kernos.workspace {named[:200]!r} is not an "
                       "absolute path")
    problem = _not_a_workspace(path)
    if problem is not None:
        raise _refused(notebook, f"metadata.kernos.workspace {named[:200]!r} {problem}")
    return path


def _not_a_workspace(path: Path) -> str | None:
    """Why ``path`` may not be bound to, or None if it has a workspace's shape."""
    try:
        if not path.is_dir():
            return "does not exist" if not path.exists() else "is not a directory"
        if path.stat().st_uid != os.geteuid():
            return "belongs to another user"
        if not (path / "workspace.json").is_file() or not (path / "history.git").is_dir():
            return "is not a Kernos workspace (it has no workspace.json and history.git)"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    return None


def _mentions_workspace(notebook: Path) -> bool:
    needle = b'"workspace"'
    tail = b""
    with notebook.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle):]
    return False


def _refused(notebook: Path, why: str) -> WorkspaceError:
    return WorkspaceError(
        f"The notebook {notebook} binds its kernel to a workspace, but {why}. No workspace "
        "was opened or changed. Fix or remove metadata.kernos.workspace (Edit Notebook "
        "Metadata in JupyterLab's property inspector), or open the fork again from the "
        "Kernos sidebar, which writes it.", path=str(notebook))
