"""Values the image writes sealed under a data subject's key, never in the clear.

The pickler does not know what a personal value is: a type whose instances
must be sealed registers a sealer here (``kernos.personal`` registers
``Personal``), and the pickler hands every instance of exactly that type,
before any other reduction, to its sealer together with the workspace's
keyring.  A sealer returns the reduction to write (a load-side constructor
and its arguments, which hold the sealed bytes).  Without a keyring (a
serializer outside a workspace) such a value cannot be persisted at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SEALERS", "register_sealer"]

SEALERS: dict[type, Callable[[Any, Any], Any]] = {}
"""Exact type -> ``sealer(obj, keyring)``, which returns the reduction to write."""


def register_sealer(kind: type, sealer: Callable[[Any, Any], Any]) -> None:
    """Have the pickler write every instance of exactly ``kind`` through ``sealer``."""
    SEALERS[kind] = sealer
