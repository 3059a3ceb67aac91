"""``kernos audit verify|log`` and ``kernos erase``: the audit log, from disk."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernos.cli._common import Exit, emit_json
from kernos.cli._progress import Progress
from kernos.store.workspace import Workspace

__all__ = ["audit", "erase"]


def audit(args: argparse.Namespace, path: Path, progress: Progress) -> int:
    from kernos.audit import open_audit, verify

    if args.audit_command == "verify":
        since = "" if args.since is None else f" after record {args.since.partition(':')[0]}"
        progress.phase(f"verifying {path}{since}" + ("" if args.no_objects else
                                                     " (re-hashing every object)"))
        report = verify(str(path), anchor=args.anchor, since=args.since,
                        objects=not args.no_objects)
        progress.close()
        if args.json:
            emit_json(report.to_json())
        else:
            print(report.summary())
        return Exit.OK if report.ok else Exit.FAILED
    with Workspace.open(str(path), writable=False) as workspace:
        records = open_audit(workspace).records(principal=args.principal, status=args.status,
                                                topic=args.topic, limit=args.n)
    if args.json:
        for record in records:  # a stream: one record per line
            emit_json(record)
    else:
        from kernos.audit.human import format_records

        print(format_records(records))
    return Exit.OK


def erase(args: argparse.Namespace, path: Path) -> int:
    from kernos.audit import erase as erase_subject
    from kernos.audit import open_audit

    with Workspace.open(path, create=False, purpose="kernos erase") as workspace:
        report = erase_subject(open_audit(workspace), args.subject)
    if args.json:
        emit_json({"subject": report.subject, "key_destroyed": report.key_destroyed,
                   "payloads": list(report.payloads), "record": report.record})
    else:
        print(f"Erased the data subject {report.subject!r}: key "
              f"{'destroyed' if report.key_destroyed else 'already gone'}, "
              f"{len(report.payloads)} audit payload(s) deleted; audit record "
              f"{report.record}.")
    return Exit.OK
