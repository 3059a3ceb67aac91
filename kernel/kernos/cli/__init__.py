"""The ``kernos`` command: one tool for people and harnesses.

``kernos install``            install the kernelspec (--user, --sys-prefix or --prefix DIR)
``kernos demo``               the headless demonstration, on a real kernel
``kernos run CODE``           one op (or ``--tool NAME --args JSON``), through the running
                              kernel, or a kernel started for it and shut down after; a
                              line on stderr says which op committed (``-q``: not)
``kernos objects``            the image's names, versions and who changed them
``kernos grants [AGENT]``     capability grants (needs a kernel; one is started if none runs)
``kernos agent policy|circuit|reset NAME``  circuit breakers (see ``cli/_agent_supervise``)
``kernos workspaces``         the workspaces: name, path, head op, size, last used
``kernos log|show|diff``      browse a workspace's history, from disk (``log --all``: every op,
                              the rolled-back and read-only ones too)
``kernos checkout REF``       a new snapshot equal to REF (an op in the running kernel, or
                              one started through ``--gateway``,
                              else offline for the next kernel)
``kernos gc``                 repack every object into one pack (beside a kernel too)
``kernos prune``              delete old snapshots by a retention policy (``--keep-last``,
                              ``--keep-daily``, ``--keep-tag``, ``--dry-run``; the kernel
                              must be stopped)
``kernos events``             committed events from the durable log; ``--follow`` streams
``kernos agent loop NAME``    start an agent's loop (``-c CODE`` or ``--step FILE``,
                              ``--every MS``, ``--max N``, ``--follow``); ``agent
                              pause|resume|stop NAME`` and ``agent loops``
``kernos audit verify|log``   verify the audit chain and history; list the records
``kernos erase SUBJECT``      erase a data subject (the kernel must be stopped)
``kernos fork SRC[@REF] DST`` a new workspace from a snapshot of SRC, sharing its objects
``kernos replay``             re-run the recorded ops in a fresh workspace, checking every
                              snapshot (``--from``, ``--to``, ``--until OP``)
``kernos mcp``                the MCP server (``kernos.mcp``)
``kernos remote|push|pull``   a workspace through git remotes (``add``, ``list``, ``remove``,
``kernos clone URL DIR``      ``release``); a refused push (another writer) exits 3

The workspace is ``--workspace NAME|PATH`` (a name as ``kernos workspaces`` lists
it, or a path with a ``/``: ``kernos.store.catalog``), else ``$KERNOS_WORKSPACE``,
else the default (see ``kernos.store.workspace``).  A running kernel is found through
``<workspace>/kernel.json`` (``kernos.client``).  Reads that the head
snapshot answers never start a kernel.

``--json`` (every subcommand that prints data) prints one JSON document on
stdout, or one JSON object per line for streams (``events``, ``audit log``).
The documents have the harness protocol's shapes (``kernos.harness.protocol``):
``run`` and ``checkout`` print an OP-RESULT, ``objects`` ``{"objects", "source"}``,
``grants`` ``{"grants"}``, ``log`` ``{"snapshots"}``, ``show`` and ``diff`` the
``show`` and ``diff`` results.  Progress goes to stderr, only when it is a
terminal or with ``--progress``.

Exit statuses (:class:`Exit`), which scripts may rely on (each subcommand's
``--help`` lists the ones it can return):

====  =====================================================================
0     success (an op committed, or was a duplicate of one that did)
1     the op did not commit (rolled back, failed, denied, vetoed,
      interrupted, rejected), or ``audit verify`` found tampering
2     usage or input error: bad arguments, an unknown ref, name, agent or
      tool, a path that is not a workspace, a workspace held by a kernel
      (for the offline writes ``checkout``, ``erase`` and ``prune``)
3     conflict: a precondition of ``run`` failed (``--expect``,
      ``--predicate``, or an expected name is gone); nothing ran; or a
      ``push``/``pull`` refused: another writer moved the remote or holds its lease
4     no kernel: none runs where one is needed (``--no-start``,
      ``events --follow``), one could not be started, or it died
5     a bug in Kernos: the line says what to report
130   interrupted (Ctrl-C); ``events --follow`` ends with 0 instead
====  =====================================================================

Every failure is one line on stderr, ``kernos COMMAND: what was wrong and
what to do``, never a traceback; with ``--json`` it is also a document on
stdout: ``{"error": {"kind", "message", "exit"}}``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kernos.cli._common import (
    Exit,
    Fail,
    check_default_exists,
    emit_json,
    stderr_is_tty,
    workspace_path,
)
from kernos.cli._progress import Progress
from kernos.errors import (
    EventError,
    KernosError,
    UnknownAgent,
    UnknownRef,
    UnknownSubject,
    UnknownTool,
    UnknownWorkspace,
    WorkspaceError,
    WorkspaceLocked,
)

__all__ = ["Exit", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kernos`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    from kernos.cli._parser import build_parser

    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(with_mcp=arguments[:1] == ["mcp"]).parse_args(arguments)
    if args.command != "mcp":  # the MCP server sets up its own logging
        _one_line_logs()
    shown = args.progress if getattr(args, "progress", None) is not None else stderr_is_tty()
    progress = Progress(bool(shown), tty=stderr_is_tty())
    try:
        return int(_dispatch(args, progress))
    except Fail as failure:
        return _failed(args, progress, str(failure), failure.code, failure.kind)
    except KernosError as error:
        return _failed(args, progress, str(error), Exit.USAGE, _kind(error))
    except KeyboardInterrupt:
        return _failed(args, progress, "interrupted", Exit.INTERRUPTED, "interrupted")
    except BrokenPipeError:
        # The reader went away (`kernos log | head`): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return Exit.OK
    except OSError as error:
        return _failed(args, progress, f"{error.strerror or error}"
                       + (f": {error.filename}" if error.filename else ""), Exit.USAGE, "os")
    except Exception as error:
        return _failed(args, progress, f"internal error {type(error).__name__}: {error} "
                       "(a bug in Kernos: please report it with the command that caused it)",
                       Exit.INTERNAL, "internal")
    finally:
        progress.close()


class _OneLine(logging.Formatter):
    """A library's log record as one line, never with its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        text = " ".join(record.getMessage().split())
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f" ({type(error).__name__}: {' '.join(str(error).split())})"
        return f"kernos: {record.name}: {text}"


def _one_line_logs() -> None:
    """Warnings that libraries log (jupyter_client, zmq, tornado) as one line each."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_OneLine())
        root.addHandler(handler)
        root.setLevel(logging.WARNING)


def _dispatch(args: argparse.Namespace, progress: Progress) -> int:
    command = args.command
    if command == "install":
        from kernos.kernel.install import install

        prefix = sys.prefix if args.sys_prefix else args.prefix
        where = install(user=args.user, prefix=prefix)
        if args.json:
            emit_json({"kernelspec": where})
        else:
            print(f"Installed the kernos kernelspec in {where}")
        return Exit.OK
    if command == "demo":
        from kernos.demo import run_demo

        return run_demo(args.workspace)
    if command == "mcp":
        return _mcp(args)
    if command == "fork":
        from kernos.cli._fork import fork

        return fork(args)
    if command == "workspaces":
        from kernos.cli._workspaces import workspaces

        return workspaces(args)
    path = workspace_path(args)
    if command in _READS or (command == "objects" and args.principal in (None, "human")):
        check_default_exists(args, path)
    if command in ("remote", "push", "pull", "clone"):
        from kernos.cli import _remote

        return _remote.dispatch(args, path)
    from kernos.cli import _audit, _history, _kernel

    if command == "run":
        return _kernel.run(args, path, progress)
    if command == "objects":
        return _kernel.objects(args, path, progress)
    if command == "grants":
        return _kernel.grants(args, path, progress)
    if command == "events":
        return _kernel.events(args, path)
    if command == "agent":
        from kernos.cli import _agent_loop, _agent_supervise

        if args.agent_command in _agent_loop.COMMANDS:
            return _agent_loop.dispatch(args, path, progress)
        return _agent_supervise.dispatch(args, path, progress)
    if command == "audit":
        return _audit.audit(args, path, progress)
    if command == "erase":
        return _audit.erase(args, path)
    if command == "replay":
        return _replay(args, path)
    if command == "memory":
        from kernos.cli._memory import memory

        return memory(args, path, progress)
    if command == "checkout":
        return _history.checkout(args, path, progress)
    if command == "log":
        return _history.log(args, path)
    if command == "gc":
        return _history.gc(args, path)
    if command == "prune":
        return _history.prune(args, path)
    if command == "show":
        return _history.show(args, path)
    assert command == "diff", command
    return _history.diff(args, path)


_READS = frozenset(("log", "show", "diff", "checkout", "gc", "prune", "events", "audit",
                    "erase", "replay", "remote", "push", "pull"))
"""Commands that need an existing workspace (a missing default gets a helpful error)."""


def _replay(args: argparse.Namespace, path: Path) -> int:
    from kernos.replay import replay

    report = replay(path, start=args.start, end=args.end, until=args.until, into=args.into,
                    keep_going=args.keep_going)
    if args.json:
        emit_json(report.to_json())
    else:
        print(report.summary())
    return Exit.OK if report.ok else Exit.FAILED


def _mcp(args: argparse.Namespace) -> int:
    missing = getattr(args, "mcp_missing", None)
    if missing is not None:
        raise Fail(f"the MCP server is not available in this installation ({missing}); "
                   "reinstall kernos (pip install -U kernos)")
    import kernos.mcp as server

    try:
        return int(server.main(args) or 0)
    except KeyboardInterrupt:
        return Exit.OK  # Ctrl-C is how a stdio or HTTP server ends


def _kind(error: KernosError) -> str:
    """A stable word for a Kernos error, as the harness protocol's error kinds are."""
    for kind, types in (("unknown_ref", UnknownRef), ("unknown_principal", UnknownAgent),
                        ("unknown_tool", UnknownTool), ("unknown_subject", UnknownSubject),
                        ("workspace_locked", WorkspaceLocked),
                        ("unknown_workspace", UnknownWorkspace), ("workspace", WorkspaceError),
                        ("invalid", EventError)):
        if isinstance(error, types):
            return kind
    return "usage"


def _failed(args: argparse.Namespace, progress: Progress, message: str, code: Exit,
            kind: str) -> int:
    progress.close()  # so the line is not drawn over
    if getattr(args, "json", False):
        with contextlib.suppress(OSError):
            emit_json({"error": {"kind": kind, "message": message, "exit": int(code)}})
    message = " ".join(message.split())  # one line, whatever the message held
    print(f"kernos {args.command}: {message}", file=sys.stderr)
    return code
