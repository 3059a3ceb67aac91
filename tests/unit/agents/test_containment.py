"""Containment inside the interpreter: the address-space cap, a ``MemoryError`` turned
into a breach, and the watchdog raising a breach into agent code that lost its trace
function -- all without killing the process.

A test whose failure would be the watchdog's kill (of pytest, here) runs its supervised
code in a forked child (:func:`in_child`), which reports how it ended.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

from kernos.agents import limits
from kernos.agents.limits import (
    AGENT_FILENAME_PREFIX,
    DeadlineExceeded,
    Limits,
    MemoryLimitExceeded,
    Supervisor,
    address_space_bytes,
)

SMALL = Limits(seconds=1, hard_seconds=30, memory_mb=64, recursion=30)
SAFE = Limits(seconds=1, hard_seconds=600, memory_mb=4096, recursion=30)


def supervised(source: str, bounds: Limits = SMALL, **names: object) -> str:
    """Run plain Python as agent code; how it ended: ``finished`` or ``Type: message``."""
    code = compile(source, f"{AGENT_FILENAME_PREFIX}test>", "exec")
    supervisor = Supervisor(bounds, describe="the test")
    supervisor.start()
    try:
        exec(code, dict(names))
    except BaseException as error:
        return f"{type(error).__name__}: {error}"
    finally:
        supervisor.stop()
    return "finished"


def in_child(work: Callable[[], str], timeout: float = 30.0) -> str:
    """``work()`` in a forked child: what it returned, or how the child ended."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # never returns into pytest
        status = 0
        try:
            os.close(read_end)
            try:
                result = work()
            except BaseException as error:
                result = f"the child raised {type(error).__name__}: {error}"
            os.write(write_end, result.encode()[:4096])
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "the child timed out"
            time.sleep(0.02)
        if os.WIFSIGNALED(status):
            return f"the child was killed by signal {os.WTERMSIG(status)}"
        return os.read(read_end, 4096).decode() or f"the child exited with {status}"
    finally:
        os.close(read_end)


def soft_cap() -> int:
    return resource.getrlimit(resource.RLIMIT_AS)[0]


# -- the address-space cap ------------------------------------------------------------


def test_the_address_space_is_capped_only_while_agent_code_runs() -> None:
    before = resource.getrlimit(resource.RLIMIT_AS)
    seen: list[int] = []
    size = address_space_bytes()
    assert supervised("see(cap())", SAFE, see=seen.append, cap=soft_cap) == "finished"
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    limit = SAFE.memory_mb * 2**20
    assert size + limit < seen[0] < size + 2 * limit


def test_the_cap_leaves_other_threads_headroom_under_a_small_limit() -> None:
    def work() -> str:
        seen: list[int] = []
        supervised("see(cap() - size())", Limits(memory_mb=1, hard_seconds=30),
                   see=seen.append, cap=soft_cap, size=address_space_bytes)
        return f"{seen[0] // 2**20} MB"

    # Address space left while the agent runs: the limit and CAP_HEADROOM, less what the
    # supervisor's own threads mapped after the cap (not 1.5 MB: half a 1 MB limit).
    headroom = int(in_child(work).split()[0])
    assert limits.CAP_HEADROOM // 2**20 // 2 <= headroom <= 1 + limits.CAP_HEADROOM // 2**20


@pytest.mark.parametrize("source", [
    "raise ValueError('agent error')",
    "while True:\n    pass",
    "def f(n):\n    return f(n + 1)\nf(0)",
])
def test_the_cap_is_lifted_on_every_way_out(source: str) -> None:
    before = resource.getrlimit(resource.RLIMIT_AS)
    seen: list[int] = []
    assert supervised("see(cap())\n" + source, SAFE, see=seen.append, cap=soft_cap) != "finished"
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    assert seen[0] < address_space_bytes() + 2 * SAFE.memory_mb * 2**20  # it was capped


def test_only_the_outermost_supervisor_caps() -> None:
    before = resource.getrlimit(resource.RLIMIT_AS)
    outer = Supervisor(SAFE, describe="outer")
    outer.start()
    try:
        capped = soft_cap()
        assert supervised("x = 1", SAFE) == "finished"
        assert soft_cap() == capped
    finally:
        outer.stop()
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_a_lower_limit_already_set_is_kept() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    lower = address_space_bytes() + SAFE.memory_mb * 2**20  # below the supervisor's
    resource.setrlimit(resource.RLIMIT_AS, (lower, hard))
    try:
        seen: list[int] = []
        supervised("see(cap())", SAFE, see=seen.append, cap=soft_cap)
        assert seen == [lower]
        assert soft_cap() == lower
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("source", [
    "s = 'x'.ljust(10 ** 9)",
    "b = (1).to_bytes(10 ** 9, 'big')",
    "s = f'{1:>{10 ** 9}}'",
    "s = 'x' * 10 ** 7\nfor i in range(9):\n    s = s + s",
    "hoard = []\nfor i in range(200):\n    hoard.append('x' * 10 ** 7)",
])
def test_one_big_allocation_is_a_memory_breach_not_a_kill(source: str) -> None:
    outcome = in_child(lambda: supervised(source))
    # Refused by the cap ("ran out of memory"), or its growth seen first ("grew memory by").
    assert outcome.startswith("MemoryLimitExceeded: the test "), outcome
    assert outcome.endswith("64 MB limit)") or outcome.endswith("64 MB limit"), outcome


# -- MemoryError is a breach ------------------------------------------------------------


def test_agent_code_cannot_catch_a_memory_error() -> None:
    caught: list[object] = []
    outcome = in_child(lambda: supervised(
        "try:\n    s = 'x'.ljust(10 ** 10)\nexcept Exception as e:\n    caught.append(e)\n"
        "print('caught', caught)", caught=caught))
    assert outcome.startswith("MemoryLimitExceeded"), outcome


def out_of_memory() -> None:
    raise MemoryError


def test_a_memory_error_from_host_code_is_a_breach_too() -> None:
    caught: list[object] = []
    outcome = supervised("try:\n    grow()\nexcept Exception as e:\n    caught.append(e)",
                         SAFE, grow=out_of_memory, caught=caught)
    assert outcome.startswith("MemoryLimitExceeded: the test ran out of memory"), outcome
    assert caught == []


# -- the watchdog: a lost trace function, and nothing after stop() --------------------------


def lose_the_trace() -> None:
    """What a RecursionError inside the trace function does: CPython drops it."""
    sys.settrace(None)


def test_the_watchdog_stops_untraced_agent_code_at_the_deadline() -> None:
    def work() -> str:
        started = time.monotonic()
        outcome = supervised("lose()\nwhile True:\n    pass", lose=lose_the_trace)
        return f"{outcome} after {time.monotonic() - started:.1f} s"

    outcome = in_child(work)
    assert outcome.startswith("DeadlineExceeded: the test ran over its 1 s deadline"), outcome
    assert float(outcome.split(" after ")[1].split()[0]) < 1.9


def test_the_watchdog_stops_untraced_agent_code_over_its_memory() -> None:
    source = ("lose()\nhoard = []\nwhile True:\n    try:\n        hoard.append('x' * 1000)\n"
              "    except Exception:\n        pass")
    outcome = in_child(lambda: supervised(source, lose=lose_the_trace))
    assert outcome.startswith("MemoryLimitExceeded: the test grew memory by"), outcome


def test_host_code_after_stop_is_not_watched() -> None:
    """After a breach, the op's rollback may need as much memory again as the op grew (it
    pickles the namespace to compare it with what is stored), and take its time: neither
    is the op's.  (The cause of resources-8's intermittent kill.)"""
    def work() -> str:
        outcome = supervised("hoard = []\nwhile True:\n    hoard.append('x' * 10 ** 5)")
        copy = b"x" * (2 * SMALL.memory_mb * 2**20)  # touched, so resident
        time.sleep(limits.BREACH_GRACE_SECONDS + 0.5)
        del copy
        return outcome

    outcome = in_child(work)
    assert outcome.startswith("MemoryLimitExceeded: the test "), outcome


def test_a_breach_sent_but_not_raised_is_dropped_by_stop() -> None:
    """The watchdog sends a breach while stop() waits for its lock: stop() raises it where
    it is caught (``PyThreadState_SetAsyncExc(id, NULL)`` instead would leave CPython 3.11
    looping forever at the next traced call)."""
    def work() -> str:
        main = threading.get_ident()
        supervisor = Supervisor(SAFE, describe="the test")
        supervisor.start()
        holding = threading.Event()

        def watchdog() -> None:
            with supervisor._lock:
                holding.set()
                time.sleep(0.2)  # stop() waits for the lock by now
                limits._set_async_exc(main, limits._raisable(DeadlineExceeded("sent late")))
                supervisor._sent = True

        threading.Thread(target=watchdog).start()
        holding.wait()
        supervisor.stop()
        calls = 0

        def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
            return trace

        sys.settrace(trace)
        try:
            for _ in range(1000):
                calls += len("x")
        finally:
            sys.settrace(None)
        return f"finished {calls} calls"

    assert in_child(work, timeout=10) == "finished 1000 calls"


def test_a_breach_is_raised_only_into_agent_code() -> None:
    """Host code the agent called (a tool, the runtime) runs to its end past the deadline;
    the breach is raised once an agent frame runs again."""
    def work() -> str:
        done: list[int] = []

        def host_work() -> None:
            time.sleep(1.5)  # past the 1 s deadline, but in C: no line events meanwhile
            done.append(len("finished"))

        outcome = supervised("host_work()\nx = 1", host_work=host_work)
        return f"{outcome}, host work {done}"

    outcome = in_child(work)
    assert outcome == ("DeadlineExceeded: the test ran over its 1 s deadline, "
                       "host work [8]"), outcome


def test_the_interpreter_is_left_as_it_was_found() -> None:
    """No stale "asynchronous exception pending" flag after stop(), which would make
    CPython 3.11 loop forever at the next traced call."""
    def work() -> str:
        outcomes = [supervised("x = 1"),
                    supervised("lose()\nwhile True:\n    pass", lose=lose_the_trace)]

        def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
            return trace

        sys.settrace(trace)
        try:
            calls = sum(len((lambda: "x")()) for _ in range(1000))
        finally:
            sys.settrace(None)
        return f"{outcomes[0]}; {outcomes[1][:16]}; {calls} traced calls"

    assert in_child(work, timeout=10) == "finished; DeadlineExceeded; 1000 traced calls"


def test_the_breach_raised_into_agent_code_names_the_limit() -> None:
    raisable = limits._raisable(MemoryLimitExceeded("op 3 (mallory) grew memory"))
    error = raisable()
    assert isinstance(error, MemoryLimitExceeded)
    assert (type(error).__name__, error.message) == ("MemoryLimitExceeded",
                                                     "op 3 (mallory) grew memory")


def test_the_output_is_echoed_after_supervision(env) -> None:  # type: ignore[no-untyped-def]
    """The kernel's I/O (IOPub) is host work: it runs without the cap an agent may have filled."""
    with env.op():
        env.agents.add("alice")
    before = resource.getrlimit(resource.RLIMIT_AS)
    seen: list[tuple[str, tuple[int, int]]] = []
    with env.op():
        env.runtime.run("alice", "print('hello')",
                        echo=lambda text: seen.append(
                            (text, resource.getrlimit(resource.RLIMIT_AS))))
    assert seen == [("hello\n", before)]
