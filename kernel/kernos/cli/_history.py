"""``kernos log``, ``show``, ``diff`` (from disk), ``checkout`` (through a kernel or not), ``gc``
and ``prune``."""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kernos import history
from kernos.audit.offline import checkout_offline
from kernos.cli._common import Exit, Fail, emit_json, plural
from kernos.cli._progress import Progress
from kernos.errors import UnknownRef
from kernos.store.snapshots import read_snapshot
from kernos.store.workspace import Workspace

__all__ = ["checkout", "diff", "gc", "log", "prune", "show"]

def log(args: argparse.Namespace, path: Path) -> int:
    """The snapshots (a line says what the ops between them became); ``--all``: every op."""
    from kernos.audit import open_audit
    from kernos.audit.oplog import every_op, gap_note, missing_ops

    note = None
    with Workspace.open(path, writable=False) as workspace:
        entries = None if args.all else history.log(workspace, limit=args.n)
        missing = [] if entries is None else missing_ops(entries)
        if entries is None or missing:  # the audit log only when it has something to add
            audit = open_audit(workspace)
            try:
                if entries is None:
                    entries = every_op(workspace, audit, limit=args.n)
                else:
                    note = gap_note(missing, audit)
            finally:
                audit.close()
    if args.json:
        listed = [{
            "op": entry.op, "commit": entry.commit or None, "when": entry.committed_at,
            "principal": entry.principal, "kind": entry.kind,
            "changes": {key: list(entry.changes.get(key, []))
                        for key in ("added", "changed", "deleted")},
            "files": {key: list(entry.files.get(key, []))
                      for key in ("added", "changed", "deleted")},
            "message": entry.headline,
            **({"outcome": entry.outcome, "error": entry.error or None} if args.all else {}),
        } for entry in entries]
        emit_json({"ops": listed} if args.all else {"snapshots": listed})
    else:
        print(history.format_log(entries, internal=getattr(args, "internal", False)))
        if note is not None:
            print(note)
    return Exit.OK


def gc(args: argparse.Namespace, path: Path) -> int:
    from kernos.store.maintenance import gc as repack

    before, after = repack(path)
    if args.json:
        emit_json({"before": before.to_json(), "after": after.to_json()})
    else:
        print(f"kernos gc: {before.packs} packs and {before.loose} loose objects "
              f"({before.files} files, {history.human_size(before.bytes)}) -> {after.packs} "
              f"pack{'s' if after.packs != 1 else ''} and {after.loose} loose "
              f"({after.files} files, {history.human_size(after.bytes)})")
    return Exit.OK


def prune(args: argparse.Namespace, path: Path) -> int:
    from kernos.prune import Policy
    from kernos.prune import prune as prune_history

    report = prune_history(path, Policy(keep_last=args.keep_last, keep_daily=args.keep_daily,
                                        keep_tags=tuple(args.keep_tag)),
                           dry_run=args.dry_run)
    if args.json:
        emit_json(report.to_json())
    else:
        print(f"kernos prune{' --dry-run' if args.dry_run else ''}: {report.workspace}")
        print(report.summary())
    return Exit.OK


@contextlib.contextmanager
def _told_what_happened(workspace: Workspace) -> Iterator[None]:
    """An ``@N`` that names no snapshot: say what became of op N (rolled back, read-only,
    ...), from the audit log, instead of only that it names none."""
    try:
        yield
    except UnknownRef as error:
        match = re.fullmatch(r"\s*@(\d+)\s*", error.ref)
        if match is None:
            raise
        from kernos.audit import open_audit
        from kernos.audit.oplog import what_happened

        audit = open_audit(workspace)
        try:
            story = what_happened(audit, int(match.group(1)))
        finally:
            audit.close()
        if story is None:
            raise
        raise Fail(f"{error.ref.strip()!r} names no snapshot: {story}. `kernos log --all` "
                   "lists every op, `kernos audit log` their records", kind="unknown_ref"
                   ) from None


def show(args: argparse.Namespace, path: Path) -> int:
    with Workspace.open(path, writable=False) as workspace, _told_what_happened(workspace):
        shown = history.show(workspace, args.ref)
    if not args.json:
        print(history.format_show(shown))
        return Exit.OK
    manifest = shown["manifest"]
    # The kernel's ``show`` result (kernos.harness.service), plus what the table shows.
    emit_json({
        "commit": shown["commit"], "op": manifest.get("op"),
        "principal": manifest.get("principal"), "kind": manifest.get("kind"),
        "committed_at": manifest.get("committed_at"), "message": shown["message"],
        "code": shown["source"], "names": manifest.get("names", {}),
        "unpersisted": shown["unpersisted"], "note": manifest.get("note"),
        "changes": manifest.get("changes", {}),
        "tools": manifest.get("facts", {}).get("tools", {}),
        "files": [change.to_json() for change in shown["files"]],
    })
    return Exit.OK


def diff(args: argparse.Namespace, path: Path) -> int:
    with Workspace.open(path, writable=False) as workspace, _told_what_happened(workspace):
        result = history.diff(workspace, args.ref_a, args.ref_b)
    if not args.json:
        print(history.format_diff(result, args.ref_a, args.ref_b,
                                  internal=getattr(args, "internal", False)))
        return Exit.OK

    def brief(name: str, meta: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "type": meta.get("type"), "summary": meta.get("summary")}

    # The kernel's ``diff`` result (kernos.harness.service).
    emit_json({
        "a": result.a, "b": result.b,
        "added": [brief(name, meta) for name, meta in result.added.items()],
        "deleted": [brief(name, meta) for name, meta in result.deleted.items()],
        "changed": [_changed(name, old, new) for name, (old, new) in result.changed.items()],
        "files": [change.to_json() for change in result.files],
    })
    return Exit.OK


def _changed(name: str, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A changed name as the kernel's ``diff`` result has it, plus ``fields`` (the attributes
    that differ, as [before, after]) when both summaries read ``Type(key=value, ...)``."""
    entry = {"name": name, "type": new.get("type"), "before": old.get("summary"),
             "after": new.get("summary")}
    fields = history.field_changes(str(old.get("summary")), str(new.get("summary")))
    if fields:
        entry["fields"] = {key: list(pair) for key, pair in fields.items()}
    return entry


def _target(path: Path, ref: str) -> tuple[str, int, int]:
    """The snapshot ``ref`` names: its commit, how many names and how many bytes it holds."""
    with Workspace.open(path, writable=False) as workspace, _told_what_happened(workspace):
        snapshot = read_snapshot(workspace, workspace.resolve(ref))
    names = snapshot.manifest.get("names", {})
    return snapshot.commit.hex(), len(names), sum(int(meta["size"]) for meta in names.values())


def checkout(args: argparse.Namespace, path: Path, progress: Progress) -> int:
    """Through the running kernel if there is one (an op), else offline (the next kernel's)."""
    from kernos.cli import _kernel

    if getattr(args, "gateway", None):  # the workspace is on the gateway's host: its kernel
        with _kernel.session(path, start=True, progress=progress,
                             gateway=args.gateway) as (started, _):
            label = f"checking out {args.ref}"
            progress.phase(label)
            result = _kernel.call(started.checkout, args.ref, progress=progress.follow(label))
            progress.close()
        return _kernel.report_op(args, result, action="checkout")
    commit, names, size = _target(path, args.ref)  # an unknown ref fails here, quickly
    client = _kernel.connect_if_running(path)
    if client is not None:
        with client:
            label = (f"checking out {args.ref}: loading {plural(names, 'name')} "
                     f"({history.human_size(size)})")
            progress.phase(label)
            result = _kernel.call(client.checkout, args.ref, progress=progress.follow(label))
            progress.close()
        return _kernel.report_op(args, result, action="checkout")
    progress.phase(f"checking out {args.ref}")
    with Workspace.open(path, create=False, purpose="kernos checkout") as workspace:
        new = checkout_offline(workspace, args.ref)
        op = read_snapshot(workspace, bytes.fromhex(new)).manifest.get("op")
    progress.close()
    if args.json:
        emit_json({"status": "committed", "op": op, "commit": new, "principal": "human",
                   "kernel": None, "checkout": {"ref": args.ref, "commit": commit,
                                                "names": names, "bytes": size}})
    else:
        print(f"Checked out {args.ref} ({commit[:12]}: {plural(names, 'name')}, "
              f"{history.human_size(size)}) as a new snapshot {new[:12]}, op {op}. "
              "The next kernel on this workspace restores it.")
    return Exit.OK
