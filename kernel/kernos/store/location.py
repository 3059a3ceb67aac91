"""Which directory a workspace is: the name a client may give, and where it lives.

Which directory is used, in order:

1. ``$KERNOS_WORKSPACE_ROOT/<name>`` when the operator sets that root (a gateway's
   kernelspec does): ``<name>`` is the client's ``$KERNEL_WORKSPACE`` (Enterprise
   Gateway forwards ``KERNEL_*`` variables from a start request), ``default`` when
   unset, and must match :data:`WORKSPACE_NAME`, so a client picks a name, never a
   path;
2. the workspace the kernel's notebook names in ``metadata.kernos.workspace``
   (a notebook opened on a fork; ``kernos.store.binding``, which checks it): a
   binding in the notebook is more specific than the server-wide
   ``$KERNOS_WORKSPACE``, so it wins over it;
3. ``$KERNOS_WORKSPACE``;
4. from a source checkout, ``<checkout>/snapshots/<name>``;
5. otherwise ``$XDG_DATA_HOME/kernos/workspaces/<name>`` (``~/.local/share``).

``<name>`` is derived from the notebook path that Jupyter passes in
``$JPY_SESSION_NAME`` so that every notebook gets its own image, or is
``default`` when there is none.

:class:`~kernos.store.workspace.Workspace` opens what :func:`default_workspace`
names when it is given no path; it also offers these names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from kernos.errors import WorkspaceError
from kernos.store.binding import notebook_binding

__all__ = ["WORKSPACE_NAME", "check_workspace_name", "default_workspace",
           "notebook_workspace_name", "workspaces_root"]


WORKSPACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""What a client may send as a workspace name under ``$KERNOS_WORKSPACE_ROOT``: an
allowlist (no ``/``, no leading ``.``, so no ``..`` and no hidden directory)."""


def check_workspace_name(name: str) -> str:
    """``name`` if it may name a workspace under a root; else a :class:`WorkspaceError`."""
    if WORKSPACE_NAME.fullmatch(name):
        return name
    raise WorkspaceError(
        f"{name!r} cannot name a workspace: a name is 1 to 64 letters, digits, '.', '_' or "
        "'-', starting with a letter or a digit (no '/', no '..'). The gateway's operator "
        "chose the directory that holds the workspaces; pick a name such as 'analysis-2'.",
        path=name)


def default_workspace(environ: Mapping[str, str] | None = None) -> Path:
    """The workspace directory to use when none is given explicitly."""
    environ = os.environ if environ is None else environ
    if environ.get("KERNOS_WORKSPACE_ROOT"):  # the operator's root: a name, never a path
        return workspaces_root(environ) / check_workspace_name(
            environ.get("KERNEL_WORKSPACE", "default"))
    bound = notebook_binding(environ)
    if bound is not None:
        return bound
    explicit = environ.get("KERNOS_WORKSPACE")
    if explicit:
        return Path(explicit).expanduser()
    return workspaces_root(environ) / notebook_workspace_name(
        environ.get("JPY_SESSION_NAME", ""))


def workspaces_root(environ: Mapping[str, str] | None = None) -> Path:
    """The directory that holds the workspaces named by notebooks (or by a gateway's
    clients): ``$KERNOS_WORKSPACE_ROOT``, else ``<checkout>/snapshots`` from a source
    checkout, else ``$XDG_DATA_HOME/kernos/workspaces``."""
    environ = os.environ if environ is None else environ
    root = environ.get("KERNOS_WORKSPACE_ROOT")
    if root:
        return Path(root).expanduser()
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "snapshots" / "README.md").exists() and (checkout / "pyproject.toml").exists():
        return checkout / "snapshots"
    data_home = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "kernos" / "workspaces"


def notebook_workspace_name(notebook: str) -> str:
    """The name of the workspace a notebook gets under :func:`workspaces_root`: its path
    (``$JPY_SESSION_NAME``, directories included) without the suffix, with every run of
    other characters than letters, digits, '.', '_' and '-' made one '-'
    (``/tmp/lab/Untitled.ipynb`` is ``tmp-lab-Untitled``); ``default`` for none."""
    if not notebook:
        return "default"
    return _slug(Path(notebook).with_suffix("").as_posix())


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return slug or "default"
