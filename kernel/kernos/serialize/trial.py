"""Would a value come back from its snapshot?  Tried once per new type, in a forked child.

Some objects pickle without complaint and then cannot be loaded: a
``MagicMock`` recurses forever, sympy's ``RR`` calls ``mpq.__new__`` without
its argument.  A restore would find out only after a restart, when the value
is a placeholder and the cell that made it long gone.  So a commit tries the
restore path for what it stores, the first time it stores an object of a type
(:attr:`Pickled.kinds`): it loads the stream in a child process forked for
that purpose, so nothing the load does in memory (a class made again, a
registry written to, an import) touches the live process.  What a load does
outside the process (a ``__setstate__`` that writes a file) happens, as it
would at the restore this stands for; values of the user's own making only:
nothing here loads what came from elsewhere.  What fails is reported with the
commit, as a value that cannot be persisted; it is still stored.

A child that does not answer within :data:`TIMEOUT` seconds is killed and
the value is taken as loadable: the check may miss, never block an op.
Types that loaded once are not tried again (:class:`Trials`); nor is a type
that failed, whose failure was reported.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
import weakref
from collections.abc import Callable

__all__ = ["TIMEOUT", "Trials"]

TIMEOUT = 10.0
"""Seconds a trial load may take before the child is killed and the value passes."""

_LIMIT = 400
"""Characters of the loader's error kept for the notice."""


class Trials:
    """The types whose loading has been tried in this process."""

    def __init__(self) -> None:
        self._tried: weakref.WeakSet[type] = weakref.WeakSet()

    def untried(self, kinds: frozenset[type]) -> bool:
        return any(kind not in self._tried for kind in kinds)

    def check(self, kinds: frozenset[type], load: Callable[[], object]) -> str | None:
        """Why ``load()`` would fail (the loader's error), or None if it loads.

        ``kinds``: the types of what the stream holds (:attr:`Pickled.kinds`); ``load``
        loads it (the serializer's ``load`` of the stream), run in a forked child.
        """
        if not self.untried(kinds):
            return None
        problem = _load_in_child(load)
        for kind in kinds:
            with contextlib.suppress(TypeError):
                self._tried.add(kind)
        return problem


def _load_in_child(load: Callable[[], object]) -> str | None:
    if not hasattr(os, "fork"):
        return None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: load, answer, and leave without running any cleanup
        try:
            os.close(read)
            with open(os.devnull, "w") as sink:
                sys.stdout = sys.stderr = sink
                try:
                    load()
                    answer = b"ok"
                except BaseException as error:
                    text = f"{type(error).__name__}: {error}"
                    answer = b"no" + text[:_LIMIT].encode("utf-8", "replace")
            os.write(write, answer)
        finally:
            os._exit(0)
    os.close(write)
    try:
        deadline = time.monotonic() + TIMEOUT
        chunks = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read], [], [], left)[0]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return None
            chunk = os.read(read, 4096)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    answer = b"".join(chunks)
    if answer.startswith(b"no"):
        return answer[2:].decode("utf-8", "replace")
    return None  # "ok", or a child that died without a word: not the value's fault
