"""The supervisor's files outside the image: journal lines, a fork's copy, and the
burn-rate window over the LLM ledger (see ``kernos.agents.supervisor``)."""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["BurnWindow", "copy_journal", "line"]


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
