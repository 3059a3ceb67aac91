"""Verify a workspace's audit chain and history, from disk, in any process.

:func:`verify` checks, and names the first bad record for, each of these:

* the chain: every line is canonical JSON, in sequence (``index``), linked to
  the one before (``prev``), and hashes to its ``hash``;
* the payloads: each one still hashes to its reference, and a missing one
  belongs to a data subject whose erasure is recorded after it;
* the snapshots: every committed (not voided) op's commit exists, its
  manifest agrees with the record (op, principal, changes), and it binds the
  hashes of the records before it, as the chain stood when it committed;
* the history: each such commit's parent is the previous committed op's
  commit, and the branch ends at the last one (nothing rewritten, nothing
  committed without a record);
* the objects: every git object those commits reach hashes to its id (a
  flipped bit in a blob, loose or packed, is found);
* an anchor, if given: the chain still holds that record with that hash.

What a chain alone cannot show: someone who can write the workspace can
rewrite the whole suffix after the last commit, or every record and every
snapshot consistently.  An *anchor* closes that gap: copy the head digest
that verify prints (``INDEX:HASH``) somewhere the workspace's writers cannot
change, and pass it back with ``--anchor``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernos.audit.canonical import canonical
from kernos.audit.log import CHAIN, DIRECTORY, GENESIS_PREV, PAYLOADS, record_hash
from kernos.errors import KernosError, UsageError
from kernos.store.objects import decode_tree, object_id
from kernos.store.snapshots import MANIFEST
from kernos.store.workspace import Workspace

__all__ = ["Problem", "VerifyReport", "verify"]


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing verify found wrong."""

    index: int
    """The record it concerns (the count of records, for something missing at the end)."""
    what: str
    """What is wrong, in words."""


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """The outcome of :func:`verify`."""

    records: int
    """How many records the chain holds."""
    head: str
    """``INDEX:HASH`` of the newest record: the digest to anchor elsewhere."""
    commits: int
    """Committed ops whose snapshots were checked."""
    objects: int
    """Git objects re-hashed."""
    problems: tuple[Problem, ...] = field(default_factory=tuple)
    """Everything found, first bad record first."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_bad(self) -> int | None:
        return self.problems[0].index if self.problems else None

    def summary(self) -> str:
        if self.ok:
            return (f"ok: {self.records} records, {self.commits} snapshots and "
                    f"{self.objects} objects verified\nhead {self.head}")
        first = self.problems[0]
        lines = [f"FAILED: first bad record is {first.index}: {first.what}"]
        lines += [f"  also record {problem.index}: {problem.what}"
                  for problem in self.problems[1:10]]
        if len(self.problems) > 10:
            lines.append(f"  ... and {len(self.problems) - 10} more")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "records": self.records, "head": self.head,
                "commits": self.commits, "objects": self.objects,
                "first_bad": self.first_bad,
                "problems": [{"index": p.index, "what": p.what} for p in self.problems]}


class _Checker:
    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.problems: list[Problem] = []
        self.records: list[dict[str, Any] | None] = []
        self.hashes: list[str] = []
        self.seen_objects: set[bytes] = set()
        self.commits = 0

    def bad(self, index: int, what: str) -> None:
        self.problems.append(Problem(index=index, what=what))

    # -- the chain ------------------------------------------------------------------

    def chain(self, data: bytes) -> None:
        lines = data.split(b"\n")
        tail = lines.pop()  # after the final newline: empty unless the last line is torn
        expected_prev = GENESIS_PREV
        for index, line in enumerate(lines):
            record = self._record(index, line, expected_prev)
            self.records.append(record)
            stored = record.get("hash") if record is not None else None
            # Link the next record to what this one *claims*, so one damaged
            # record is reported once, not at every record after it.
            expected_prev = stored if isinstance(stored, str) else "?"
            self.hashes.append(expected_prev)
        if tail:
            self.bad(len(lines), "the last record is incomplete (cut short)")
        if not self.records:
            return
        first = self.records[0]
        if first is not None and first.get("type") != "genesis":
            self.bad(0, "the chain does not start with its genesis record (records were "
                        "deleted from the front)")

    def _record(self, index: int, line: bytes, expected_prev: str) -> dict[str, Any] | None:
        try:
            record = json.loads(line)
        except ValueError as error:
            self.bad(index, f"it is not valid JSON ({error.__class__.__name__})")
            return None
        if type(record) is not dict:
            self.bad(index, "it is not a JSON object")
            return None
        try:
            if canonical(record) != line:
                self.bad(index, "it is not in canonical form (it was edited)")
        except (TypeError, ValueError):
            self.bad(index, "it holds values the canonical form does not allow")
            return None
        if record.get("index") != index:
            self.bad(index, f"it says it is record {record.get('index')!r} (records were "
                            "deleted, inserted or reordered)")
        elif record.get("prev") != expected_prev:
            self.bad(index, "its prev does not match the hash of the record before it "
                            "(records were deleted, inserted or reordered)")
        if record_hash(record) != record.get("hash"):
            self.bad(index, "its hash does not match its content (it was altered)")
        return record

    # -- payloads -----------------------------------------------------------------------

    def payloads(self) -> None:
        erased: dict[str, int] = {}
        for index, record in enumerate(self.records):
            if record is not None and record.get("type") == "erasure":
                erased.setdefault(str(record.get("subject")), index)
        directory = Path(self.workspace.path) / DIRECTORY / PAYLOADS
        for index, record in enumerate(self.records):
            if record is None or record.get("type") != "op":
                continue
            for ref, subjects in _refs(record):
                path = directory / ref
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    if not any(erased.get(s, -1) > index for s in subjects):
                        self.bad(index, f"its payload {ref[:16]} is missing (deleted without "
                                        "a recorded erasure)")
                    continue
                if hashlib.sha256(data).hexdigest() != ref:
                    self.bad(index, f"its payload {ref[:16]} was modified")

    # -- snapshots and history -------------------------------------------------------------

    def snapshots(self, check_objects: bool) -> None:
        genesis = self.records[0] if self.records else None
        adopted = genesis.get("adopts") if genesis is not None else None
        voided = {record.get("voids") for record in self.records
                  if record is not None and record.get("type") == "void"}
        self._voids()
        previous_commit: str | None = adopted if isinstance(adopted, str) else None
        previous_index = 0
        if previous_commit is not None:
            self._adoption(previous_commit)
            if check_objects:
                self._history_objects(previous_commit, 0)
        for index, record in enumerate(self.records):
            if (record is None or record.get("type") != "op"
                    or record.get("status") != "committed" or index in voided):
                continue
            commit = record.get("commit")
            if not isinstance(commit, str):
                self.bad(index, "a committed op without a commit id")
                continue
            self.commits += 1
            try:
                data = self.workspace.read_commit(bytes.fromhex(commit))
            except (KernosError, ValueError):
                self.bad(index, f"its snapshot commit {commit[:12]} is missing or unreadable")
                previous_commit, previous_index = commit, index
                continue
            parent = data.parents[0].hex() if data.parents else None
            if parent != previous_commit:
                self.bad(index, f"its commit {commit[:12]} has the parent "
                                f"{(parent or 'none')[:12]}, but the op recorded before it "
                                f"committed {(previous_commit or 'nothing')[:12]} (the history "
                                "was rewritten)")
            manifest = self._manifest(index, data.tree)
            if manifest is not None:
                self._agrees(index, record, manifest)
            if check_objects:
                self._objects(bytes.fromhex(commit), index, "commit")
            previous_commit, previous_index = commit, index
        head = self.workspace.head()
        head_hex = None if head is None else head.hex()
        if head_hex != previous_commit:
            self._head_mismatch(head_hex, previous_commit, previous_index)

    def _adoption(self, commit: str) -> None:
        """A genesis may adopt only history that was never audited (it predates the log)."""
        try:
            data = self.workspace.read_commit(bytes.fromhex(commit))
        except (KernosError, ValueError):
            self.bad(0, f"it adopts the commit {commit[:12]}, which is missing")
            return
        manifest = self._manifest(0, data.tree)
        if manifest is not None and isinstance((manifest.get("facts") or {}).get("audit"), dict):
            self.bad(0, f"it adopts {commit[:12]} as history from before the log, but that "
                        "snapshot was audited: the audit log was deleted and started afresh")

    def _voids(self) -> None:
        """A void is true only for a commit that never became visible (it does not exist)."""
        for index, record in enumerate(self.records):
            if record is None or record.get("type") != "void":
                continue
            target = record.get("voids")
            voided = self.records[target] if type(target) is int and 0 <= target < index else None
            if voided is None or voided.get("type") != "op" or voided.get(
                    "status") != "committed":
                self.bad(index, f"it voids {target!r}, which is not an earlier committed op")
                continue
            commit = voided.get("commit")
            try:
                self.workspace.read_commit(bytes.fromhex(str(commit)))
            except (KernosError, ValueError):
                continue
            self.bad(index, f"it voids op {voided.get('op')}, but that op's commit "
                            f"{str(commit)[:12]} exists: the op did happen (a forged void)")

    def _head_mismatch(self, head: str | None, expected: str | None, last: int) -> None:
        ahead = []
        if head is not None:
            for sha, _commit in self.workspace.history(bytes.fromhex(head)):
                if sha.hex() == expected:
                    break
                ahead.append(sha.hex())
            else:
                if expected is not None:
                    self.bad(last, f"the branch points at {head[:12]}, which does not descend "
                                   f"from this record's commit {expected[:12]} (the history "
                                   "was rewritten or reset)")
                    return
        if head is None:
            self.bad(last, "the history's branch is gone")
            return
        self.bad(len(self.records),
                 f"{len(ahead)} snapshot(s) after record {last}'s commit have no audit record "
                 f"(newest {head[:12]}): records were truncated or deleted")

    def _manifest(self, index: int, tree: bytes) -> dict[str, Any] | None:
        try:
            _, data = self.workspace.read_object(tree)
            entries = {entry.name: entry.sha for entry in decode_tree(data)}
            _kind, raw = self.workspace.read_object(entries[MANIFEST])
            manifest: dict[str, Any] = json.loads(raw)
            return manifest
        except (KernosError, KeyError, ValueError):
            self.bad(index, "its snapshot's manifest is unreadable")
            return None

    def _agrees(self, index: int, record: dict[str, Any], manifest: dict[str, Any]) -> None:
        for key in ("op", "principal"):
            if manifest.get(key) != record.get(key):
                self.bad(index, f"its {key} {record.get(key)!r} differs from its snapshot's "
                                f"{manifest.get(key)!r}")
        if record.get("changes") is not None and manifest.get("changes") != record["changes"]:
            self.bad(index, "its changes differ from its snapshot's")
        binding = (manifest.get("facts") or {}).get("audit")
        if not isinstance(binding, dict):
            self.bad(index, "its snapshot does not bind the audit chain")
            return
        if binding.get("index") != index:
            self.bad(index, f"its snapshot was committed as record {binding.get('index')!r}")
        start = binding.get("from")
        bound = binding.get("hashes")
        if type(start) is not int or type(bound) is not list:
            self.bad(index, "its snapshot's binding of the chain is malformed")
            return
        for offset, expected in enumerate(bound):
            position = start + offset
            if position >= len(self.hashes) or self.hashes[position] != expected:
                self.bad(position, f"its hash differs from the one record {index}'s snapshot "
                                   "bound when it committed (the record was rewritten)")
                return

    def _history_objects(self, commit: str, index: int) -> None:
        try:
            for sha, _data in self.workspace.history(bytes.fromhex(commit)):
                self._objects(sha, index, "commit")
        except KernosError as error:
            self.bad(index, f"the history it adopts is unreadable ({error})")

    def _objects(self, root: bytes, index: int, path: str) -> None:
        """Re-hash every object ``root`` reaches that no earlier snapshot reached, once each."""
        stack = [(root, path)]
        while stack:
            sha, where = stack.pop()
            if sha in self.seen_objects:
                continue
            self.seen_objects.add(sha)
            try:
                kind, data = self.workspace.objects.read(sha)
            except Exception as error:
                self.bad(index, f"the object {sha.hex()[:12]} ({where}) of its snapshot is "
                                f"unreadable ({type(error).__name__})")
                continue
            if object_id(kind, data) != sha:
                self.bad(index, f"the object {sha.hex()[:12]} ({where}) of its snapshot was "
                                "modified (its content no longer matches its id)")
                continue
            if kind == b"commit":
                stack.append((bytes.fromhex(data.split(b"\n", 1)[0].split(b" ")[1].decode()),
                              "tree"))
            elif kind == b"tree":
                try:
                    entries = decode_tree(data)
                except (ValueError, UnicodeDecodeError):
                    continue
                prefix = "" if where == "tree" else where + "/"
                stack.extend((entry.sha, prefix + entry.name) for entry in reversed(entries)
                             if entry.sha not in self.seen_objects)

    # -- anchor -----------------------------------------------------------------------------

    def anchor(self, anchor: str) -> None:
        index, expected = parse_anchor(anchor)
        if index >= len(self.records):
            self.bad(len(self.records), f"the anchored record {index} is gone (the log holds "
                                        f"{len(self.records)}): the log was truncated")
        elif self.hashes[index] != expected:
            self.bad(index, "it differs from the anchor (the log was rewritten)")


def parse_anchor(anchor: str) -> tuple[int, str]:
    """``INDEX:HASH`` as verify prints it, or UsageError."""
    index_text, sep, expected = anchor.strip().partition(":")
    if (not sep or not index_text.isdigit() or len(expected) != 64
            or any(c not in "0123456789abcdef" for c in expected)):
        raise UsageError(f"the anchor {anchor[:80]!r} is not INDEX:HASH as `kernos audit "
                         "verify` prints it (a record number, a colon, 64 hex digits)")
    return int(index_text), expected


def _refs(record: dict[str, Any]) -> list[tuple[str, list[str]]]:
    found = []
    code = record.get("code")
    if isinstance(code, dict) and isinstance(code.get("ref"), str):
        found.append((code["ref"], list(code.get("sealed", []))))
    for event in record.get("events") or []:
        if isinstance(event, dict) and isinstance(event.get("ref"), str):
            found.append((event["ref"], list(event.get("subjects", []))))
    return found


def verify(path: str | Path, *, anchor: str | None = None,
           objects: bool = True) -> VerifyReport:
    """Verify the workspace at ``path`` (read-only; a kernel may be running on it)."""
    if anchor is not None:
        parse_anchor(anchor)  # a malformed anchor is a usage error, not tampering
    with Workspace.open(path, writable=False, create=False) as workspace:
        checker = _Checker(workspace)
        chain = Path(workspace.path) / DIRECTORY / CHAIN
        try:
            data = chain.read_bytes()
        except FileNotFoundError:
            data = b""
            checker.bad(0, f"the audit log {chain} is missing")
        checker.chain(data)
        checker.payloads()
        if checker.records:
            checker.snapshots(objects)
        elif workspace.head() is not None:
            checker.bad(0, "the audit log holds no records, but the history holds snapshots "
                           "with no audit record: the log was truncated or emptied")
        if anchor is not None:
            checker.anchor(anchor)
        problems = sorted(checker.problems, key=lambda problem: problem.index)
        last = len(checker.hashes) - 1
        head = f"{last}:{checker.hashes[last]}" if last >= 0 else f"-1:{GENESIS_PREV}"
        return VerifyReport(records=len(checker.records), head=head, commits=checker.commits,
                            objects=len(checker.seen_objects), problems=tuple(problems))
