"""Retention: which snapshots ``kernos prune`` keeps, and how the history is rewritten.

**The policy** (:func:`select`, a pure function).  The snapshots are the
commits of the branch's first-parent chain, from the first to HEAD.  Kept are:

* HEAD, always;
* the newest ``keep_last`` snapshots;
* for each of the ``keep_daily`` most recent UTC calendar days *that have a
  snapshot*, the newest snapshot of that day, by commit time (as restic and
  borg count days: a month without ops does not empty the dailies);
* every snapshot that a tag (``refs/tags/NAME``) whose name matches one of
  ``keep_tags`` (fnmatch, case-sensitive) names;
* everything another ref still needs.  Any ref but the branch and the tags
  on it (``refs/heads/backup``, a replay's ``refs/kernos/source``, a tag on a
  commit off the branch) keeps the commit it names and all its ancestors
  unchanged, since their ids are part of its id.

Everything else is pruned.  A tag on a pruned snapshot is deleted; a tag on a
kept snapshot follows it to its new id (an annotated tag is rewritten).

**The rewrite** (:func:`plan`).  Commits before the first pruned one keep
their ids.  Each kept commit after it gets a new id: the same bytes with its
parent line naming the previous kept commit's new id (:func:`with_parent`).
The tree, author, committer, times and message are unchanged, so a kept
snapshot restores exactly as before, and its old id can be recomputed from
its new bytes and its old parent (``kernos audit verify`` does).

**Crash safety.**  The commit point is the branch's ref, as for an op:

1. :func:`write`: the new commits (and rewritten tags) go through the object
   store's journal as one batch, and are sealed (made durable);
2. :func:`intend`: ``<workspace>/pruning`` names the old and new heads, the
   tag moves and the pruned commits (durably);
3. the caller appends the ``prune`` audit record (:mod:`kernos.prune`);
4. :func:`publish`: the branch moves to the new head: the commit point;
5. :func:`finish`: the tags move, the reflogs are expired, ``git repack -a
   -d`` rewrites the packs with only what a ref reaches and ``git prune
   --expire=now`` deletes unreachable loose objects; then the pruned commits
   must be gone (a repack that another process ran meanwhile may have copied
   them: the steps run once more, then it is an error);
6. the intent file is removed.

A crash before 4 leaves the old history: the object store's recovery deletes
the new batch, :func:`finish_interrupted` removes the intent file and the
audit log's recovery voids the record.  A crash after 4 leaves the new
history: :func:`finish_interrupted`, which every writable open runs, does 5
and 6 (each step can run twice).  Crash points (``KERNOS_CRASH_AT``):
``prune.written``, ``prune.intent``, ``prune.recorded``, ``prune.published``,
``prune.tags``, ``prune.repacked``.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernos import _faults
from kernos._durable import fsync_dir, replace_file
from kernos.errors import KernosError, UsageError, WorkspaceCorrupt
from kernos.store.object_store import GIT_FSYNC
from kernos.store.objects import decode_commit, object_id
from kernos.store.workspace import BRANCH, Workspace, finish_at_open, op_of

__all__ = [
    "INTENT",
    "Freed",
    "Intent",
    "Plan",
    "Policy",
    "Selection",
    "Snapshot",
    "abandon",
    "finish",
    "finish_interrupted",
    "intend",
    "measure",
    "plan",
    "publish",
    "select",
    "with_parent",
    "write",
]

INTENT = "pruning"
"""The intent file, in the workspace directory, while a prune is not finished."""
TIMEOUT = 3600
TAGS = "refs/tags/"


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What ``kernos prune`` keeps, besides HEAD and what other refs need."""

    keep_last: int = 0
    """The newest N snapshots."""
    keep_daily: int = 0
    """The newest snapshot of each of the D most recent UTC days that have one."""
    keep_tags: tuple[str, ...] = ()
    """fnmatch patterns: every snapshot a tag whose name matches one names."""

    def __post_init__(self) -> None:
        if self.keep_last < 0 or self.keep_daily < 0:
            raise UsageError("keep_last and keep_daily are counts: give 0 or more")

    @property
    def empty(self) -> bool:
        return not (self.keep_last or self.keep_daily or self.keep_tags)

    def to_json(self) -> dict[str, Any]:
        return {"keep_last": self.keep_last, "keep_daily": self.keep_daily,
                "keep_tags": list(self.keep_tags)}


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """One commit of the branch, as the policy sees it."""

    commit: str
    """Its commit id (hex)."""
    time: int
    """Its commit time (seconds since the epoch)."""
    op: int | None = None
    """The op that wrote it (its ``Kernos-Op`` trailer), if any."""

    @property
    def day(self) -> str:
        """Its UTC calendar day, ``YYYY-MM-DD``."""
        return datetime.datetime.fromtimestamp(self.time, datetime.UTC).date().isoformat()


@dataclass(frozen=True, kw_only=True)
class Selection:
    """What a policy keeps of a chain."""

    kept: dict[str, tuple[str, ...]]
    """Kept commit -> why, oldest first (``HEAD``, ``last``, ``daily DAY``, ``tag NAME``,
    ``needed by REF``)."""
    pruned: tuple[str, ...]
    """The other commits, oldest first."""
    unmatched: tuple[str, ...] = ()
    """``keep_tags`` patterns that matched no tag on the branch."""


def select(chain: Sequence[Snapshot], policy: Policy, *,
           tags: Mapping[str, str] | None = None,
           needed: Mapping[str, str] | None = None) -> Selection:
    """The snapshots of ``chain`` (oldest first, HEAD last) that ``policy`` keeps.

    ``tags``: tag name (without ``refs/tags/``) -> the commit it names.
    ``needed``: commit -> the ref that needs it kept as it is.
    """
    reasons: dict[str, list[str]] = {}

    def keep(commit: str, why: str) -> None:
        reasons.setdefault(commit, []).append(why)

    if not chain:
        return Selection(kept={}, pruned=())
    keep(chain[-1].commit, "HEAD")
    for snapshot in chain[max(len(chain) - policy.keep_last, 0):] if policy.keep_last else ():
        keep(snapshot.commit, "last")
    newest_of_day: dict[str, Snapshot] = {}
    for snapshot in chain:  # a later snapshot of the same day replaces an earlier one
        newest_of_day[snapshot.day] = snapshot
    for day in sorted(newest_of_day, reverse=True)[:policy.keep_daily]:
        keep(newest_of_day[day].commit, f"daily {day}")
    on_chain = {snapshot.commit for snapshot in chain}
    matched: set[str] = set()
    for name, commit in sorted((tags or {}).items()):
        for pattern in policy.keep_tags:
            if commit in on_chain and fnmatch.fnmatchcase(name, pattern):
                matched.add(pattern)
                keep(commit, f"tag {name}")
                break
    for commit, ref in (needed or {}).items():
        if commit in on_chain:
            keep(commit, f"needed by {ref}")
    return Selection(
        kept={s.commit: tuple(reasons[s.commit]) for s in chain if s.commit in reasons},
        pruned=tuple(s.commit for s in chain if s.commit not in reasons),
        unmatched=tuple(pattern for pattern in policy.keep_tags if pattern not in matched))


def with_parent(raw: bytes, parent: str | None) -> bytes:
    """A commit object's bytes with its parent line(s) replaced by ``parent`` (none if None).

    Every other byte is kept: the tree, the author and committer lines with
    their times, other headers and the message.
    """
    header, separator, message = raw.partition(b"\n\n")
    lines = [line for line in header.split(b"\n") if not line.startswith(b"parent ")]
    if parent is not None:
        lines.insert(1, b"parent " + parent.encode())  # after the tree line, as git writes it
    return b"\n".join(lines) + separator + message


# -- planning ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A prune worked out in memory: nothing written yet."""

    head: str
    """HEAD before."""
    chain: tuple[Snapshot, ...]
    """The branch, oldest first."""
    selection: Selection
    rewritten: dict[str, str]
    """Old id -> new id of the kept commits that get new ids, oldest first."""
    new_head: str
    """HEAD after."""
    objects: tuple[tuple[bytes, bytes, bytes], ...]
    """(kind, data, id) of the objects to write: the new commits and tags."""
    tags: dict[str, tuple[str, str | None]]
    """Tag ref -> (the object it names now, the one it will name; None: deleted)."""
    others: tuple[str, ...]
    """Refs other than the branch and its tags (their objects are all kept)."""

    @property
    def pruned(self) -> tuple[str, ...]:
        return self.selection.pruned

    def intent(self) -> Intent:
        return Intent(old_head=self.head, new_head=self.new_head,
                      tags={ref: new for ref, (_old, new) in self.tags.items()},
                      pruned=self.pruned, replaced=tuple(self.rewritten))


def plan(workspace: Workspace, policy: Policy) -> Plan:
    """Work out what ``policy`` keeps of ``workspace``'s history and the new history."""
    head = workspace.head()
    if head is None:
        raise UsageError(f"the history of {workspace.path} is empty: there is nothing to prune")
    chain = _read_chain(workspace, head)
    on_chain = {snapshot.commit for snapshot in chain}
    tag_targets: dict[str, tuple[str, str, str]] = {}  # ref -> (object, its type, commit)
    others: list[str] = []
    for name, sha, kind, peeled, peeled_kind in _refs(workspace):
        if name == BRANCH:
            continue
        commit = sha if kind == "commit" else peeled if peeled_kind == "commit" else None
        if name.startswith(TAGS) and commit in on_chain:
            assert commit is not None
            tag_targets[name] = (sha, kind, commit)
        else:
            others.append(name)
    needed = _needed(workspace, others, on_chain)
    selection = select(chain, policy, needed=needed, tags={
        name.removeprefix(TAGS): commit for name, (_sha, _kind, commit) in tag_targets.items()})
    rewritten, objects, new_head = _rewrite(workspace, chain, selection)
    tags: dict[str, tuple[str, str | None]] = {}
    pruned = set(selection.pruned)
    for name, (sha, kind, commit) in sorted(tag_targets.items()):
        if commit in pruned:
            tags[name] = (sha, None)
        elif commit in rewritten and kind == "commit":
            tags[name] = (sha, rewritten[commit])
        elif commit in rewritten:  # an annotated tag: a new tag object naming the new commit
            _kind, data = workspace.read_object(bytes.fromhex(sha))
            _object_line, _, rest = data.partition(b"\n")
            data = b"object " + rewritten[commit].encode() + b"\n" + rest
            tag = object_id(b"tag", data)
            objects.append((b"tag", data, tag))
            tags[name] = (sha, tag.hex())
    return Plan(head=head.hex(), chain=chain, selection=selection, rewritten=rewritten,
                new_head=new_head, objects=tuple(objects), tags=tags, others=tuple(others))


def _read_chain(workspace: Workspace, head: bytes) -> tuple[Snapshot, ...]:
    chain = []
    sha: bytes | None = head
    while sha is not None:
        kind, data = workspace.read_object(sha)
        if kind != b"commit":
            raise WorkspaceCorrupt(str(workspace.path), f"{sha.hex()} is a {kind.decode()}, "
                                   "not a commit")
        commit = decode_commit(data)
        if len(commit.parents) > 1:
            raise UsageError(f"the commit {sha.hex()[:12]} on the branch has "
                             f"{len(commit.parents)} parents: Kernos never writes a merge, and "
                             "prune does not rewrite one. Nothing was changed.")
        chain.append(Snapshot(commit=sha.hex(), time=commit.timestamp, op=op_of(commit)))
        sha = commit.parents[0] if commit.parents else None
    chain.reverse()
    return tuple(chain)


def _rewrite(workspace: Workspace, chain: Sequence[Snapshot], selection: Selection
             ) -> tuple[dict[str, str], list[tuple[bytes, bytes, bytes]], str]:
    rewritten: dict[str, str] = {}
    objects: list[tuple[bytes, bytes, bytes]] = []
    parent: str | None = None
    diverged = False  # a commit before this one was pruned: the ids change from here on
    for snapshot in chain:
        if snapshot.commit not in selection.kept:
            diverged = True
            continue
        if diverged:
            _kind, data = workspace.read_object(bytes.fromhex(snapshot.commit))
            data = with_parent(data, parent)
            sha = object_id(b"commit", data)
            objects.append((b"commit", data, sha))
            rewritten[snapshot.commit] = sha.hex()
            parent = sha.hex()
        else:
            parent = snapshot.commit
    assert parent is not None  # HEAD is always kept
    return rewritten, objects, parent


def _refs(workspace: Workspace) -> list[tuple[str, str, str, str, str]]:
    """(name, object, type, peeled object, peeled type) of every ref (peeled: tags only)."""
    out = _git(workspace, "for-each-ref", "--format=%(refname) %(objectname) %(objecttype) "
                                           "%(*objectname) %(*objecttype)")
    refs = []
    for line in out.splitlines():
        name, sha, kind, peeled, peeled_kind = (line.split(" ") + [""] * 5)[:5]
        refs.append((name, sha, kind, peeled, peeled_kind))
    return refs


def _needed(workspace: Workspace, others: Iterable[str], on_chain: set[str]) -> dict[str, str]:
    """Commit of the branch -> the other ref that reaches it (and so needs it as it is)."""
    needed: dict[str, str] = {}
    for ref in others:
        try:
            reached = _git(workspace, "rev-list", ref, "--").split()
        except KernosError:
            continue  # the ref vanished or broke since for-each-ref listed it
        for commit in reached:
            if commit in on_chain:
                needed.setdefault(commit, ref)
    return needed


@dataclass(frozen=True, kw_only=True)
class Freed:
    """What the pruned snapshots alone reach: what a prune deletes."""

    objects: tuple[str, ...]
    """Their ids."""
    bytes: int
    """What they take on disk now (one copy each, as stored: compressed or a delta)."""


def measure(workspace: Workspace, plan: Plan) -> Freed:
    """The objects that only the pruned snapshots reach, and their size on disk now."""
    if not plan.pruned:
        return Freed(objects=(), bytes=0)
    reach = _git(workspace, "rev-list", "--objects", "--no-walk", "--stdin",
                 stdin="\n".join(plan.pruned) + "\n")
    freed = {line[:40] for line in reach.splitlines()}
    kept = _git(workspace, "rev-list", "--objects", "--no-walk", "--stdin",
                stdin="\n".join(plan.selection.kept) + "\n")
    freed -= {line[:40] for line in kept.splitlines()}
    if plan.others:
        held = _git(workspace, "rev-list", "--objects", *plan.others, "--")
        freed -= {line[:40] for line in held.splitlines()}
    # The old ids of rewritten commits, and the tag objects replaced or deleted, go too.
    freed |= set(plan.rewritten) | {old for old, new in plan.tags.values() if old != new}
    ids = tuple(sorted(freed))
    sizes = _git(workspace, "cat-file", "--batch-check=%(objectsize:disk)",
                 stdin="".join(sha + "\n" for sha in ids)) if ids else ""
    return Freed(objects=ids, bytes=sum(int(size) for size in sizes.split() if size.isdigit()))


# -- doing it ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Intent:
    """What ``<workspace>/pruning`` says: enough to finish a prune after a crash."""

    old_head: str
    new_head: str
    tags: dict[str, str | None] = field(default_factory=dict)
    """Tag ref -> the object it will name (None: deleted)."""
    pruned: tuple[str, ...] = ()
    """The pruned commits."""
    replaced: tuple[str, ...] = ()
    """The old ids of the commits rewritten (they must be gone too)."""

    def to_json(self) -> bytes:
        return json.dumps({"from": self.old_head, "to": self.new_head, "tags": self.tags,
                           "pruned": list(self.pruned),
                           "replaced": list(self.replaced)}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Intent:
        loaded = json.loads(data)
        return cls(old_head=str(loaded["from"]), new_head=str(loaded["to"]),
                   tags={str(ref): None if new is None else str(new)
                         for ref, new in dict(loaded["tags"]).items()},
                   pruned=tuple(str(commit) for commit in loaded["pruned"]),
                   replaced=tuple(str(commit) for commit in loaded.get("replaced", ())))


def write(workspace: Workspace, plan: Plan) -> None:
    """Step 1: write the new commits and tags as one journaled batch, durably."""
    objects = workspace.objects
    objects.begin()
    try:
        for kind, data, sha in plan.objects:
            objects.write(kind, data, sha)
        objects.seal(bytes.fromhex(plan.new_head))
    except BaseException:
        objects.discard()
        raise
    _faults.point("prune.written")


def intend(workspace: Workspace, plan: Plan) -> None:
    """Step 2: the intent file, durably."""
    replace_file(workspace.path / INTENT, plan.intent().to_json(), durable=workspace.durable)
    _faults.point("prune.intent")


def abandon(workspace: Workspace) -> None:
    """Undo steps 1 and 2 (an error before the commit point)."""
    workspace.objects.discard()
    (workspace.path / INTENT).unlink(missing_ok=True)


def publish(workspace: Workspace, plan: Plan) -> None:
    """Step 4, the commit point: the branch names the new head."""
    workspace.set_head(bytes.fromhex(plan.new_head))
    _faults.point("prune.published")
    workspace.objects.finish()
    workspace.objects.wait_for_maintenance()  # no repack of ours may race the one below


def finish(workspace: Workspace, intent: Intent, *, freed: Iterable[str] = ()) -> None:
    """Steps 5 and 6: move the tags, delete what no ref reaches, check, drop the intent."""
    commands = "".join(f"update {ref} {new}\n" if new is not None else f"delete {ref}\n"
                       for ref, new in sorted(intent.tags.items()))
    if commands:
        _git(workspace, "update-ref", "--stdin", stdin=commands)
    _faults.point("prune.tags")
    _git(workspace, "reflog", "expire", "--expire=now", "--expire-unreachable=now", "--all")
    gone = sorted({*intent.pruned, *intent.replaced, *freed})
    left: list[str] = []
    for _attempt in range(2):
        _git(workspace, "repack", "-a", "-d", "-q")
        _faults.point("prune.repacked")
        _git(workspace, "prune", "--expire=now")
        left = _present(workspace, gone)
        if not left:
            break
    workspace.objects.packs.refresh()
    if left:
        raise KernosError(
            f"the history was pruned, but {len(left)} of the pruned objects (first "
            f"{left[0][:12]}) are still in {workspace.git_dir}: another process copied them "
            "while they were deleted (a `kernos gc`, or the background repack of a kernel that "
            "died). Run `kernos prune` again once it has finished, to delete them.")
    (workspace.path / INTENT).unlink(missing_ok=True)
    if workspace.durable:
        fsync_dir(workspace.path)


def finish_interrupted(workspace: Workspace) -> str | None:
    """Finish (or forget) a prune a crash interrupted; what was done, in words.

    Run by every writable open, after the object store's recovery.
    """
    path = workspace.path / INTENT
    try:
        intent = Intent.from_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        path.unlink()  # written by rename: never torn; not ours to act on
        return "removed an unreadable prune intent file"
    head = workspace.head()
    if head is None or head.hex() != intent.new_head:
        path.unlink()
        return "an interrupted prune had not moved the branch: nothing was pruned"
    try:
        finish(workspace, intent)
    except KernosError as error:
        return f"an interrupted prune was published, but its clean-up failed: {error}"
    return (f"finished an interrupted prune ({len(intent.pruned)} snapshots pruned, their "
            "objects deleted)")


def _present(workspace: Workspace, ids: Sequence[str]) -> list[str]:
    if not ids:
        return []
    out = _git(workspace, "cat-file", "--batch-check=%(objectname)",
               stdin="".join(sha + "\n" for sha in ids))
    return [line for line in out.splitlines() if not line.endswith(" missing")]


def _git(workspace: Workspace, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["git", *GIT_FSYNC, f"--git-dir={workspace.git_dir}", *args],
                          input=stdin, capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise KernosError(f"git {args[0]} failed in {workspace.git_dir}: "
                          f"{done.stderr.strip()[:500]}")
    return done.stdout


# Every writable open finishes a prune a crash cut (looked up at each call: tests replace it).
finish_at_open("prune", lambda workspace: finish_interrupted(workspace))
