"""A fork's origin: what its genesis record says it was forked from, checked against the source.

``kernos fork`` (:mod:`kernos.fork`) writes the fork's genesis record with a
``forked_from`` field (see :mod:`kernos.audit.log`); :func:`check_origin`
reads that field and checks it against the source workspace's chain, if the
source is still there.  :func:`kernos.audit.verify.verify` reports it; the
record format and its check sit here, below both the fork and the verifier.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernos.audit.log import AuditLog
from kernos.errors import KernosError
from kernos.personal import Keyring
from kernos.store.workspace import Workspace

__all__ = ["Origin", "check_origin"]


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Where a forked workspace came from, checked against its source when it is there."""

    forked_from: dict[str, Any]
    """The genesis record's ``forked_from``."""
    checked: bool
    """Whether SRC was found and its chain read."""
    problems: list[str] = field(default_factory=list)
    """What disagrees with SRC (empty: the origin is confirmed, or SRC is gone)."""
    note: str = ""
    """Why it was not checked, or what else a reader should know."""

    def describe(self) -> str:
        source = self.forked_from.get("workspace")
        commit = str(self.forked_from.get("commit"))[:12]
        audit = self.forked_from.get("audit") or {}
        text = (f"forked from {source} at {commit} (op {self.forked_from.get('op')}), "
                f"its audit record {audit.get('index')}:{str(audit.get('hash'))[:16]}")
        if self.problems:
            return text + ": " + "; ".join(self.problems)
        if self.checked:
            return text + ": confirmed against the source's chain"
        return text + f": not checked ({self.note})"

    def to_json(self) -> dict[str, Any]:
        return {"forked_from": self.forked_from, "checked": self.checked,
                "problems": self.problems, "note": self.note}


def check_origin(path: str | os.PathLike[str], genesis: dict[str, Any]) -> Origin | None:
    """For a fork's genesis (``forked_from``), check its origin against SRC if it exists:
    SRC's chain still holds the record it names with that hash, and REF's commit is in
    SRC's history (or a prune there says it was pruned).  A source deleted, or replaced by
    another workspace (another ``created_at``), is not checked, and says so; that is no
    problem of the fork's.  None for a workspace that is no fork."""
    facts = genesis.get("forked_from")
    if not isinstance(facts, dict):
        return None
    problems = []
    if facts.get("commit") != genesis.get("adopts"):
        problems.append(f"its genesis adopts {str(genesis.get('adopts'))[:12]}, not the "
                        f"commit it names as forked from ({str(facts.get('commit'))[:12]})")
    source = Path(str(facts.get("workspace")))
    if not (source / "workspace.json").exists():
        return Origin(forked_from=facts, checked=False, problems=problems,
                      note=f"the source {source} is not there any more")
    try:
        created = json.loads((source / "workspace.json").read_text()).get("created_at")
    except (OSError, ValueError, AttributeError):
        created = None
    if facts.get("created_at") is not None and created != facts.get("created_at"):
        return Origin(forked_from=facts, checked=False, problems=problems,
                      note=f"the workspace at {source} now is another one (created {created}, "
                           f"not {facts.get('created_at')})")
    audit = facts.get("audit") or {}
    index = audit.get("index")
    try:
        with Workspace.open(source, writable=False, create=False) as src:
            # Read only: what open_audit does for a workspace opened read-only.
            log = AuditLog(src.path, keyring=Keyring(Path(src.path) / "keys",
                                                     durable=src.durable),
                           durable=src.durable, writable=False)
            try:
                if type(index) is not int or not 0 <= index < len(log):
                    problems.append(f"the source's chain has no record {index!r} (the chain "
                                    "was cut, or the origin is false)")
                elif log.entries[index].hash != audit.get("hash"):
                    problems.append(f"the source's record {index} has another hash than the "
                                    "fork names (the source's chain was rewritten, or the "
                                    "origin is false)")
                pruned = any(entry.type == "prune" for entry in log.entries)
            finally:
                log.close()
            try:
                src.read_commit(bytes.fromhex(str(facts.get("commit"))))
            except (KernosError, ValueError):
                if not pruned:
                    problems.append(f"the source has no commit {str(facts.get('commit'))[:12]}")
    except KernosError as error:
        return Origin(forked_from=facts, checked=False, problems=problems,
                      note=f"the source could not be read ({error})")
    return Origin(forked_from=facts, checked=True, problems=problems)
