"""What a pull or a clone takes from a remote: fetched aside, checked whole, then landed.

A remote is untrusted input: anyone who can write to it can put anything
there with plain git.  So nothing it holds reaches the workspace until all of
it has been checked, and a refusal leaves the workspace byte for byte as it
was.

1. **Fetch aside.**  One ``git fetch`` (one reading of the remote's refs, so
   ``main`` and the audit chain are from the same moment) into a *quarantine*
   repository, ``<workspace>/incoming/q.git``, which borrows the history's
   objects and touches nothing else (:mod:`kernos.remote.quarantine`).
2. **Check everything** (:func:`take`), refusing with
   :class:`~kernos.errors.RemoteRefused` (which names the record, commit or
   path) at the first thing wrong:

   * *paths*: every file of the audit, LLM and metadata trees has exactly the
     shape a push gives it (:data:`SHAPES`), is a plain file, and is no bigger
     than :data:`MAX_FILE_BYTES`; chain and ledger segments are numbered
     without a gap, full but for the last, of whole lines no longer than
     :data:`MAX_LINE_BYTES`, each a JSON object;
   * *content*: an audit payload hashes to its name, an LLM object too (or is
     a sealed or erased envelope, whose plain bytes only the keys here could
     show), a recording names a response by its hash;
   * *the chain*: this workspace's chain is a prefix of the remote's (else
     :class:`~kernos.errors.RemoteDiverged`), and what the workspace would be
     after the pull passes :func:`kernos.audit.verify.verify_candidate`: every
     new record canonical, in sequence, linked, hashing to its hash and
     signed by a key this workspace trusts (``kernos.store.trust``); every
     new commit named by exactly one record, with the parent the records
     before it say, its manifest agreeing with its record and binding the
     chain as it stood; ``main`` at the last one (every fetched object was
     hashed by git's own ``index-pack`` to get its name, and the fetch checked
     that the refs reach nothing missing).  A prune record is honoured only
     if the whole chain verifies with it (the snapshots it kept keep their
     trees; the head descends as recorded) and it maps this workspace's head
     into the remote's history.
     Unsigned new records (an older Kernos wrote them, or anyone) are refused
     unless the human accepts them for this pull.
   * *tracked files*: every new snapshot's ``files/`` tree is one a restore
     here accepts (:func:`kernos.files.contents.check_files_tree`: its index,
     every name, mode and chunk list, every link).  Which directories it may
     write outside the workspace is decided here, not by the remote
     (:mod:`kernos.files.here`).

3. **Land** (:mod:`kernos.remote.land`): the checked files and lines are
   written to ``incoming/`` and synced, then the intent file ``pulling`` is
   renamed into place, the one commit point; then objects, files, chain,
   ledger, branch and (after a prune) the deletion of what the prune deleted,
   each step idempotent.  A ``kill -9`` before the intent leaves the workspace
   as it was (the next writable open deletes ``incoming/``); after it, the next
   writable open finishes the pull.

What cannot be checked before the fetch: how much the remote sends.  The
sizes are checked once it is here, before any of it is read into memory.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernos import _faults
from kernos.audit.canonical import canonical, digest
from kernos.audit.signing import signer_of
from kernos.audit.verify import verify_candidate
from kernos.errors import RemoteDiverged, RemoteError, RemoteRefused, WorkspaceCorrupt
from kernos.files.contents import Contents, check_files_tree
from kernos.remote.git import git
from kernos.remote.prune import PrunedSince, prunes_since
from kernos.remote.quarantine import QUARANTINE, Candidate, Entry, Joined, Quarantine
from kernos.store.objects import TREE_MODE, decode_tree, object_id
from kernos.store.snapshots import FILES
from kernos.store.trust import Trust
from kernos.store.workspace import BRANCH, FORMAT, SETTINGS

__all__ = ["AUDIT_REF", "LLM_REF", "MAX_FILE_BYTES", "MAX_LINE_BYTES", "META_REF", "QUARANTINE",
           "SEGMENT_GROUP", "SEGMENT_LINES", "SHAPES", "Incoming", "Quarantine", "shape_of",
           "take", "whole_bytes"]

AUDIT_REF = "refs/kernos/audit"
LLM_REF = "refs/kernos/llm"
META_REF = "refs/kernos/meta"
SEGMENT_LINES = 64
"""Records (or ledger lines) per chain segment: a push rewrites only the last one."""
SEGMENT_GROUP = 256
"""Segments per directory of segments."""
MAX_LINE_BYTES = 16 << 20
"""The longest audit record or ledger line a pull accepts."""
MAX_FILE_BYTES = 256 << 20
"""The largest file (payload, LLM object, segment) a pull accepts."""
_SEGMENT = r"(?P<group>\d{5})/(?P<index>\d{8})\.jsonl"
_HEX = r"(?P<shard>[0-9a-f]{2})/(?P<name>[0-9a-f]{64})"
SHAPES: dict[str, dict[str, re.Pattern[str]]] = {
    "audit": {"chain": re.compile(f"chain/{_SEGMENT}"),
              "payload": re.compile(f"payloads/{_HEX}")},
    "llm": {"ledger": re.compile(f"calls/{_SEGMENT}"),
            "object": re.compile(f"objects/{_HEX}\\.json"),
            "recording": re.compile(f"recordings/{_HEX}")},
    "meta": {"workspace": re.compile("workspace\\.json"),
             "settings": re.compile("settings\\.json")},
}
"""Every path a push writes in each tree, exactly; a pull refuses any other."""
_TARGET = {("audit", "payload"): "audit/payloads/{name}",
           ("llm", "object"): "llm/objects/{name}.json",
           ("llm", "recording"): "llm/recordings/{name}"}
_REFS = {"audit": AUDIT_REF, "llm": LLM_REF, "meta": META_REF}
_SEALED_KEYS = ("$sealed", "$erased")


# -- what comes in ----------------------------------------------------------------------------


@dataclass(kw_only=True)
class Incoming:
    """Everything a pull (or clone) takes, checked; :mod:`kernos.remote.land` lands
    it."""

    remote: str
    url: str
    old_head: bytes | None
    new_head: bytes | None
    chain_size: int
    """Bytes of this workspace's chain it extends."""
    chain_add: bytes
    """The new records' lines."""
    ledger_size: int
    ledger_add: bytes
    files: dict[str, bytes] = field(default_factory=dict)
    """Workspace path (``audit/payloads/...``) -> the checked bytes, for files not here."""
    meta: dict[str, bytes] = field(default_factory=dict)
    """``workspace.json`` / ``settings.json`` (a clone takes them)."""
    prunes: PrunedSince | None = None
    """The remote's prunes this pull follows (None: a fast-forward)."""
    records: int = 0
    signers: dict[str, int] = field(default_factory=dict)
    """Key id -> new records it signed."""
    unsigned: int = 0
    """New records without a signature."""

    @property
    def changes(self) -> bool:
        return (self.new_head != self.old_head or bool(self.chain_add) or bool(self.ledger_add)
                or bool(self.files))


def take(workspace: Path, quarantine: Quarantine, *, url: str, name: str, head: bytes | None,
         trust: Trust, accept_unsigned: bool, clone: bool,
         awaiting: Callable[[Sequence[str]], Sequence[str]] | None = None) -> Incoming:
    """Fetch the remote into ``quarantine`` and check all of it against the workspace at
    ``workspace`` (its branch at ``head``); raise ``RemoteRefused`` / ``RemoteDiverged``
    at the first thing wrong (see the module docstring).

    ``awaiting`` (a clone): given the new records' signers, returns those to leave
    awaiting the human's trust instead of refusing them.
    """
    refs = quarantine.fetch(url, name, [head] if head is not None else [])
    _faults.point("pull.fetched")
    if clone and META_REF not in refs:
        raise RemoteError(f"{url} holds no Kernos workspace (it has no {META_REF}); push one "
                          "to it first with `kernos push`", remote=name)
    trees = {tree: _checked_tree(quarantine, name, tree, refs.get(ref))
             for tree, ref in _REFS.items()}
    remote_head = refs.get(BRANCH)
    chain_path = workspace / "audit" / "chain.jsonl"
    local_chain = whole_bytes(chain_path)
    new_lines, chain_size = _extension(quarantine, name, "audit chain", trees["audit"],
                                       "chain", local_chain)
    ledger = whole_bytes(workspace / "llm" / "calls.jsonl")
    ledger_lines, ledger_size = _extension(quarantine, name, "LLM ledger", trees["llm"],
                                           "ledger", ledger)
    incoming = Incoming(remote=name, url=url, old_head=head, new_head=head,
                        chain_size=chain_size, chain_add=b"".join(new_lines),
                        ledger_size=ledger_size, ledger_add=b"".join(ledger_lines),
                        records=len(new_lines))
    records = [_record(name, line, index) for index, line in
               enumerate(new_lines, start=local_chain.count(b"\n"))]
    for record in records:
        signer = signer_of(record)
        if signer is None:
            incoming.unsigned += 1
        else:
            incoming.signers[signer] = incoming.signers.get(signer, 0) + 1
    if incoming.unsigned and not accept_unsigned:
        first = next(r["index"] for r in records if signer_of(r) is None)
        raise RemoteRefused(
            f"Refused: the remote {name} holds {incoming.unsigned} unsigned audit record"
            f"{'' if incoming.unsigned == 1 else 's'} this workspace lacks (the first is "
            f"record {first}): anyone who can write to the remote could have written them. "
            "If its writer ran a Kernos from before signing, accept them once with "
            f"`--accept-unsigned`. Nothing was changed here.", remote=name, record=first)
    if new_lines:
        incoming.new_head = remote_head
        left = list(awaiting(sorted(incoming.signers))) if awaiting is not None else []
        if left:
            trust.mark_untrusted(url=url, signers=left, unsigned=0)
        else:  # a pull: who wrote a record is asked before what it says
            _check_signers(name, records, trust)
        incoming.files = _files(workspace, quarantine, name, trees)
        arriving = {target.rsplit("/", 1)[1]: data for target, data in incoming.files.items()
                    if target.startswith("audit/payloads/")}
        prunes = _check_candidate(workspace, quarantine, name, local_chain, new_lines,
                                  remote_head, head, trust, arriving)
        if remote_head is not None:
            _check_tracked_files(workspace, quarantine, name, remote_head, head)
        if prunes:
            incoming.prunes = prunes
    elif remote_head is not None and remote_head != head and (
            head is None or not _is_ancestor(quarantine, remote_head, head)):
        raise RemoteRefused(
            f"Refused: the remote {name}'s main ({remote_head.hex()[:12]}) holds snapshots "
            "that no audit record of it names (its chain adds nothing to this workspace's): "
            "its main was moved by plain git, or it was tampered with. Nothing was changed "
            "here.", remote=name, commit=remote_head.hex())
    _faults.point("pull.checked")
    if ledger_lines:
        for index, line in enumerate(ledger_lines):
            _json_line(name, "LLM ledger", line, index)
    if not new_lines:
        incoming.files = _files(workspace, quarantine, name, trees)
    if clone:
        incoming.meta = _meta(quarantine, name, trees["meta"])
    return incoming


def whole_bytes(path: Path) -> bytes:
    """The whole lines of an append-only file (a writer may be mid-append)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return b""
    return data[: data.rfind(b"\n") + 1]


def _is_ancestor(quarantine: Quarantine, older: bytes, newer: bytes) -> bool:
    if older == newer:
        return True
    return git(quarantine.git_dir, "merge-base", "--is-ancestor", older.hex(), newer.hex(),
               check=False).returncode == 0


def _refused(name: str, what: str, *, path: str | None = None, record: int | None = None
             ) -> RemoteRefused:
    return RemoteRefused(f"Refused: the remote {name} {what}; it is not a Kernos remote, or it "
                         "was tampered with. Nothing was changed here.", remote=name,
                         path=path, record=record)


def _checked_tree(quarantine: Quarantine, name: str, tree: str, commit: bytes | None
                  ) -> dict[str, dict[str, Entry]]:
    """``kind -> path -> entry`` of one of the remote's trees, every path checked against
    :data:`SHAPES` and every size against the limits."""
    found: dict[str, dict[str, Entry]] = {kind: {} for kind in SHAPES[tree]}
    if commit is None:
        return found
    for entry in quarantine.tree(commit, name, tree):
        kind = shape_of(tree, entry.path)
        if kind is None:
            raise _refused(name, f"holds {tree}/{entry.path[:200]!r}, which Kernos never "
                           "pushes", path=f"{tree}/{entry.path}")
        if entry.mode != "100644" or entry.kind != "blob":
            raise _refused(name, f"holds {tree}/{entry.path} as a {entry.kind} of mode "
                           f"{entry.mode}, where a push writes a plain file",
                           path=f"{tree}/{entry.path}")
        if not 0 <= entry.size <= MAX_FILE_BYTES:
            raise _refused(name, f"holds {tree}/{entry.path} of {entry.size} bytes, more than "
                           f"the {MAX_FILE_BYTES >> 20} MiB a pull accepts",
                           path=f"{tree}/{entry.path}")
        found[kind][entry.path] = entry
    return found


def shape_of(tree: str, path: str) -> str | None:
    """Which kind of file ``path`` is in the remote's ``tree`` (:data:`SHAPES`), or None:
    a path Kernos never pushes."""
    for kind, pattern in SHAPES[tree].items():
        match = pattern.fullmatch(path)
        if match is None:
            continue
        groups = match.groupdict()
        if "index" in groups and int(groups["group"]) != int(groups["index"]) // SEGMENT_GROUP:
            return None
        if "shard" in groups and groups["name"][:2] != groups["shard"]:
            return None
        return kind
    return None


def _extension(quarantine: Quarantine, name: str, what: str,
               tree: Mapping[str, Mapping[str, Entry]], kind: str, ours: bytes
               ) -> tuple[list[bytes], int]:
    """(the lines the remote's log adds to ``ours``, the size of ``ours`` they follow).

    Only the segments from the one holding our last line on are read; the earlier ones
    must be ours, blob for blob.
    """
    segments = sorted(tree[kind].values(), key=lambda entry: entry.path)
    for number, entry in enumerate(segments):
        if int(entry.path.rsplit("/", 1)[1][:8]) != number:
            raise _refused(name, f"holds its {what} with segment {number} missing",
                           path=entry.path)
    lines = ours.splitlines(keepends=True)
    done = len(lines) // SEGMENT_LINES  # segments wholly ours
    for number in range(min(done, len(segments))):
        mine = lines[number * SEGMENT_LINES:(number + 1) * SEGMENT_LINES]
        if object_id(b"blob", b"".join(mine)) == segments[number].sha:
            continue
        if number == len(segments) - 1:
            # The remote's last segment, shorter than ours: ours is ahead if it is a prefix.
            theirs_last = _segment_lines(quarantine, name, what, segments, number)
            if mine[:len(theirs_last)] == theirs_last:
                return [], len(ours)
        raise _diverged(name, what)
    if len(segments) <= done:  # the remote's lines are ours, or a prefix of them
        return [], len(ours)
    theirs: list[bytes] = []
    for number in range(done, len(segments)):
        theirs += _segment_lines(quarantine, name, what, segments, number)
    mine = lines[done * SEGMENT_LINES:]
    if theirs[:len(mine)] != mine:
        if mine[:len(theirs)] == theirs:
            return [], len(ours)  # ours is ahead (not pushed yet)
        raise _diverged(name, what)
    return theirs[len(mine):], len(ours)


def _segment_lines(quarantine: Quarantine, name: str, what: str, segments: Sequence[Entry],
                   number: int) -> list[bytes]:
    """The lines of segment ``number``, each checked for size; whole segments full."""
    entry = segments[number]
    data = quarantine.cat(entry.sha)
    if not data.endswith(b"\n"):
        raise _refused(name, f"holds its {what} segment {number} with a cut-off line",
                       path=entry.path)
    split = data.splitlines(keepends=True)
    if len(split) > SEGMENT_LINES or (number < len(segments) - 1
                                      and len(split) != SEGMENT_LINES):
        raise _refused(name, f"holds its {what} segment {number} with {len(split)} lines "
                       f"(a push writes {SEGMENT_LINES} in every one but the last)",
                       path=entry.path)
    for offset, line in enumerate(split):
        if len(line) > MAX_LINE_BYTES:
            index = number * SEGMENT_LINES + offset
            raise _refused(name, f"holds a line of {len(line)} bytes in its {what} (line "
                           f"{index}), more than the {MAX_LINE_BYTES >> 20} MiB a pull "
                           "accepts", path=entry.path, record=index)
    return split


def _diverged(name: str, what: str) -> RemoteDiverged:
    return RemoteDiverged(
        f"Refused: pulling would fork the history. This workspace's {what} is not a prefix "
        f"of the remote {name}'s: both were appended to since they last met (another "
        "writer, or this copy wrote ops the remote lacks). Keep one side: clone the remote "
        "into a new workspace, or push this one to a new remote. Nothing was changed here.",
        remote=name, writer="another writer")


def _json_line(name: str, what: str, line: bytes, index: int) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError as error:
        raise _refused(name, f"holds {what} line {index}, which is not JSON "
                       f"({type(error).__name__})", record=index) from None
    if type(value) is not dict:
        raise _refused(name, f"holds {what} line {index}, which is not a JSON object",
                       record=index)
    return value


def _record(name: str, line: bytes, index: int) -> dict[str, Any]:
    record = _json_line(name, "audit record", line, index)
    if record.get("index") != index:
        raise _refused(name, f"holds a record that says it is {record.get('index')!r} where "
                       f"record {index} must be", record=index)
    return record


def _check_signers(name: str, records: Sequence[dict[str, Any]], trust: Trust) -> None:
    """Every new signed record is signed by a key this workspace trusts."""
    for record in records:
        signer = signer_of(record)
        if signer is not None and not trust.trusts(signer):
            raise RemoteRefused(
                f"Refused: the remote {name}'s audit record {record['index']} is signed by "
                f"{signer[:80]}, a key this workspace neither owns nor trusts: anyone who can "
                "write to the remote can sign with a key of their own. If it is the key of a "
                "writer you work with (`kernos remote trust` in their workspace prints it), "
                f"run `kernos remote trust {signer[:80]}`, then pull again. Nothing was "
                "changed here.", remote=name, record=record["index"])


def _check_candidate(workspace: Path, quarantine: Quarantine, name: str, local: bytes,
                     new_lines: list[bytes], remote_head: bytes | None, head: bytes | None,
                     trust: Trust, arriving: Mapping[str, bytes]) -> PrunedSince | None:
    """Refuse unless the workspace the pull would make verifies; the prunes it follows."""
    added = b"".join(new_lines)
    local_lines = local.splitlines(keepends=True)
    since_prunes = prunes_since([*local_lines, *new_lines], len(local_lines))
    # A clone has no head to follow a prune from: the remote's prunes are its past.
    follows_prune = head is not None and (bool(since_prunes) or (
        remote_head is not None and not _is_ancestor(quarantine, head, remote_head)))
    if remote_head is not None:
        _check_parents(quarantine, name, head, remote_head)
    candidate = Candidate(workspace, quarantine, remote_head, name)
    chain_path = workspace / "audit" / "chain.jsonl"
    anchor = None
    if local_lines and not follows_prune:
        last = json.loads(local_lines[-1])
        anchor = f"{last['index']}:{last['hash']}"
    # The objects themselves are not hashed again: git's index-pack named each fetched
    # object by hashing it, and the fetch checked that the refs reach only objects that are
    # here.  What verify adds is everything else: records, links, manifests, parents.
    with open(chain_path, "rb") if local else contextlib.nullcontext() as handle:
        joined = Joined(handle, len(local), added)
        report = verify_candidate(
            candidate, joined, len(local) + len(added),  # type: ignore[arg-type]
            since=anchor, known_head=None if head is None else head.hex(), trust=trust,
            arriving=arriving, objects=False)
    problems = [p for p in report.problems if p.index >= len(local_lines) or anchor is None]
    if problems:
        first = problems[0]
        raise RemoteRefused(
            f"Refused: the remote {name}'s audit record {first.index} fails the checks a "
            f"pull makes: {first.what}. Nothing was changed here; tell whoever writes the "
            "remote, and keep working on this copy (or clone the remote into a new workspace "
            "to look at it).", remote=name, record=first.index)
    if report.unfinished is not None:
        raise _refused(name, f"ends with an op whose snapshot is not in its history "
                       f"({report.unfinished})", record=len(local_lines) + len(new_lines) - 1)
    if not follows_prune:
        return None
    if head is None or remote_head is None or not since_prunes:  # (head: checked above)
        raise RemoteDiverged(
            f"Refused: the remote {name}'s main does not contain this workspace's head, and "
            "no prune record the remote has since this workspace's last one explains it: its "
            "history was rewritten by something other than `kernos prune`. Keep one side: "
            "clone the remote into a new workspace, or push this one to a new remote. Nothing "
            "was changed here.", remote=name, writer="another writer")
    now = since_prunes.follow(head.hex())
    if not _is_ancestor(quarantine, bytes.fromhex(now), remote_head):
        raise RemoteDiverged(
            f"Refused: the remote {name} was pruned, but its prunes do not account for this "
            f"workspace's head ({head.hex()[:12]}): they make it {now[:12]}, which is not the "
            f"remote's main ({remote_head.hex()[:12]}) or an ancestor of it. Nothing was "
            "changed here.", remote=name, writer="another writer")
    return since_prunes


def _check_tracked_files(workspace: Path, quarantine: Quarantine, name: str,
                         remote_head: bytes, head: bytes | None) -> None:
    """Every new snapshot's tracked files are what a restore here would accept
    (:func:`kernos.files.contents.check_files_tree`): a hostile tree is refused now, not
    when a kernel opens it."""
    candidate = Candidate(workspace, quarantine, remote_head, name)
    checked: dict[bytes, Contents] = {}
    seen: set[bytes] = set()
    for commit, data in candidate.history():
        if commit == head:
            break
        try:
            entries = decode_tree(candidate.read_object(data.tree)[1])
        except ValueError:
            continue  # not a snapshot's tree: verify_candidate has said so already
        files = next((entry for entry in entries
                      if entry.name == FILES and entry.mode == TREE_MODE), None)
        if files is None or files.sha in seen:
            continue
        seen.add(files.sha)
        try:
            check_files_tree(candidate, files.sha, workspace, checked)
        except WorkspaceCorrupt as error:
            raise RemoteRefused(
                f"Refused: the remote {name}'s snapshot {commit.hex()[:12]} holds tracked "
                f"files Kernos will not restore: {error.problem}. Nothing was changed here; "
                "tell whoever writes the remote.", remote=name, commit=commit.hex()) from None


def _check_parents(quarantine: Quarantine, name: str, head: bytes | None,
                   remote_head: bytes) -> None:
    """Every new commit has at most one parent: the history is a line, as Kernos writes it
    (a second parent would bring in history no record names)."""
    listing = git(quarantine.git_dir, "rev-list", "--parents", remote_head.hex(),
                  *([f"^{head.hex()}"] if head is not None else []),
                  what="listing the new snapshots").stdout.decode()
    for line in listing.splitlines():
        ids = line.split()
        if len(ids) > 2:
            raise RemoteRefused(
                f"Refused: the remote {name}'s commit {ids[0][:12]} has {len(ids) - 1} "
                "parents, where every Kernos snapshot has one; it was tampered with. Nothing "
                "was changed here.", remote=name, commit=ids[0])


def _files(workspace: Path, quarantine: Quarantine, name: str,
           trees: Mapping[str, Mapping[str, Mapping[str, Entry]]]) -> dict[str, bytes]:
    """The payloads, LLM objects and recordings this workspace lacks, each checked."""
    files: dict[str, bytes] = {}
    for (tree, kind), pattern in _TARGET.items():
        for path, entry in trees[tree][kind].items():
            match = SHAPES[tree][kind].fullmatch(path)
            assert match is not None
            file_name = match.group("name")
            target = pattern.format(name=file_name)
            if (workspace / target).exists():
                continue
            data = quarantine.cat(entry.sha)
            problem = _content_problem(kind, file_name, data)
            if problem is not None:
                raise _refused(name, f"holds {tree}/{path}, whose content {problem}",
                               path=f"{tree}/{path}")
            files[target] = data
    return files


def _content_problem(kind: str, file_name: str, data: bytes) -> str | None:
    if kind == "payload":
        return None if digest(data) == file_name else "does not hash to its name"
    if kind == "recording":
        return None if re.fullmatch(rb"[0-9a-f]{64}", data) else \
            "is not the hash of a recorded response"
    if digest(data) == file_name:
        return None
    try:  # a sealed or erased envelope: its name is the hash of bytes only a key shows
        value = json.loads(data)
    except ValueError:
        return "is not JSON"
    if (type(value) is dict and len(value) == 1 and next(iter(value)) in _SEALED_KEYS
            and type(next(iter(value.values()))) is dict and canonical(value) == data):
        return None
    return "does not hash to its name (and is not a sealed or erased recording)"


def _meta(quarantine: Quarantine, name: str, tree: Mapping[str, Mapping[str, Entry]]
          ) -> dict[str, bytes]:
    meta: dict[str, bytes] = {}
    for kind, entries in tree.items():
        for path, entry in entries.items():
            data = quarantine.cat(entry.sha)
            try:
                value = json.loads(data)
            except ValueError:
                value = None
            if type(value) is not dict:
                raise _refused(name, f"holds meta/{path}, which is not a JSON object",
                               path=f"meta/{path}")
            if kind == "workspace":
                version = value.get("format")
                if type(version) is not int:
                    raise _refused(name, "holds a workspace.json without a format",
                                   path="meta/workspace.json")
                if version > FORMAT:
                    raise RemoteError(f"the remote {name} holds a workspace of a newer Kernos "
                                      f"(format {version}); upgrade Kernos to clone it",
                                      remote=name)
            else:
                for key, setting in value.items():
                    if key not in SETTINGS or setting not in SETTINGS[key]:
                        raise _refused(name, f"holds settings.json with {key!r}: "
                                       f"{str(setting)[:60]!r}, which is not a setting Kernos "
                                       "writes", path="meta/settings.json")
            meta[path] = data
    return meta
