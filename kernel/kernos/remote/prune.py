"""Push and pull across a ``kernos prune``: the proof that a rewrite was a prune, nothing else.

``kernos prune`` (:mod:`kernos.prune`) rewrites the history: it deletes old
snapshots and gives the kept ones after them new commit ids.  A remote that
had the old history then names, as its ``main``, a commit that is not an
ancestor of the workspace's head, which is what a second writer leaves too.
The audit chain tells them apart.  Every prune appends a ``prune`` record
(:mod:`kernos.audit.pruning`) before it moves the branch, and the chain is
append-only on the remote too, so the records one side has and the other
lacks say what happened in between.

:func:`prunes_since` reads them: the prune records among those lines that no
later ``void`` record voids (a prune whose process died before the branch
moved is voided: it pruned nothing), composed in chain order.
:meth:`PrunedSince.follow` says what a commit of the old history is now:

* a commit a prune renamed: its new id (followed through the later prunes);
* a commit a prune deleted (pruned while the other side lagged behind): the
  head that prune left, followed the same way, since everything the deleted
  commit held was on the branch that prune rewrote;
* any other commit: itself (so a commit no prune saw stays what it was, and
  the caller's ancestry check refuses it).

A push (and a pull, the other way round: ``kernos.remote.pull``,
which also verifies the whole chain with the prunes before it follows them)
is accepted when the shorter chain is a prefix of the longer one, and the
followed head of the shorter side is the longer side's head or an ancestor of
it (the caller checks both).  :func:`drop_pruned` then deletes, on the side
that pulled, what the prunes deleted.

Tags follow the records too: :meth:`PrunedSince.tag_after` replays, on the
value a tag has, each move or deletion a record made of that tag from that
value.  A tag no record names, or one that names another object, is left as
it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernos._durable import replace_file
from kernos.audit.pruning import Prunes
from kernos.errors import RemoteDiverged
from kernos.remote.git import Staging, git, ls_remote
from kernos.store import retention
from kernos.store.workspace import BRANCH, Workspace

__all__ = ["PrunedSince", "TagMove", "drop_pruned", "follow_tags", "prunes_since",
           "pushed_over_prune"]

_TAG = re.compile(r"refs/tags/(?!.*\.\.)(?!.*\.lock$)[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}"
                  r"(/[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}){0,7}")
_ID = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True, kw_only=True)
class TagMove:
    """What one prune record did to one tag."""

    ref: str
    """The tag's ref (``refs/tags/NAME``)."""
    old: str
    """The object it named before the prune."""
    new: str | None
    """The object it names after (None: deleted, its snapshot was pruned)."""


@dataclass(frozen=True, kw_only=True)
class PrunedSince:
    """The prune records among a stretch of chain lines (see the module docstring)."""

    prunes: Prunes
    """The prune records that were not voided, in chain order."""
    tags: tuple[TagMove, ...]
    """The tag moves those records made, in chain order."""

    def __bool__(self) -> bool:
        return bool(self.prunes)

    def follow(self, commit: str) -> str:
        """What ``commit`` of the history before these prunes is after them."""
        for pruning in self.prunes.prunings:
            moved = pruning.moves(commit)
            commit = pruning.target if moved is None else moved
        return commit

    def mentions(self, commit: str) -> bool:
        """Whether one of these prunes deleted or renamed ``commit``."""
        return any(commit in pruning.pruned or commit in pruning.rewritten
                   for pruning in self.prunes.prunings)

    def deleted(self) -> set[str]:
        """The commits these prunes deleted, and the old ids of those they renamed."""
        gone: set[str] = set()
        for pruning in self.prunes.prunings:
            gone |= pruning.pruned | set(pruning.rewritten)
        return gone

    def tag_after(self, ref: str, value: str) -> str | None:
        """What a tag naming ``value`` names after these prunes (None: deleted)."""
        current: str | None = value
        for move in self.tags:
            if move.ref == ref and move.old == current:
                current = move.new
        return current

    def tag_refs(self) -> list[str]:
        return sorted({move.ref for move in self.tags})


def prunes_since(lines: Sequence[bytes], start: int) -> PrunedSince:
    """The prune records among ``lines[start:]`` that no line there voids.

    A void record always comes after the record it voids, so the lines from
    ``start`` on hold every void of the records among them.  A line that is
    not a JSON object is a ``ValueError`` (the caller says whose chain it was).
    """
    records: list[tuple[int, dict[str, Any]]] = []
    voided: set[int] = set()
    for index in range(start, len(lines)):
        record = json.loads(lines[index])
        if type(record) is not dict:
            raise ValueError(f"record {index} is not a JSON object")
        if record.get("type") == "void" and type(record.get("voids")) is int:
            voided.add(record["voids"])
        elif record.get("type") == "prune":
            records.append((index, record))
    kept = [(index, record) for index, record in records if index not in voided]
    tags: list[TagMove] = []
    for _index, record in kept:
        tags += _tag_moves(record.get("tags"))
    return PrunedSince(prunes=Prunes(kept), tags=tuple(tags))


def _tag_moves(value: object) -> list[TagMove]:
    """The well-formed tag moves of one record's ``tags`` (anything else is ignored: such a
    tag is not followed)."""
    if type(value) is not dict:
        return []
    moves: list[TagMove] = []
    moved, deleted = value.get("moved"), value.get("deleted")
    for item in moved if type(moved) is list else []:
        if (type(item) is list and len(item) == 3 and all(type(part) is str for part in item)
                and _TAG.fullmatch(item[0]) and _ID.fullmatch(item[1])
                and _ID.fullmatch(item[2])):
            moves.append(TagMove(ref=item[0], old=item[1], new=item[2]))
    for item in deleted if type(deleted) is list else []:
        if (type(item) is list and len(item) == 2 and all(type(part) is str for part in item)
                and _TAG.fullmatch(item[0]) and _ID.fullmatch(item[1])):
            moves.append(TagMove(ref=item[0], old=item[1], new=None))
    return moves


# -- push ---------------------------------------------------------------------------------


def pushed_over_prune(stage: Staging, name: str, before: bytes, head: bytes,
                      chain: Sequence[bytes], shared: int, writer: str) -> PrunedSince:
    """The prunes that let a push move the remote's main ``before`` to ``head``, which does
    not contain it: the remote's audit chain is ``chain[:shared]`` (the caller checked),
    and the records after it must map ``before`` to ``head`` or an ancestor of it.  Else
    ``RemoteDiverged`` says which condition failed."""
    try:
        since = prunes_since(chain, shared)
    except ValueError:  # our own chain, unreadable past the remote's: no prune is proven
        since = PrunedSince(prunes=Prunes(()), tags=())
    if not since:
        raise RemoteDiverged(
            f"Refused: the remote {name}'s main ({before.hex()[:12]}, pushed by {writer}) is "
            "not in this workspace's history, and no prune record since the last push "
            "explains it: the history was rewritten by something other than `kernos prune` "
            "(a restore from a backup, a git reset), or the remote's main was moved by plain "
            "git. Keep one side: `kernos clone` the remote into a new workspace, or push this "
            "one to a new remote.", remote=name, writer=writer)
    now = since.follow(before.hex())
    if not (stage.has(bytes.fromhex(now)) and stage.is_ancestor(bytes.fromhex(now), head)):
        raise RemoteDiverged(
            f"Refused: this workspace's history was pruned (audit record "
            f"{_indices(since)}), but the prunes do not account for the remote {name}'s main "
            f"({before.hex()[:12]}, pushed by {writer}): they make it {now[:12]}, which is "
            "not this workspace's head or an ancestor of it, so the remote holds snapshots "
            "this workspace never had. Keep one side: `kernos clone` the remote into a new "
            "workspace, or push this one to a new remote.", remote=name, writer=writer)
    return since


def follow_tags(stage: Staging, url: str, since: PrunedSince,
                updates: dict[str, bytes | None], leases: dict[str, bytes]) -> None:
    """Add to a push the remote's tags that the prune records moved or deleted, each by
    compare-and-swap on the value read (``leases``); a tag they do not name stays."""
    refs = since.tag_refs()
    for ref, value in (ls_remote(url, refs) if refs else {}).items():
        after = since.tag_after(ref, value.hex())
        if after == value.hex() or (after is not None and not stage.has(bytes.fromhex(after))):
            continue  # untouched, or moved to an object this workspace no longer has
        updates[ref] = None if after is None else bytes.fromhex(after)
        leases[ref] = value


def _indices(since: PrunedSince) -> str:
    return ", ".join(str(pruning.index) for pruning in since.prunes.prunings)


# -- pull -----------------------------------------------------------------------------------


def drop_pruned(workspace: Workspace, since: PrunedSince, old_head: bytes,
                new_head: bytes) -> int:
    """After a pull moved the branch over the remote's prunes: move this copy's tags as the
    records say, and delete every object that only the pruned commits reach, as a prune
    does (:func:`kernos.store.retention.finish`, under the same intent file, so a crash is
    finished by the next writable open).  How many commits were deleted here (pruned, or
    the old ids of renamed ones)."""
    refs = dict(line.split(" ", 1)[::-1] for line in git(
        workspace.git_dir, "for-each-ref", "--format=%(objectname) %(refname)",
        what="listing the history's refs").stdout.decode().splitlines())
    tags: dict[str, str | None] = {}
    for ref in since.tag_refs():
        if ref in refs:
            after = since.tag_after(ref, refs[ref])
            if after != refs[ref] and (after is None or _present(workspace, [after])):
                tags[ref] = after
    # Commits another ref still reaches stay (retention.finish checks that the rest went).
    holders = [sha for ref, sha in refs.items() if ref != BRANCH and ref not in tags]
    holders += [sha for sha in tags.values() if sha is not None]
    held = set(git(workspace.git_dir, "rev-list", *holders, "--", check=False).stdout
               .decode().split()) if holders else set()
    gone = _present(workspace, sorted(since.deleted() - held))
    intent = retention.Intent(old_head=old_head.hex(), new_head=new_head.hex(), tags=tags,
                              pruned=tuple(gone))
    replace_file(workspace.path / retention.INTENT, intent.to_json(), durable=workspace.durable)
    workspace.objects.wait_for_maintenance()  # no repack of ours may race the one below
    retention.finish(workspace, intent)
    return len(gone)


def _present(workspace: Workspace, ids: Sequence[str]) -> list[str]:
    if not ids:
        return []
    out = git(workspace.git_dir, "cat-file", "--batch-check=%(objectname)",
              stdin="".join(sha + "\n" for sha in ids).encode(),
              what="looking up pruned objects").stdout.decode()
    return [line for line in out.splitlines() if not line.endswith(" missing")]
