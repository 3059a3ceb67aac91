"""The sandbox's exceptions, named as E2B names them.

They are raised for what is not a cell's outcome (a cell that fails is an
``Execution`` whose ``error`` is set, never an exception): a sandbox whose
kernel died (:class:`SandboxDied`), a missing file (:class:`NotFoundException`),
a refused file request or argument (:class:`InvalidArgumentException`,
:class:`PermissionDeniedException`), a ``run_code`` over its ``timeout``
(:class:`TimeoutException`).  All are :class:`SandboxException`, which is a
:class:`~kernos.errors.KernosError`.
"""

from __future__ import annotations

from kernos.errors import KernosError

__all__ = ["InvalidArgumentException", "NotFoundException", "PermissionDeniedException",
           "SandboxDied", "SandboxException", "TimeoutException"]


class SandboxException(KernosError):
    """Something the sandbox could not do; the message says what to do instead."""


class InvalidArgumentException(SandboxException, ValueError):
    """A bad argument: an unsupported language, per-run ``envs``, a refused path."""


class NotFoundException(SandboxException, FileNotFoundError):
    """No file at that path (under the sandbox's working directory)."""


class PermissionDeniedException(SandboxException, PermissionError):
    """The sandbox's principal lacks the grant (``file:read:GLOB`` / ``file:write:GLOB``)."""


class TimeoutException(SandboxException, TimeoutError):
    """``run_code`` ran over its ``timeout``: the op was interrupted and rolled back."""


class SandboxDied(SandboxException):
    """The sandbox's kernel process is gone (killed, crashed, or ``kill()`` was called).

    What committed before is kept in the workspace: make a new sandbox on it
    (``Sandbox.create(workspace=..., principal=...)``) to go on from there."""
