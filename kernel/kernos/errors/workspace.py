"""Errors of the workspace on disk (locked, damaged, full, untrusted) and of its git remotes.

Part of the tree drawn in ``kernos.errors``, which is where they are imported from.
"""

from __future__ import annotations

import errno
import os
import shlex
from pathlib import Path

from kernos.errors.base import KernosError

__all__ = ["DiskFull", "RemoteDiverged", "RemoteError", "RemoteLeaseHeld", "RemoteRefused",
           "UnknownWorkspace", "WorkspaceCorrupt", "WorkspaceError", "WorkspaceFormatError",
           "WorkspaceLocked", "WorkspaceUntrusted", "is_disk_full"]


class WorkspaceError(KernosError):
    """The workspace directory cannot be used as asked."""

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        super().__init__(message)


class WorkspaceLocked(WorkspaceError):
    """Another process (usually another kernel) owns the workspace."""

    def __init__(self, path: str, owner: str, *, advice: str | None = None) -> None:
        self.owner = owner
        super().__init__(
            f"The workspace {path} is in use by {owner}. " + (advice or (
                "A workspace belongs to one kernel at a time. Stop that kernel, or point "
                "KERNOS_WORKSPACE at another directory.")),
            path=path,
        )


class WorkspaceCorrupt(WorkspaceError):
    """The snapshot history on disk is damaged or cannot be read."""

    def __init__(self, path: str, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"The workspace {path} is damaged: {problem}. Nothing was changed. Inspect it "
            "with `kernos log` and `git -C <workspace>/history.git fsck`, or check out an "
            "earlier snapshot with `kernos checkout REF`.",
            path=path,
        )


class WorkspaceFormatError(WorkspaceError):
    """The directory is not a Kernos workspace this version can read."""


class WorkspaceUntrusted(WorkspaceError):
    """A clone whose audit records are signed by writers this workspace does not trust yet.

    Restoring a snapshot runs pickle, which runs code: nothing is restored, replayed or
    forked from it until the human trusts each writer (``kernos remote trust``).
    """

    def __init__(self, path: str, *, url: str, signers: list[str], unsigned: int) -> None:
        self.url = url
        self.signers = signers
        self.unsigned = unsigned
        where = f" -w {shlex.quote(path)}"
        steps = [f"`kernos remote trust {key}{where}`" for key in signers]
        if unsigned:
            steps.append(f"`kernos remote trust --accept-unsigned{where}` (its {unsigned} "
                         "records from before signing existed)")
        who = ", ".join(signers) if signers else "no key"
        super().__init__(
            f"The workspace {path} was cloned from {url}, whose records are signed by {who}"
            + (f" ({unsigned} unsigned)" if unsigned else "") + ", which it does not trust "
            "yet. Restoring a snapshot runs code (pickle), so nothing in it is restored until "
            "you trust its writers: compare each key id with the one `kernos remote trust` "
            "prints in the writer's own workspace, then run " + " and ".join(steps) + ". "
            "`kernos log` and `kernos audit verify` work meanwhile.", path=path)


class UnknownWorkspace(WorkspaceError):
    """A workspace name (``kernos -w NAME``) that names no workspace, or several.

    ``name`` is what was given, ``root`` the directory names are looked up in, and
    ``candidates`` the workspaces it could mean (empty: none matched).
    """

    def __init__(self, message: str, *, name: str, root: str,
                 candidates: tuple[str, ...] = ()) -> None:
        self.name = name
        self.root = root
        self.candidates = candidates
        super().__init__(message, path=name)

    @classmethod
    def unknown(cls, name: str, *, root: str, known: list[str]) -> UnknownWorkspace:
        listed = (f"the workspaces there are {', '.join(known[:8])}"
                  + (f" and {len(known) - 8} more" if len(known) > 8 else "")) if known \
            else "there is no workspace there yet"
        return cls(f"no workspace is named {name!r} under {root} ({listed}). `kernos "
                   "workspaces` lists them with their paths. -w takes one of those names or a "
                   f"path: ./{name} for a directory here, {root}/{name} for a new workspace "
                   "there.", name=name, root=root)

    @classmethod
    def ambiguous(cls, name: str, *, root: str, candidates: list[str]) -> UnknownWorkspace:
        return cls(f"{name!r} could name {len(candidates)} workspaces under {root}: "
                   f"{', '.join(candidates[:8])}{' ...' if len(candidates) > 8 else ''}. "
                   "Give the whole name (`kernos workspaces` lists them) or a path.",
                   name=name, root=root, candidates=tuple(candidates))


class DiskFull(WorkspaceError, OSError):
    """A write into the workspace found its filesystem full (or the user's quota spent).

    It is an ``OSError`` too (``errno`` is ENOSPC or EDQUOT), so code that copes with
    a failed write copes with this one.  ``path`` is the file being written,
    ``what`` says what it is, ``mount`` the filesystem's mount point, ``free`` the
    bytes left there when the write failed, ``needed`` the size of the write when
    known, and ``then`` what became of the operation.
    """

    def __init__(self, *, path: str, what: str, mount: str, free: int | None,
                 needed: int | None, code: int, reason: str, then: str) -> None:
        self.what = what
        self.mount = mount
        self.free = free
        self.needed = needed
        self.then = then
        room = (f"{free:,} bytes free on {mount}" if free is not None
                else f"free space on {mount} unknown")
        if needed is not None:
            room += f", {needed:,} needed for this write"
        self.message = (
            f"the disk is full: writing {what} ({path}) failed with {reason}; {room}. "
            f"{then} Free space on {mount} (or move the workspace to a larger disk), "
            "then retry.")
        super().__init__(self.message, path=path)
        self.errno = code
        self.strerror = reason

    def __str__(self) -> str:
        return self.message  # not OSError's "[Errno 28] ...": the message says it all

    @classmethod
    def from_os_error(cls, error: OSError, *, path: str | os.PathLike[str], what: str,
                      needed: int | None = None,
                      then: str = "Nothing was written.") -> DiskFull:
        """The error for ``error`` (an ENOSPC or EDQUOT) while writing ``what`` at ``path``."""
        where = Path(path)
        probe = where
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free: int | None
        try:
            stat = os.statvfs(probe)
            free = stat.f_bavail * stat.f_frsize
        except OSError:
            free = None
        code = error.errno if error.errno is not None else errno.ENOSPC
        reason = f"{errno.errorcode.get(code, code)} ({os.strerror(code)})"
        return cls(path=str(where), what=what, mount=_mount_point(probe), free=free,
                   needed=needed, code=code, reason=reason, then=then)


    def retold(self, then: str) -> DiskFull:
        """The same failure, told with what it means for the operation at hand."""
        return DiskFull(path=self.path, what=self.what, mount=self.mount, free=self.free,
                        needed=self.needed, code=self.errno or errno.ENOSPC,
                        reason=self.strerror or "ENOSPC", then=then)


def _mount_point(path: Path) -> str:
    """The mount point of the filesystem that holds ``path`` (an existing path)."""
    try:
        current = path.resolve()
        device = current.stat().st_dev
        while current != current.parent and current.parent.stat().st_dev == device:
            current = current.parent
    except OSError:
        return str(path)
    return str(current)


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says that a filesystem (or a quota) has no room left."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


class RemoteError(KernosError):
    """A git remote cannot be reached or used as asked (``kernos.remote.transfer``)."""

    def __init__(self, message: str, *, remote: str = "") -> None:
        self.remote = remote
        super().__init__(message)


class RemoteDiverged(RemoteError):
    """A push (or pull) that would fork the history: another writer moved the remote."""

    def __init__(self, message: str, *, remote: str, writer: str) -> None:
        self.writer = writer
        """Who moved the remote last, as far as it says (host, workspace id, when)."""
        super().__init__(message, remote=remote)


class RemoteRefused(RemoteError):
    """A pull or clone refused what the remote holds (tampered, unsigned, untrusted, planted,
    oversized or malformed); the local workspace was not changed."""

    def __init__(self, message: str, *, remote: str, record: int | None = None,
                 commit: str | None = None, path: str | None = None) -> None:
        self.record = record
        """The audit record that was wrong, if one was."""
        self.commit = commit
        """The commit that was wrong, if one was."""
        self.path = path
        """The path in the remote's tree that was wrong, if one was."""
        super().__init__(message, remote=remote)


class RemoteLeaseHeld(RemoteError):
    """Another workspace holds the remote's writer lease, and it has not expired."""

    def __init__(self, remote: str, holder: str, *, expires: str,
                 workspace: str | None = None) -> None:
        self.holder = holder
        self.expires = expires
        where = f" -w {shlex.quote(workspace)}" if workspace else ""
        super().__init__(
            f"The remote {remote} is leased to {holder} until {expires}: one writer at a "
            "time extends a workspace. Wait for that kernel to stop (or the lease to expire), "
            f"or, if that writer is gone for good, take it over with "
            f"`kernos remote release {remote} --force{where}`.", remote=remote)
