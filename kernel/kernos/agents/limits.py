"""Resource limits for agent code, and the two layers that enforce them.

1. **In the interpreter.**  While agent code runs, a trace function watches
   the agent's own frames (host frames are not traced, so host code pays
   nothing).  On each line it checks the deadline and the recursion depth,
   and every 64 lines the process's resident memory.  A breach
   raises a :class:`LimitExceeded`, which is a ``BaseException``: agent code
   cannot name it (no ``BaseException`` is in the agent's builtins), a bare
   ``except:`` is refused by the dialect, and ``except Exception`` does not
   catch it; the dialect has no ``finally``, so no agent code runs while it
   unwinds.  The breach vetoes the op.

2. **Outside the interpreter.**  A C-level loop (``sum(range(10**15))``, a
   catastrophic regular expression, ``math.factorial(10**9)``) never reaches
   a line event, and holds the GIL, so no Python thread can run either.
   ``faulthandler``'s C timer thread needs no GIL: once the op has run
   ``hard_seconds`` it dumps the stacks to the kernel's stderr and exits the
   process.  A watchdog thread, when it gets the GIL, also kills the process
   (SIGKILL) if memory grows past twice the limit, or if agent code keeps
   running 2 s after a breach.  The
   kernel's supervisor (the Jupyter server, the Kernos client) restarts it,
   and the restart restores the last committed snapshot: the breaching op was
   never committed, so nothing of it remains.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import types
from dataclasses import dataclass, fields, replace
from typing import Any

from kernos.errors import InvalidGrant

__all__ = ["DeadlineExceeded", "LimitExceeded", "Limits", "MemoryLimitExceeded",
           "RecursionLimitExceeded", "Supervisor"]

AGENT_FILENAME_PREFIX = "<agent:"
_PAGE = os.sysconf("SC_PAGE_SIZE")
BREACH_GRACE_SECONDS = 2.0
WATCH_SECONDS = 0.05
MAX_RECURSION = 300


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Per-op bounds on agent code (all integers, so they persist exactly)."""

    seconds: int = 10
    """Wall-clock seconds before the op is interrupted."""
    hard_seconds: int = 30
    """Seconds before the watchdog kills the process (code stuck in C)."""
    memory_mb: int = 512
    """Resident memory the op may add; the watchdog kills at twice this."""
    recursion: int = 100
    """Nested agent function calls (at most 300, well inside the interpreter's own limit)."""
    output_bytes: int = 64 * 1024
    """Printed output kept; the rest is counted and dropped."""
    source_bytes: int = 64 * 1024
    """Size of one piece of agent source."""
    ast_depth: int = 60
    """Syntax nesting of one piece of agent source."""
    llm_tokens: int = 100_000
    """LLM tokens (prompt and completion, every call counted) the op may use."""
    llm_micro_usd: int = 5_000_000
    """What the op's LLM calls may cost, in millionths of a USD (5_000_000 is 5 USD)."""

    def with_overrides(self, overrides: dict[str, Any]) -> Limits:
        known = {field.name for field in fields(self)}
        for key, value in overrides.items():
            if key not in known:
                raise InvalidGrant(f"unknown limit {key!r}; the limits are {sorted(known)}")
            if type(value) is not int or value <= 0 or value > 10**9:
                raise InvalidGrant(f"the limit {key} must be a positive int, not {value!r}")
            if key == "recursion" and value > MAX_RECURSION:
                raise InvalidGrant(f"the recursion limit is at most {MAX_RECURSION}: deeper, "
                                   "the interpreter's own limit would hit host code first")
        return replace(self, **overrides)


class LimitExceeded(BaseException):
    """Agent code breached a resource limit.  Not an ``Exception``, on purpose."""

    kind = "limit"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DeadlineExceeded(LimitExceeded):
    kind = "time"


class RecursionLimitExceeded(LimitExceeded):
    kind = "recursion"


class MemoryLimitExceeded(LimitExceeded):
    kind = "memory"


def resident_bytes() -> int:
    """Anonymous resident memory: what allocations add (statm's resident less shared).

    File-backed pages are left out: they come and go without anyone
    allocating (a forked process re-faults its libraries' code as it runs it).
    """
    with open("/proc/self/statm", "rb") as statm:
        fields = statm.read().split()
    return (int(fields[1]) - int(fields[2])) * _PAGE


class Supervisor:
    """Enforces :class:`Limits` on the agent code run between start() and stop().

    A breach is raised by the trace function into the agent frame that is
    running.  CPython then drops the trace function, but nothing of the agent
    can run after it: the dialect has no ``finally`` and no bare ``except``,
    agents cannot name a ``BaseException``, and their classes cannot define
    ``__exit__`` or ``__del__``, so the breach unwinds every agent frame.  If
    agent code is still running 2 s after a breach anyway (say, it made an
    ``except`` clause itself raise, and caught that), the watchdog kills the
    process, as for code stuck in C.

    The watchdog acts under ``_lock`` and only while the run is active, and
    stop() ends the run under the same lock: nothing the watchdog does reaches
    the host code that runs after stop() (the rollback, say, which may briefly
    need as much memory again as the op grew, to compare the namespace with
    what is stored).
    """

    def __init__(self, limits: Limits, *, describe: str) -> None:
        self.limits = limits
        self.describe = describe
        self.breach: LimitExceeded | None = None
        self._depth = 0
        self._lines = 0
        self._started = 0.0
        self._deadline = 0.0
        self._memory_base = 0
        self._previous_trace: Any = None
        self._breach_at = 0.0
        self._active = False
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watchdog: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self._started = time.monotonic()
        self._deadline = self._started + self.limits.seconds
        self._memory_base = resident_bytes()
        self._previous_trace = sys.gettrace()
        self._active = True
        # The last resort, in C: a thread that needs no GIL, so it fires even
        # while C code holds the GIL forever (the watchdog below cannot run then).
        faulthandler.dump_traceback_later(self.limits.hard_seconds, exit=True,
                                          file=sys.__stderr__ or 2)
        sys.settrace(self._global_trace)
        self._watchdog = threading.Thread(target=self._watch, name="kernos-watchdog",
                                          daemon=True)
        self._watchdog.start()

    def stop(self) -> None:
        with self._lock:
            self._active = False
        self._stopped.set()  # wakes the watchdog, which then ends
        sys.settrace(self._previous_trace)
        faulthandler.cancel_dump_traceback_later()

    # -- layer 1: the trace function -------------------------------------------------

    def _global_trace(self, frame: types.FrameType, event: str, arg: object) -> Any:
        if not frame.f_code.co_filename.startswith(AGENT_FILENAME_PREFIX):
            return None
        if event == "call":
            self._depth += 1
            if self._depth > self.limits.recursion:
                self._trip(RecursionLimitExceeded(
                    f"{self.describe} nested calls over {self.limits.recursion} deep"))
        return self._local_trace

    def _local_trace(self, frame: types.FrameType, event: str, arg: object) -> Any:
        if event == "return":
            self._depth -= 1
        elif event == "line":
            self._lines += 1
            if time.monotonic() > self._deadline:
                self._trip(DeadlineExceeded(
                    f"{self.describe} ran over its {self.limits.seconds} s deadline"))
            elif self._lines % 64 == 0:
                grown = resident_bytes() - self._memory_base
                if grown > self.limits.memory_mb * 1024 * 1024:
                    self._trip(MemoryLimitExceeded(
                        f"{self.describe} grew memory by {grown // 2**20} MB, over its "
                        f"{self.limits.memory_mb} MB limit"))
        return self._local_trace

    def _trip(self, breach: LimitExceeded) -> None:
        if self.breach is None:
            self.breach = breach
            self._breach_at = time.monotonic()
        raise self.breach

    # -- layer 2: the watchdog ---------------------------------------------------

    def _watch(self) -> None:
        hard_deadline = self._started + self.limits.hard_seconds
        memory_cap = self._memory_base + 2 * self.limits.memory_mb * 1024 * 1024
        while not self._stopped.wait(WATCH_SECONDS):
            with self._lock:
                if not self._active:
                    return
                self._check(time.monotonic(), hard_deadline, memory_cap)

    def _check(self, now: float, hard_deadline: float, memory_cap: int) -> None:
        if now > self._deadline and self.breach is None:
            # Stuck in C past the deadline: the trace function raises this
            # at the next line, if there is one.
            self.breach = DeadlineExceeded(
                f"{self.describe} ran over its {self.limits.seconds} s deadline")
            self._breach_at = now
        if now > hard_deadline:
            self._kill(f"it ran {self.limits.hard_seconds} s")
        elif self.breach is not None and now > self._breach_at + BREACH_GRACE_SECONDS:
            self._kill(f"it kept running {BREACH_GRACE_SECONDS:.0f} s after a breach "
                       "(stuck in C code, or past the interpreter's checks)")
        elif resident_bytes() > memory_cap:
            self._kill(f"it grew memory past {2 * self.limits.memory_mb} MB")

    def _kill(self, why: str) -> None:
        try:
            os.write(2, (f"\nkernos: killing the kernel: {self.describe} breached its limits "
                         f"({why}). A restart restores the last committed snapshot; the "
                         "op is not committed.\n").encode())
        finally:
            os.kill(os.getpid(), 9)
