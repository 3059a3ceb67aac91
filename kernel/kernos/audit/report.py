"""What :func:`kernos.audit.verify.verify` found: :class:`VerifyReport` and its problems."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Problem", "Pruned", "Signer", "VerifyReport"]


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing verify found wrong."""

    index: int
    """The record it concerns (the count of records, for something missing at the end)."""
    what: str
    """What is wrong, in words."""


@dataclass(frozen=True, kw_only=True)
class Pruned:
    """A ``prune`` record verify found (``kernos prune`` rewrote the history there)."""

    record: int
    """The prune record's index."""
    at: str
    """When it was appended."""
    snapshots: int
    """The snapshots it deleted."""
    rewritten: int
    """The kept snapshots it gave new commit ids (checked at their new ids)."""
    records: int
    """Committed op records in the range verified whose snapshot it deleted: they verify by
    the chain alone."""

    def summary(self) -> str:
        return (f"pruned: record {self.record} ({self.at}) deleted "
                f"{self.snapshots} snapshot{'' if self.snapshots == 1 else 's'} and renamed "
                f"{self.rewritten}; {self.records} record{'' if self.records == 1 else 's'} "
                "naming a deleted snapshot verify by the chain only")

    def to_json(self) -> dict[str, Any]:
        return {"record": self.record, "at": self.at, "snapshots": self.snapshots,
                "rewritten": self.rewritten, "records": self.records}


@dataclass(frozen=True, kw_only=True)
class Signer:
    """A key that signed records verify read."""

    key: str
    """Its key id (``ed25519:...``)."""
    records: int
    """How many of the records read it signed."""
    trusted: bool
    """Whether this workspace trusts it (its own key, or one trusted since)."""

    def summary(self) -> str:
        return (f"signed by {self.key}: {self.records} record{'' if self.records == 1 else 's'}"
                + ("" if self.trusted else " (NOT TRUSTED here: `kernos remote trust` lists "
                   "the trusted keys)"))

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "records": self.records, "trusted": self.trusted}


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """The outcome of :func:`verify`."""

    records: int
    """How many records the chain holds (with ``since``: the newest one's index + 1)."""
    head: str
    """``INDEX:HASH`` of the newest record: the digest to anchor elsewhere."""
    commits: int
    """Committed ops whose snapshots were checked."""
    objects: int
    """Git objects re-hashed."""
    problems: tuple[Problem, ...] = field(default_factory=tuple)
    """Everything found, first bad record first."""
    since: int | None = None
    """With ``since``: the anchor's index.  Only the records after it were verified."""
    pruned: tuple[Pruned, ...] = ()
    """The prune records in the range, oldest first."""
    unfinished: str | None = None
    """The newest op record names a commit that was never published (a process died
    before its commit point): what the next writable open will void, said plainly."""
    origin: str | None = None
    """For a fork (``kernos fork``): where it came from, and whether its source confirmed
    it."""
    signers: tuple[Signer, ...] = ()
    """The keys that signed the records read, in the order they first appear."""
    unsigned: int = 0
    """Records read from before signing existed (written by an older Kernos)."""
    adopted: int = 0
    """Snapshots of the history the genesis adopts, checked with it (``commits`` does not
    count them): a fork's, from its source up to the snapshot it was forked at."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_bad(self) -> int | None:
        return self.problems[0].index if self.problems else None

    @property
    def verified(self) -> tuple[int, int]:
        """(first, last) index of the records verified; first > last when there were none."""
        return (0 if self.since is None else self.since + 1, self.records - 1)

    def range(self) -> str:
        """The records verified, in words."""
        first, last = self.verified
        if self.since is None:
            return f"records 0..{last} (the whole log)"
        if last < self.since:
            return f"nothing: the anchored record {self.since} was not found"
        if first > last:
            return f"no records after the anchor at {self.since}"
        return f"records {first}..{last}, after the anchor at {self.since}"

    def not_read(self) -> str | None:
        """What verify did not read, in words (None for a whole log)."""
        if self.since is None:
            return None
        if self.records <= self.since:
            return ("the records before the anchor were not read (verify without --since "
                    "checks them)")
        return (f"records 0..{self.since} were not read: they are outside the range (verify "
                "without --since checks them)")

    def summary(self) -> str:
        signed = f"; {self.signed()}" if self.signed() else ""
        if self.ok:
            if self.since is None:
                lines = [f"ok: {self.records} records, {self.snapshots()} and "
                         f"{self.objects} objects verified{signed}"]
            else:
                lines = [f"ok: {self.range()}: {self.commits} snapshots and {self.objects} "
                         f"objects verified{signed}"]
        else:
            first = self.problems[0]
            lines = [f"FAILED: first bad record is {first.index}: {first.what}"]
            lines += [f"  also record {problem.index}: {problem.what}"
                      for problem in self.problems[1:10]]
            if len(self.problems) > 10:
                lines.append(f"  ... and {len(self.problems) - 10} more")
            if signed:
                lines.append(signed[2:])
            if self.since is not None:
                lines.append(f"verified: {self.range()}")
        lines += [pruned.summary() for pruned in self.pruned]
        if self.unfinished is not None:
            lines.append(f"unfinished: {self.unfinished}")
        if self.origin is not None:
            lines.append(f"origin: {self.origin}")
        if self.not_read() is not None:
            lines.append(str(self.not_read()))
        if self.ok:
            lines.append(f"head {self.head}")
        return "\n".join(lines)

    def snapshots(self) -> str:
        """How many snapshots were verified, in words (the adopted ones said apart)."""
        total = self.commits + self.adopted
        text = f"{total} snapshot{'' if total == 1 else 's'}"
        if not self.adopted:
            return text
        source = "from the source, up to the fork" if self.origin is not None else \
            "from before the log"
        return (f"{text} ({self.commits} committed here, {self.adopted} adopted {source})")

    def signed(self) -> str:
        """Who signed the records read, in words (empty when none was read)."""
        parts = [signer.summary() for signer in self.signers]
        if self.unsigned:
            parts.append(f"unsigned: {self.unsigned} record{'' if self.unsigned == 1 else 's'} "
                         "from before signing existed (written by an older Kernos)")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        first, last = self.verified
        return {"ok": self.ok, "records": self.records, "head": self.head,
                "commits": self.commits, "adopted": self.adopted, "objects": self.objects,
                "first_bad": self.first_bad,
                "problems": [{"index": p.index, "what": p.what} for p in self.problems],
                "since": self.since, "verified": {"first": first, "last": last},
                "range": self.range(), "not_read": self.not_read(),
                "pruned": [pruned.to_json() for pruned in self.pruned],
                "unfinished": self.unfinished, "origin": self.origin,
                "signers": [signer.to_json() for signer in self.signers],
                "unsigned": self.unsigned}
