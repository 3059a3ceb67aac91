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

With ``since=INDEX:HASH`` (``kernos audit verify --since``) it checks only
what came after an anchor, at a cost that does not grow with the log: it
reads the chain backwards from its end to the line that claims record
``INDEX`` (see ``suffix.py``), which must hash to ``HASH``; each later record
must name its predecessor's hash, as usual.  Then the same checks run on the
records after the anchor, the snapshots they name (their manifests, their
parents from the anchor's commit on, every object they reach) and the
branch.  Nothing before the anchor is read, except a record that a void in
the range names; tampering there is outside the range, and the report says
so.  Erasure only appends, so an anchor stays valid across it.

What a chain alone cannot show: someone who can write the workspace can
rewrite the whole suffix after the last commit, or every record and every
snapshot consistently.  An *anchor* closes that gap: copy the head digest
that verify prints (``INDEX:HASH``) somewhere the workspace's writers cannot
change, and pass it back with ``--anchor``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kernos.audit.canonical import canonical
from kernos.audit.log import CHAIN, DIRECTORY, GENESIS_PREV, PAYLOADS, record_hash
from kernos.audit.report import Problem, VerifyReport
from kernos.audit.suffix import Suffix, read_suffix
from kernos.errors import KernosError, UsageError
from kernos.store.objects import decode_tree, object_id
from kernos.store.snapshots import MANIFEST
from kernos.store.workspace import Workspace

__all__ = ["Problem", "VerifyReport", "verify"]


class _Checker:
    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.problems: list[Problem] = []
        self.records: list[dict[str, Any] | None] = []
        self.hashes: list[str] = []
        self.seen_objects: set[bytes] = set()
        self.commits = 0
        self.base = 0
        """The index of ``records[0]`` (the anchor's, with ``since``)."""
        self.since: int | None = None
        """With ``since``: the anchor's index; the range verified starts after it."""
        self.suffix: Suffix | None = None

    def bad(self, index: int, what: str) -> None:
        self.problems.append(Problem(index=index, what=what))

    @property
    def end(self) -> int:
        """The index after the newest record read."""
        return self.base + len(self.records)

    @property
    def first(self) -> int:
        """The first record in the range verified."""
        return 0 if self.since is None else self.since + 1

    def in_range(self) -> list[tuple[int, dict[str, Any] | None]]:
        """(index, record) of every record in the range verified."""
        skip = self.first - self.base
        return [(self.base + skip + position, record)
                for position, record in enumerate(self.records[skip:])]

    def record_at(self, index: int) -> dict[str, Any] | None:
        position = index - self.base
        return self.records[position] if 0 <= position < len(self.records) else None

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

    def since_chain(self, chain: Path, anchor: str) -> bool:
        """Read the anchor and the records after it; False if the anchor is not there."""
        index, expected = parse_anchor(anchor)
        try:
            with open(chain, "rb") as handle:
                size = handle.seek(0, 2)
                self.suffix = suffix = read_suffix(handle, size, index)
        except FileNotFoundError:
            self.bad(0, f"the audit log {chain} is missing")
            return False
        if suffix.anchor is None:
            self._anchor_not_found(suffix)
            return False
        self.base = self.since = index
        record = self._record(index, suffix.anchor.raw, None, suffix.anchor.record)
        stored = None if record is None else record.get("hash")
        if stored != expected:
            self.bad(index, f"it differs from the anchor {index}:{expected[:12]}... (the log "
                            "was rewritten)")
        self.records.append(record)
        expected_prev = stored if isinstance(stored, str) else "?"
        self.hashes.append(expected_prev)
        for position, line in enumerate(suffix.after, start=index + 1):
            record = self._record(position, line.raw, expected_prev, line.record)
            self.records.append(record)
            stored = record.get("hash") if record is not None else None
            expected_prev = stored if isinstance(stored, str) else "?"
            self.hashes.append(expected_prev)
        if suffix.tail:
            self.bad(self.end, "the last record is incomplete (cut short)")
        return True

    def _anchor_not_found(self, suffix: Suffix) -> None:
        index = suffix.index
        newer = [line.claimed_index for line in suffix.after if line.claimed_index is not None]
        if newer:
            self.bad(index, f"no line of the log claims to be the anchored record {index} "
                            "(it was altered, or records around it were deleted or "
                            "reordered); verify without --since to find the first bad record")
        elif suffix.stopped_at is not None:
            self.bad(suffix.stopped_at + 1,
                     f"the anchored record {index} is gone (the log ends at record "
                     f"{suffix.stopped_at}): the log was truncated, or the anchor is from "
                     "another workspace")
        else:
            self.bad(0, f"the anchored record {index} is gone: no line of the log claims an "
                        "index (the log was emptied or overwritten)")

    def _record(self, index: int, line: bytes, expected_prev: str | None,
                parsed: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Check one line; ``expected_prev`` None skips the link (the anchor's is not read)."""
        if parsed is None:
            try:
                loaded = json.loads(line)
            except ValueError as error:
                self.bad(index, f"it is not valid JSON ({error.__class__.__name__})")
                return None
            if type(loaded) is not dict:
                self.bad(index, "it is not a JSON object")
                return None
            parsed = loaded
        record: dict[str, Any] = parsed
        try:
            if canonical(record) != line:
                self.bad(index, "it is not in canonical form (it was edited)")
        except (TypeError, ValueError):
            self.bad(index, "it holds values the canonical form does not allow")
            return None
        if record.get("index") != index:
            self.bad(index, f"it says it is record {record.get('index')!r} (records were "
                            "deleted, inserted or reordered)")
        elif expected_prev is not None and record.get("prev") != expected_prev:
            self.bad(index, "its prev does not match the hash of the record before it "
                            "(records were deleted, inserted or reordered)")
        if record_hash(record) != record.get("hash"):
            self.bad(index, "its hash does not match its content (it was altered)")
        return record

    # -- payloads -----------------------------------------------------------------------

    def payloads(self) -> None:
        erased: dict[str, int] = {}
        for index, record in self.in_range():
            if record is not None and record.get("type") == "erasure":
                erased.setdefault(str(record.get("subject")), index)
        directory = Path(self.workspace.path) / DIRECTORY / PAYLOADS
        for index, record in self.in_range():
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
        voided = {record.get("voids") for _index, record in self.in_range()
                  if record is not None and record.get("type") == "void"}
        self._voids()
        previous_commit: str | None = None
        previous_index = self.base
        # Whether the commit the next one must descend from is known: with
        # ``since`` it is only if the anchor itself committed (the records
        # before it are not read).
        known = True
        if self.since is None:
            genesis = self.records[0] if self.records else None
            adopted = genesis.get("adopts") if genesis is not None else None
            previous_commit = adopted if isinstance(adopted, str) else None
            if previous_commit is not None:
                self._adoption(previous_commit)
                if check_objects:
                    self._history_objects(previous_commit, 0)
        else:
            anchor = self.records[0]
            committed = (anchor is not None and anchor.get("type") == "op"
                         and anchor.get("status") == "committed"
                         and isinstance(anchor.get("commit"), str))
            if committed and self.since not in voided:
                assert anchor is not None
                previous_commit = str(anchor["commit"])
            known = previous_commit is not None
        for index, record in self.in_range():
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
            if known and parent != previous_commit:
                self.bad(index, f"its commit {commit[:12]} has the parent "
                                f"{(parent or 'none')[:12]}, but the op recorded before it "
                                f"committed {(previous_commit or 'nothing')[:12]} (the history "
                                "was rewritten)")
            manifest = self._manifest(index, data.tree)
            if manifest is not None:
                self._agrees(index, record, manifest)
            if check_objects:
                self._objects(bytes.fromhex(commit), index, "commit")
            previous_commit, previous_index, known = commit, index, True
        head = self.workspace.head()
        head_hex = None if head is None else head.hex()
        if not known:
            self._unrecorded_after_anchor(head_hex)
        elif head_hex != previous_commit:
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
        for index, record in self.in_range():
            if record is None or record.get("type") != "void":
                continue
            target = record.get("voids")
            voided = None
            if type(target) is int and self.base <= target < index:
                voided = self.record_at(target)
            elif type(target) is int and 0 <= target < self.base and self.suffix is not None:
                found = self.suffix.before(target)  # before the anchor: read for this alone
                voided = None if found is None else found.record
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
        self.bad(self.end,
                 f"{len(ahead)} snapshot(s) after record {last}'s commit have no audit record "
                 f"(newest {head[:12]}): records were truncated or deleted")

    def _unrecorded_after_anchor(self, head: str | None) -> None:
        """Without a known last commit: no snapshot may say it was committed after the anchor."""
        assert self.since is not None
        if head is None:
            return
        ahead = 0
        try:
            for _sha, commit in self.workspace.history(bytes.fromhex(head)):
                bound = _bound_index(self.workspace, commit.tree)
                if bound is None or bound <= self.since:
                    break
                ahead += 1
        except KernosError as error:
            self.bad(self.end, f"the history after the anchor is unreadable ({error})")
            return
        if ahead:
            self.bad(self.end, f"{ahead} snapshot(s) committed after the anchored record "
                               f"{self.since} have no audit record (newest {head[:12]}): "
                               "records were truncated or deleted")

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
            if position < self.base:
                continue  # before the anchor: not read
            if position >= self.end or self.hashes[position - self.base] != expected:
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
        if index >= self.end:
            self.bad(self.end, f"the anchored record {index} is gone (the log holds "
                               f"{self.end}): the log was truncated")
        elif self.hashes[index - self.base] != expected:
            self.bad(index, "it differs from the anchor (the log was rewritten)")


def parse_anchor(anchor: str) -> tuple[int, str]:
    """``INDEX:HASH`` as verify prints it, or UsageError."""
    index_text, sep, expected = anchor.strip().partition(":")
    if (not sep or not index_text.isdigit() or len(expected) != 64
            or any(c not in "0123456789abcdef" for c in expected)):
        raise UsageError(f"the anchor {anchor[:80]!r} is not INDEX:HASH as `kernos audit "
                         "verify` prints it (a record number, a colon, 64 hex digits)")
    return int(index_text), expected


def _bound_index(workspace: Workspace, tree: bytes) -> int | None:
    """The record index a snapshot's manifest says its op got, if it binds the chain."""
    try:
        _, data = workspace.read_object(tree)
        entries = {entry.name: entry.sha for entry in decode_tree(data)}
        _kind, raw = workspace.read_object(entries[MANIFEST])
        binding = (json.loads(raw).get("facts") or {}).get("audit")
    except (KernosError, KeyError, ValueError, AttributeError):
        return None
    index = binding.get("index") if isinstance(binding, dict) else None
    return index if type(index) is int else None


def _refs(record: dict[str, Any]) -> list[tuple[str, list[str]]]:
    found = []
    code = record.get("code")
    if isinstance(code, dict) and isinstance(code.get("ref"), str):
        found.append((code["ref"], list(code.get("sealed", []))))
    for event in record.get("events") or []:
        if isinstance(event, dict) and isinstance(event.get("ref"), str):
            found.append((event["ref"], list(event.get("subjects", []))))
    return found


def verify(path: str | Path, *, anchor: str | None = None, since: str | None = None,
           objects: bool = True) -> VerifyReport:
    """Verify the workspace at ``path`` (read-only; a kernel may be running on it).

    ``anchor`` (``INDEX:HASH``): the chain must still hold that record with that
    hash.  ``since`` (``INDEX:HASH``): verify only what came after that record,
    which must hold that hash, without reading the log before it (see the
    module docstring).  A malformed one is a :class:`UsageError`.
    """
    # A malformed anchor is a usage error, not tampering.
    if anchor is not None:
        anchored, _ = parse_anchor(anchor)
    if since is not None:
        start, _ = parse_anchor(since)
        if anchor is not None and anchored < start:
            raise UsageError(f"the --anchor record {anchored} lies before the --since anchor "
                             f"{start}, outside the range verified; give an --anchor at or "
                             "after it, or verify without --since")
    with Workspace.open(path, writable=False, create=False) as workspace:
        checker = _Checker(workspace)
        chain = Path(workspace.path) / DIRECTORY / CHAIN
        if since is not None:
            found = checker.since_chain(chain, since)
        else:
            found = True
            try:
                data = chain.read_bytes()
            except FileNotFoundError:
                data = b""
                checker.bad(0, f"the audit log {chain} is missing")
            checker.chain(data)
        if found:
            checker.payloads()
            if checker.records:
                checker.snapshots(objects)
            elif workspace.head() is not None:
                checker.bad(0, "the audit log holds no records, but the history holds "
                               "snapshots with no audit record: the log was truncated or "
                               "emptied")
            if anchor is not None:
                checker.anchor(anchor)
        problems = sorted(checker.problems, key=lambda problem: problem.index)
        last = checker.end - 1
        head = (f"{last}:{checker.hashes[-1]}" if checker.hashes else f"-1:{GENESIS_PREV}")
        return VerifyReport(records=checker.end, head=head, commits=checker.commits,
                            objects=len(checker.seen_objects), problems=tuple(problems),
                            since=None if since is None else parse_anchor(since)[0])
