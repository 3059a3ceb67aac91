"""The ``kernos`` command.

``kernos install``            install the kernelspec (--user, --sys-prefix or --prefix DIR)
``kernos demo``               the headless demonstration, on a real kernel
``kernos log|show|diff``      browse a workspace's history; no kernel needed
``kernos checkout REF``       record a new snapshot equal to REF (the kernel must be stopped)
``kernos audit verify``       verify the audit chain, the snapshots and the history
``kernos audit log``          the audit records, newest last
``kernos events``             committed events, from the durable log
``kernos erase SUBJECT``      erase a data subject (the kernel must be stopped)

The workspace is ``--workspace DIR``, else ``$KERNOS_WORKSPACE``, else the
default (see ``kernos.store.workspace``).  Exit status: 0 success, 1 ``audit
verify`` found tampering, 2 an error (one clear line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kernos import history
from kernos.errors import KernosError
from kernos.store.workspace import Workspace, default_workspace

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernos",
        description="Kernos: a persistent, transactional Python image for Jupyter.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    install = commands.add_parser("install", help="install the 'kernos' kernelspec")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="into the user's Jupyter directory")
    where.add_argument("--sys-prefix", action="store_true", help="into sys.prefix (this env)")
    where.add_argument("--prefix", metavar="DIR", help="into DIR/share/jupyter/kernels")

    demo = commands.add_parser("demo", help="run the headless demonstration on a real kernel")
    demo.add_argument("--workspace", "-w", metavar="DIR",
                      help="workspace to use (default: a fresh one under snapshots/ or a "
                           "temporary directory)")

    def with_workspace(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--workspace", "-w", metavar="DIR",
                         help="the workspace directory (default: $KERNOS_WORKSPACE)")
        return sub

    log = with_workspace("log", "list the snapshots, newest first")
    log.add_argument("-n", type=int, default=20, metavar="N", help="at most N (default 20)")
    show = with_workspace("show", "show one snapshot")
    show.add_argument("ref", nargs="?", default="HEAD")
    diff = with_workspace("diff", "names that differ between two snapshots")
    diff.add_argument("ref_a")
    diff.add_argument("ref_b", nargs="?", default="HEAD")
    checkout = with_workspace("checkout", "record a new snapshot equal to REF")
    checkout.add_argument("ref")

    audit = commands.add_parser("audit", help="verify or list the audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True,
                                          metavar="SUBCOMMAND")
    verify = audit_commands.add_parser(
        "verify", help="verify the chain, the snapshots and the history (exit 1 if tampered)")
    verify.add_argument("--workspace", "-w", metavar="DIR",
                        help="the workspace directory (default: $KERNOS_WORKSPACE)")
    verify.add_argument("--anchor", metavar="INDEX:HASH",
                        help="a head digest printed by an earlier verify, kept elsewhere")
    verify.add_argument("--no-objects", action="store_true",
                        help="skip re-hashing every git object (faster, weaker)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    audit_log = audit_commands.add_parser("log", help="list audit records, oldest first")
    audit_log.add_argument("--workspace", "-w", metavar="DIR",
                           help="the workspace directory (default: $KERNOS_WORKSPACE)")
    audit_log.add_argument("-n", type=int, default=20, metavar="N",
                           help="the newest N (default 20)")
    audit_log.add_argument("--principal", help="only this principal's ops")
    audit_log.add_argument("--status", help="committed, rolled back, failed, interrupted, "
                                            "denied or vetoed")
    audit_log.add_argument("--topic", help="only ops that emitted a matching event")
    audit_log.add_argument("--json", action="store_true", help="one JSON record per line")

    events = with_workspace("events", "committed events, from the durable log")
    events.add_argument("--since", type=int, default=0, metavar="SEQ",
                        help="after this sequence number (default 0: all)")
    events.add_argument("--topic", metavar="PATTERN", help="only matching topics")
    events.add_argument("--principal", help="only events this principal emitted")
    events.add_argument("-n", type=int, default=None, metavar="N", help="at most N")
    events.add_argument("--json", action="store_true", help="one JSON event per line")

    erase = with_workspace("erase", "erase a data subject's personal values (irreversible)")
    erase.add_argument("subject")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except KernosError as error:
        print(f"kernos {args.command}: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "install":
        from kernos.kernel.install import install

        prefix = sys.prefix if args.sys_prefix else args.prefix
        print(f"Installed the kernos kernelspec in {install(user=args.user, prefix=prefix)}")
        return 0
    if args.command == "demo":
        from kernos.demo import run_demo

        return run_demo(args.workspace)
    path = args.workspace or default_workspace()
    if args.command == "audit":
        return _audit(args, path)
    if args.command == "erase":
        from kernos.audit import erase, open_audit

        with Workspace.open(path, create=False, purpose="kernos erase") as workspace:
            report = erase(open_audit(workspace), args.subject)
        print(f"Erased the data subject {report.subject!r}: key "
              f"{'destroyed' if report.key_destroyed else 'already gone'}, "
              f"{len(report.payloads)} audit payload(s) deleted; audit record {report.record}.")
        return 0
    if args.command == "events":
        import json

        from kernos.audit import open_audit

        with Workspace.open(path, writable=False) as workspace:
            found = open_audit(workspace).events_since(
                args.since, topic=args.topic, principal=args.principal, limit=args.n)
        for event in found:
            if args.json:
                print(json.dumps(event, sort_keys=True))
            else:
                print(f"{event['seq']:>6}  op {event['op']:<5} {event['principal']:<12} "
                      f"{event['topic']}  {json.dumps(event['payload'], sort_keys=True)[:80]}")
        return 0
    if args.command == "checkout":
        with Workspace.open(path, create=False, purpose="kernos checkout") as workspace:
            commit = history.checkout_offline(workspace, args.ref)
        print(f"Checked out {args.ref} as a new snapshot {commit[:12]}. The next kernel on "
              f"this workspace restores it.")
        return 0
    with Workspace.open(path, writable=False) as workspace:
        if args.command == "log":
            print(history.format_log(history.log(workspace, limit=args.n)))
        elif args.command == "show":
            print(history.format_show(history.show(workspace, args.ref)))
        elif args.command == "diff":
            result = history.diff(workspace, args.ref_a, args.ref_b)
            print(history.format_diff(result, args.ref_a, args.ref_b))
    return 0


def _audit(args: argparse.Namespace, path: object) -> int:
    import json

    from kernos.audit import open_audit, verify

    if args.audit_command == "verify":
        report = verify(str(path), anchor=args.anchor, objects=not args.no_objects)
        print(json.dumps(report.to_json(), indent=2) if args.json else report.summary())
        return 0 if report.ok else 1
    with Workspace.open(str(path), writable=False) as workspace:
        records = open_audit(workspace).records(principal=args.principal, status=args.status,
                                                topic=args.topic, limit=args.n)
    if args.json:
        for record in records:
            print(json.dumps(record, sort_keys=True))
    else:
        from kernos.audit.human import format_records

        print(format_records(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
