"""The supervisor's files outside the image: its journal and the state it gives, a
fork's copy, and the burn-rate window over the LLM ledger (see
``kernos.agents.supervisor``, whose docstring holds the contract: which lines,
which are synced, when the journal is compacted)."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kernos._durable import replace_file

__all__ = ["AgentState", "BurnWindow", "Journal", "Trip", "copy_journal", "line"]


@dataclass(frozen=True, kw_only=True)
class Trip:
    """Why a circuit is open."""

    agent: str
    policy: str
    """``failures``, ``repeats`` ... (the figure that tripped)."""
    limit: int
    figures: dict[str, Any]
    message: str
    op: int
    at: str


@dataclass(kw_only=True)
class AgentState:
    """One agent's counters since its last reset, and its open trip (from the journal)."""

    first: float | None = None
    iterations: int = 0
    failures: int = 0
    failed_ops: list[int] = field(default_factory=list)
    last: str | None = None
    run: int = 0
    trip: Trip | None = None


def line(entry: dict[str, Any]) -> bytes:
    """One journal line."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def copy_journal(source: Path, dest: Path, op: int | None) -> None:
    """A fork's journal: ``source``'s lines about ops up to ``op`` (a fork of snapshot N
    keeps the circuits as they were after op N; later trips and resets are not its)."""
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        return
    kept = []
    for text in data[:data.rfind(b"\n") + 1].splitlines(keepends=True):
        at = json.loads(text).get("op")
        if op is None or at is None or at <= op:
            kept.append(text)
    if kept:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(b"".join(kept))


class Journal:
    """The append-only journal ``<workspace>/supervisor/journal.jsonl`` and the state it
    gives: each agent's :class:`AgentState`, the ops that ended, the trips announced.

    Not locked itself: its owner (``Breakers``) holds its lock around every use.
    """

    def __init__(self, path: Path, *, durable: bool) -> None:
        self.path = path
        self.durable = durable
        self.states: dict[str, AgentState] = {}
        self.ended: set[int] = set()
        """The ops whose ``end`` line is written (an op ends once)."""
        self.announced: set[tuple[str, int]] = set()
        """The trips (agent, op) whose ``kernos.circuit.open`` event committed."""

    def load(self, *, compact_over: int) -> None:
        """Rebuild the state from the journal; compact it if it is longer than
        ``compact_over`` lines."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        lines = data[:data.rfind(b"\n") + 1].splitlines()
        for text in lines:
            entry = json.loads(text)
            state = self.states.setdefault(entry["agent"], AgentState())
            kind = entry["type"]
            if kind == "admit":
                self.apply_admit(state, entry["sha"], entry["at"])
            elif kind == "end":
                self.ended.add(entry["op"])
                self.apply_end(state, entry["op"], entry["ok"])
            elif kind == "state":
                self.states[entry["agent"]] = AgentState(
                    first=entry["first"], iterations=entry["iterations"],
                    failures=entry["failures"], failed_ops=entry["failed_ops"],
                    last=entry["last"], run=entry["run"])
            elif kind == "trip":
                state.trip = Trip(agent=entry["agent"], policy=entry["policy"],
                                  limit=entry["limit"], figures=entry["figures"],
                                  message=entry["message"], op=entry["op"], at=entry["at"])
            elif kind == "reset":
                self.states[entry["agent"]] = AgentState()
            elif kind == "announced":
                self.announced.add((entry["agent"], entry["op"]))
        if len(lines) > compact_over:
            self.compact()

    def compact(self) -> None:
        """Rewrite the journal as the state it gives: one ``state`` line per agent, plus
        its open trip and whether that was announced.  Atomic (a new file, synced, renamed
        over the old one), so a crash leaves either journal, both giving the same state."""
        entries: list[dict[str, Any]] = []
        for agent, state in sorted(self.states.items()):
            entries.append({"type": "state", "agent": agent, "first": state.first,
                            "iterations": state.iterations, "failures": state.failures,
                            "failed_ops": state.failed_ops, "last": state.last,
                            "run": state.run})
            trip = state.trip
            if trip is not None:
                entries.append({"type": "trip", "agent": agent, "policy": trip.policy,
                                "limit": trip.limit, "figures": trip.figures,
                                "message": trip.message, "op": trip.op, "at": trip.at})
                if (agent, trip.op) in self.announced:
                    entries.append({"type": "announced", "agent": agent, "op": trip.op})
        temporary = self.path.with_name(self.path.name + ".compacting")
        try:  # a crash leaves the old journal or the new one
            replace_file(self.path, b"".join(line(entry) for entry in entries),
                         durable=self.durable, temporary=temporary)
        except OSError:  # a read-only or full disk: the old journal still serves
            temporary.unlink(missing_ok=True)

    @staticmethod
    def apply_admit(state: AgentState, print_: str, now: float) -> None:
        if state.first is None:
            state.first = now
        state.iterations += 1
        state.run = state.run + 1 if print_ == state.last else 1
        state.last = print_

    @staticmethod
    def apply_end(state: AgentState, op: int, ok: bool) -> None:
        if ok:
            state.failures, state.failed_ops = 0, []
        else:
            state.failures += 1
            state.failed_ops = [*state.failed_ops[-9:], op]

    def write(self, entry: dict[str, Any]) -> None:
        """Append ``entry``; a ``trip`` or ``reset`` line is synced (in a durable workspace)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = line(entry)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            if self.durable and entry["type"] in ("trip", "reset"):
                os.fsync(fd)
        finally:
            os.close(fd)


class BurnWindow:
    """What the LLM ledger charged, per key, in the last ``seconds``: read incrementally.

    Each check reads only the lines appended since the last one, and keeps only
    the calls reserved within the window (a call's time is its reservation's,
    so an older call can never count again).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self.offset = 0
        """How far into the ledger the window has read."""
        self.calls: dict[int, dict[str, Any]] = {}
        """The calls reserved within the window: keys, time, tokens, cost."""

    def charged(self, ledger: Path, key: str, now: float) -> tuple[int, int]:
        """(tokens, micro-USD) charged to ``key`` in the window before ``now``."""
        since = now - self.seconds
        with self._lock:
            try:
                with open(ledger, "rb") as file:
                    if os.fstat(file.fileno()).st_size < self.offset:
                        self.offset, self.calls = 0, {}  # truncated (a torn line): reread
                    file.seek(self.offset)
                    data = file.read()
            except FileNotFoundError:
                return 0, 0
            data = data[:data.rfind(b"\n") + 1]
            self.offset += len(data)
            calls = self.calls
            for text in data.splitlines():
                entry = json.loads(text)
                number = entry["call"]
                if entry.get("type") == "reserve":
                    calls[number] = {"keys": entry.get("keys") or [],
                                     "at": _epoch(entry["at"]) if entry.get("at") else None}
                elif number not in calls:
                    continue  # the settlement of a call that left the window
                calls[number]["tokens"], calls[number]["cost"] = entry["tokens"], entry["cost"]
            for number in [number for number, call in calls.items()
                           if call["at"] is None or call["at"] < since]:
                del calls[number]
            tokens = micro = 0
            for call in calls.values():
                if key in call["keys"]:
                    tokens += int(call["tokens"])
                    micro += int(float(call["cost"]) * 1_000_000)
            return tokens, micro


def _epoch(stamp: object) -> float:
    if isinstance(stamp, (int, float)):
        return float(stamp)
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
