"""``audit``: the human's Python API over the audit log and erasure.

In a Kernos notebook ``audit`` is this object (the kernel's, never
persisted)::

    audit.records(principal="bob", status="denied")
    audit.head()               # "INDEX:HASH", to anchor somewhere else
    audit.verify()             # from disk, like `kernos audit verify`
    audit.erase("c-1042")      # crypto-shred a data subject (irreversible)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kernos.audit.erasure import ErasureReport, erase, known_subjects
from kernos.audit.log import AuditLog
from kernos.audit.oplog import headline
from kernos.audit.verify import VerifyReport, verify
from kernos.history import format_table
from kernos.store.workspace import Workspace

__all__ = ["Audit", "AuditedImage", "format_records"]


class AuditedImage(Protocol):
    """What :class:`Audit` needs of the kernel's image (:class:`kernos.image.Image`)."""

    @property
    def audit(self) -> AuditLog: ...

    @property
    def workspace(self) -> Workspace: ...


class Audit:
    """Read the audit log, verify it, and erase data subjects."""

    def __init__(self, image: Callable[[], AuditedImage]) -> None:
        self._image = image

    def records(self, *, principal: str | None = None, status: str | None = None,
                topic: str | None = None, type: str | None = None,
                since_op: int | None = None, limit: int | None = 50) -> list[dict[str, Any]]:
        """Audit records, oldest first (the newest ``limit``), filtered."""
        return self._image().audit.records(principal=principal, status=status, topic=topic,
                                           type=type, since_op=since_op, limit=limit)

    def head(self) -> str:
        """``INDEX:HASH`` of the newest record."""
        index, digest = self._image().audit.head()
        return f"{index}:{digest}"

    def verify(self, anchor: str | None = None, *, since: str | None = None) -> VerifyReport:
        """Verify the chain, the snapshots and the history from disk (``since``: only after
        that ``INDEX:HASH``)."""
        return verify(self._image().workspace.path, anchor=anchor, since=since)

    def code(self, op: int) -> str | None:
        """The code op ``op`` ran (None if it was sealed and its subject erased)."""
        return self._image().audit.code(op)

    def subjects(self) -> list[str]:
        """Data subjects that personal values in this workspace belong to (not erased)."""
        known, erased = known_subjects(self._image().audit)
        return sorted(known - set(erased))

    def erase(self, subject: str) -> ErasureReport:
        """Erase a data subject now; it cannot be undone (see kernos.audit.erasure)."""
        return erase(self._image().audit, subject)

    def __repr__(self) -> str:
        return "<kernos audit: records, head, verify, code, subjects, erase>"


def format_records(records: list[dict[str, Any]]) -> str:
    """Audit records as a table (shared with the CLI)."""
    if not records:
        return "No audit records."
    rows = [("#", "op", "principal", "status", "commit", "events", "what")]
    for record in records:
        kind = record.get("type")
        if kind == "op":
            what = headline(record)  # a harness request in words, not the JSON it records
            if record.get("error"):
                what = f"{record['error']['kind']}: {record['error']['message']}"
            denied = (record.get("grants") or {}).get("denied") or []
            if denied:
                what = "denied " + ", ".join(str(d["capability"]) for d in denied[:3])
            status = str(record["status"]) + (" (no change)" if record.get("unchanged")
                                              else "")
            rows.append((str(record["index"]), str(record["op"]), str(record["principal"]),
                         status, str(record.get("commit") or "")[:12],
                         str(len(record.get("events") or [])), _cut(what)))
        else:
            detail = {"void": f"voids record {record.get('voids')}",
                      "died": f"op {record.get('op')} died with its kernel",
                      "erasure": f"erased subject {record.get('subject')}",
                      "effect": f"{record.get('tool')} {record.get('state')} (attempt "
                                f"{record.get('attempt')}, key {str(record.get('key'))[-12:]})",
                      "prune": f"pruned {len(record.get('pruned') or [])} snapshots, "
                               f"renamed {len(record.get('rewritten') or [])}; HEAD "
                               f"{str(record.get('from'))[:12]} -> "
                               f"{str(record.get('to'))[:12]}",
                      "genesis": "log started"
                      + (f", adopting {str(record.get('adopts'))[:12]}"
                         if record.get("adopts") else "")
                      + _forked(record)}.get(str(kind), str(kind))
            rows.append((str(record["index"]), str(record.get("op") or ""), "", str(kind), "",
                         "", detail))
    return format_table(rows)


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _forked(record: dict[str, Any]) -> str:
    """How a fork's genesis (``kernos fork``) names its source."""
    origin = record.get("forked_from")
    return f", forked from {origin.get('workspace')}" if isinstance(origin, dict) else ""
