"""What every subcommand shares: exit codes, the one-line failure, JSON, workspaces, and
a name's manifest entry as the harness protocol shows it."""

from __future__ import annotations

import argparse
import enum
import json
import os
import sys
from pathlib import Path
from typing import Any

from kernos.store.catalog import find_workspace, workspace_names
from kernos.store.workspace import default_workspace, workspaces_root

__all__ = ["Exit", "Fail", "check_default_exists", "emit_json", "name_info", "plural",
           "stderr_is_tty", "workspace_path"]


class Exit(enum.IntEnum):
    """The exit statuses of ``kernos``; scripts may rely on them."""

    OK = 0
    """Success (an op committed, or was a duplicate of one that did)."""
    FAILED = 1
    """The op did not commit (rolled back, failed, denied, vetoed, interrupted, rejected),
    or ``audit verify`` found tampering."""
    USAGE = 2
    """Bad arguments or input: an unknown ref, name, agent or tool, a path that is not a
    workspace, a workspace a kernel holds for an offline write, a pull or clone that refused
    what the remote holds (tampered, unsigned, untrusted, planted: nothing changed)."""
    CONFLICT = 3
    """A precondition of ``run`` failed (``--expect`` or ``--predicate``): nothing ran; or a
    push or pull was refused (another writer moved the remote, or holds its lease)."""
    NO_KERNEL = 4
    """No kernel runs where one is needed, one could not be started, or it died."""
    INTERNAL = 5
    """A bug in Kernos; the one line on stderr says what to report."""
    INTERRUPTED = 130
    """Ctrl-C (``events --follow`` exits 0 instead: that is how it ends)."""


class Fail(Exception):
    """Stop the command: print ``kernos COMMAND: MESSAGE`` on stderr and exit with ``code``."""

    def __init__(self, message: str, code: Exit = Exit.USAGE, *, kind: str | None = None
                 ) -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind or code.name.lower()
        """A stable word for ``--json`` error documents (a protocol error kind, ...)."""


def emit_json(document: Any) -> None:
    """One JSON document (or one JSON line of a stream) on stdout."""
    print(json.dumps(document, sort_keys=True, default=str), flush=True)


def workspace_path(args: argparse.Namespace) -> Path:
    """``--workspace`` (a name or a path: ``kernos.store.catalog.find_workspace``), else
    ``$KERNOS_WORKSPACE``, else the default workspace.

    With ``--gateway`` it is a name under the gateway's root (``default`` if not given).
    """
    given = getattr(args, "workspace", None)
    if getattr(args, "gateway", None):
        return Path(given or "default")
    return find_workspace(given) if given else default_workspace()


def check_default_exists(args: argparse.Namespace, path: Path) -> None:
    """For a command that reads an existing workspace and was given none (no ``-w``, no
    ``$KERNOS_WORKSPACE``): if the default is missing, say which workspaces there are."""
    if (getattr(args, "workspace", None) or getattr(args, "gateway", None)
            or os.environ.get("KERNOS_WORKSPACE") or (path / "workspace.json").exists()):
        return
    root = workspaces_root()
    names = workspace_names(root)
    told = (f"no workspace at {path}, the default (no -w was given and KERNOS_WORKSPACE is "
            "not set). ")
    if len(names) == 1:
        raise Fail(told + f"The only workspace under {root} is {names[0]!r}: kernos "
                   f"{args.command} -w {names[0]}")
    if names:
        raise Fail(told + f"{len(names)} workspaces are under {root} (`kernos workspaces` "
                   "lists them): pick one with -w NAME, or set KERNOS_WORKSPACE")
    raise Fail(told + f"There is no workspace under {root} yet: a notebook on the Kernos "
               "kernel (or `kernos run CODE`) makes one; -w PATH reads one elsewhere")


def plural(count: int, noun: str) -> str:
    """``1 name``, ``2 names``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


# What a name's entry in a manifest tells a reader (its group and hash are internal).
_NAME_FIELDS = ("type", "size", "version", "op", "principal", "changed_at", "summary")


def name_info(name: str, meta: dict[str, Any]) -> dict[str, Any]:
    """A manifest entry as the harness protocol's OBJECT."""
    return {"name": name, **{key: meta.get(key) for key in _NAME_FIELDS}}
