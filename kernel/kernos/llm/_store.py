"""The LLM store: recordings and the spending ledger, outside the image.

Layout, in the workspace (``<workspace>/llm/``)::

    llm/
        objects/<sha256>.json    requests and responses in canonical JSON, named by the
                                 SHA-256 of their bytes (a request's name is its hash)
        recordings/<request>     the response hash replayed for a request (first one wins)
        calls.jsonl              the ledger: every call, one JSON line, appended and synced
        tmp/                     files being written, renamed into place

Everything is append-only: an object or a recording is written once
(temporary file, fsync, rename, fsync of the directory) and never changed;
the ledger only grows.  None of it is part of the image, so none of it rolls
back: a rolled-back op's calls still cost tokens and money, and replaying a
failed op needs its responses.

**Why a ledger outside the image.**  An ``llm`` grant's ``used`` field lives
in the image and rolls back with its op, so counting spending there would
let an agent spend its budget again in every op that fails.  The ledger
counts what was really asked for, whatever became of the op.  Before a
provider call, a ``reserve`` line (the call's worst case: prompt tokens plus
``max_tokens``, and its price) is appended and synced; after it, a
``settle`` line with what the provider reported.  A reservation never
settled (the process died during the call) stays charged at its worst case.
Budgets are checked against settled spending plus open reservations, under
a lock, so threads and serialized ops alike can never promise the same
tokens twice.

A ledger line charges *keys*: ``grant:g3@12`` (grant ``g3`` made in op
12: grant ids are reused after a rollback, the op that made them is not),
``cost:g5@12`` (the USD cost charged to a ``spend:USD`` grant), ``op:40``
and ``principal:alice``.
"""

from __future__ import annotations

import base64
import decimal
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos import amounts
from kernos._durable import fsync_dir, replace_file, write_all
from kernos._time import utc_now
from kernos.audit.canonical import canonical, digest
from kernos.errors import LLMBudgetExceeded, LLMRecordingErased
from kernos.store.space import reporting_full_disk

if TYPE_CHECKING:
    from kernos.personal import Keyring

__all__ = ["LEDGER_FILE", "Budget", "Ledger", "LlmStore", "Spent", "read_calls"]

SEALED = "$kernos_sealed"
"""The one key of a stored object written sealed under data subjects' keys."""
ERASED = "$kernos_erased"
"""The one key of what an erasure leaves of a sealed object: the subjects, no bytes of it."""
DIRECTORY = "llm"
LEDGER = "calls.jsonl"
LEDGER_FILE = f"{DIRECTORY}/{LEDGER}"
"""The ledger's path in a workspace."""
COMPLETION = "completion"
"""The kind of a ledger call that says none (an embedding call's lines say ``embedding``)."""


@dataclass(frozen=True, kw_only=True)
class Budget:
    """One limit a call must stay within."""

    key: str
    """The ledger key it limits (``grant:g3@12``, ``op:40`` ...)."""
    label: str
    """How errors name it (``grant g3 (llm:gpt-4o-mini) of alice``)."""
    tokens: int | None = None
    """The most tokens (prompt and completion) the key may be charged, if limited."""
    cost: decimal.Decimal | None = None
    """The most USD the key may be charged, if limited."""


@dataclass(kw_only=True)
class Spent:
    """What a key was charged."""

    tokens: int = 0
    cost: decimal.Decimal = field(default_factory=decimal.Decimal)

    def add(self, tokens: int, cost: decimal.Decimal, sign: int = 1) -> None:
        self.tokens += sign * tokens
        self.cost = (amounts.add if sign > 0 else amounts.subtract)(self.cost, cost)


@dataclass(kw_only=True)
class _Open:
    keys: tuple[str, ...]
    tokens: int
    cost: decimal.Decimal


class Ledger:
    """``calls.jsonl``: reservations and settlements of every call, and their totals."""

    def __init__(self, path: Path, *, durable: bool) -> None:
        self.path = path
        self.durable = durable
        self._lock = threading.Lock()
        self._spent: dict[str, Spent] = {}
        self._pending: dict[str, Spent] = {}
        self._open: dict[int, _Open] = {}
        self.next_call = 1
        self.in_doubt = 0
        """Reservations found unsettled when the ledger was read (the process died)."""
        self._load()

    # -- reading -------------------------------------------------------------------

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line torn by a crash: it was never acknowledged
            with open(self.path, "r+b") as file:
                file.truncate(end)
            data = data[:end]
        for call in _calls(data):
            self.next_call = max(self.next_call, call["call"] + 1)
            if not call["settled"]:  # in doubt: charged at the worst case
                self.in_doubt += 1
            self._charge(self._spent, call["keys"], call["tokens"], _decimal(call["cost"]))

    @staticmethod
    def _charge(table: dict[str, Spent], keys: Iterable[str], tokens: int,
                cost: decimal.Decimal, sign: int = 1) -> None:
        for key in keys:
            table.setdefault(key, Spent()).add(tokens, cost, sign)

    def spent(self, key: str) -> Spent:
        """Settled spending of ``key`` (and in-doubt reservations), not counting open ones."""
        with self._lock:
            found = self._spent.get(key, Spent())
            return Spent(tokens=found.tokens, cost=found.cost)

    # -- writing -------------------------------------------------------------------

    def _append(self, entry: dict[str, Any]) -> None:
        line = canonical(entry) + b"\n"
        with reporting_full_disk(self.path, "the LLM spending ledger", needed=len(line),
                                 then=f"The {entry['type']} entry of call {entry['call']} was "
                                      "not written; the op rolls back."):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                try:
                    write_all(fd, line)
                    if self.durable:
                        os.fsync(fd)
                except BaseException:
                    os.ftruncate(fd, size)  # no torn line for the next entry to follow
                    raise
            finally:
                os.close(fd)

    def reserve(self, *, budgets: Iterable[Budget], keys: Iterable[str], tokens: int,
                cost: decimal.Decimal | None, facts: dict[str, Any], request: str,
                model: str) -> int:
        """Promise ``tokens`` (and ``cost``) to a call, or raise LLMBudgetExceeded.

        Returns the call's number; settle it with :meth:`settle`.
        """
        worst = cost or decimal.Decimal(0)
        charged = tuple(dict.fromkeys([*keys, *(budget.key for budget in budgets)]))
        with self._lock:
            self._admit(budgets, tokens, cost, request, model)
            number = self.next_call
            self._append({"type": "reserve", "call": number, "keys": list(charged),
                          "tokens": tokens, "cost": str(worst), "request": request,
                          "model": model, "at": utc_now(), **facts})
            self.next_call += 1
            self._open[number] = _Open(keys=charged, tokens=tokens, cost=worst)
            self._charge(self._pending, charged, tokens, worst)
        return number

    def admit(self, budgets: Iterable[Budget], *, tokens: int, cost: decimal.Decimal | None,
              request: str, model: str) -> None:
        """LLMBudgetExceeded if a call of ``tokens`` (and ``cost``) would not fit; nothing
        is written or promised (a replay asks this of a call it has no recording for)."""
        with self._lock:
            self._admit(budgets, tokens, cost, request, model)

    def _admit(self, budgets: Iterable[Budget], tokens: int, cost: decimal.Decimal | None,
               request: str, model: str) -> None:
        for budget in budgets:
            used = self._spent.get(budget.key, Spent())
            pending = self._pending.get(budget.key, Spent())
            if budget.tokens is not None and \
                    used.tokens + pending.tokens + tokens > budget.tokens:
                raise LLMBudgetExceeded(
                    budget=budget.label, unit="tokens", limit=str(budget.tokens),
                    used=str(used.tokens + pending.tokens), asked=str(tokens),
                    phase="before", request=request, model=model)
            committed = amounts.add(used.cost, pending.cost)
            if budget.cost is not None and cost is not None and \
                    amounts.add(committed, cost) > budget.cost:
                raise LLMBudgetExceeded(
                    budget=budget.label, unit="USD", limit=str(budget.cost),
                    used=str(committed), asked=str(cost),
                    phase="before", request=request, model=model)

    def settle(self, number: int, *, tokens: int, cost: decimal.Decimal | None,
               facts: dict[str, Any]) -> None:
        """Record what call ``number`` really used; its reservation is released."""
        actual = cost or decimal.Decimal(0)
        with self._lock:
            opened = self._open.pop(number)
            self._append({"type": "settle", "call": number, "tokens": tokens,
                          "cost": str(actual), "at": utc_now(), **facts})
            self._charge(self._pending, opened.keys, opened.tokens, opened.cost, sign=-1)
            self._charge(self._spent, opened.keys, tokens, actual)

    def check(self, budgets: Iterable[Budget], *, asked: int, asked_cost: decimal.Decimal | None,
              request: str, model: str) -> None:
        """After a call: LLMBudgetExceeded if the provider took a budget past its limit."""
        with self._lock:
            for budget in budgets:
                used = self._spent.get(budget.key, Spent())
                if budget.tokens is not None and used.tokens > budget.tokens:
                    raise LLMBudgetExceeded(
                        budget=budget.label, unit="tokens", limit=str(budget.tokens),
                        used=str(used.tokens), asked=str(asked), phase="after",
                        request=request, model=model)
                if budget.cost is not None and used.cost > budget.cost:
                    raise LLMBudgetExceeded(
                        budget=budget.label, unit="USD", limit=str(budget.cost),
                        used=str(used.cost), asked=str(asked_cost), phase="after",
                        request=request, model=model)

    def entries(self) -> list[dict[str, Any]]:
        """Every line of the ledger, in order."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_bytes().splitlines()]

    def absorb(self, calls: Iterable[dict[str, Any]]) -> None:
        """Charge calls another ledger made (see :func:`read_calls`), one settled line each.

        A replay does this for the calls of the ops it does not re-run (those
        before its start, and those a dead kernel never finished), so its budgets
        stand where the source's stood when each op ran.
        """
        with self._lock:
            for call in calls:
                number = self.next_call
                line = {"type": "settle", "call": number, "keys": list(call["keys"]),
                        "tokens": call["tokens"], "cost": call["cost"],
                        "absorbed": call["call"], "op": call["op"], "at": utc_now()}
                if call.get("kind", COMPLETION) != COMPLETION:  # completions' lines as ever
                    line["kind"] = call["kind"]
                self._append(line)
                self.next_call += 1
                self._charge(self._spent, call["keys"], call["tokens"], _decimal(call["cost"]))


def read_calls(path: Path) -> list[dict[str, Any]]:
    """The calls of the ledger at ``path``, read only (a torn last line, never
    acknowledged, is left out): see :func:`_calls`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return _calls(data[:data.rfind(b"\n") + 1])


def _calls(data: bytes) -> list[dict[str, Any]]:
    """Each call of the ledger lines ``data``, in call order: number, op, kind
    (``completion`` or ``embedding``), keys, tokens and cost as settled (or, never
    ``settled``, the reservation's worst case)."""
    calls: dict[int, dict[str, Any]] = {}
    for line in data.splitlines():
        entry = json.loads(line)
        number = entry["call"]
        if entry["type"] == "reserve":
            calls[number] = {"call": number, "op": entry.get("op"),
                             "kind": entry.get("kind", COMPLETION), "keys": entry["keys"],
                             "tokens": entry["tokens"], "cost": entry["cost"],
                             "settled": False}
        elif entry["type"] == "settle":
            call = calls.setdefault(number, {"call": number, "op": entry.get("op"),
                                             "kind": entry.get("kind", COMPLETION),
                                             "keys": entry.get("keys", [])})
            call.update(tokens=entry["tokens"], cost=entry["cost"], settled=True)
    return [calls[number] for number in sorted(calls)]


def _decimal(text: str) -> decimal.Decimal:
    return decimal.Decimal(text)


class LlmStore:
    """``<workspace>/llm/``: content-addressed requests and responses, recordings, ledger."""

    def __init__(self, workspace: Path, *, durable: bool = True,
                 keyring: Keyring | None = None) -> None:
        self.path = workspace / DIRECTORY
        self.durable = durable
        self.keyring = keyring
        """Seals what an op that touched personal data sends and gets (see :meth:`put`)."""
        self.objects = self.path / "objects"
        self.recordings = self.path / "recordings"
        self.scratch = self.path / "tmp"
        for directory in (self.objects, self.recordings, self.scratch):
            directory.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(self.path / LEDGER, durable=durable)

    def _write_once(self, path: Path, data: bytes) -> None:
        if path.exists():
            return
        temporary = self.scratch / f"{path.name}.{os.getpid()}.{threading.get_ident()}"
        with reporting_full_disk(path, "the LLM store", needed=len(data),
                                 then="It was not stored; the op rolls back."):
            replace_file(path, data, durable=self.durable, temporary=temporary)

    def put(self, value: dict[str, Any], *, subjects: Iterable[str] = ()) -> str:
        """Store JSON data; returns the SHA-256 of its canonical bytes (its name).

        With ``subjects`` (the data subjects whose values the op created or
        revealed), the bytes are written sealed under their keys, so erasing any
        of them shreds the recording (and :func:`erase_recordings` replaces it).
        The name is still the hash of the plain bytes: it proves a guess, it
        reveals nothing.
        """
        data = canonical(value)
        name = digest(data)
        sealed_by = sorted(set(subjects))
        if sealed_by and self.keyring is not None:
            sealed = self.keyring.seal(sealed_by, data)
            data = canonical({SEALED: {"subjects": sealed_by,
                                       "data": base64.b64encode(sealed).decode("ascii")}})
        self._write_once(self.objects / f"{name}.json", data)
        return name

    def get(self, name: str) -> dict[str, Any]:
        """The data stored as ``name``; LLMRecordingErased if a subject of it was erased."""
        found: dict[str, Any] = json.loads((self.objects / f"{name}.json").read_bytes())
        envelope = _only(found, SEALED)
        if envelope is None:
            erased = _only(found, ERASED)
            if erased is not None:
                raise LLMRecordingErased(name, [str(s) for s in erased["subjects"]])
            return found
        subjects = [str(subject) for subject in envelope["subjects"]]
        plain = None if self.keyring is None else self.keyring.open(
            subjects, base64.b64decode(envelope["data"]))
        if plain is None:
            raise LLMRecordingErased(name, subjects)
        opened: dict[str, Any] = json.loads(plain)
        return opened

    def recorded(self, request: str) -> str | None:
        """The response hash recorded for a request hash, if any."""
        path = self.recordings / request
        return path.read_text().strip() if path.exists() else None

    def record(self, request: str, response: str) -> None:
        """Record ``response`` for ``request``, unless one is recorded already (first wins)."""
        self._write_once(self.recordings / request, response.encode("ascii"))

    def sync(self) -> None:
        if self.durable:
            fsync_dir(self.path)


def erase_recordings(workspace: Path, subject: str, *, durable: bool = True) -> int:
    """Replace the recordings sealed under ``subject`` (its key destroyed already) by a
    note naming their subjects, so a replay says why it cannot answer; returns how many.

    The others, and the ledger (hashes and counts, no content), stay.
    """
    objects = workspace / DIRECTORY / "objects"
    deleted = 0
    if objects.is_dir():
        for path in objects.glob("*.json"):
            try:
                found = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            envelope = _only(found, SEALED)
            if envelope is not None and subject in envelope.get("subjects", ()):
                note = canonical({ERASED: {"subjects": envelope["subjects"]}})
                replace_file(path, note, durable=durable,
                             temporary=workspace / DIRECTORY / "tmp" / f"{path.name}.erasing")
                deleted += 1
    return deleted


def _only(found: object, key: str) -> dict[str, Any] | None:
    """``found[key]`` if ``found`` is an object with that one key (a sealed or erased
    recording), else None."""
    if isinstance(found, dict) and len(found) == 1:
        value = found.get(key)
        if isinstance(value, dict):
            return value
    return None
