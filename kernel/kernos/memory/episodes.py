"""The episodic layer's text, read from the audit chain: ops, events and LLM exchanges.

:func:`op_entries` turns one ``op`` record into index entries (the op's
status, error and code; one per event, its topic and payload; one per LLM
exchange, the request and answer from ``<workspace>/llm/objects``, but none
for the embedding calls recall itself made), each with
the data subjects whose sealed payloads it holds, so that an erasure finds them.

Each entry belongs to the principal that made it, which is not always the
op's: one op holds the exchanges of everyone whose code ran in it.  An
agent's subscriber runs as itself inside the emitter's op, so its events
and LLM calls are its own; a tool runs as its caller (the call entry names
the principal the runtime ran it as); the human's trusted code (a subscriber,
a tool calling ``agents.llm``) acts as the human.  So the op entry goes to
the record's ``principal``, each event to its own ``principal`` (the
emitter) and each LLM call to its own ``principal`` (the caller).  A field
that is missing or not a name (a damaged or foreign record) proves no one
the maker: the entry goes to the human, who may read the whole chain
anyway, and never to another principal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kernos.audit.log import AuditLog

__all__ = ["code_text", "flat", "llm_store", "llm_text", "maker", "op_entries", "records_from"]

HUMAN = "human"


def op_entries(log: AuditLog, record: dict[str, Any], llm: Any) -> Iterator[dict[str, Any]]:
    """The entries (``MemoryIndex._add``'s arguments) of one op record: the op, its events,
    its LLM exchanges, each credited to the principal that made it (see the module
    docstring)."""
    common: dict[str, Any] = {"kind": "episodic", "op": record.get("op"),
                              "audit": record["index"],
                              "at": record.get("finished_at") or record.get("at"),
                              "status": record.get("status")}
    code, code_subjects = code_text(log, record.get("code"))
    error = record.get("error") or ""
    status = record.get("status")
    yield {"body": f"{status} {error}\n{code}", "title": f"op {record.get('op')} {status}",
           "subjects": code_subjects, "principal": maker(record), **common}
    for event in record.get("events") or []:
        subjects = list(event.get("subjects", []))
        try:
            payload = (event["payload"] if "payload" in event
                       else log.resolve_event(event, record)["payload"])
        except (OSError, ValueError, KeyError):
            payload = None
        yield {"body": f"{event.get('topic')} {flat(payload)}",
               "title": f"event {event.get('topic')}", "subjects": subjects,
               "principal": maker(event), **common}
    for call in record.get("llm") or []:
        if call.get("kind") == "embedding":
            continue  # the memory's own upkeep (an entry's text, a query): not an exchange
        text, subjects = llm_text(llm, call)
        yield {"body": f"{call.get('model')} {text}", "title": f"llm {call.get('model')}",
               "subjects": subjects, "principal": maker(call), **common}


def maker(item: dict[str, Any]) -> str:
    """Who made an op, an event or an LLM call, as its record says; the human when the
    record does not say (nothing then proves that any agent made it)."""
    found = item.get("principal")
    return found if type(found) is str and found else HUMAN


def records_from(log: AuditLog, start: int) -> Iterator[dict[str, Any]]:
    """The chain's records from ``start``, read in one pass (not one open per record)."""
    if start >= len(log):
        return
    end = len(log)
    with open(log.path, "rb") as chain:
        chain.seek(log.entries[start].offset)
        for _position in range(start, end):
            record: dict[str, Any] = json.loads(chain.readline())
            yield record


def code_text(log: AuditLog, code: object) -> tuple[str, list[str]]:
    if not isinstance(code, dict):
        return "", []
    if "text" in code:
        return str(code["text"]), []
    subjects = [str(subject) for subject in code.get("sealed", [])]
    data = log.payload(str(code.get("ref")))
    if data is None:
        return "", subjects
    if subjects:
        opened = log.keyring.open(subjects, data)
        return ("" if opened is None else opened.decode("utf-8", "replace")), subjects
    return data.decode("utf-8", "replace"), []


def flat(value: object) -> str:
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def llm_store(log: AuditLog) -> Any:
    from kernos.llm._store import LlmStore

    if not (log.root / "llm").is_dir():
        return None
    return LlmStore(log.root, durable=False, keyring=log.keyring)


def llm_text(store: Any, call: dict[str, Any]) -> tuple[str, list[str]]:
    """The request and response of one recorded call, and the subjects they were sealed for."""
    from kernos.llm._store import SEALED

    if store is None:
        return "", []
    parts: list[str] = []
    subjects: set[str] = set()
    for key in ("request", "response"):
        name = call.get(key)
        if type(name) is not str:
            continue
        try:
            raw = json.loads((store.objects / f"{name}.json").read_bytes())
            if isinstance(raw, dict) and isinstance(raw.get(SEALED), dict):
                subjects |= {str(s) for s in raw[SEALED].get("subjects", [])}
            parts.append(flat(store.get(name)))
        except Exception:  # missing or erased recording: index what remains
            continue
    return " ".join(parts), sorted(subjects)
