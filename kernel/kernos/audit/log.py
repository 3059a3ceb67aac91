"""The audit log: an append-only, hash-chained record of every op.

Layout, beside the history in the workspace::

    audit/
        chain.jsonl      one record per line, in canonical JSON (see canonical.py)
        payloads/<sha>   large or personal payloads, named by the SHA-256 of their bytes
        inflight.json    the op now running (overwritten as each op begins)

A record is a JSON object; ``kernos.audit.entries`` describes every type and
field, and holds the in-memory :class:`~kernos.audit.entries.Entry` the log
keeps of each record.

Crash semantics match the snapshots': the record of a committed op (or of a
prune) is appended and synced *before* the branch moves (the commit point), so
an op acknowledged as committed always has its record.  If the process dies in
between, the next open finds a record whose commit (a prune's ``to``) is not
in the history and appends a ``void`` record for it.  Events are published (to external
subscribers) only from committed records that are not voided and whose
commit the branch has reached.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernos._durable import write_all
from kernos._time import utc_now
from kernos.audit.canonical import canonical, digest
from kernos.audit.entries import (
    CHAIN,
    COMMITTED,
    DIRECTORY,
    FORMAT,
    GENESIS_PREV,
    INFLIGHT,
    INLINE_CODE_BYTES,
    INLINE_PAYLOAD_BYTES,
    MAX_BOUND_HASHES,
    PAYLOADS,
    Entry,
    entry_of,
    record_hash,
)
from kernos.audit.markers import open_personal_markers
from kernos.audit.signing import sign
from kernos.audit.topics import compile_pattern, matches
from kernos.errors import AuditError
from kernos.personal import Keyring
from kernos.store.identity import load_identity
from kernos.store.space import reporting_full_disk

__all__ = ["CHAIN", "DIRECTORY", "GENESIS_PREV", "INLINE_CODE_BYTES", "INLINE_PAYLOAD_BYTES",
           "MAX_BOUND_HASHES", "PAYLOADS", "AuditLog", "Entry", "record_hash",
           "restore_records"]

class AuditLog:
    """The audit chain of one workspace.  Writable only by the process holding its lock."""

    def __init__(self, root: Path, *, keyring: Keyring, durable: bool = True,
                 writable: bool = True, signer: Ed25519PrivateKey | None = None) -> None:
        self.root = root
        self.directory = root / DIRECTORY
        self.path = self.directory / CHAIN
        self.payload_dir = self.directory / PAYLOADS
        self.keyring = keyring
        self.durable = durable
        self.unsynced = False
        """Whether the last record was appended without an fsync (see :meth:`append`)."""
        self.writable = writable
        self._signer = signer
        """Loaded at the first append (``signer``): opening a log never touches the
        workspace's identity, so a damaged chain refused at open changes nothing."""
        self.published = -1
        """Index of the newest op record whose commit is visible."""
        self.notes: list[str] = []
        self._reset()
        self._file: io.FileIO | None = None
        """The chain, open for appending between records (closed with the log)."""
        self._inflight_file: io.FileIO | None = None
        self._inflight_size = 0
        self.last_line = b""
        """The last record appended, as its line (a commit's frame carries a copy)."""
        self._load()

    def _reset(self) -> None:
        """The in-memory index of an empty chain (``_load`` fills it)."""
        self.entries: list[Entry] = []
        self._keys: dict[str, int] = {}
        """Idempotency key -> index of the committed op record that carries it."""
        self._effects: dict[str, int] = {}
        """Effect key -> index of its newest ``effect`` record (see kernos.effects)."""
        self._next_seq = 1
        self._last_op = 0
        self._last_commit: int | None = None
        self._last_prune: int | None = None
        self._size = 0

    # -- reading ------------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        torn = b""
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            data, torn = data[:cut], data[cut:]
        offset = 0
        previous = GENESIS_PREV
        for index, line in enumerate(data.splitlines(keepends=True)):
            try:
                record = json.loads(line)
                if type(record) is not dict:
                    raise ValueError("not an object")
                if record.get("index") != index or record.get("prev") != previous:
                    raise ValueError("out of sequence")
            except ValueError as error:
                raise self._damaged(index, f"it cannot be read ({error})") from None
            entry = entry_of(record, index=index, offset=offset, length=len(line))
            target = record.get("voids")
            self._register(entry, target if type(target) is int else None)
            previous = entry.hash
            offset += len(line)
        if self.entries:
            last = self.read(len(self.entries) - 1)
            if record_hash(last) != last.get("hash"):
                raise self._damaged(len(self.entries) - 1, "its hash does not match its content")
        self._size = offset
        if torn:
            if not self.writable:
                raise self._damaged(len(self.entries),
                                    "the last line is incomplete (an append was cut short)")
            self._cut_torn(torn)

    def _register(self, entry: Entry, voids: int | None) -> None:
        """Add an entry to the in-memory index, keeping the running totals current."""
        if entry.type == "void" and voids is not None and 0 <= voids < len(self.entries):
            self.entries[voids].voided = True
            voided_key = self.entries[voids].key
            if voided_key is not None and self._keys.get(voided_key) == voids:
                del self._keys[voided_key]
            if voids == self._last_commit:
                self._last_commit = None
                for earlier in reversed(self.entries[:voids]):
                    if (earlier.type == "op" and earlier.status == COMMITTED
                            and not earlier.unchanged and not earlier.voided):
                        self._last_commit = earlier.index
                        break
            if voids == self._last_prune:
                self._last_prune = next((earlier.index for earlier in reversed(
                    self.entries[:voids]) if earlier.type == "prune" and not earlier.voided),
                    None)
        self.entries.append(entry)
        if entry.events:
            self._next_seq = entry.first_seq + entry.events
        if entry.op is not None:
            self._last_op = max(self._last_op, entry.op)
        if entry.type == "effect" and entry.key is not None:
            self._effects[entry.key] = entry.index
        if entry.type == "op" and entry.status == COMMITTED:
            if not entry.unchanged:  # an op that changed nothing wrote no snapshot
                self._last_commit = entry.index
            if entry.key is not None:
                self._keys.setdefault(entry.key, entry.index)
        if entry.type == "prune":
            self._last_prune = entry.index

    def _damaged(self, index: int, problem: str) -> AuditError:
        return AuditError(
            f"the audit log {self.path} is damaged at record {index}: {problem}. Nothing was "
            "changed. Run `kernos audit verify` to see the first bad record; to keep working, "
            "move the audit directory aside (it is evidence) and restore it from a backup.",
            path=str(self.path), index=index)

    def _cut_torn(self, torn: bytes) -> None:
        keep = keep_torn(self.directory, torn)
        with open(self.path, "r+b") as log:
            log.truncate(self._size)
        self.notes.append(f"an audit record cut short by a crash ({len(torn)} bytes, never "
                          f"acknowledged) was moved to {keep.name}")

    def read(self, index: int) -> dict[str, Any]:
        entry = self.entries[index]
        with open(self.path, "rb") as log:
            log.seek(entry.offset)
            line = log.read(entry.length)
        record: dict[str, Any] = json.loads(line)
        return record

    def __len__(self) -> int:
        return len(self.entries)

    def head(self) -> tuple[int, str]:
        """(index, hash) of the newest record: the digest to anchor elsewhere."""
        if not self.entries:
            return (-1, GENESIS_PREV)
        return (self.entries[-1].index, self.entries[-1].hash)

    @property
    def last_op(self) -> int:
        """The highest op id recorded (ids are never reused, rolled-back ops included)."""
        return self._last_op

    @property
    def next_seq(self) -> int:
        """The sequence number the next committed event gets."""
        return self._next_seq

    def last_commit_index(self) -> int | None:
        """The newest committed op record with a snapshot that was not voided."""
        return self._last_commit

    def last_prune_index(self) -> int | None:
        """The newest prune record that was not voided."""
        return self._last_prune

    def committed_with_key(self, key: str) -> dict[str, Any] | None:
        """The record of the committed (and not voided) op that carries idempotency ``key``."""
        index = self._keys.get(key)
        return None if index is None else self.read(index)

    def effect_state(self, key: str) -> dict[str, Any] | None:
        """The newest ``effect`` record of the effect with idempotency ``key``, if any."""
        index = self._effects.get(key)
        return None if index is None else self.read(index)

    def binding(self) -> dict[str, Any]:
        """What the next snapshot's manifest records of the chain before it."""
        start = self.last_commit_index()
        start = 0 if start is None else start
        # Bounded, so that thousands of failed ops between two commits do not bloat
        # a manifest: the newest hashes still pin the chain up to this record.
        start = max(start, len(self.entries) - MAX_BOUND_HASHES)
        hashes = [entry.hash for entry in self.entries[start:]]
        return {"index": len(self.entries), "from": start, "hashes": hashes}

    def records(self, *, principal: str | None = None, status: str | None = None,
                topic: str | None = None, type: str | None = None,
                since_op: int | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Records, oldest first, filtered; ``limit`` keeps the newest."""
        pattern = compile_pattern(topic) if topic is not None else None
        chosen = []
        for entry in self.entries:
            if principal is not None and entry.principal != principal:
                continue
            if status is not None and entry.status != status:
                continue
            if type is not None and entry.type != type:
                continue
            if since_op is not None and (entry.op is None or entry.op <= since_op):
                continue
            if pattern is not None and not any(matches(pattern, t) for t in entry.topics):
                continue
            chosen.append(entry.index)
        if limit is not None:
            chosen = chosen[-limit:] if limit > 0 else []
        return [self.read(index) for index in chosen]

    def events_since(self, seq: int | None = None, *, op: int | None = None,
                     topic: str | None = None, principal: str | None = None,
                     limit: int | None = None) -> list[dict[str, Any]]:
        """Committed, published events after ``seq`` (exclusive) or after op ``op``.

        Oldest first, at most ``limit``.  Personal values in payloads come back as
        ``{"$personal": {"subject": ..., "value": ...}}`` (``"erased": true`` once erased).
        """
        pattern = compile_pattern(topic) if topic is not None else None
        found: list[dict[str, Any]] = []
        if limit is not None and limit <= 0:
            return found
        for entry in self._published_entries():
            if not entry.events:
                continue
            if seq is not None and entry.first_seq + entry.events - 1 <= seq:
                continue
            if op is not None and (entry.op is None or entry.op <= op):
                continue
            if pattern is not None and not any(matches(pattern, t) for t in entry.topics):
                continue
            record = self.read(entry.index)
            for event in record["events"]:
                if seq is not None and event["seq"] <= seq:
                    continue
                if pattern is not None and not matches(pattern, event["topic"]):
                    continue
                if principal is not None and event["principal"] != principal:
                    continue
                found.append(self.resolve_event(event, record))
                if limit is not None and len(found) >= limit:
                    return found
        return found

    def _published_entries(self) -> Iterator[Entry]:
        for entry in self.entries[: self.published + 1]:
            if entry.type == "op" and entry.status == COMMITTED and not entry.voided:
                yield entry

    def resolve_event(self, event: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        """An event as external subscribers see it: its payload resolved and opened."""
        out = {"seq": event["seq"], "topic": event["topic"], "principal": event["principal"],
               "op": record["op"], "depth": event["depth"], "commit": record["commit"],
               "at": record["finished_at"]}
        if "payload" in event:
            out["payload"] = event["payload"]
        else:
            out["payload"] = self._load_payload(event["ref"], event.get("subjects", []))
        return out

    def _load_payload(self, ref: str, subjects: Sequence[str]) -> Any:
        data = self.payload(ref)
        if data is None:
            return {"$erased": {"subjects": list(subjects)}}
        value = json.loads(data)
        return open_personal_markers(value, self.keyring)

    def code(self, op: int) -> str | None:
        """The code an op ran, if it is still readable (None once sealed and erased)."""
        for entry in reversed(self.entries):
            if entry.op == op and entry.type == "op":
                code = self.read(entry.index)["code"]
                if code is None:
                    return None
                if "text" in code:
                    return str(code["text"])
                data = self.payload(code["ref"])
                if data is None:
                    return None
                if code.get("sealed"):
                    opened = self.keyring.open(code["sealed"], data)
                    return None if opened is None else opened.decode()
                return data.decode()
        return None

    # -- payloads -----------------------------------------------------------------

    def payload(self, ref: str) -> bytes | None:
        try:
            return (self.payload_dir / ref).read_bytes()
        except FileNotFoundError:
            return None

    def store_payload(self, data: bytes) -> str:
        from kernos._durable import replace_file

        ref = digest(data)
        path = self.payload_dir / ref
        if path.exists():
            return ref
        with reporting_full_disk(path, "an audit payload", needed=len(data),
                                 then="The record that refers to it was not appended."):
            self.payload_dir.mkdir(parents=True, exist_ok=True)
            replace_file(path, data, durable=self.durable,
                         temporary=self.payload_dir / f".{ref}.tmp")
        return ref

    def delete_payload(self, ref: str) -> bool:
        path = self.payload_dir / ref
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        with open(path, "r+b") as handle:
            handle.write(b"\0" * size)
            handle.flush()
            os.fsync(handle.fileno())
        path.unlink()
        return True

    # -- writing ------------------------------------------------------------------

    def append(self, body: dict[str, Any], *, sync: bool = True) -> dict[str, Any]:
        """Append a record (``type`` and its fields); returns it with index, prev and hash.

        With ``sync=False`` the record is not fsynced here: ``unsynced`` says so,
        and the caller makes it durable otherwise (an op's record goes with its
        snapshot: ``Workspace.set_head``; ``last_line`` is the copy a tail frame
        carries).
        """
        if not self.writable:
            raise AuditError("this audit log was opened read-only", path=str(self.path))
        index, previous = self.head()
        record = {"v": FORMAT, "at": utc_now(), **body, "index": index + 1, "prev": previous}
        record = sign(record, self.signer)
        record["hash"] = record_hash(record)
        line = canonical(record) + b"\n"
        with reporting_full_disk(self.path, "the audit log", needed=len(line),
                                 then="The record was not appended."):
            handle = self._chain()
            try:
                # Until the newline is in, the record is not there: a full disk (or a
                # failed fsync) leaves the chain as it was, to be appended to again.
                write_all(handle.fileno(), line)
                if self.durable and sync:
                    os.fsync(handle.fileno())
            except BaseException:
                handle.truncate(self._size)
                raise
        self.unsynced = self.durable and not sync
        self.last_line = line
        entry = entry_of(record, index=index + 1, offset=self._size, length=len(line))
        self._register(entry, record.get("voids"))
        self._size += len(line)
        return record

    def retract(self, index: int) -> None:
        """Take back record ``index``, the last one, never acknowledged: the record of an
        op whose commit failed, when the disk is too full for the ``void`` record that
        would close it.  The chain is as it was before the record (a crash in between
        would have left it to be voided at the next open, which says the same)."""
        if index != len(self.entries) - 1:
            raise AuditError(f"record {index} cannot be taken back: only the last record can",
                             path=str(self.path), index=index)
        entry = self.entries[index]
        self._chain().truncate(entry.offset)
        self.unsynced = False
        self.last_line = b""
        published = self.published
        self._reset()
        self._load()
        self.published = min(published, len(self.entries) - 1)

    def sync(self) -> None:
        """fsync a record appended with ``sync=False`` that nothing has synced since."""
        if self.unsynced:
            with reporting_full_disk(self.path, "the audit log (fsync)",
                                     then="The record is not durable."):
                os.fsync(self.sync_target)
            self.unsynced = False

    @property
    def sync_target(self) -> int:
        """What to fsync to make the records appended durable: the open chain's fd."""
        return self._chain().fileno()

    def _chain(self) -> io.FileIO:
        if self._file is None:
            self.directory.mkdir(exist_ok=True)
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 (kept open)
        return self._file

    @property
    def signer(self) -> Ed25519PrivateKey:
        """The key every record this log appends is signed with (``kernos.audit.signing``):
        this workspace copy's (``kernos.store.identity``)."""
        if self._signer is None:  # (a copy made by pickling: the key never travels with it)
            self._signer = load_identity(self.root).key
        return self._signer

    def __getstate__(self) -> dict[str, Any]:
        # A value that refers to the workspace copies the log; open files stay here, and so
        # does the signing key (a copy could end up in a snapshot, and snapshots travel).
        return {**self.__dict__, "_file": None, "_inflight_file": None, "_signer": None}

    def close(self) -> None:
        for handle in (self._file, self._inflight_file):
            if handle is not None:
                handle.close()
        self._file = self._inflight_file = None

    def ensure_genesis(self, head: str | None) -> None:
        if not self.entries:
            self.append({"type": "genesis", "adopts": head})
            self.published = 0

    def note_inflight(self, op: int, principal: str, kind: str, code_sha256: str | None) -> None:
        """Remember the op that is starting (no sync: it only has to survive the process)."""
        data = json.dumps({"op": op, "principal": principal, "kind": kind,
                           "code": code_sha256, "started_at": utc_now()}).encode()
        with reporting_full_disk(self.directory / INFLIGHT, "the running op's note",
                                 then="The op did not start: nothing ran."):
            if self._inflight_file is None:
                self.directory.mkdir(exist_ok=True)
                self._inflight_file = open(self.directory / INFLIGHT, "wb",  # noqa: SIM115
                                           buffering=0)
                self._inflight_size = 0
            # Written over in place, padded with spaces (JSON allows them), not truncated:
            # freeing and allocating blocks costs more than the rest of this.
            padded = data.ljust(self._inflight_size)
            self._inflight_file.seek(0)
            write_all(self._inflight_file.fileno(), padded)
        self._inflight_size = len(padded)

    def recover(self, head: str | None, is_commit: Any) -> list[str]:
        """After the workspace's own recovery: void unpublished commits, record dead ops.

        ``head`` is the branch's commit (hex) and ``is_commit(hex)`` says whether
        a commit exists in the history.
        """
        notes = list(self.notes)
        self.notes.clear()
        self.ensure_genesis(head)
        # Ops run one at a time and each record precedes its commit point, so
        # only the newest committed record can name a commit that never became
        # visible.  (A commit that exists but is not the head is not ours to
        # judge: verify reports a rewritten history.)  A prune moves the branch
        # too: if its record is the newest, it is the one to judge, by its ``to``.
        last = self.last_commit_index()
        prune = self.last_prune_index()
        if prune is not None and (last is None or prune > last):
            target = self.read(prune).get("to")
            if target != head and isinstance(target, str) and not is_commit(target):
                self.append({"type": "void", "voids": prune,
                             "reason": "the process died before the pruned history was "
                                       "published; nothing was pruned"})
                notes.append("an interrupted prune was voided: nothing was pruned")
        elif last is not None:
            entry = self.entries[last]
            if entry.commit != head and entry.commit is not None and not is_commit(entry.commit):
                self.append({"type": "void", "voids": entry.index, "op": entry.op,
                             "reason": "the process died before this op's commit was "
                                       "published; the op did not happen"})
                notes.append(f"op {entry.op} was voided: its commit was never published")
        inflight = self._inflight()
        if inflight is not None and type(inflight.get("op")) is int:
            op = inflight["op"]
            if not any(entry.op == op for entry in self.entries if entry.type != "void"):
                self.append({"type": "died", "op": op, "principal": inflight.get("principal"),
                             "kind": inflight.get("kind"), "code": inflight.get("code"),
                             "started_at": inflight.get("started_at")})
                notes.append(f"op {op} was running when the kernel died; it was rolled back")
        self.published = len(self.entries) - 1
        return notes

    def _inflight(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.directory / INFLIGHT).read_bytes())
        except (FileNotFoundError, ValueError):
            return None
        return data if type(data) is dict else None


def keep_torn(directory: Path, torn: bytes) -> Path:
    """Save a record a crash cut short beside the chain (it is evidence) before it is cut off."""
    keep = directory / f"torn-{int(time.time())}.bin"
    keep.write_bytes(torn)
    return keep


def restore_records(path: Path, lines: Sequence[bytes], *, durable: bool = True) -> int:
    """Put back records the chain at ``path`` lost in a crash, from the copies the
    commit tail's frames carry (``kernos.store.tail``); return how many.

    A line is appended only if it is the chain's next record (its index and
    ``prev`` continue the last whole line); a torn last line is cut off first,
    and kept beside the chain, as :class:`AuditLog` would.  Anything else is
    left for ``verify`` to judge.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = 0
    with open(path, "a+b") as handle:
        window = 1 << 20
        while True:  # read back until the last whole line starts after a newline read
            start = max(0, size - window)
            handle.seek(start)
            end = handle.read()
            whole = end[: end.rfind(b"\n") + 1]
            if start == 0 or b"\n" in whole[:-1]:
                break
            window *= 2
        if len(whole) != len(end):
            keep_torn(path.parent, end[len(whole):])
            handle.truncate(start + len(whole))
        lines_before = whole.splitlines()
        if lines_before:
            last = json.loads(lines_before[-1])
            index, previous = int(last["index"]), str(last["hash"])
        else:
            index, previous = -1, GENESIS_PREV
        restored = 0
        for line in lines:
            record = json.loads(line)
            if type(record) is not dict or record.get("index") != index + 1:
                continue  # the chain holds it already (or it is not the next one)
            if record.get("prev") != previous:
                break
            handle.seek(0, os.SEEK_END)
            handle.write(line)
            index, previous = index + 1, str(record.get("hash"))
            restored += 1
        if restored and durable:
            handle.flush()
            os.fsync(handle.fileno())
    return restored
