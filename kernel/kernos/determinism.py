"""Randomness inside ops, made deterministic so that a replay reproduces it.

When an op begins, :func:`seed_op` seeds Python's global ``random``
generator (and numpy's legacy global one, if numpy is already imported) from
the workspace's identity and the op id.  So ``random.random()``,
``random.choice(...)``, ``numpy.random.rand()`` and ``uuid.uuid4()`` (which
:func:`install` makes draw from the seeded generator while an op runs) give
the same values when the op is replayed, in any process and under any
``PYTHONHASHSEED``, and different values in different ops and workspaces.
Code that seeds the generator itself still gets exactly what it asked for.

What this does not cover, and a replay therefore reports as a divergence
at the op that used it: the OS's randomness (``os.urandom``,
``random.SystemRandom``, ``secrets``), generators created with fresh OS
entropy (``numpy.random.default_rng()`` without a seed), wall-clock time
stored into the image (``time.time()``, ``datetime.now()``) and environment
variables read into the image.  Seed such generators from ``random``, or keep
such values out of the image, for replays to match.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import sys
import uuid
from collections.abc import Callable

__all__ = ["install", "op_seed", "seed_op"]

_original_uuid4: Callable[[], uuid.UUID] = uuid.uuid4
_active = False


def op_seed(identity: str, op: int) -> bytes:
    """The seed of op ``op`` in the workspace ``identity``."""
    return hashlib.sha256(f"kernos:{identity}:{op}".encode()).digest()


def seed_op(identity: str, op: int) -> None:
    """Seed the global generators for one op (called as the op begins)."""
    global _active
    seed = op_seed(identity, op)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):  # an unusual numpy build
            numpy.random.seed(int.from_bytes(seed[:4], "big"))
    _active = True


def end_op() -> None:
    global _active
    _active = False


def _uuid4() -> uuid.UUID:
    if not _active:
        return _original_uuid4()
    return uuid.UUID(int=random.getrandbits(128), version=4)


def install() -> None:
    """Make ``uuid.uuid4`` draw from the seeded generator inside ops (idempotent)."""
    uuid.uuid4 = _uuid4
