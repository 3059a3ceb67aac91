"""The root of every Kernos error, and the errors of a call the API does not support.

``KernosError`` is the root; ``UsageError`` the branch of "fix the call".  The
whole tree is drawn in ``kernos.errors``, which is where every error is
imported from.
"""

from __future__ import annotations

__all__ = ["KernosError", "PathRefused", "RequestRejected", "TransactionStateError", "UnknownRef",
           "UsageError"]


class KernosError(Exception):
    """Root of every error Kernos raises on purpose."""


class UsageError(KernosError):
    """The API was called in a way it does not support."""


class PathRefused(UsageError):
    """A path that cannot name a file in a tracked directory (``kernos.files``): it holds
    a NUL byte, a ``..`` component, or is absolute outside the directory.  Nothing was
    changed."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path!r} is refused: {reason}. Give a path relative to the "
                         "tracked directory, without '..'.")


class UnknownRef(UsageError):
    """A history reference (commit, ``@op``, ``HEAD~n``) names no snapshot."""

    def __init__(self, ref: str, workspace: str) -> None:
        self.ref = ref
        self.workspace = workspace
        super().__init__(
            f"{ref!r} names no snapshot in {workspace}. Use a commit id (or a prefix "
            "of one), HEAD, HEAD~N, or @N for op N; `kernos log` (or `%kernos log` in a "
            "notebook) lists them."
        )


class RequestRejected(UsageError):
    """A request was refused before anything ran; the image is untouched."""

    def __init__(self, message: str, *, reason: str) -> None:
        self.reason = reason
        super().__init__(message)

    @classmethod
    def oversized_source(cls, size: int, limit: int) -> RequestRejected:
        return cls(
            f"The code is {size:,} bytes, over the limit of {limit:,} bytes "
            "(KERNOS_MAX_SOURCE_BYTES). Nothing ran and the image is unchanged. Put large "
            "data in a file and load it from a short cell.",
            reason="oversized-source",
        )


class TransactionStateError(UsageError):
    """A transaction was used in a state that does not allow the call."""
