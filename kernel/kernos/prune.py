"""``kernos prune``: delete old snapshots by a retention policy, for good.

:func:`prune` keeps what a :class:`~kernos.store.retention.Policy` says
(HEAD, the last N, one a day for D days, tagged snapshots, what other refs
need), rewrites the history so that the kept snapshots form the branch,
records the prune in the audit chain, and deletes every object that only the
pruned snapshots reached, from the packs too.  The store's part (the policy,
the rewrite, the deletion and its crash protocol) is
:mod:`kernos.store.retention`; the record is :mod:`kernos.audit.pruning`.
This module joins them, as a writer holding the workspace's lock:

1. open the workspace writable (a running kernel holds the lock: refused,
   naming it) and its audit log (recovered first: an op or a prune a crash
   interrupted is voided, an interrupted erasure finished);
2. plan and measure; stop there for a dry run, or if nothing is pruned;
3. write the new commits and the intent file, append the ``prune`` record,
   move the branch (the commit point), then delete and check.

An error before the commit point undoes what was written (a record already
appended is voided); a crash is finished or undone by the next writable
open (``retention.py``).  Pruning composes with erasure: an erasure destroys
keys, so the sealed bytes a prune repacks stay noise, and one a crash
interrupted is finished before the prune starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos.errors import UsageError, WorkspaceLocked
from kernos.store import retention
from kernos.store.maintenance import Footprint, footprint
from kernos.store.retention import Plan, Policy, Snapshot
from kernos.store.workspace import Workspace

if TYPE_CHECKING:
    from kernos.audit.log import AuditLog

__all__ = ["Kept", "Policy", "PruneReport", "prune"]

_LOCKED = ("kernos prune rewrites the history, so it needs the workspace to itself: stop that "
           "kernel (shut down its notebook or harness), then run kernos prune again. Nothing "
           "was changed; `kernos prune --dry-run` shows what it would do while the kernel "
           "runs.")


@dataclass(frozen=True, kw_only=True)
class Kept:
    """A snapshot the prune keeps."""

    snapshot: Snapshot
    """It, as it was (its old commit id)."""
    commit: str
    """Its commit id after the prune (the old one unless an earlier snapshot was pruned)."""
    why: tuple[str, ...]
    """``HEAD``, ``last``, ``daily DAY``, ``tag NAME``, ``needed by REF``."""


@dataclass(frozen=True, kw_only=True)
class PruneReport:
    """What :func:`prune` did (or, with ``dry_run``, would do)."""

    workspace: str
    dry_run: bool
    snapshots: tuple[Snapshot, ...]
    """The branch before, oldest first."""
    kept: tuple[Kept, ...]
    pruned: tuple[Snapshot, ...]
    tags: dict[str, str | None]
    """Tag ref -> the object it names after (None: deleted, its snapshot was pruned)."""
    unmatched: tuple[str, ...]
    """``--keep-tag`` patterns that matched no tag on the branch."""
    freed_objects: int
    """Objects that only the pruned snapshots reach (they are deleted)."""
    freed_bytes: int
    """What those take on disk before (one copy each, as stored)."""
    before: Footprint
    after: Footprint | None
    """The objects on disk after (None for a dry run)."""
    record: int | None
    """The index of the ``prune`` audit record (None: dry run, or nothing pruned)."""
    head: str
    new_head: str

    def summary(self) -> str:
        """What ``kernos prune`` prints."""
        from kernos.history import human_size

        would = "would " if self.dry_run else ""
        first, last = (self.snapshots[0], self.snapshots[-1])
        lines = [f"{len(self.snapshots)} snapshots on the branch: {_ops(self.snapshots)} "
                 f"({first.day} .. {last.day} UTC)"]
        lines.append(f"{would}keep {len(self.kept)}: {_ops([k.snapshot for k in self.kept])}"
                     f" ({'; '.join(_reasons(self.kept))})")
        if self.pruned:
            lines.append(f"{would}prune {len(self.pruned)}: {_ops(self.pruned)} "
                         f"({self.freed_objects} objects, {human_size(self.freed_bytes)} "
                         "that only they reach)")
        else:
            lines.append("nothing to prune: the policy keeps every snapshot")
        for ref, new in sorted(self.tags.items()):
            name = ref.removeprefix("refs/tags/")
            if new is None:
                lines.append(f"tag {name}: {'would be ' if self.dry_run else ''}deleted (its "
                             "snapshot is pruned)")
            else:
                lines.append(f"tag {name}: {'would move' if self.dry_run else 'moved'} with its "
                             f"snapshot, to {new[:12]}")
        for pattern in self.unmatched:
            lines.append(f"--keep-tag {pattern}: no tag on the branch matches it")
        size = f"{human_size(self.before.bytes)} in {self.before.files} files"
        if self.dry_run:
            lines.append(f"history: {size} now; nothing was changed (dry run)")
        elif self.after is not None and self.record is not None:
            lines.append(f"history: {size} -> {human_size(self.after.bytes)} in "
                         f"{self.after.files} files; HEAD {self.head[:12]} -> "
                         f"{self.new_head[:12]}; audit record {self.record}")
        else:
            lines.append(f"history: {size}; nothing was changed")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "workspace": self.workspace, "dry_run": self.dry_run,
            "snapshots": len(self.snapshots),
            "kept": [{"commit": kept.snapshot.commit, "new_commit": kept.commit,
                      "op": kept.snapshot.op, "time": kept.snapshot.time, "why": list(kept.why)}
                     for kept in self.kept],
            "pruned": [{"commit": s.commit, "op": s.op, "time": s.time} for s in self.pruned],
            "tags": {"moved": {ref: new for ref, new in self.tags.items() if new is not None},
                     "deleted": sorted(ref for ref, new in self.tags.items() if new is None)},
            "unmatched_tags": list(self.unmatched),
            "freed": {"objects": self.freed_objects, "bytes": self.freed_bytes},
            "before": self.before.to_json(),
            "after": None if self.after is None else self.after.to_json(),
            "record": self.record, "head": {"from": self.head, "to": self.new_head},
        }


def prune(path: str | Path, policy: Policy, *, dry_run: bool = False) -> PruneReport:
    """Prune the history of the workspace at ``path`` by ``policy`` (see the module docstring).

    ``dry_run`` changes nothing (and takes no lock: it works beside a kernel).
    """
    if policy.empty:
        raise UsageError("say what to keep: --keep-last N, --keep-daily D or --keep-tag "
                         "PATTERN (HEAD is always kept; --keep-last 1 keeps only it)")
    if dry_run:
        with Workspace.open(path, writable=False, create=False) as workspace:
            plan = retention.plan(workspace, policy)
            freed = retention.measure(workspace, plan)
            return _report(workspace, plan, freed, before=footprint(workspace.git_dir),
                           after=None, record=None, dry_run=True)
    try:
        workspace = Workspace.open(path, create=False, purpose="kernos prune")
    except WorkspaceLocked as error:
        raise WorkspaceLocked(error.path, error.owner, advice=_LOCKED) from None
    with workspace:
        from kernos.audit import open_audit
        from kernos.audit.pruning import record_body

        log = open_audit(workspace)  # recovers first: voids, deaths, erasures
        plan = retention.plan(workspace, policy)
        freed = retention.measure(workspace, plan)
        before = footprint(workspace.git_dir)
        if not plan.pruned:
            return _report(workspace, plan, freed, before=before, after=None, record=None,
                           dry_run=False)
        retention.write(workspace, plan)
        record: int | None = None
        try:
            retention.intend(workspace, plan)
            record = int(log.append(record_body(plan, policy))["index"])
            from kernos import _faults

            _faults.point("prune.recorded")
            retention.publish(workspace, plan)
        except BaseException:
            _undo(workspace, log, plan, record)
            raise
        retention.finish(workspace, plan.intent(), freed=freed.objects)
        return _report(workspace, plan, freed, before=before,
                       after=footprint(workspace.git_dir), record=record, dry_run=False)


def _undo(workspace: Workspace, log: AuditLog, plan: Plan, record: int | None) -> None:
    """An error before the commit point: the old history stays; never hide the error."""
    head = workspace.head()
    if head is not None and head.hex() == plan.new_head:
        return  # the branch moved after all: the prune stands (the next open finishes it)
    with contextlib.suppress(Exception):  # else the next open voids and cleans up
        retention.abandon(workspace)
        if record is not None:
            log.append({"type": "void", "voids": record,
                        "reason": "the prune failed before the branch moved; nothing was "
                                  "pruned"})


def _report(workspace: Workspace, plan: Plan, freed: retention.Freed, *, before: Footprint,
            after: Footprint | None, record: int | None, dry_run: bool) -> PruneReport:
    by_commit = {snapshot.commit: snapshot for snapshot in plan.chain}
    return PruneReport(
        workspace=str(workspace.path), dry_run=dry_run, snapshots=plan.chain,
        kept=tuple(Kept(snapshot=by_commit[commit], why=why,
                        commit=plan.rewritten.get(commit, commit))
                   for commit, why in plan.selection.kept.items()),
        pruned=tuple(by_commit[commit] for commit in plan.pruned),
        tags={ref: new for ref, (_old, new) in plan.tags.items()},
        unmatched=plan.selection.unmatched, freed_objects=len(freed.objects),
        freed_bytes=freed.bytes, before=before, after=after, record=record,
        head=plan.head, new_head=plan.new_head)


def _ops(snapshots: Iterable[Snapshot]) -> str:
    """``ops 1-4, 7`` (and how many snapshots carry no op number)."""
    snapshots = list(snapshots)
    numbers = sorted(s.op for s in snapshots if s.op is not None)
    ranges: list[str] = []
    for number in numbers:
        if ranges and ranges[-1].rpartition("-")[2] == str(number - 1):
            start = ranges[-1].partition("-")[0]
            ranges[-1] = f"{start}-{number}"
        else:
            ranges.append(str(number))
    text = ("op " if len(numbers) == 1 else "ops ") + ", ".join(ranges) if numbers else ""
    others = sum(1 for s in snapshots if s.op is None)
    if others:
        text += (", " if text else "") + f"{others} without an op number"
    return text or "none"


def _reasons(kept: tuple[Kept, ...]) -> list[str]:
    """``last 5: ops 36-40`` and the like, one per reason (every daily one as ``daily``)."""
    groups: dict[str, list[Snapshot]] = {}
    for item in kept:
        for why in item.why:
            groups.setdefault("daily" if why.startswith("daily ") else why, []).append(
                item.snapshot)
    order = ("HEAD", "last", "daily", "tag ", "needed by ")
    return [f"{why}: {_ops(snapshots)}" for why, snapshots in sorted(
        groups.items(), key=lambda item: next(
            (rank for rank, start in enumerate(order) if item[0].startswith(start)),
            len(order)))]
