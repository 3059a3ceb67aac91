"""Erasing a data subject (crypto-shredding; see ``kernos.personal`` for the choice).

``erase(log, subject)`` makes every value tagged with ``subject`` unreadable
everywhere on disk, without rewriting history:

1. an intent file (``keys/<id>.erasing``) is written and synced, so that a
   crash part-way is finished by the next open (:func:`finish_erasures`);
2. live wrappers in this process are erased (they show ``<erased>``);
3. the subject's key is overwritten, synced and deleted: every sealed copy in
   snapshots, packfiles, old commits and the audit payloads is now noise;
4. the code of the ops that tagged the subject's values, stored sealed as
   audit payloads, is deleted as well, and so are the recorded answers of
   recalls that held the subject's text (``memory``, kernos.memory).  Event
   payloads stay: their personal values are sealed inside them, noise once
   the key is gone, and the rest of each payload is ordinary audit data
   (reading it back shows
   ``{"$personal": {"subject": ..., "erased": true}}`` where a value was);
   What floors above the audit hold sealed under the subject is deleted by
   the erasers they register (:func:`register_eraser`: the LLM recordings,
   ``kernos.llm._erasure``);
5. the memory index (``memory/index.sqlite``, a cache: see ``kernos.memory``)
   is deleted, since it may hold the subject's opened text; it is rebuilt
   from the chain when next opened;
6. an ``erasure`` record is appended to the chain, naming the subject and
   the payloads removed, so ``verify`` knows those payloads are missing on
   purpose; the intent file is removed.

Erasure is not part of an op's transaction: it cannot be rolled back, by
design.  Snapshot hashes and the chain are untouched, so ``verify`` still
passes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kernos.audit.log import AuditLog
from kernos.errors import UnknownSubject, UsageError
from kernos.personal import check_subject, erase_live

__all__ = [
    "Eraser",
    "ErasureReport",
    "erase",
    "finish_erasures",
    "known_subjects",
    "register_eraser",
]

Eraser = Callable[[Path, str, bool], int]
"""What else holds a subject's sealed data, below the audit's sight: called with the
workspace's root, the subject and ``durable`` after the subject's key is destroyed;
returns how many recordings it deleted (``ErasureReport.recordings``)."""

_erasers: list[Eraser] = []


def register_eraser(eraser: Eraser) -> None:
    """Have :func:`erase` call ``eraser`` too (kernos.llm._erasure registers the LLM
    recordings; ``kernos/__init__.py`` imports it, so every process has it)."""
    if eraser not in _erasers:
        _erasers.append(eraser)


class _HasAudit(Protocol):
    """What :func:`finish_erasures` needs of an image: its audit log."""

    @property
    def audit(self) -> AuditLog: ...

MEMORY_INDEX = "memory/index.sqlite"
"""The memory index (``kernos.memory.index.INDEX_PATH``; named here, not imported, since
the audit sits below the memory)."""


@dataclass(frozen=True, kw_only=True)
class ErasureReport:
    """What an erasure did."""

    subject: str
    """The data subject erased."""
    key_destroyed: bool
    """Whether a key existed and was destroyed."""
    payloads: tuple[str, ...]
    """Audit payloads deleted."""
    live: int
    """Live values in this process that now show ``<erased>``."""
    recordings: int
    """Recorded LLM requests and answers (``<workspace>/llm/``) sealed under it, deleted."""
    record: int
    """The index of the erasure record in the chain."""

    def __str__(self) -> str:
        key = "its key destroyed" if self.key_destroyed else "it had no key"
        return (f"erased {self.subject}: {key}; {_count(len(self.payloads), 'audit payload')}"
                f" and {_count(self.recordings, 'LLM recording')} deleted; "
                f"{_count(self.live, 'live value')} now {'shows' if self.live == 1 else 'show'}"
                f" <erased> (audit record {self.record})")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def known_subjects(log: AuditLog) -> tuple[set[str], dict[str, int]]:
    """(subjects with a key or a sealed payload, subject -> index of its erasure record)."""
    known = set(log.keyring.subjects())
    erased: dict[str, int] = {}
    for entry in log.entries:
        if entry.type == "erasure":
            record = log.read(entry.index)
            erased[str(record["subject"])] = entry.index
        elif entry.type == "op":
            known |= set(_subjects_of_record(log.read(entry.index)))
    return known, erased


def sealed_fields(record: dict[str, object]) -> list[dict[str, Any]]:
    """The fields of an op record stored like code (inline, by ref, or sealed): its code and
    the answers of its recalls (``memory``, see kernos.memory.service)."""
    fields = [record.get("code")]
    memory = record.get("memory")
    if isinstance(memory, list):
        fields += [item.get("answer") for item in memory if isinstance(item, dict)]
    return [field for field in fields if isinstance(field, dict)]


def _subjects_of_record(record: dict[str, object]) -> list[str]:
    found: list[str] = []
    for field in sealed_fields(record):
        found += list(field.get("sealed", []))
    events = record.get("events")
    if isinstance(events, list):
        for event in events:
            found += list(event.get("subjects", []))
    return found


def _refs_for(log: AuditLog, subject: str) -> list[str]:
    refs = []
    for entry in log.entries:
        if entry.type != "op":
            continue
        for field in sealed_fields(log.read(entry.index)):
            if subject in field.get("sealed", []):
                refs.append(str(field["ref"]))
    return sorted(set(refs))


def _intent(log: AuditLog, subject: str) -> str:
    import hashlib

    return str(log.keyring.directory / (hashlib.sha256(subject.encode()).hexdigest()[:40]
                                        + ".erasing"))


def erase(log: AuditLog, subject: object) -> ErasureReport:
    """Erase ``subject`` (see the module docstring); UnknownSubject if it was never seen."""
    subject = check_subject(subject)
    known, erased = known_subjects(log)
    if subject in erased and log.keyring.key(subject) is None:
        raise UsageError(f"the data subject {subject!r} was already erased (audit record "
                         f"{erased[subject]}); there is nothing left to erase")
    if subject not in known:
        raise UnknownSubject(subject, sorted(known - set(erased)))
    from kernos._durable import replace_file

    log.keyring.directory.mkdir(exist_ok=True)
    path = _intent(log, subject)
    replace_file(Path(path), json.dumps({"subject": subject}).encode(), durable=True, mode=0o600)
    return _complete(log, subject, path)


def _complete(log: AuditLog, subject: str, intent: str) -> ErasureReport:
    live = erase_live(subject)
    destroyed = log.keyring.destroy(subject)
    refs = _refs_for(log, subject)
    deleted = tuple(ref for ref in refs if log.delete_payload(ref))
    recordings = sum(eraser(log.root, subject, log.durable) for eraser in _erasers)
    (log.root / MEMORY_INDEX).unlink(missing_ok=True)  # a cache holding opened text
    record = log.append({"type": "erasure", "subject": subject, "refs": refs,
                         "key_destroyed": destroyed, "recordings": recordings})
    os.unlink(intent)
    return ErasureReport(subject=subject, key_destroyed=destroyed, payloads=deleted, live=live,
                         recordings=recordings, record=record["index"])


def finish_erasures(image: _HasAudit) -> list[str]:
    """Complete erasures that a crash interrupted (their intent files remain)."""
    return finish_pending(image.audit)


def finish_pending(log: AuditLog) -> list[str]:
    notes: list[str] = []
    directory = log.keyring.directory
    if not directory.is_dir():
        return notes
    for path in sorted(directory.glob("*.erasing")):
        try:
            subject = check_subject(json.loads(path.read_text())["subject"])
        except (ValueError, KeyError, TypeError, UsageError):
            continue
        _complete(log, subject, str(path))
        notes.append(f"finished erasing the data subject {subject!r}")
    return notes
