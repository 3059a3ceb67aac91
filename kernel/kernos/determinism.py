"""Randomness and the clock inside ops, made reproducible for replay.

**Randomness is seeded.**  When an op begins, :func:`seed_op` seeds Python's
global ``random`` generator (and numpy's legacy global one, if numpy is
already imported) from the workspace's identity and the op id.  So
``random.random()``, ``random.choice(...)``, ``numpy.random.rand()`` and
``uuid.uuid4()`` (which :func:`install` makes draw from the seeded generator
while an op runs) give the same values when the op is replayed, in any
process and under any ``PYTHONHASHSEED``, and different values in different
ops and workspaces.  Code that seeds a generator itself gets what it asked
for.

**The clock is recorded.**  ``time.time()`` and ``time.time_ns()`` called
from the op's own code (a cell, harness code, a tool: any code outside the
standard library, the installed packages and Kernos) are recorded, in order,
in the op's audit record (``clock``, nanoseconds); a replay hands the op the
same readings (:func:`seed_op` with ``clock``).  Kernos and libraries keep
reading the real clock.

**Environment reads are fingerprinted.**  Each environment variable the
op's own code reads (``os.environ[...]``, ``os.environ.get``,
``os.getenv``) is recorded in its audit record (``environ``) as the name
and a SHA-256 of its value (never the value: environments hold secrets).  A
replay runs with its own environment and checks the fingerprints: a variable
that differs is a divergence naming it.

What this does not cover, and a replay therefore reports as a divergence at
the op that used it: the OS's randomness (``os.urandom``,
``random.SystemRandom``, ``secrets``), generators created with fresh OS
entropy (``numpy.random.default_rng()`` without a seed), ``datetime.now()``
and other clocks read in C, and clocks read inside libraries.  Code that imported ``time.time`` or
``uuid.uuid4`` by name before Kernos started keeps the unrecorded originals.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable
from types import FrameType

__all__ = ["end_op", "install", "op_seed", "seed_op"]

_original_uuid4: Callable[[], uuid.UUID] = uuid.uuid4
_original_time_ns: Callable[[], int] = time.time_ns
_active = False
_environ: list[list[str | None]] | None = None
"""Where the running op's environment reads are fingerprinted (its ``environ`` list)."""
_readings: list[int] | None = None
"""Where the running op's clock readings are recorded (its ``clock`` list)."""
_replayed: list[int] = []
"""Readings to hand out instead of the clock's (a replay), oldest first."""
_STDLIB = tuple(sorted({path + os.sep for key in ("stdlib", "platstdlib")
                       if (path := sysconfig.get_paths().get(key))}))
_NOT_OPS_CODE = tuple(sorted({os.path.dirname(os.path.abspath(__file__)) + os.sep} | {
    path + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (path := sysconfig.get_paths().get(key))}))


def op_seed(identity: str, op: int) -> bytes:
    """The seed of op ``op`` in the workspace ``identity``."""
    return hashlib.sha256(f"kernos:{identity}:{op}".encode()).digest()


def seed_op(identity: str, op: int, *, readings: list[int] | None = None,
            clock: list[int] | None = None,
            environ: list[list[str | None]] | None = None) -> None:
    """Seed the generators for one op, and start recording its clock (as it begins).

    ``readings`` receives the op's clock readings, ``environ`` its environment
    reads; ``clock`` (a replay) are the readings to hand out instead of the
    real clock's.
    """
    global _active, _readings, _replayed, _environ
    _readings = readings
    _environ = environ
    _replayed = list(clock or ())
    seed = op_seed(identity, op)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):  # an unusual numpy build
            numpy.random.seed(int.from_bytes(seed[:4], "big"))
    _active = True


def end_op() -> None:
    global _active, _readings, _replayed, _environ
    _active = False
    _readings = None
    _environ = None
    _replayed = []


def _ops_code(frame: FrameType | None) -> bool:
    """Whether the first frame outside the standard library is the op's own code."""
    while frame is not None and frame.f_code.co_filename.startswith(_STDLIB):
        frame = frame.f_back
    return frame is not None and not frame.f_code.co_filename.startswith(_NOT_OPS_CODE)


class _FingerprintedEnviron(os._Environ):  # type: ignore[type-arg]
    """``os.environ``, noting which variables the op's own code reads (not their values)."""

    def __getitem__(self, key: str) -> str:
        try:
            value: str = super().__getitem__(key)
        except KeyError:
            _note(key, None)
            raise
        _note(key, value)
        return value


def _note(key: str, value: str | None) -> None:
    if _environ is not None and type(key) is str and _ops_code(sys._getframe(2)):
        shown = None if value is None else hashlib.sha256(
            value.encode("utf-8", "surrogateescape")).hexdigest()
        if [key, shown] not in _environ:
            _environ.append([key, shown])


def _reading(caller: FrameType | None) -> int:
    """The clock for ``caller``: recorded (or replayed) if it is the op's own code."""
    if _readings is None or caller is None or caller.f_code.co_filename.startswith(
            _NOT_OPS_CODE) or caller.f_code.co_filename.startswith("<frozen"):
        return _original_time_ns()
    value = _replayed.pop(0) if _replayed else _original_time_ns()
    _readings.append(value)
    return value


def _time() -> float:
    return _reading(sys._getframe(1)) / 1e9


def _time_ns() -> int:
    return _reading(sys._getframe(1))


def _uuid4() -> uuid.UUID:
    if not _active:
        return _original_uuid4()
    return uuid.UUID(int=random.getrandbits(128), version=4)


def install() -> None:
    """Make ``uuid.uuid4`` seeded and ``time.time`` recorded inside ops (idempotent)."""
    uuid.uuid4 = _uuid4
    time.time = _time
    time.time_ns = _time_ns
    if type(os.environ) is os._Environ:
        os.environ.__class__ = _FingerprintedEnviron
