"""What a replay reports: each op's :class:`Step`, the first :class:`Divergence`,
and the whole :class:`ReplayReport`, as ``kernos replay`` prints it
(:meth:`ReplayReport.summary`) and as JSON (:meth:`ReplayReport.to_json`).

Plain records: :mod:`kernos.replay.driver` fills them in as it replays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernos.history import format_table

__all__ = ["Divergence", "ReplayReport", "Step"]


@dataclass(kw_only=True)
class Step:
    """One replayed op."""

    op: int
    kind: str
    principal: str
    status: str
    """How the op ended in the source."""
    replayed: str
    """How it ended in the replay."""
    digest: str | None = None
    """The state digest after it (committed ops), in the replay."""
    original: str | None = None
    """The state digest of the source's snapshot of it."""
    pruned_by: int | None = None
    """The prune record that deleted the source's snapshot of it: not compared."""
    files: str | None = None
    """The id of the replayed snapshot's ``files/`` tree (its tracked files; None: none)."""
    original_files: str | None = None
    """The id of the source's snapshot's ``files/`` tree."""

    @property
    def matches(self) -> bool:
        return self.replayed == self.status and (
            self.pruned_by is not None or (self.digest == self.original
                                           and self.files == self.original_files))

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "matches": self.matches}


@dataclass(kw_only=True)
class Divergence:
    """The first op whose replay did not end like the original."""

    op: int
    reason: str
    names: dict[str, str] = field(default_factory=dict)
    """Name -> what differs (``added``, ``missing``, or the first difference); a tracked
    file is named ``files/PATH`` (``files:KEY/PATH`` outside the files root)."""

    def __str__(self) -> str:
        lines = [f"op {self.op}: {self.reason}"]
        lines += [f"  {name}: {what}" for name, what in sorted(self.names.items())]
        return "\n".join(lines)


@dataclass(kw_only=True)
class ReplayReport:
    source: str
    into: str
    steps: list[Step]
    divergence: Divergence | None = None
    stopped_before: int | None = None
    """With ``until``: the op not run (its code is ``pending_code``)."""
    pending_code: str | None = None
    unfinished: int | None = None
    """An op the source's kernel died committing (its record is written, its commit was
    never published): not run, since the next open of the source voids it."""

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def summary(self) -> str:
        """The steps as a table, then the verdict (what ``kernos replay`` prints)."""
        rows = [("op", "kind", "principal", "original", "replayed", "state", "same")]
        rows += [(str(s.op), s.kind, s.principal, s.status, s.replayed,
                  (s.digest or "")[:12],
                  "NO" if not s.matches else "pruned" if s.pruned_by is not None else "yes")
                 for s in self.steps]
        lines = [format_table(rows), ""]
        committed = sum(1 for s in self.steps
                        if s.status == "committed" and s.pruned_by is None)
        pruned = sum(1 for s in self.steps if s.pruned_by is not None)
        if self.divergence is not None:
            lines.append(f"DIVERGED at {self.divergence}")
        else:
            lines.append(f"ok: {len(self.steps)} ops replayed, {committed} snapshots equal to "
                         "the original (tracked files hash for hash); no effect was executed"
                         + (f"; {pruned} not checked: their snapshots were pruned"
                            if pruned else ""))
        if self.unfinished is not None:
            lines.append(f"op {self.unfinished} not replayed: the kernel died before its "
                         "commit was published, and the next open of the workspace voids it")
        if self.stopped_before is not None:
            lines.append(f"stopped before op {self.stopped_before}; its code:")
            lines += ["    " + line for line in (self.pending_code or "").splitlines()]
            lines.append(f"open that state with KERNOS_WORKSPACE={self.into}")
        lines.append(f"replayed into {self.into}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "into": self.into, "ok": self.ok,
                "steps": [step.to_json() for step in self.steps],
                "divergence": None if self.divergence is None else {
                    "op": self.divergence.op, "reason": self.divergence.reason,
                    "names": self.divergence.names},
                "stopped_before": self.stopped_before, "pending_code": self.pending_code,
                "unfinished": self.unfinished}
