"""The audit: a tamper-evident, hash-chained record of every op, and erasure.

* ``kernos.audit.log``: the chain on disk (:class:`AuditLog`);
  ``entries.py`` holds the records' format, ``canonical.py`` their encoding,
  ``markers.py`` the sealed personal values inside payloads, and ``topics.py``
  the topic syntax events are named and filtered by;
* ``kernos.audit.record``: how an op's transaction writes its record (it reads
  the op through the narrow :class:`~kernos.audit.record.AuditedOp`);
* ``kernos.audit.verify``: :func:`verify`, run from disk in any process
  (``report.py`` holds what it returns, ``suffix.py`` reads the records after
  an anchor from the end of the log);
* ``kernos.audit.erasure``: :func:`erase` a data subject;
* ``kernos.audit.pruning``: the ``prune`` record, and what older records'
  commits became after ``kernos prune`` rewrote the history.
* ``kernos.audit.origin``: a fork's origin, checked against its source;
* ``kernos.audit.offline``: a checkout without a kernel (an op with a record).

Nothing here imports Jupyter.
"""

from __future__ import annotations

from pathlib import Path

from kernos.audit.erasure import ErasureReport, erase, finish_pending
from kernos.audit.log import AuditLog, record_hash
from kernos.audit.verify import Problem, VerifyReport, verify
from kernos.personal import Keyring
from kernos.store.workspace import Workspace

__all__ = [
    "AuditLog",
    "ErasureReport",
    "Problem",
    "VerifyReport",
    "erase",
    "open_audit",
    "record_hash",
    "verify",
]


def open_audit(workspace: Workspace) -> AuditLog:
    """The audit log of a workspace opened without a kernel (recovered if writable)."""
    keyring = Keyring(Path(workspace.path) / "keys", durable=workspace.durable)
    log = AuditLog(workspace.path, keyring=keyring, durable=workspace.durable,
                   writable=workspace.writable)
    head = workspace.head()
    if workspace.writable:

        def exists(commit: str) -> bool:
            try:
                workspace.read_commit(bytes.fromhex(commit))
            except Exception:
                return False
            return True

        log.recover(None if head is None else head.hex(), exists)
        finish_pending(log)
    else:
        log.published = _published(log, None if head is None else head.hex())
    return log


def _published(log: AuditLog, head: str | None) -> int:
    """The newest record whose events are visible, reading from disk.

    That is the newest committed record whose commit the branch names (or
    prune record whose new head it names: a prune renames the commits older
    records name); a newer one (written just before its commit point) is not
    published yet.  A log with no committed op publishes everything (there is
    nothing to hide).
    """
    committed = False
    for entry in reversed(log.entries):
        if entry.voided:
            continue
        if entry.type == "op" and entry.status == "committed":
            if entry.commit == head:
                return entry.index
            committed = True
        elif entry.type == "prune" and log.read(entry.index).get("to") == head:
            return entry.index
    return -1 if committed else len(log.entries) - 1
