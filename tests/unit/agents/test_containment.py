"""Containment inside the interpreter, without killing the process.

A test whose failure would be the watchdog's kill (of pytest, here) runs its supervised
code in a forked child (:func:`in_child`), which reports how it ended.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from kernos.agents import limits
from kernos.agents.limits import AGENT_FILENAME_PREFIX, Limits, Supervisor

SMALL = Limits(seconds=1, hard_seconds=30, memory_mb=64, recursion=30)


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
