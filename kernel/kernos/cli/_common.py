"""What every subcommand shares: exit codes, the one-line failure, JSON and workspaces."""

from __future__ import annotations

import argparse
import enum
import json
import sys
from pathlib import Path
from typing import Any

from kernos.store.workspace import default_workspace

__all__ = ["Exit", "Fail", "emit_json", "plural", "stderr_is_tty", "workspace_path"]


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
    """``--workspace``, else ``$KERNOS_WORKSPACE``, else the default workspace.

    With ``--gateway`` it is a name under the gateway's root (``default`` if not given).
    """
    given = getattr(args, "workspace", None)
    if getattr(args, "gateway", None):
        return Path(given or "default")
    return Path(given).expanduser() if given else default_workspace()


def plural(count: int, noun: str) -> str:
    """``1 name``, ``2 names``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
