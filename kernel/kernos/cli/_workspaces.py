"""``kernos workspaces``: the workspaces under the root, and ``$KERNOS_WORKSPACE``'s
(``kernos.store.catalog``)."""

from __future__ import annotations

import argparse

from kernos import history
from kernos.cli._common import Exit, emit_json
from kernos.store.catalog import list_workspaces
from kernos.store.workspace import default_workspace, workspaces_root

__all__ = ["add_workspaces", "workspaces"]


def add_workspaces(add: object) -> None:
    """The ``workspaces`` subcommand (``add`` is the parser's ``add``)."""
    add(  # type: ignore[operator]
        "workspaces", "list the workspaces: name, head op, size, last use, path", "json",
        description="List the workspaces under the workspaces root ($KERNOS_WORKSPACE_ROOT, "
                    "else snapshots/ in a source checkout, else "
                    "$XDG_DATA_HOME/kernos/workspaces), where each notebook gets one named "
                    "after its path (/tmp/lab/Untitled.ipynb: tmp-lab-Untitled), and the one "
                    "$KERNOS_WORKSPACE names. Every other command's -w takes a NAME from "
                    "this list, or a path. From disk; a running kernel is no obstacle.")


def workspaces(args: argparse.Namespace) -> int:
    found = list_workspaces()
    root = workspaces_root()
    default = default_workspace().absolute()
    if args.json:
        emit_json({"root": str(root), "default": str(default),
                   "workspaces": [info.to_json() for info in found]})
        return Exit.OK
    if not found:
        print(f"No workspaces under {root} yet: a notebook on the Kernos kernel makes one "
              "there (or `kernos run CODE`).")
        return Exit.OK
    rows = [("name", "head op", "size", "last used (UTC)", "path")]
    for info in found:
        rows.append((info.name + (" *" if info.default else ""),
                     "-" if info.head_op is None else str(info.head_op),
                     history.human_size(info.bytes),
                     (info.last_used or "").replace("T", " ")[:16],
                     info.path + (f"  (unreadable: {info.problem})" if info.problem else "")))
    print(history.format_table(rows))
    marked = any(info.default for info in found)
    print(f"root: {root}; " + ("* is the workspace a command without -w uses" if marked else
                               f"without -w, commands use {default}, which does not exist "
                               "yet"))
    return Exit.OK
