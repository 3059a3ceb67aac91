"""The vocabulary of ``kernos``'s argument parser that the subcommand modules share.

The exit-status table, the ``count`` argument type, the parser class and the
``add`` function's type live here, below :mod:`kernos.cli._parser` (which
builds the whole parser) and the subcommand modules (which add their own
subparsers through the ``add`` the parser hands them), so neither imports the
other for them.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Protocol

__all__ = ["EXIT_STATUSES", "WORKSPACE_HELP", "count", "exit_statuses"]

EXIT_STATUSES = """\
exit status:
  0    success (an op committed, or was a duplicate of one that did)
  1    the op did not commit (rolled back, failed, denied, vetoed, interrupted,
       rejected), or `audit verify` found tampering
  2    usage or input error: bad arguments, an unknown ref, name, agent or tool,
       a path that is not a workspace, a workspace a kernel holds (offline writes,
       prune), a pull or clone that refused what the remote holds (nothing changed)
  3    conflict: a precondition of `run` failed (--expect, --predicate); nothing ran;
       or a push/pull refused: another writer moved the remote or holds its lease
  4    no kernel: none runs where one is needed, one could not start, or it died
  5    a bug in Kernos (the message says what to report)
  130  interrupted (Ctrl-C); `events --follow` exits 0 instead
errors are one line on stderr: "kernos COMMAND: what was wrong and what to do";
with --json they are also a document on stdout: {"error": {"kind", "message", "exit"}}"""
"""The whole table, for ``kernos --help``; each subcommand's help lists only its own
statuses (:func:`exit_statuses`)."""

_OP = "success (an op committed, or was a duplicate of one that did)"
_NOT_COMMITTED = ("the op did not commit (rolled back, failed, denied, vetoed, interrupted,\n"
                  "       rejected)")
_DENIED = "the kernel refused the request (denied)"
_USAGE = ("usage or input error: bad arguments, an unknown ref or name, a path or\n"
          "       name that is not a workspace")
_NO_KERNEL = "no kernel: none runs where one is needed, one could not start, or it died"
_REMOTE = ("refused: another writer moved the remote or holds its lease (nothing\n"
           "       changed)")
_USAGE_HELD = _USAGE + ", a workspace a kernel holds"

# Each subcommand's statuses beyond 2, 5 and 130 (which every one can return), with what
# each means there; 0 is plain success unless said otherwise.
_EXITS: dict[str, dict[int, str]] = {
    "install": {}, "log": {}, "show": {}, "diff": {}, "gc": {}, "fork": {},
    "workspaces": {}, "audit log": {}, "mcp": {}, "remote": {},
    "demo": {1: "the demonstration found something wrong (it says what)",
             4: _NO_KERNEL},
    "run": {0: _OP, 1: _NOT_COMMITTED,
            3: "conflict: a precondition failed (--expect, --predicate, or an expected\n"
               "       name is gone); nothing ran",
            4: _NO_KERNEL},
    "objects": {1: _DENIED, 4: _NO_KERNEL},
    "grants": {1: _DENIED, 4: _NO_KERNEL},
    "checkout": {0: _OP, 1: _NOT_COMMITTED, 2: _USAGE_HELD + " (offline)", 4: _NO_KERNEL},
    "prune": {2: _USAGE_HELD},
    "erase": {2: _USAGE_HELD + ", an unknown subject"},
    "events": {4: "no kernel: --follow needs a running one (or the gateway's died)",
               130: "interrupted (Ctrl-C) reading the log; Ctrl-C ends --follow with 0"},
    "agent": {0: _OP, 1: _NOT_COMMITTED + " or refused", 4: _NO_KERNEL},
    "memory": {1: _DENIED, 4: _NO_KERNEL},
    "audit": {1: "`audit verify` found tampering (the first bad record is named)"},
    "audit verify": {1: "tampering: the first bad record is named"},
    "replay": {1: "a snapshot diverged from the original (the first op that did is named)"},
    "push": {3: _REMOTE},
    "pull": {2: _USAGE_HELD + ", or the remote holds what this copy refuses\n"
                "       (tampered, unsigned, untrusted: nothing changed)", 3: _REMOTE},
    "clone": {2: _USAGE + ", or the remote holds what this copy refuses\n"
                 "       (tampered, unsigned, untrusted: nothing was made)", 3: _REMOTE},
}


def exit_statuses(command: str) -> str:
    """The ``exit status:`` epilog of one subcommand: only what it can return (the whole
    table for a subcommand :data:`_EXITS` does not know yet)."""
    own = _EXITS.get(command)
    if own is None:
        return EXIT_STATUSES
    codes = {0: "success", 2: _USAGE, 5: "a bug in Kernos (the message says what to report)",
             130: "interrupted (Ctrl-C)", **own}
    lines = ["exit status:"]
    lines += [f"  {code:<4} {codes[code]}" for code in sorted(codes)]
    lines.append('errors are one line on stderr: "kernos COMMAND: what was wrong and what to '
                 'do";')
    lines.append('with --json they are also a document on stdout: {"error": {"kind", '
                 '"message", "exit"}}')
    return "\n".join(lines)


WORKSPACE_HELP = ("the workspace: a name (`kernos workspaces` lists them) or a path with a '/' "
                  "(default: $KERNOS_WORKSPACE, else the default one)")


def count(text: str) -> int:
    """An int >= 0 (a count, an offset or a sequence number)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit 2, like every other failure."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message}; see '{self.prog} --help'\n")
        sys.exit(2)


class _Add(Protocol):
    """The type of ``add`` in :func:`build_parser` (for the helpers' signatures)."""

    def __call__(self, name: str, help_text: str, *uses: str,
                 description: str | None = None) -> argparse.ArgumentParser: ...
