"""Which recordings a call may use: ``off``, ``record`` or ``replay``.

``record`` (the default)
    answer from the recording of an equal request if there is one, else call
    the provider and record its answer.  Re-running an op, or retrying a
    failed one, then gets the same answer and pays nothing more, and a
    session can be replayed as it ran.  Ask for a fresh sample by changing
    the request (a ``seed``, say) or with ``off``.
``off``
    always call the provider (the answer is still stored, and recorded for
    its request if none was).
``replay``
    never call the provider: a request without a recording fails with
    :class:`~kernos.errors.LLMReplayMiss`, which names the request's hash.

The mode is ``$KERNOS_LLM_MODE``, read at every call, unless a process sets
it with :func:`set_mode` (``set_mode(None)`` goes back to the environment).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping

from kernos.errors import UsageError

__all__ = ["ENVIRONMENT", "Mode", "current_mode", "set_mode"]

ENVIRONMENT = "KERNOS_LLM_MODE"


class Mode(enum.Enum):
    OFF = "off"
    RECORD = "record"
    REPLAY = "replay"


DEFAULT = Mode.RECORD
_override: Mode | None = None


def _parse(value: object, where: str) -> Mode:
    for mode in Mode:
        if value is mode or value == mode.value:
            return mode
    raise UsageError(f"{where} is {str(value)[:40]!r}; the LLM modes are "
                     f"{', '.join(mode.value for mode in Mode)}")


def current_mode(environ: Mapping[str, str] | None = None) -> Mode:
    """The mode calls use now: the override, else ``$KERNOS_LLM_MODE``, else ``record``."""
    if _override is not None:
        return _override
    found = (os.environ if environ is None else environ).get(ENVIRONMENT, "").strip()
    return _parse(found.lower(), f"${ENVIRONMENT}") if found else DEFAULT


def set_mode(mode: Mode | str | None) -> Mode | None:
    """Set this process's mode, and return it (``None``: follow the environment again)."""
    global _override
    _override = None if mode is None else _parse(mode, "the mode")
    return _override
