"""The source of a replay: the workspace whose recorded ops are re-run, read only.

:class:`Source` answers what the original recorded, as it was then: an op's
code, the snapshot a fork started from, the snapshot a ref such as ``@N``
names, the snapshot a checkout took, the outcomes a follow-up op took from
the effects journal, and the op the source's kernel died committing.  A
prune may have renamed or deleted snapshots since; :attr:`Source.prunes`
maps recorded ids to the current ones.  :func:`fetch_history` and
:func:`copy_recordings` bring the source's history objects and its recorded
LLM calls into the new workspace.  Nothing here writes to the source.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from kernos.audit import open_audit
from kernos.audit.pruning import Prunes
from kernos.audit.verify_history import unpublished
from kernos.errors import UsageError
from kernos.llm._store import DIRECTORY as LLM_DIRECTORY
from kernos.store.snapshots import read_snapshot
from kernos.store.workspace import Workspace


class Source:
    """A source workspace, opened read-only, with its audit log and the prunes it records."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.audit = open_audit(workspace)
        self.prunes = Prunes.from_log(self.audit)
        self._journal: dict[str, list[dict[str, Any]]] | None = None

    def tag(self) -> str:
        """The identity the replayed image takes: the source's first audit hash."""
        entries = self.audit.entries
        return str(entries[0].hash[:12]) if entries else "local"

    def unfinished(self) -> int | None:
        """The audit index of the op the source's kernel died committing, if it did.

        Only the newest committed record can name a commit that was never
        published (see ``AuditLog.recover``, which voids it at the next writable
        open, and ``verify``, which reports it as unfinished)."""
        index = self.audit.last_commit_index()
        if index is None:
            return None
        commit = self.audit.entries[index].commit
        if commit is None or self.prunes.resolve(commit, index)[1] is not None:
            return None  # a prune after it renamed or deleted its snapshot
        head = self.workspace.head()
        if head is not None and commit == head.hex():
            return None
        return index if unpublished(self.workspace, commit) else None

    def code(self, record: dict[str, Any]) -> str | None:
        code = record.get("code")
        if code is None:
            return None
        if code.get("sealed"):
            return None
        if "text" in code:
            return str(code["text"])
        return self.audit.code(int(record["op"]))

    def forked_at(self) -> str | None:
        """A fork's history starts at the snapshot it was forked from (``kernos.fork``):
        its ops run on that image, not on an empty one."""
        if not self.audit.entries:
            return None
        genesis = self.audit.read(0)
        adopted = genesis.get("adopts")
        return adopted if isinstance(genesis.get("forked_from"), dict) and isinstance(
            adopted, str) else None

    def resolve(self, ref: str) -> bytes:
        """A ref of the source; ``@N`` of an op that wrote no snapshot (it changed nothing,
        or rolled back, as its audit record says) is the image it left: the snapshot before."""
        op = op_named(ref)
        if op:
            entries = [entry for entry in self.audit.entries
                       if entry.type == "op" and entry.op == op and not entry.voided]
            wrote = any(entry.status == "committed" and not entry.unchanged for entry in entries)
            if entries and not wrote:
                return self.workspace.snapshot_of_op(op, exact=False, ref=ref)
        return self.workspace.resolve(ref)

    def checked_out(self, record: dict[str, Any], ref: str) -> str:
        """The commit a checkout took, as it resolved then (``HEAD~1`` moves on)."""
        commit = record.get("commit")
        if not isinstance(commit, str):
            return ref
        now, by = self.prunes.resolve(commit, int(record.get("index", -1)))
        if now is None:
            raise UsageError(f"op {record.get('op')} checked out {ref}, but its snapshot was "
                             f"pruned (audit record {by}), so which snapshot it took is not "
                             "known any more: replay --from a snapshot after it")
        note = str(read_snapshot(self.workspace, bytes.fromhex(now)).manifest.get("note", ""))
        return note.removeprefix("checkout ").strip() if note.startswith("checkout ") else ref

    def recorded_effects(self, record: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The outcomes a follow-up op recorded, with their request hashes and results."""
        if self._journal is None:
            self._journal = {}
            for entry in self.audit.entries:
                if entry.type == "effect" and entry.key is not None:
                    self._journal.setdefault(entry.key, []).append(
                        self.audit.read(entry.index))
        found = {}
        for outcome in record.get("effects") or []:
            key = str(outcome.get("key"))
            journal = self._journal.get(key, [])
            done = [item for item in journal if item.get("state") == "done"]
            found[key] = {**outcome, "request": journal[0].get("request") if journal else None,
                          "result": done[-1].get("result") if done else None}
        return found


def fetch_history(workspace: Workspace, original: Workspace) -> None:
    """Bring the source's history objects into the new workspace (not its branch)."""
    if original.head() is None:
        return
    # Commits the source's kernel has not folded into git yet (kernos.store.tail).
    workspace.objects.add_packed(original.tail.objects.items())
    if original.git_ref() is None:
        return  # every commit is still in the tail
    completed = subprocess.run(
        # One pack (the store reads packs itself): unpacking every object loose made a
        # replay's start grow with the whole history, 8 s at 1,100 ops.
        ["git", "--git-dir", str(workspace.git_dir), "fetch", "--quiet", "--no-tags",
         str(original.git_dir), "+refs/heads/main:refs/kernos/source"],
        capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise UsageError(f"could not read the history of {original.path}: "
                         f"{completed.stderr.strip()[:500]}")


def copy_recordings(workspace: Workspace, original: Workspace) -> None:
    """The source's recorded LLM requests and answers (not its ledger: the replayed ops
    spend again, and the calls of the others are absorbed as the replay goes)."""
    for part in ("objects", "recordings"):
        source = Path(original.path) / LLM_DIRECTORY / part
        if source.is_dir():
            shutil.copytree(source, Path(workspace.path) / LLM_DIRECTORY / part,
                            dirs_exist_ok=True)


def op_named(ref: str) -> int:
    """N for a ref ``@N``, else 0."""
    match = re.fullmatch(r"\s*@(\d+)\s*", ref)
    return int(match.group(1)) if match else 0
