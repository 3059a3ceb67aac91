"""The ``kernos`` argument parser: every subcommand, its options and its ``--help``."""

from __future__ import annotations

import argparse
import os

from kernos._version import __version__
from kernos.cli._argtypes import (
    EXIT_STATUSES,
    WORKSPACE_HELP,
    _Add,
    _Parser,
    count,
    exit_statuses,
)

__all__ = ["EXIT_STATUSES", "build_parser", "exit_statuses"]

def _parents() -> dict[str, _Parser]:
    workspace = _Parser(add_help=False)
    workspace.add_argument("--workspace", "-w", metavar="NAME|PATH", help=WORKSPACE_HELP)
    as_json = _Parser(add_help=False)
    as_json.add_argument("--json", action="store_true",
                         help="print JSON on stdout, for machines")
    progress = _Parser(add_help=False)
    shown = progress.add_mutually_exclusive_group()
    shown.add_argument("--progress", action="store_true", default=None,
                       help="show progress on stderr even when it is not a terminal")
    shown.add_argument("--no-progress", dest="progress", action="store_false",
                       help="never show progress")
    gateway = _Parser(add_help=False)
    gateway.add_argument("--gateway", metavar="URL", default=os.environ.get("KERNOS_GATEWAY_URL"),
                         help="start the kernel through the Jupyter Enterprise Gateway at URL "
                              "($KERNOS_GATEWAY_URL; token: $KERNOS_GATEWAY_TOKEN); "
                              "--workspace is then a name under the gateway's workspace root")
    start = _Parser(add_help=False, parents=[gateway])
    start.add_argument("--no-start", action="store_true",
                       help="if no kernel runs on the workspace, fail (exit 4) instead of "
                            "starting one for this command")
    return {"workspace": workspace, "json": as_json, "progress": progress, "start": start,
            "gateway": gateway}


def build_parser(*, with_mcp: bool = False) -> argparse.ArgumentParser:
    """The parser; ``with_mcp`` imports ``kernos.mcp`` for the ``mcp`` subcommand's options."""
    parser = _Parser(
        prog="kernos", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Kernos: a persistent, transactional Python image for Jupyter.\n"
                    "One op against a workspace, its objects, grants, history, events "
                    "and audit.",
        epilog=EXIT_STATUSES)
    parser.add_argument("--version", action="version", version=f"kernos {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)
    parents = _parents()

    def add(name: str, help_text: str, *uses: str, description: str | None = None
            ) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=help_text, description=description or help_text[0].upper()
            + help_text[1:] + ".", epilog=exit_statuses(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[parents[use] for use in uses])

    install = add("install", "install the 'kernos' kernelspec", "json")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="into the user's Jupyter directory")
    where.add_argument("--sys-prefix", action="store_true", help="into sys.prefix (this env)")
    where.add_argument("--prefix", metavar="DIR", help="into DIR/share/jupyter/kernels")

    demo = add("demo", "run the headless demonstration on a real kernel")
    demo.add_argument("--workspace", "-w", metavar="DIR",
                      help="workspace to use (default: a fresh one under snapshots/ or a "
                           "temporary directory)")

    _add_run(add)

    objects = add("objects", "the names in the image: type, size, version, who changed them",
                  "workspace", "json", "progress", "start",
                  description="The names in the image, sorted. From the running kernel if "
                              "there is one, else from the head snapshot on disk (an agent's "
                              "view, --principal, needs a kernel: one is started).")
    objects.add_argument("--principal", metavar="NAME",
                         help="only what this principal may read (default: the human: all)")
    objects.add_argument("--prefix", metavar="TEXT", help="only names starting with TEXT")
    objects.add_argument("-n", type=count, metavar="N", help="at most N")
    objects.add_argument("--offset", type=count, default=0, metavar="N",
                         help="skip the first N")
    objects.add_argument("--internal", action="store_true",
                         help="list the image's own names (kernos:...) too")

    grants = add("grants", "capability grants: who holds what, used and left",
                 "workspace", "json", "progress", "start",
                 description="Capability grants, from the running kernel (one is started "
                             "for this command if none runs).")
    grants.add_argument("agent", nargs="?", metavar="AGENT", help="only this agent's grants")

    add("gc", "repack the workspace's objects into one pack (safe beside a running kernel)",
        "workspace", "json",
        description="Repack every object of the workspace into one pack with git's own "
                    "repack (the kernel keeps packs few by itself; run this before copying "
                    "a workspace, or after a long life). Nothing is deleted but what the "
                    "new pack replaces, so the history and the audit chain are unchanged.")
    _add_prune(add)
    from kernos.cli._workspaces import add_workspaces

    add_workspaces(add)
    log = add("log", "list the snapshots, newest first (from disk)", "workspace", "json",
              description="List the snapshots, newest first, from disk. Every op has a "
                          "number, but only an op that committed a change writes a snapshot: "
                          "an op that rolled back (failed, denied, vetoed, interrupted, "
                          "rejected) or changed nothing (read-only) leaves a gap, which the "
                          "log counts; --all lists those ops too, from the audit log.")
    log.add_argument("-n", type=count, default=20, metavar="N", help="at most N (default 20)")
    log.add_argument("--all", action="store_true",
                     help="every op, also those that wrote no snapshot (rolled back, "
                          "read-only), marked as such")
    log.add_argument("--internal", action="store_true",
                     help="show the image's own names (kernos:...) among the changes")
    show = add("show", "show one snapshot: op, code, names, the files it changed (from disk)",
               "workspace", "json")
    show.add_argument("ref", nargs="?", default="HEAD",
                      help="a commit (or prefix), HEAD, HEAD~N or @N for op N (default HEAD)")
    diff = add("diff", "names and tracked files that differ between two snapshots (from disk)",
               "workspace", "json")
    diff.add_argument("ref_a", metavar="A", help="a commit, HEAD, HEAD~N or @N")
    diff.add_argument("ref_b", metavar="B", nargs="?", default="HEAD",
                      help="another one (default HEAD)")
    diff.add_argument("--internal", action="store_true",
                      help="show the image's own names (kernos:...) too")
    checkout = add(
        "checkout", "record a new snapshot equal to REF", "workspace", "json", "progress",
        "gateway",
        description="Record a new snapshot equal to REF; history is never rewritten. "
                    "Through the running kernel if there is one (an op: the live image "
                    "changes), else offline (the next kernel restores it). With --gateway, "
                    "through a kernel started there for this command.")
    checkout.add_argument("ref", help="a commit (or prefix), HEAD, HEAD~N or @N for op N")

    from kernos.cli._fork import add_fork

    add_fork(add)
    _add_events(add)
    _add_agent(add, parents)
    _add_audit(add, parents)
    _add_replay(add)
    from kernos.cli._memory import add_memory

    add_memory(add, parents)
    from kernos.cli._remote import add_arguments as add_remote_arguments

    add_remote_arguments(add)

    erase = add("erase", "erase a data subject's personal values (irreversible; the "
                "kernel must be stopped)", "workspace", "json")
    erase.add_argument("subject")

    mcp = add("mcp", "serve the workspace to MCP clients (the Model Context Protocol)")
    if with_mcp:
        try:
            import kernos.mcp as server
        except ImportError as error:
            mcp.set_defaults(mcp_missing=str(error))
            mcp.add_argument("ignored", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        else:
            server.add_arguments(mcp)
    return parser


def _add_run(add: _Add) -> None:
    run = add(
        "run", "run one op against a workspace (starting a kernel if none runs)",
        "workspace", "json", "progress", "start",
        description="Run one op: code as a principal, or a registry tool. It commits "
                    "completely or rolls back completely. Uses the kernel running on the "
                    "workspace, or starts one for this op and shuts it down after.")
    run.add_argument("code", nargs="?", metavar="CODE",
                     help="the code to run; '-' reads it from stdin")
    run.add_argument("-c", dest="command_code", metavar="CODE", help="the code to run")
    run.add_argument("--file", metavar="FILE", help="run the code in FILE")
    run.add_argument("--tool", metavar="NAME", help="call this registry tool instead of code")
    run.add_argument("--args", dest="arguments", metavar="JSON",
                     help="the tool's arguments, a JSON object (with --tool)")
    run.add_argument("--principal", default="human", metavar="NAME",
                     help="who the op runs as (default: human; an agent runs restricted code)")
    run.add_argument("--key", metavar="KEY",
                     help="idempotency key: if an op with it committed, nothing runs again")
    run.add_argument("--expect", action="append", default=[], metavar="NAME=VERSION",
                     help="run only if NAME is at VERSION (0: must not exist); repeatable; "
                          "else exit 3")
    run.add_argument("--predicate", metavar="EXPR",
                     help="run only if EXPR is true (checked atomically, as the principal)")
    run.add_argument("--quiet", "-q", action="store_true",
                     help="on success, print only the op's output and value (not the line "
                          "saying which op committed)")


def _add_prune(add: _Add) -> None:
    prune = add(
        "prune", "delete old snapshots by a retention policy, for good (the kernel must be "
        "stopped)", "workspace", "json",
        description="Keep HEAD, the last N snapshots, the newest of each of the last D days "
                    "(UTC days that have one), the snapshots tags matching PATTERN name and "
                    "whatever other refs need; delete the rest, packs included. The kept "
                    "snapshots after a pruned one get new commit ids (same trees); an audit "
                    "record says what was pruned, so `kernos audit verify` still passes, "
                    "and `kernos push` moves the remote's main over the prune (the remote "
                    "keeps the pruned objects until its own git gc). "
                    "Needs the workspace to itself (stop its kernel); --dry-run changes "
                    "nothing and works beside a kernel.")
    prune.add_argument("--keep-last", type=count, default=0, metavar="N",
                       help="keep the newest N snapshots")
    prune.add_argument("--keep-daily", type=count, default=0, metavar="D",
                       help="keep the newest snapshot of each of the D most recent UTC days "
                            "that have one")
    prune.add_argument("--keep-tag", action="extend", nargs="+", default=[],
                       metavar="PATTERN",
                       help="keep the snapshots that tags (refs/tags/NAME in history.git) "
                            "matching PATTERN name (fnmatch: 'v*'); repeatable")
    prune.add_argument("--dry-run", action="store_true",
                       help="print what would be kept and pruned (and the bytes); change "
                            "nothing")


def _add_events(add: _Add) -> None:
    events = add(
        "events", "committed events (the durable log; --follow streams them live)",
        "workspace", "json", "gateway",
        description="Committed events, oldest first, from the durable log (no kernel "
                    "needed). With --follow: the backlog, then each op's events as it "
                    "commits, from the running kernel, until Ctrl-C (exit 0). --json "
                    "prints one JSON event per line. With --gateway, through the "
                    "gateway's kernel serving the workspace (for the log, one is started "
                    "if none runs; --follow needs a running one).")
    events.add_argument("--since", type=count, default=0, metavar="SEQ",
                        help="after this sequence number (default 0: all)")
    events.add_argument("--topic", metavar="PATTERN", help="only matching topics")
    events.add_argument("--principal", help="only events this principal emitted")
    events.add_argument("-n", type=count, default=None, metavar="N",
                        help="at most N (with --follow: stop after N)")
    events.add_argument("--follow", "-f", action="store_true",
                        help="keep streaming new events from the running kernel")


def _add_agent(add: _Add, parents: dict[str, _Parser]) -> None:
    agent = add("agent", "agents' loops (loop, pause, resume, stop, loops) and circuit "
                "breakers (policy, circuit, reset)",
                description="Agents' loops (kernos.agents.loop) and circuit breakers "
                            "(kernos.agents.supervisor), through the running kernel (one is "
                            "started for the command if none runs).")
    agent_commands = agent.add_subparsers(dest="agent_command", required=True,
                                          metavar="SUBCOMMAND", parser_class=_Parser)
    from kernos.cli._agent_loop import add_arguments as add_loop_arguments
    from kernos.cli._agent_supervise import add_arguments as add_supervise_arguments

    add_loop_arguments(agent_commands, parents, exit_statuses("agent"))
    add_supervise_arguments(agent_commands, [parents[use] for use in (
        "workspace", "json", "progress", "start")])


def _add_audit(add: _Add, parents: dict[str, _Parser]) -> None:
    audit = add("audit", "verify or list the audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True,
                                          metavar="SUBCOMMAND", parser_class=_Parser)
    verify = audit_commands.add_parser(
        "verify", help="verify the chain, the snapshots and the history (exit 1 if tampered)",
        description="Verify the audit chain, the snapshots, the history and every git "
                    "object, from disk (also while a kernel runs). Exit 1 names the first "
                    "bad record.", epilog=exit_statuses("audit verify"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[parents["workspace"], parents["json"], parents["progress"]])
    verify.add_argument("--anchor", metavar="INDEX:HASH",
                        help="a head digest printed by an earlier verify, kept elsewhere")
    verify.add_argument("--since", metavar="INDEX:HASH",
                        help="verify only what came after this head digest (printed by an "
                             "earlier verify): the records after it, their snapshots and "
                             "objects; the records up to it are not read")
    verify.add_argument("--no-objects", action="store_true",
                        help="skip re-hashing every git object (faster, weaker)")
    audit_log = audit_commands.add_parser(
        "log", help="list audit records, oldest first",
        description="Audit records, oldest first (the newest N). --json prints one JSON "
                    "record per line.", epilog=exit_statuses("audit log"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[parents["workspace"], parents["json"]])
    audit_log.add_argument("-n", type=count, default=20, metavar="N",
                           help="the newest N (default 20)")
    audit_log.add_argument("--principal", help="only this principal's ops")
    audit_log.add_argument("--status", help="committed, rolled back, failed, interrupted, "
                                            "denied or vetoed")
    audit_log.add_argument("--topic", help="only ops that emitted a matching event")


def _add_replay(add: _Add) -> None:
    replay = add(
        "replay", "re-run the recorded ops in a fresh workspace and check every snapshot",
        "workspace", "json",
        description="Rebuild the image in a fresh workspace by re-running the ops the audit "
                    "log recorded, with the recorded effect outcomes (no effect runs again), "
                    "and check that every snapshot equals the original. Exit 1 names the "
                    "first op that diverged and the names that differ. Reads the workspace "
                    "from disk (also while a kernel runs).")
    replay.add_argument("--from", dest="start", metavar="REF",
                        help="start from this snapshot (default: the empty image)")
    replay.add_argument("--to", dest="end", metavar="REF",
                        help="stop after this snapshot's op (default: the last op)")
    replay.add_argument("--until", type=count, metavar="OP",
                        help="stop just before op OP (a failed op, say), to open that state in "
                             "a notebook (KERNOS_WORKSPACE=the --into directory) and run it")
    replay.add_argument("--into", metavar="DIR",
                        help="the new workspace (must not exist; default: a temporary one)")
    replay.add_argument("--keep-going", action="store_true",
                        help="go on after the first divergence")
