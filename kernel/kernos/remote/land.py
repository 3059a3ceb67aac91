"""Landing a checked pull or clone: one commit point, then steps a crash can repeat.

:func:`stage` writes what :func:`kernos.remote.pull.take` checked into
``<workspace>/incoming/`` (next to the quarantine repository) and syncs it::

    incoming/files/<workspace path>   payloads, LLM objects and recordings the workspace lacks
    incoming/chain.add                the new audit records, as lines
    incoming/ledger.add               the new LLM ledger lines
    incoming/meta/<name>              a clone's workspace.json and settings.json

then renames the intent file ``<workspace>/pulling`` into place: the pull's
commit point.  Before it, the workspace is as it was; a crash leaves only
``incoming``, which the next writable open deletes.  After it, :func:`land`
does each step, each one idempotent, so whoever finds the intent (this pull,
or the next writable open of the workspace after a crash:
:func:`finish_interrupted`) carries the pull through:

1. the new snapshots' objects into ``history.git`` (``git fetch`` from the
   quarantine);
2. the files, each written once (temporary name, fsync, rename);
3. the audit chain, then the ledger: cut back to the length the pull
   extended (a torn line a crash left goes), then the new lines, synced;
4. the branch, by the same rename a commit uses;
5. after the remote's prunes, what they deleted is deleted here
   (``kernos.remote.prune.drop_pruned``, under its own intent);
6. a clone's metadata, trust and remotes;
7. the intent and ``incoming`` are removed.

Crash points (``KERNOS_CRASH_AT``): ``pull.fetched`` and ``pull.checked``
(``kernos.remote.pull``), ``pull.staged`` (all written, no intent), ``pull.intent``
(the commit point passed), then ``pull.objects``, ``pull.files``,
``pull.chain``, ``pull.ledger``, ``pull.ref`` and ``pull.dropped``, each
after its step.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernos import _faults
from kernos._durable import fsync_all, fsync_dir, replace_file
from kernos.errors import AuditError, WorkspaceCorrupt
from kernos.remote.config import RemoteConfig
from kernos.remote.git import git
from kernos.remote.prune import drop_pruned, prunes_since
from kernos.remote.pull import QUARANTINE, Incoming
from kernos.store.space import NOT_FOLDED
from kernos.store.trust import TRUST, Trust
from kernos.store.workspace import Workspace

__all__ = ["INTENT", "Landed", "finish_interrupted", "land", "stage"]

INTENT = "pulling"
"""The pull's intent file, in the workspace: it exists only between its commit point and
the end of its landing."""


@dataclass(frozen=True, kw_only=True)
class Landed:
    """What a landing did."""

    dropped: int
    """Commits the remote's prunes deleted here."""


def stage(workspace: Workspace, incoming: Incoming, *, trust: dict[str, Any] | None = None,
          remote: tuple[str, str] | None = None) -> None:
    """Write what ``incoming`` brings beside the quarantine, sync it, then the intent (the
    commit point).  ``trust`` and ``remote`` (name, url): what a clone records."""
    root = workspace.path / QUARANTINE
    written: list[Path] = []
    for target, data in incoming.files.items():
        written.append(_put(root / "files" / target, data))
    for name, data in incoming.meta.items():
        written.append(_put(root / "meta" / name, data))
    written.append(_put(root / "chain.add", incoming.chain_add))
    written.append(_put(root / "ledger.add", incoming.ledger_add))
    if workspace.durable:
        fsync_all([*written, *{path.parent for path in written}])
    _faults.point("pull.staged")
    intent = {
        "v": 1, "remote": incoming.remote, "url": incoming.url,
        "old_head": None if incoming.old_head is None else incoming.old_head.hex(),
        "new_head": None if incoming.new_head is None else incoming.new_head.hex(),
        "chain": incoming.chain_size, "ledger": incoming.ledger_size,
        "files": sorted(incoming.files), "meta": sorted(incoming.meta),
        "prunes": incoming.prunes is not None, "trust": trust,
        "remote_config": None if remote is None else list(remote),
    }
    replace_file(workspace.path / INTENT, json.dumps(intent, sort_keys=True).encode(),
                 durable=workspace.durable, temporary=root / "intent.tmp")
    _faults.point("pull.intent")


def _put(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def land(workspace: Workspace) -> Landed:
    """Carry out the pull the intent file describes (see the module docstring)."""
    path = workspace.path / INTENT
    try:
        intent = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise WorkspaceCorrupt(str(workspace.path), f"the pull intent file {INTENT} is "
                               f"unreadable ({error}); the pull cannot be finished: move it "
                               "aside and run `kernos pull` again") from None
    root = workspace.path / QUARANTINE
    new_head = intent["new_head"]
    if new_head is not None and not _has(workspace, new_head):
        git(workspace.git_dir, "-c", "core.fsync=committed", "fetch", "--no-tags",
            "--no-write-fetch-head", "--quiet", str(root / "q.git"), new_head,
            what="moving the pulled snapshots into the history")
    _faults.point("pull.objects")
    for target in intent["files"]:
        destination = workspace.path / target
        if not destination.exists():
            destination.parent.mkdir(parents=True, exist_ok=True)
            replace_file(destination, (root / "files" / target).read_bytes(),
                         durable=workspace.durable,
                         temporary=destination.with_name(f".{destination.name}.pull.tmp"))
    _faults.point("pull.files")
    _extend(workspace, workspace.path / "audit" / "chain.jsonl", intent["chain"],
            (root / "chain.add").read_bytes())
    _faults.point("pull.chain")
    _extend(workspace, workspace.path / "llm" / "calls.jsonl", intent["ledger"],
            (root / "ledger.add").read_bytes())
    _faults.point("pull.ledger")
    if new_head is not None and workspace.git_ref() != bytes.fromhex(new_head):
        workspace._move_ref(bytes.fromhex(new_head), lambda temporary: fsync_all([temporary])
                            if workspace.durable else None, then=NOT_FOLDED)
    _faults.point("pull.ref")
    dropped = 0
    if intent["prunes"] and intent["old_head"] is not None and new_head is not None:
        lines = (workspace.path / "audit" / "chain.jsonl").read_bytes().splitlines(
            keepends=True)
        since = prunes_since(lines, _lines_in(workspace.path / "audit" / "chain.jsonl",
                                              intent["chain"]))
        dropped = drop_pruned(workspace, since, bytes.fromhex(intent["old_head"]),
                              bytes.fromhex(new_head))
    _faults.point("pull.dropped")
    for name in intent["meta"]:
        replace_file(workspace.path / name, (root / "meta" / name).read_bytes(),
                     durable=workspace.durable, temporary=workspace.path / f".{name}.tmp")
    if intent["trust"] is not None:
        Trust(path=workspace.path / TRUST, keys=intent["trust"]["keys"],
              untrusted=intent["trust"]["untrusted"]).save(durable=workspace.durable)
    if intent["remote_config"] is not None:
        name, url = intent["remote_config"]
        config = RemoteConfig.load(workspace.path)
        if name not in config.remotes:
            config.add(name, url)
    path.unlink()
    if workspace.durable:
        fsync_dir(workspace.path)
    shutil.rmtree(root, ignore_errors=True)
    return Landed(dropped=dropped)


def _has(workspace: Workspace, sha: str) -> bool:
    return git(workspace.git_dir, "cat-file", "-e", sha, check=False).returncode == 0


def _lines_in(path: Path, size: int) -> int:
    with open(path, "rb") as handle:
        return handle.read(size).count(b"\n")


def _extend(workspace: Workspace, path: Path, size: int, add: bytes) -> None:
    """Make ``path`` its first ``size`` bytes followed by ``add`` (whatever a crash left
    after them goes: a torn line, or ``add`` half written)."""
    if not add:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        end = handle.seek(0, os.SEEK_END)
        if end < size:
            raise AuditError(f"{path} is shorter ({end} bytes) than when the pull was checked "
                             f"({size}): something else cut it. The pull was not finished; "
                             "restore the file from a backup and pull again", path=str(path))
        handle.seek(size)
        if handle.read(len(add) + 1) == add:
            return  # landed already
        handle.truncate(size)
        handle.seek(0, os.SEEK_END)
        handle.write(add)
        handle.flush()
        if workspace.durable:
            os.fsync(handle.fileno())
    if workspace.durable:
        fsync_dir(path.parent)


def finish_interrupted(workspace: Workspace) -> str | None:
    """At a writable open: finish a pull a crash interrupted after its commit point, or
    delete what one left before it; what was done, in words."""
    if (workspace.path / INTENT).exists():
        landed = land(workspace)
        return ("finished a pull that a crash had interrupted" +
                (f" ({landed.dropped} pruned snapshots deleted)" if landed.dropped else ""))
    leftover = workspace.path / QUARANTINE
    if leftover.exists():
        shutil.rmtree(leftover, ignore_errors=True)
        return "deleted what an interrupted pull had fetched (nothing of it had landed)"
    return None
