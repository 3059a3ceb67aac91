"""Verify a workspace's audit chain and history, from disk, in any process.

:func:`verify` checks, and names the first bad record for, each of these:

* the chain: every line is canonical JSON, in sequence (``index``), linked to
  the one before (``prev``), and hashes to its ``hash``;
* the signatures (``signing.py``): a signed record's signature verifies with
  the key it names, and once one record is signed every later one is (the
  records of an older Kernos come first); every signer is a key this
  workspace owns or trusts (``kernos.store.trust``), save a fresh clone's
  signers that await the human's trust, which the report marks; it counts the
  unsigned records from before signing;
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
* an anchor, if given: the chain still holds that record with that hash;
* a fork's origin (a genesis with ``forked_from``, :mod:`kernos.fork`): if its
  source is still there, the source's chain holds the record the genesis
  names with that hash, and the commit it was forked at; the report says
  where it came from (``origin``), and whether that could be checked.

The snapshot and history checks live in ``verify_history.py``.  They follow
``prune`` records (``kernos prune``, see ``pruning.py``): a record whose
snapshot a later prune deleted verifies by the chain alone, and the report
says which prune deleted how many; a snapshot a prune gave a new id is
checked at that id, and its recorded id must be what the new commit's bytes
hash to with its old parent put back (so its tree, author, time and message
are the original's); the kept snapshots must still form the branch, in
order.  A commit missing *without* a prune record saying so is tampering,
as before.

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
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from kernos.audit.canonical import canonical
from kernos.audit.log import CHAIN, DIRECTORY, GENESIS_PREV, PAYLOADS, record_hash
from kernos.audit.origin import Origin, check_origin
from kernos.audit.report import Problem, Pruned, Signer, VerifyReport
from kernos.audit.signing import signature_problem, signer_of
from kernos.audit.suffix import Suffix, read_suffix
from kernos.audit.verify_history import HistoryChecks, HistorySource
from kernos.errors import UsageError
from kernos.store.identity import own_keys
from kernos.store.trust import Trust
from kernos.store.workspace import Workspace

__all__ = ["Problem", "VerifyReport", "verify", "verify_candidate"]


class _Checker(HistoryChecks):
    """The chain, the payloads and the anchor (the history checks are inherited)."""

    signing_began: int | None = None
    """The first signed record read."""
    unsigned = 0
    """Unsigned records read before it (from before signing existed)."""

    def __init__(self, workspace: HistorySource) -> None:
        super().__init__(workspace)
        self.signers: dict[str, int] = {}
        """Key id -> records it signed (among those read)."""
        self.first_signed: dict[str, int] = {}
        """Key id -> the first record it signed."""
        self._pending_signature: tuple[int, dict[str, Any], bool] | None = None
        """The last signed record read, its signature not checked yet (``_signature``)."""
        self.payload_dirs: list[Path] = [Path(workspace.path) / DIRECTORY / PAYLOADS]
        """Where payloads are looked up, in order."""
        self.arriving: Mapping[str, bytes] = {}
        """Payloads not in the workspace yet, by name (a pull's)."""

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
        self._signatures_done()
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
        try:
            with open(chain, "rb") as handle:
                return self.since_lines(handle, handle.seek(0, 2), anchor)
        except FileNotFoundError:
            self.bad(0, f"the audit log {chain} is missing")
            return False

    def since_lines(self, handle: IO[bytes], size: int, anchor: str) -> bool:
        """:meth:`since_chain` on the chain ``handle`` reads (``size`` bytes)."""
        index, expected = parse_anchor(anchor)
        self.suffix = suffix = read_suffix(handle, size, index)
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
        self._signatures_done()
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
        altered = record_hash(record) != record.get("hash")
        if altered:
            self.bad(index, "its hash does not match its content (it was altered)")
        self._signature(index, record, altered=altered)
        return record

    def _signature(self, index: int, record: dict[str, Any], *, altered: bool) -> None:
        """Once records are signed, every later one must be (an unsigned one was written by
        an older Kernos, or forged); a signed record's signature must verify.

        Each signature covers ``prev``, the hash of everything before, so the signature of
        the last record of a run by one signer vouches for the whole run: a record is
        checked itself only when the next one does not continue its run intact (another
        signer, a broken link or hash) or when it is the last one (:meth:`_signatures_done`).
        An ed25519 check costs about 0.1 ms; a chain's runs are long.  An altered record
        (its hash does not match) is reported once, for its hash."""
        pending = self._pending_signature
        signer = signer_of(record)
        if pending is not None:
            before_index, before, _ = pending
            continued = (signer is not None and signer == signer_of(before) and not altered
                         and record.get("index") == before_index + 1
                         and record.get("prev") == before.get("hash"))
            if not continued:
                self._check_signature(*pending)
        self._pending_signature = None
        if signer is None:
            problem = signature_problem(record)  # a sig without a signer
            if problem is not None and not altered:
                self.bad(index, problem)
            if self.signing_began is not None:
                self.bad(index, f"it is unsigned, but record {self.signing_began} and the "
                                "signed records after it show signing had begun: it was "
                                "written by an older Kernos, or forged")
            else:
                self.unsigned += 1
            return
        self._pending_signature = (index, record, altered)
        if self.signing_began is None:
            self.signing_began = index
        if signer not in self.signers:
            self.first_signed[signer] = index
        self.signers[signer] = self.signers.get(signer, 0) + 1

    def _check_signature(self, index: int, record: dict[str, Any], altered: bool) -> None:
        problem = signature_problem(record)
        if problem is not None and not altered:
            self.bad(index, problem)

    def _signatures_done(self) -> None:
        """Check the last signed record read (see :meth:`_signature`)."""
        if self._pending_signature is not None:
            self._check_signature(*self._pending_signature)
            self._pending_signature = None

    def trust(self, trust: Trust) -> tuple[Signer, ...]:
        """Every signer must be a key this workspace owns or trusts; a clone's signers that
        await the human's trust (``kernos.store.trust``) are reported as such, not as
        problems.  The signers, for the report."""
        awaiting = set((trust.untrusted or {}).get("signers") or ())
        for key, first in self.first_signed.items():
            if not trust.trusts(key) and key not in awaiting:
                self.bad(first, f"it is signed by {key}, a key this workspace neither owns nor "
                                "trusts: someone else wrote it. If that key is a writer's you "
                                f"work with, `kernos remote trust {key}`; if not, the chain "
                                "was tampered with")
        return tuple(Signer(key=key, records=count, trusted=trust.trusts(key))
                     for key, count in self.signers.items())

    # -- payloads -----------------------------------------------------------------------

    def payloads(self) -> None:
        # Subject -> its latest erasure: a subject given a new key after an erasure can
        # be erased again, and that erasure explains the payloads sealed in between.
        erased: dict[str, int] = {}
        for index, record in self.in_range():
            if record is not None and record.get("type") == "erasure":
                erased[str(record.get("subject"))] = index
        for index, record in self.in_range():
            if record is None or record.get("type") != "op":
                continue
            for ref, subjects in _refs(record):
                try:
                    data = self._payload(ref)
                except FileNotFoundError:
                    if not any(erased.get(s, -1) > index for s in subjects):
                        self.bad(index, f"its payload {ref[:16]} is missing (deleted without "
                                        "a recorded erasure)")
                    continue
                if hashlib.sha256(data).hexdigest() != ref:
                    self.bad(index, f"its payload {ref[:16]} was modified")

    def _payload(self, ref: str) -> bytes:
        """A payload's bytes, from :attr:`arriving` or the first of :attr:`payload_dirs`
        that holds it."""
        if ref in self.arriving:
            return self.arriving[ref]
        for directory in self.payload_dirs:
            try:
                return (directory / ref).read_bytes()
            except FileNotFoundError:
                continue
        raise FileNotFoundError(ref)

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


def _refs(record: dict[str, Any]) -> list[tuple[str, list[str]]]:
    from kernos.audit.erasure import sealed_fields

    found = []
    for field in sealed_fields(record):
        if isinstance(field.get("ref"), str):
            found.append((field["ref"], list(field.get("sealed", []))))
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
        emptied = False  # the file is there with nothing in it, not even its genesis
        if since is not None:
            found = checker.since_chain(chain, since)
        else:
            found = True
            try:
                data = chain.read_bytes()
            except FileNotFoundError:
                data = b""
                checker.bad(0, f"the audit log {chain} is missing")
            else:
                emptied = not data
            checker.chain(data)
        if found:
            checker.payloads()
            if checker.records:
                checker.snapshots(objects)
            elif workspace.head() is not None:
                checker.bad(0, "the audit log holds no records, but the history holds "
                               "snapshots with no audit record: the log was truncated or "
                               "emptied")
            elif emptied:
                # The log is created by its genesis record's append: empty, it was emptied.
                checker.bad(0, f"the audit log {chain} is empty, but every log starts with "
                               "its genesis record: its records were deleted")
            if anchor is not None:
                checker.anchor(anchor)
        origin = _origin(workspace, checker)
        signers = checker.trust(Trust.load(Path(workspace.path),
                                           own=own_keys(Path(workspace.path))))
        problems = sorted(checker.problems, key=lambda problem: problem.index)
        last = checker.end - 1
        head = (f"{last}:{checker.hashes[-1]}" if checker.hashes else f"-1:{GENESIS_PREV}")
        pruned = tuple(Pruned(record=p.index, at=p.at, snapshots=len(p.pruned),
                              rewritten=len(p.rewritten),
                              records=checker.pruned_records.get(p.index, 0))
                       for p in checker.prunes.prunings)
        return VerifyReport(records=checker.end, head=head, commits=checker.commits,
                            adopted=checker.adopted,
                            objects=len(checker.seen_objects), problems=tuple(problems),
                            since=None if since is None else parse_anchor(since)[0],
                            pruned=pruned, unfinished=checker.unfinished,
                            origin=None if origin is None else origin.describe(),
                            signers=signers, unsigned=checker.unsigned)


def _origin(workspace: Workspace, checker: _Checker) -> Origin | None:
    """A fork's origin (``kernos.fork``), checked against its source; a disagreement is a
    problem of the genesis record."""
    genesis = checker.records[0] if checker.records and checker.since is None else None
    if genesis is None or genesis.get("type") != "genesis":
        return None
    origin = check_origin(workspace.path, genesis)
    for problem in [] if origin is None else origin.problems:
        checker.bad(0, f"its origin: {problem}")
    return origin


def verify_candidate(source: HistorySource, chain: IO[bytes], size: int, *,
                     since: str | None, known_head: str | None, trust: Trust,
                     arriving: Mapping[str, bytes], objects: bool = True) -> VerifyReport:
    """Verify what a workspace *would* be, before it is: ``source`` reads its history
    (its head, its objects), ``chain`` its audit chain (``size`` bytes), ``arriving``
    the payloads it would gain (by name; the others are the workspace's).  A pull or a
    clone (``kernos.remote.pull``) lands only what this passes.

    With ``since`` (``INDEX:HASH`` of the workspace's own newest record), only the records
    after it are checked, and ``known_head`` (the workspace's head now) is the branch they
    must continue; without it, the whole chain from its genesis.  Every signer must be a
    key ``trust`` holds, save those it lists as awaiting the human's trust.  ``objects``:
    re-hash every object the new snapshots reach (a caller whose objects git's own
    ``index-pack`` just hashed, as a fetch's are, may skip it).
    """
    checker = _Checker(source)
    checker.arriving = arriving
    if since is not None:
        checker.known_head = known_head
        found = checker.since_lines(chain, size, since)
    else:
        found = True
        chain.seek(0)
        checker.chain(chain.read(size))
    if found:
        checker.payloads()
        if checker.records:
            checker.snapshots(objects)
        elif source.head() is not None:
            checker.bad(0, "it holds snapshots but no audit record")
    signers = checker.trust(trust)
    problems = sorted(checker.problems, key=lambda problem: problem.index)
    last = checker.end - 1
    head = f"{last}:{checker.hashes[-1]}" if checker.hashes else f"-1:{GENESIS_PREV}"
    return VerifyReport(records=checker.end, head=head, commits=checker.commits,
                        adopted=checker.adopted,
                        objects=len(checker.seen_objects), problems=tuple(problems),
                        since=None if since is None else parse_anchor(since)[0],
                        unfinished=checker.unfinished, signers=signers,
                        unsigned=checker.unsigned)
