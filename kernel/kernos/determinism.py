"""Randomness and the clock inside ops, made reproducible for replay.

**The global generators' state is part of the image.**  The state of
Python's ``random`` and of numpy's legacy global generator
(``numpy.random.seed``, ``numpy.random.standard_normal``, ...) is persisted
under the runtime's own name :data:`STATE_NAME`, like any other value: a
:class:`GeneratorParticipant` captures it when an op commits (a new value
only if the op drew from or seeded a generator), an op that rolls back puts
the generators back where the last commit left them, a restore and a
checkout set them from the snapshot, and each op begins from exactly the
committed state.  So a seed set in one cell governs the next cells as it
does on IPython, across restarts, and a replay that starts from a snapshot
continues the same streams (I7, I9).  A workspace that never stored a state
starts from one derived from its identity (:func:`fresh_seed`), and so does
numpy's generator the first time numpy is imported in it (an import hook
sets it as ``numpy.random`` finishes loading, before any code can draw).

``uuid.uuid4()`` draws, while an op runs, from a private generator seeded
per op from the workspace's identity and the op id (:func:`seed_op`): a
replay reproduces the ids, and no id ever moves the user's ``random`` stream.

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
import functools
import hashlib
import importlib.abc
import importlib.machinery
import os
import random
import sys
import sysconfig
import time
import types
import uuid
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, Protocol

from kernos.transaction import Transaction

__all__ = [
    "STATE_NAME",
    "GeneratorImage",
    "GeneratorParticipant",
    "apply_state",
    "capture_state",
    "end_op",
    "ensure_state",
    "fresh_seed",
    "fresh_state",
    "generators_untouched",
    "install",
    "op_seed",
    "op_time_ns",
    "same_state",
    "seed_op",
]

STATE_NAME = "kernos:random"
"""The image's name for the global generators' state."""
_STATE_FORMAT = "kernos.random/1"
_NO_STATE = object()
"""What :data:`_pending` holds until an image has said which state the generators are in."""
_pending: object = _NO_STATE
"""(numpy's part of the image's state or None, the workspace identity): what numpy's
generator is set to when numpy.random is imported after the image set the state."""
_uuid_generator = random.Random()
"""uuid4's generator inside ops: never the user's ``random`` stream."""
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
    """Seed uuid4's generator for one op, and start recording its clock (as it begins).

    ``readings`` receives the op's clock readings, ``environ`` its environment
    reads; ``clock`` (a replay) are the readings to hand out instead of the
    real clock's.
    """
    global _active, _readings, _replayed, _environ
    _readings = readings
    _environ = environ
    _replayed = list(clock or ())
    _uuid_generator.seed(op_seed(identity, op))
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


def op_time_ns() -> int:
    """The clock as Kernos code that stores a time in the image reads it: recorded with the
    op's own readings (and handed back in a replay), so the image replays the same."""
    if _readings is None:
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
    return uuid.UUID(int=_uuid_generator.getrandbits(128), version=4)


def install() -> None:
    """Make ``uuid.uuid4`` seeded and ``time.time`` recorded inside ops (idempotent).

    Also watch for numpy.random's import, to set its generator from the image.
    """
    uuid.uuid4 = _uuid4
    if not any(isinstance(finder, _NumpyRandomHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NumpyRandomHook())
    time.time = _time
    time.time_ns = _time_ns
    if type(os.environ) is os._Environ:
        os.environ.__class__ = _FingerprintedEnviron


# -- the global generators' state, part of the image --------------------------------------


def fresh_seed(identity: str) -> bytes:
    """The seed of a workspace that never stored a generator state (op 0 is no op's id)."""
    return op_seed(identity, 0)


def capture_state(identity: str, stored: object = None) -> tuple[object, ...]:
    """The global generators' state, as plain data (no numpy objects in it).

    ``(format, random's state, numpy's)``.  numpy's part is None while numpy's
    generator is at the workspace's fresh start, and is ``stored``'s while numpy
    is not imported: so the state does not depend on whether this process
    happens to have numpy loaded, only on what the workspace drew.
    """
    numpy_random = _numpy_random()
    if numpy_random is None:
        numpy_state = stored[2] if _valid(stored) else None  # type: ignore[index]
    else:
        numpy_state = _plain(numpy_random.get_state(legacy=False))
        if numpy_state == _fresh_numpy(identity):
            numpy_state = None
    return (_STATE_FORMAT, random.getstate(), numpy_state)


def same_state(state: object, other: object) -> bool:
    """Whether two captured states are equal (plain data: ``==`` is exact)."""
    return state is other or (type(state) is tuple and state == other)


def apply_state(state: object, identity: str) -> None:
    """Set the generators to ``state``, or to the workspace's fresh start if it has none.

    numpy's part waits for numpy.random's import if numpy is not loaded yet.
    """
    global _pending
    if not _valid(state):
        state = fresh_state(identity)
    assert isinstance(state, tuple)
    random.setstate(state[1])
    _pending = (state[2], identity)
    numpy_random = _numpy_random()
    if numpy_random is not None:
        _set_numpy(numpy_random)


def ensure_state(state: object, identity: str) -> bool:
    """Make the generators equal ``state`` (or the fresh start); say whether they differed.

    Cheap when they are equal already, as after every commit and rollback.
    """
    target = state if _valid(state) else fresh_state(identity)
    if same_state(capture_state(identity, target), target):
        return False
    apply_state(target, identity)
    return True


@functools.lru_cache(maxsize=16)
def fresh_state(identity: str) -> tuple[object, ...]:
    """The state of a workspace that never stored one: seeded from its identity."""
    return (_STATE_FORMAT, random.Random(fresh_seed(identity)).getstate(), None)


@functools.lru_cache(maxsize=16)
def _fresh_numpy(identity: str) -> object:
    generator = sys.modules["numpy.random"].RandomState(_numpy_seed(identity))
    return _plain(generator.get_state(legacy=False))


def _numpy_seed(identity: str) -> int:
    return int.from_bytes(fresh_seed(identity)[:4], "big")


@contextlib.contextmanager
def generators_untouched() -> Iterator[None]:
    """Keep the user's generators as they are while Kernos' own code runs in an op.

    Libraries Kernos imports lazily can draw at import (rich, under litellm, takes
    24 bits from ``random``): the user's stream must not depend on that.
    """
    state = random.getstate()
    numpy_random = _numpy_random()
    numpy_state = None if numpy_random is None else numpy_random.get_state(legacy=False)
    try:
        yield
    finally:
        random.setstate(state)
        if numpy_random is not None:
            numpy_random.set_state(numpy_state)
        elif _numpy_random() is not None:  # imported meanwhile: as the import hook set it
            with contextlib.suppress(Exception):
                _set_numpy(_numpy_random())


def _valid(state: object) -> bool:
    return type(state) is tuple and len(state) == 3 and state[0] == _STATE_FORMAT


def _numpy_random() -> Any:
    """numpy.random once it has finished importing, else None."""
    module = sys.modules.get("numpy.random")
    return module if module is not None and hasattr(module, "set_state") else None


def _set_numpy(numpy_random: Any) -> None:
    if _pending is _NO_STATE:
        return  # no image has set the generators yet: numpy keeps its own start
    assert isinstance(_pending, tuple)
    numpy_state, identity = _pending
    if numpy_state is None:
        numpy_random.seed(_numpy_seed(identity))
        return
    state = _unplain(numpy_state, sys.modules["numpy"])
    kind = state.get("bit_generator") if isinstance(state, dict) else None
    generator = numpy_random.mtrand._rand
    if kind is not None and type(generator._bit_generator).__name__ != kind:
        # The image's generator runs another bit generator (numpy.random.set_bit_generator).
        numpy_random.set_bit_generator(getattr(numpy_random, kind)())
    numpy_random.set_state(state)


def _plain(value: Any) -> Any:
    """numpy's state as plain data: arrays become ("ndarray", dtype, shape, bytes)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return tuple(_plain(item) for item in value)
    dtype = getattr(value, "dtype", None)
    if dtype is not None and hasattr(value, "tobytes"):
        if not getattr(value, "shape", ()):
            return value.item()  # a numpy scalar
        return ("ndarray", dtype.str, tuple(value.shape), value.tobytes())
    return value


def _unplain(value: Any, numpy: Any) -> Any:
    if isinstance(value, dict):
        return {key: _unplain(item, numpy) for key, item in value.items()}
    if isinstance(value, tuple):
        if len(value) == 4 and value[0] == "ndarray":
            return numpy.frombuffer(value[3], dtype=value[1]).reshape(value[2]).copy()
        return tuple(_unplain(item, numpy) for item in value)
    return value


class _SetAfterImport(importlib.abc.Loader):
    """numpy.random's own loader, then the image's state for its generator."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        with contextlib.suppress(Exception):  # an unusual numpy build keeps its own start
            _set_numpy(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _NumpyRandomHook(importlib.abc.MetaPathFinder):
    """Wraps numpy.random's loader so that no code draws before the image's state is set."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "numpy.random":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _SetAfterImport(spec.loader)
                return spec  # type: ignore[no-any-return]
        return None


class GeneratorImage(Protocol):
    """What :class:`GeneratorParticipant` needs of the image whose op it moves with."""

    @property
    def system(self) -> dict[str, object]:
        """The runtime's own persisted names (``kernos:...``), :data:`STATE_NAME` among them."""
        ...

    @property
    def committed(self) -> dict[str, object]:
        """The values the last commit holds."""
        ...

    @property
    def identity(self) -> str:
        """The workspace's identity (see :func:`fresh_seed`)."""
        ...


class GeneratorParticipant:
    """Moves the global generators' state with an op (see the module docstring).

    It commits first (its sort key sorts before the audit's and the image's), so
    the state it binds is part of what the image then writes; on abort it puts
    the generators back where the last commit left them.
    """

    def __init__(self, image: GeneratorImage) -> None:
        self.image = image
        self.reset = False
        """Set on abort: the op had moved the generators, and they were put back."""

    def sort_key(self) -> str:
        return "kernos.random"

    def tpc_begin(self, txn: Transaction) -> None:
        pass

    def commit(self, txn: Transaction) -> None:
        image = self.image
        stored = image.system.get(STATE_NAME)
        reference = stored if _valid(stored) else fresh_state(image.identity)
        state = capture_state(image.identity, reference)
        # A workspace that never drew keeps no state: its fresh start is implied.
        if not same_state(state, reference):
            image.system[STATE_NAME] = state

    def tpc_vote(self, txn: Transaction) -> None:
        pass

    def tpc_finish(self, txn: Transaction) -> None:
        pass

    def tpc_abort(self, txn: Transaction) -> None:
        pass

    def abort(self, txn: Transaction) -> None:
        image = self.image
        self.reset = ensure_state(image.committed.get(STATE_NAME), image.identity)
