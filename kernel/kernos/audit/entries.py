"""The records of the audit chain: their format, and what the log keeps of each in memory.

The chain (:mod:`kernos.audit.log`) is one record per line of
``audit/chain.jsonl``, in canonical JSON (:mod:`kernos.audit.canonical`).

A record is a JSON object.  Every record has ``v`` (format), ``index`` (its
position, from 0), ``type``, ``at`` (UTC time), ``prev`` (the previous
record's hash; 64 zeros for the first) and ``hash``: SHA-256 over the
canonical encoding of the record without ``hash``.  Records appended since
signing began also carry ``signer`` and ``sig``: the writer's key id and its
Ed25519 signature (``signing.py``), which ``hash`` covers too.  Types:

``genesis``
    The first record.  ``adopts`` names the history's head when the log was
    started (a workspace that predates its audit log, or a fork), else null.
    ``forked_from``, only in a workspace made by ``kernos fork``
    (:mod:`kernos.fork`): where its history came from, ``workspace`` (the
    source's path), ``created_at`` (from the source's ``workspace.json``),
    ``commit`` (the snapshot forked, which ``adopts`` names too), ``op`` (the
    op that wrote it) and ``audit`` (``index`` and ``hash`` of the source's
    newest record when the fork was made, to check against the source's
    chain).
``op``
    One op, committed or not: ``op``, ``kind``, ``principal``, ``status``
    (``committed``, ``rolled back``, ``failed``, ``interrupted``, ``denied``,
    ``vetoed``; for a harness request refused before its body ran,
    ``conflict`` or ``rejected``), ``error``, ``code`` (``sha256`` and ``text`` inline when
    small, else a payload ``ref``; *sealed* for the op's data subjects when it
    tagged personal values), ``grants`` (``used`` and ``denied``),
    ``changes``, ``events``, ``effects``, ``commit`` (the snapshot, for a
    committed op), ``started_at`` and ``finished_at``; ``sizes``
    (``image`` and ``history`` bytes after a committed op); ``key``, the
    idempotency key a harness sent with the op, only when it sent one.
    ``llm``, only when the op made LLM calls: one entry per call (``request``
    and ``response`` hashes in ``<workspace>/llm/objects``, ``model``,
    ``principal``, ``mode``, ``cached``, ``tokens``, ``cost``,
    ``latency_ms``, the ledger's ``call`` number, and ``error`` if it failed).
``void``
    ``voids`` names an ``op`` record whose commit never became visible (the
    kernel died, or the commit failed, after the record was written).
``died``
    An op that was running when its kernel died: ``op``, ``principal``,
    ``kind``, ``code`` (hash only), ``started_at``.
``erasure``
    A data subject was erased: ``subject`` and the payload ``refs`` deleted.
``prune``
    ``kernos prune`` rewrote the history: ``from`` and ``to`` (HEAD before
    and after), the ``pruned`` commits, the kept commits ``rewritten`` with
    new ids (``[old, new]`` pairs), the ``tags`` moved and deleted, the
    ``policy`` and how many snapshots were ``kept`` (see ``pruning.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernos.audit.canonical import canonical, digest

__all__ = ["CHAIN", "COMMITTED", "DIRECTORY", "FORMAT", "GENESIS_PREV", "INFLIGHT",
           "INLINE_CODE_BYTES", "INLINE_PAYLOAD_BYTES", "MAX_BOUND_HASHES", "PAYLOADS", "Entry",
           "entry_of", "record_hash"]

FORMAT = 1
DIRECTORY = "audit"
CHAIN = "chain.jsonl"
PAYLOADS = "payloads"
INFLIGHT = "inflight.json"
GENESIS_PREV = "0" * 64
INLINE_CODE_BYTES = 4096
INLINE_PAYLOAD_BYTES = 1024
COMMITTED = "committed"
MAX_BOUND_HASHES = 256
"""Record hashes a snapshot's manifest binds at most (the newest ones)."""


def record_hash(record: dict[str, Any]) -> str:
    """The hash of a record: SHA-256 of its canonical form without ``hash``."""
    body = {key: value for key, value in record.items() if key != "hash"}
    return digest(canonical(body))


@dataclass(kw_only=True)
class Entry:
    """What the log keeps in memory about one record (the record itself stays on disk)."""

    index: int
    """Position in the chain."""
    offset: int
    """Byte offset of its line in chain.jsonl."""
    length: int
    """Length of its line, newline included."""
    type: str
    """genesis, op, void, died, erasure, effect or prune."""
    hash: str
    """Its hash."""
    op: int | None = None
    """The op it records, if any."""
    status: str | None = None
    """For op records: committed, rolled back, ..."""
    principal: str | None = None
    """Who ran the op."""
    commit: str | None = None
    """The snapshot a committed op wrote (or, ``unchanged``, the one it left as it was)."""
    unchanged: bool = False
    """A committed op that changed nothing and wrote no snapshot."""
    first_seq: int = 0
    """The sequence number of its first event."""
    events: int = 0
    """How many events it holds."""
    topics: frozenset[str] = field(default_factory=frozenset)
    """The topics of its events (for filtering without reading the record)."""
    voided: bool = False
    """A later void record says its commit never became visible."""
    key: str | None = None
    """The op's idempotency key, if its sender gave one."""


def entry_of(record: dict[str, Any], *, index: int, offset: int, length: int) -> Entry:
    """The index entry of ``record``, the line at ``offset`` (``length`` bytes long)."""
    events = record.get("events") or []
    first_seq = events[0]["seq"] if events else 0
    return Entry(
        index=index, offset=offset, length=length, type=str(record.get("type")),
        hash=str(record.get("hash")), op=record.get("op"), status=record.get("status"),
        principal=record.get("principal"), commit=record.get("commit"),
        unchanged=record.get("unchanged") is True,
        first_seq=first_seq, events=len(events),
        topics=frozenset(str(event.get("topic")) for event in events),
        key=record.get("key") if type(record.get("key")) is str else None,
    )
