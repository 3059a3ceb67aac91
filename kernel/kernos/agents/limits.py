"""Resource limits for agent code, and the layers that enforce them.

1. **In the interpreter.**  While agent code runs, a trace function watches
   the agent's own frames (host frames are not traced, so host code pays
   nothing).  On each line it checks the deadline and the recursion depth,
   and every 64 lines the process's resident memory.  A breach
   raises a :class:`LimitExceeded`, which is a ``BaseException``: agent code
   cannot name it (no ``BaseException`` is in the agent's builtins), a bare
   ``except:`` is refused by the dialect, and ``except Exception`` does not
   catch it; the dialect has no ``finally``, so no agent code runs while it
   unwinds.  The breach vetoes the op.

2. **The address space.**  While agent code runs, the soft ``RLIMIT_AS`` is
   the process's size when the run started plus one and a half times the
   memory limit (at least the limit and 32 MB).  One allocation bigger than
   that (``'x'.ljust(10**9)``, ``s + s`` on a big string, a format width)
   fails in C with a ``MemoryError`` and allocates nothing; the trace
   function turns a ``MemoryError`` that reaches an agent frame into a
   :class:`MemoryLimitExceeded`, before any ``except`` clause sees it.
   Gradual growth trips the memory check at the limit, before the cap.

3. **The watchdog thread.**  Every 50 ms it notes a deadline or memory breach
   the trace function has not raised (the trace function raises it at the
   next line).  If agent code still runs a moment later (CPython drops a
   trace function that raises, so code that outlived one breach is no longer
   traced), it raises the breach into the supervised thread between two
   bytecodes (``PyThreadState_SetAsyncExc``), only while that thread is in
   an agent frame, and never after :meth:`Supervisor.stop`.

4. **Outside the interpreter.**  A C-level loop (``sum(range(10**15))``, a
   catastrophic regular expression, ``math.factorial(10**9)``) never reaches
   a bytecode boundary, and holds the GIL, so no Python thread can run either.
   ``faulthandler``'s C timer thread needs no GIL: once the op has run
   ``hard_seconds`` it dumps the stacks to the kernel's stderr and exits the
   process.  The watchdog, when it gets the GIL, also kills the process
   (SIGKILL) if agent code keeps running 2 s after a breach, or if memory is
   past twice the limit 0.2 s after one.  The
   kernel's supervisor (the Jupyter server, the Kernos client) restarts it,
   and the restart restores the last committed snapshot: the breaching op was
   never committed, so nothing of it remains.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import resource
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
INTERRUPT_AFTER_SECONDS = 0.2
"""How long the trace function has to raise a breach the watchdog noted, before the
watchdog raises it into the supervised thread itself."""
WATCH_SECONDS = 0.05
CAP_HEADROOM = 32 * 2**20
"""Address space the cap leaves above the memory limit, at least (for the kernel's
other threads: a thread stack, a malloc arena's growth)."""
MAX_RECURSION = 300


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Per-op bounds on agent code (all integers, so they persist exactly)."""

    seconds: int = 10
    """Wall-clock seconds before the op is interrupted."""
    hard_seconds: int = 30
    """Seconds before the watchdog kills the process (code stuck in C)."""
    memory_mb: int = 512
    """Resident memory the op may add.  The address space is capped at 1.5 times this (at
    least this and 32 MB) over its size when the run starts; the watchdog kills past twice
    this, 0.2 s into a breach."""
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
    file_read_bytes: int = 16 * 2**20
    """Size of one file the op reads (``files.read``, see kernos.agents.files)."""
    file_write_bytes: int = 64 * 2**20
    """Bytes the op writes and appends to files, all together."""
    file_writes: int = 100
    """Distinct files the op writes, appends to or deletes."""

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


def address_space_bytes() -> int:
    """The process's virtual size (statm's first field): what ``RLIMIT_AS`` bounds."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[0]) * _PAGE


class AddressSpaceCap:
    """Lowers the soft ``RLIMIT_AS`` for a while; only the outermost cap does anything.

    The limit is process-wide: the kernel's other threads (ZMQ, heartbeat,
    control, a sync worker) allocate under it too.  They keep headroom: the
    cap is half the memory limit above what gradual growth may reach before
    the memory check trips, a thread's existing malloc arena grows inside
    address space it reserved already, and an arena or a thread stack that
    cannot be mapped makes glibc fall back to the main arena, or
    ``Thread.start`` fail (the supervisor starts its threads before the cap).
    """

    _held = False  # whether a cap is in place in this process (one at a time: the outermost)

    def __init__(self) -> None:
        self._previous: int | None = None

    def lower(self, extra_bytes: int) -> None:
        if AddressSpaceCap._held:
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = address_space_bytes() + extra_bytes
        for bound in (soft, hard):
            if bound != resource.RLIM_INFINITY:
                cap = min(cap, bound)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        self._previous = soft
        AddressSpaceCap._held = True

    def restore(self) -> None:
        if self._previous is None:
            return
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        previous = self._previous
        if hard != resource.RLIM_INFINITY and (previous == resource.RLIM_INFINITY
                                               or previous > hard):
            previous = hard
        self._previous = None
        AddressSpaceCap._held = False
        resource.setrlimit(resource.RLIMIT_AS, (previous, hard))


_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))


def _raisable(breach: LimitExceeded) -> type[LimitExceeded]:
    """The breach as a type: an asynchronous exception is raised by instantiating a type
    with no arguments, so this subclass carries the breach's message."""
    kind = type(breach)

    def __init__(self: LimitExceeded) -> None:
        kind.__init__(self, breach.message)

    raisable: type[LimitExceeded] = type(kind.__name__, (kind,), {
        "__init__": __init__, "__module__": kind.__module__, "__qualname__": kind.__qualname__})
    return raisable


def _check_for_pending() -> None:
    """Nothing, in a call: entering a function is where CPython raises a pending
    asynchronous exception.  (Not ``PyThreadState_SetAsyncExc(id, NULL)`` to drop one: on
    CPython 3.11 that leaves the interpreter's "asynchronous exception pending" flag set
    with nothing pending, and a traced thread then loops forever at its next call.)"""


class Supervisor:
    """Enforces :class:`Limits` on the agent code run between start() and stop().

    A breach is raised by the trace function into the agent frame that is
    running.  CPython then drops the trace function, but nothing of the agent
    can run after it: the dialect has no ``finally`` and no bare ``except``,
    agents cannot name a ``BaseException``, and their classes cannot define
    ``__exit__`` or ``__del__``, so the breach unwinds every agent frame.  If
    agent code is still running a moment after a breach anyway (the trace
    function was lost: it raised, or calling it hit the interpreter's
    recursion limit), the watchdog raises the breach into it; if that does not
    end it within 2 s (host code swallowed it, or C code never returns), the
    watchdog kills the process, as for code stuck in C.

    The watchdog acts under ``_lock`` and only while the run is active, and
    stop() ends the run under the same lock (and raises and drops a breach
    sent but not yet raised, which cannot happen: one is sent only while an
    agent frame runs, and host code makes calls before it reaches stop()).
    Nothing the watchdog does reaches the host code that runs after stop():
    the rollback, say, which may briefly need as much memory again as the op
    grew, to compare the namespace with what is stored.
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
        self._thread_id = 0
        self._sent = False
        self._active = False
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._cap = AddressSpaceCap()
        self._watchdog: threading.Thread | None = None

    @property
    def _memory_limit(self) -> int:
        return self.limits.memory_mb * 1024 * 1024

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self._started = time.monotonic()
        self._deadline = self._started + self.limits.seconds
        self._memory_base = resident_bytes()
        self._previous_trace = sys.gettrace()
        self._thread_id = threading.get_ident()
        self._active = True
        # The last resort, in C: a thread that needs no GIL, so it fires even
        # while C code holds the GIL forever (the watchdog below cannot run then).
        faulthandler.dump_traceback_later(self.limits.hard_seconds, exit=True,
                                          file=sys.__stderr__ or 2)
        self._watchdog = threading.Thread(target=self._watch, name="kernos-watchdog",
                                          daemon=True)
        self._watchdog.start()
        # After the threads: their stacks are mapped outside the cap.
        self._cap.lower(self._memory_limit + max(self._memory_limit // 2, CAP_HEADROOM))
        sys.settrace(self._global_trace)

    def stop(self) -> None:
        try:
            with self._lock:
                self._active = False
                if self._sent:
                    # Sent but not raised yet (see the class docstring): raised by
                    # the first call, so it is dropped here, before anything else calls
                    # (not contextlib.suppress: constructing it is a call, outside it).
                    try:  # noqa: SIM105
                        _check_for_pending()
                    except LimitExceeded:
                        pass
            self._stopped.set()  # wakes the watchdog, which then ends
            sys.settrace(self._previous_trace)
            faulthandler.cancel_dump_traceback_later()
        finally:
            self._cap.restore()

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

    def _local_trace(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "return":
            self._depth -= 1
        elif event == "line":
            self._lines += 1
            if self.breach is not None:  # noted by the watchdog
                raise self.breach
            if time.monotonic() > self._deadline:
                self._trip(DeadlineExceeded(
                    f"{self.describe} ran over its {self.limits.seconds} s deadline"))
            elif self._lines % 64 == 0:
                grown = resident_bytes() - self._memory_base
                if grown > self._memory_limit:
                    self._trip(self._over_memory(grown))
        elif event == "exception" and issubclass(arg[0], MemoryError):
            # Raised by the address-space cap (or a real shortage), here or in
            # host code this frame called: replaced before an except clause sees it.
            self._trip(MemoryLimitExceeded(
                f"{self.describe} ran out of memory (an allocation would have taken it past "
                f"its {self.limits.memory_mb} MB limit)"))
        return self._local_trace

    def _over_memory(self, grown: int) -> MemoryLimitExceeded:
        return MemoryLimitExceeded(f"{self.describe} grew memory by {grown // 2**20} MB, over "
                                   f"its {self.limits.memory_mb} MB limit")

    def _trip(self, breach: LimitExceeded) -> None:
        if self.breach is None:
            self.breach = breach
            self._breach_at = time.monotonic()
        raise self.breach

    # -- layer 3: the watchdog ---------------------------------------------------

    def _watch(self) -> None:
        while not self._stopped.wait(WATCH_SECONDS):
            with self._lock:
                if not self._active:
                    return
                # The cap, reached by agent code, may refuse even this: look again next tick.
                with contextlib.suppress(MemoryError):
                    self._check(time.monotonic(), resident_bytes() - self._memory_base)

    def _check(self, now: float, grown: int) -> None:
        if self.breach is None:
            # The trace function raises it at the next line, if there is one.
            if now > self._deadline:
                self.breach = DeadlineExceeded(
                    f"{self.describe} ran over its {self.limits.seconds} s deadline")
                self._breach_at = now
            elif grown > self._memory_limit:
                self.breach = self._over_memory(grown)
                self._breach_at = now
        if now > self._started + self.limits.hard_seconds:
            self._kill(f"it ran {self.limits.hard_seconds} s")
        elif self.breach is not None:
            # Memory may pass twice the limit before the breach ends the run:
            # resident memory can grow faster than the address space (into
            # space reserved before the cap), so that alone is no reason to kill.
            late = now - self._breach_at
            if late > BREACH_GRACE_SECONDS:
                self._kill(f"it kept running {BREACH_GRACE_SECONDS:.0f} s after a breach "
                           "(stuck in C code, or past the interpreter's checks)")
            elif late > INTERRUPT_AFTER_SECONDS:
                if grown > 2 * self._memory_limit:
                    self._kill(f"it grew memory past {2 * self.limits.memory_mb} MB")
                self._interrupt(self.breach)

    def _interrupt(self, breach: LimitExceeded) -> None:
        """Raise ``breach`` into the supervised thread, if it is running agent code.

        Only an agent frame (or C code it called) on top: delivered anywhere
        else, the breach could land in host code that does not expect it.
        """
        frame = sys._current_frames().get(self._thread_id)
        if frame is not None and frame.f_code.co_filename.startswith(AGENT_FILENAME_PREFIX):
            _set_async_exc(self._thread_id, _raisable(breach))
            self._sent = True

    # -- layer 4: the process ---------------------------------------------------

    def _kill(self, why: str) -> None:
        try:
            os.write(2, (f"\nkernos: killing the kernel: {self.describe} breached its limits "
                         f"({why}). A restart restores the last committed snapshot; the "
                         "op is not committed.\n").encode())
        finally:
            os.kill(os.getpid(), 9)
