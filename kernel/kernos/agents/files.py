"""Files for principals: one principal's file operations under its grants, inside an op.

:class:`FileAccess` is the one implementation of file access by a principal:
agent code's ``files`` object (``kernos.agents.api``) and the harness client
and MCP server use it alike.  Every path is relative to the workspace's files
root (``image.files.root()``, tracked, so every change commits or rolls back
with the op that made it).

The rules
---------
**Paths.**  A path is a ``str`` of at most 1024 characters, valid UTF-8,
relative (:func:`kernos.files.paths.relative_path`: no NUL byte, no ``..``
component; ``a/./b`` is ``a/b``).  An absolute path is refused, even one
inside the root.  On disk, a path that is or goes through a symbolic link, a
directory where a file is meant, a device, FIFO or socket, and (for agents) a
file with more than one hard link (its other name may be outside the root) is
refused: every component is opened with ``O_NOFOLLOW`` relative to its parent
directory's descriptor, so no link is ever followed out of the root.

**Grants.**  ``file:read:GLOB`` lets a principal read (and list and test for)
the files the glob matches (:mod:`kernos.agents.globs`); ``file:write:GLOB``
lets it write, append to and delete them, *and read them* (as ``write:NAME``
implies ``read:NAME``: what you may overwrite you may see).  An agent's own
subtree, ``agents/NAME/`` (``agents/alice/bob/`` for the sub-agent
``alice/bob``, which is inside ``alice``'s), is its own without a grant.  The
human may do anything.  The grant a check used is noted in ``op.grants_used``.

**Refusals veto the op.**  A missing grant raises
:class:`~kernos.errors.CapabilityDenied`, recorded in ``op.denied``; a refused
path, bad data or a breached limit raises a :class:`~kernos.errors.UsageError`.
Each vetoes the op before it is raised, so the op rolls back whatever the
caller does with the error.  A missing file raises ``FileNotFoundError`` and a
file that is not UTF-8 (read as text) ``ValueError``: those are the caller's
to handle and veto nothing.

**Audit.**  Every access, allowed or not, is an entry of ``op.file_access``
(``principal``, ``action``, ``path``, ``outcome`` of ``ok``, ``missing``,
``denied`` or ``refused``, ``bytes``, and the ``grant`` that allowed it:
an id, ``own`` or ``human``), which the op's audit record keeps as
``file_access`` (at most :data:`MAX_RECORDED` entries, then a count).

**Limits per op** (:class:`~kernos.agents.limits.Limits`, per agent):
``file_read_bytes`` (the size of one file read), ``file_write_bytes`` (bytes
written and appended in the op, together) and ``file_writes`` (distinct files
written, appended to or deleted in the op).  A request over one is refused
before anything is written (:class:`FileLimitExceeded`).  The human has none.

**Wholeness.**  ``write`` writes a temporary file next to the target and
``os.replace``-s it into place, so the file is whole, old or new, at every
moment; a failed write (a full disk) leaves the old file and vetoes the op.
``append`` writes in place (copying a large log to add a line would cost what
the chunked store saves); the op's rollback puts a half-done append back.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import secrets
import stat
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos.agents import context
from kernos.agents.registry import HUMAN
from kernos.errors import CapabilityDenied, KernosError, PathRefused, UsageError
from kernos.files.paths import relative_path

if TYPE_CHECKING:
    from kernos.agents.context import Runtime
    from kernos.agents.limits import Limits
    from kernos.op import Op

__all__ = ["MAX_PATH", "MAX_RECORDED", "FileAccess", "FileLimitExceeded", "own_subtree"]

MAX_PATH = 1024
"""Characters in one path."""
MAX_RECORDED = 200
"""File accesses kept in one op's audit record; more are counted."""
MAX_LISTED = 100_000
"""Directory entries one ``list`` looks at before it asks for a narrower prefix."""
MAX_DENIALS_RECORDED = 20
TEMPORARY_PREFIX = ".kernos-write-"
"""The name a ``write`` gives its temporary file (``list`` never shows one)."""

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_QUERIES = frozenset({"exists", "list"})
"""Actions that ask whether something is there: a path under a file answers no."""


class FileLimitExceeded(UsageError):
    """A file request would pass one of the op's file limits."""

    def __init__(self, principal: str, limit: str, value: int, asked: int, what: str) -> None:
        super().__init__(
            f"{principal!r}: {what} would take {asked:,} past the limit {limit}={value:,} "
            f"of this op; nothing was written. The human raises it with "
            f"`agents.limits({principal!r}, {limit}=N)` (or `%kernos agent add NAME "
            f"{limit}=N` for a new agent)")
        self.limit = limit
        self.value = value
        self.asked = asked


@dataclass
class _Usage:
    bytes_written: int = 0
    files_written: set[str] = field(default_factory=set)


_USAGE: weakref.WeakKeyDictionary[Op, dict[str, _Usage]] = weakref.WeakKeyDictionary()


def own_subtree(principal: str) -> str:
    """The directory that is ``principal``'s own: ``agents/NAME`` (relative to the root)."""
    return f"agents/{principal}"


class FileAccess:
    """File operations of one principal under its grants, inside the running op."""

    def __init__(self, runtime: Runtime, principal: str, op: Op) -> None:
        """``principal`` (an agent's name, or ``human``) acting in ``op``, the running op
        of ``runtime``'s image.  An unknown agent raises UnknownAgent."""
        self.runtime = runtime
        self.principal = principal
        self.op = op
        self.human = principal == HUMAN
        self.limits: Limits = runtime.limits_for(principal)
        self.root: Path = runtime.image.files.root()

    # -- the operations ---------------------------------------------------------------

    def read(self, path: object, *, binary: bool = False) -> str | bytes:
        """The file's contents: ``bytes`` with ``binary``, else text decoded as UTF-8
        (``ValueError`` if it is not).  Needs a read grant; FileNotFoundError if absent."""
        if type(binary) is not bool:
            raise self._refused("read", "", UsageError("files.read: binary= is True or False"))
        rel = self._path(path, "read")
        grant = self._allow("read", rel, "read")
        with self._directory(rel, "read", grant, create=False) as (directory, name):
            info = self._existing(directory, name, rel, "read", grant)
            if info is None:
                raise self._missing("read", rel, grant)
            self._check_size(rel, info.st_size)
            data = self._read(directory, name, rel, info)
        self._record("read", rel, "ok", grant, size=len(data))
        if binary:
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{rel!r} is not UTF-8 text; read it with binary=True") from None

    def write(self, path: object, data: object) -> int:
        """Make the file hold ``data`` (``str``, stored as UTF-8, or ``bytes``), creating it
        and its directories if needed; returns the bytes written.  Needs a write grant."""
        rel = self._path(path, "write")
        payload = self._payload("write", rel, data)
        grant = self._allow("write", rel, "write")
        self._charge("write", rel, len(payload), grant)
        with self._directory(rel, "write", grant, create=True) as (directory, name):
            info = self._existing(directory, name, rel, "write", grant)
            temporary = f"{TEMPORARY_PREFIX}{secrets.token_hex(8)}"
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644, dir_fd=directory)
                try:
                    if info is not None:
                        os.fchmod(fd, stat.S_IMODE(info.st_mode))
                    _write_all(fd, payload)
                finally:
                    os.close(fd)
                os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
            except OSError as error:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=directory)
                raise self._failed("write", rel, grant, error) from None
        self._record("write", rel, "ok", grant, size=len(payload))
        return len(payload)

    def append(self, path: object, data: object) -> int:
        """Add ``data`` (``str`` or ``bytes``) at the end of the file, creating it if
        needed; returns the bytes written.  Needs a write grant."""
        rel = self._path(path, "append")
        payload = self._payload("append", rel, data)
        grant = self._allow("write", rel, "append")
        self._charge("append", rel, len(payload), grant)
        with self._directory(rel, "append", grant, create=True) as (directory, name):
            info = self._existing(directory, name, rel, "append", grant)
            try:
                fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                             | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=directory)
            except OSError as error:
                raise self._failed("append", rel, grant, error) from None
            try:
                opened = os.fstat(fd)
                if info is not None and not _same(info, opened):
                    raise self._refused("append", rel, PathRefused(
                        rel, "it changed while it was being opened"), grant)
                try:
                    _write_all(fd, payload)
                except OSError as error:
                    raise self._failed("append", rel, grant, error) from None
            finally:
                os.close(fd)
        self._record("append", rel, "ok", grant, size=len(payload))
        return len(payload)

    def list(self, prefix: object = "") -> list[str]:
        """Sorted paths (relative to the root) of the files under the directory ``prefix``
        (``""``: all) that this principal may read; no grant is needed to ask."""
        if type(prefix) is not str:
            raise self._refused("list", "", UsageError(
                f"files.list takes a prefix (a str), not {type(prefix).__name__}"))
        assert isinstance(prefix, str)
        rel = self._path(prefix, "list") if prefix.strip("/") else ""
        found: builtins.list[str] = []
        used: dict[str, str] = {}
        if rel:
            try:
                with self._directory(rel, "list", None, create=False) as (directory, name):
                    info = self._existing(directory, name, rel, "list", None,
                                          directory_ok=True)
                    top = (None if info is None or stat.S_ISREG(info.st_mode)
                           else os.open(name, _DIRECTORY, dir_fd=directory))
            except FileNotFoundError:
                return []
            if info is None:
                self._record("list", rel, "missing", None, size=0)
                return []
            if top is None:  # the prefix names a file: that file, if it may read it
                grant = self._may_read(rel)
                if grant is not None:
                    found.append(rel)
                    used[grant] = grant
        else:
            top = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if top is not None:
            self._walk(top, rel, found, used)
        registry = self.runtime.registry
        for grant_id in used:
            if grant_id in registry.grants:
                self.op.grants_used[grant_id] = registry.grants[grant_id].capability
        self._record("list", rel, "ok", None, size=len(found))
        return sorted(found)

    def _walk(self, top: int, rel: str, found: builtins.list[str],
              used: dict[str, str]) -> None:
        """Add the readable files under the directory ``top`` (which it closes) to ``found``."""
        stack = [(top, rel)]
        seen = 0
        try:
            while stack:
                directory, under = stack.pop()
                try:
                    with os.scandir(directory) as entries:
                        for entry in entries:
                            seen += 1
                            if seen > MAX_LISTED:
                                raise self._refused("list", rel, UsageError(
                                    f"files.list({rel!r}) looked at over {MAX_LISTED:,} "
                                    "entries; give a narrower prefix"))
                            path = f"{under}/{entry.name}" if under else entry.name
                            if not _listable(entry.name):
                                continue
                            if entry.is_dir(follow_symlinks=False):
                                with contextlib.suppress(OSError):
                                    stack.append((os.open(entry.name, _DIRECTORY,
                                                          dir_fd=directory), path))
                                continue
                            if not entry.is_file(follow_symlinks=False) or (
                                    not self.human
                                    and entry.stat(follow_symlinks=False).st_nlink > 1):
                                continue
                            grant = self._may_read(path)
                            if grant is not None:
                                found.append(path)
                                used[grant] = grant
                finally:
                    os.close(directory)
        finally:
            for directory, _ in stack:
                os.close(directory)

    def delete(self, path: object) -> None:
        """Remove the file.  Needs a write grant; FileNotFoundError if it is absent."""
        rel = self._path(path, "delete")
        grant = self._allow("write", rel, "delete")
        self._charge("delete", rel, 0, grant)
        with self._directory(rel, "delete", grant, create=False) as (directory, name):
            if self._existing(directory, name, rel, "delete", grant) is None:
                raise self._missing("delete", rel, grant)
            try:
                os.unlink(name, dir_fd=directory)
            except OSError as error:
                raise self._failed("delete", rel, grant, error) from None
        self._record("delete", rel, "ok", grant)

    def exists(self, path: object) -> bool:
        """Whether a file is at ``path`` (a directory is not a file).  Needs a read grant."""
        rel = self._path(path, "exists")
        grant = self._allow("read", rel, "exists")
        try:
            with self._directory(rel, "exists", grant, create=False) as (directory, name):
                info = self._existing(directory, name, rel, "exists", grant, directory_ok=True)
        except FileNotFoundError:
            return False  # recorded as missing
        found = info is not None and stat.S_ISREG(info.st_mode)
        self._record("exists", rel, "ok" if found else "missing", grant)
        return found

    # -- paths -----------------------------------------------------------------------

    def _path(self, path: object, action: str) -> str:
        if type(path) is not str:
            raise self._refused(action, "", UsageError(
                f"files.{action} takes a path (a str relative to the files root), not "
                f"{type(path).__name__}"))
        assert isinstance(path, str)
        shown = path[:200]
        if len(path) > MAX_PATH:
            raise self._refused(action, shown, PathRefused(
                shown, f"it is longer than {MAX_PATH} characters"))
        if "\0" not in path and os.path.isabs(path):
            raise self._refused(action, shown, PathRefused(
                shown, "it is absolute; give a path relative to the files root"))
        try:
            path.encode("utf-8")
            return relative_path(path, self.root)
        except UnicodeEncodeError:
            raise self._refused(action, shown.encode("utf-8", "backslashreplace").decode(),
                                PathRefused(repr(shown), "it is not valid UTF-8")) from None
        except PathRefused as error:
            raise self._refused(action, shown.replace("\0", "\\0"), error) from None

    @contextlib.contextmanager
    def _directory(self, rel: str, action: str, grant: str | None, *, create: bool) -> Any:
        """(descriptor of the file's directory, the file's name), links never followed."""
        *parents, name = rel.split("/")
        try:
            directory = self._open_directory(parents, rel, action, create=create)
        except NotADirectoryError:
            if action in _QUERIES:  # a question: a file in the way means nothing is there
                raise self._missing(action, rel, grant) from None
            raise self._refused(action, rel, PathRefused(
                rel, "one of its directories is a file"), grant) from None
        except FileNotFoundError:
            raise self._missing(action, rel, grant) from None
        try:
            yield directory, name
        finally:
            os.close(directory)

    def _open_directory(self, parts: builtins.list[str], rel: str, action: str, *,
                        create: bool) -> int:
        """A descriptor of root/parts, each component opened without following links."""
        directory = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts:
                try:
                    child = os.open(part, _DIRECTORY, dir_fd=directory)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=directory)
                    child = os.open(part, _DIRECTORY, dir_fd=directory)
                except OSError as error:  # ELOOP (a link), ENOTDIR (a file), EACCES...
                    info = os.stat(part, dir_fd=directory, follow_symlinks=False)
                    if stat.S_ISLNK(info.st_mode):
                        raise self._refused(action, rel, PathRefused(
                            rel, f"it goes through a symbolic link ({part!r})")) from None
                    if stat.S_ISDIR(info.st_mode):
                        raise self._refused(action, rel, PathRefused(
                            rel, f"its directory {part!r} cannot be opened "
                                 f"({error.strerror})")) from None
                    raise NotADirectoryError(rel) from None
                os.close(directory)
                directory = child
        except BaseException:
            os.close(directory)
            raise
        return directory

    def _existing(self, directory: int, name: str, rel: str, action: str, grant: str | None,
                  *, directory_ok: bool = False) -> os.stat_result | None:
        """The file's own stat (never a link's target), None if absent; refused if it is
        not a regular file with one link."""
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            return None
        mode = info.st_mode
        if stat.S_ISREG(mode):
            if info.st_nlink > 1 and not self.human:
                raise self._refused(action, rel, PathRefused(
                    rel, f"it has {info.st_nlink} hard links (another may be outside the "
                         "files root)"), grant)
            return info
        if stat.S_ISDIR(mode) and directory_ok:
            return info
        kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
                else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device")
        raise self._refused(action, rel, PathRefused(rel, f"it is {kind}, not a file"), grant)

    def _read(self, directory: int, name: str, rel: str, before: os.stat_result) -> bytes:
        try:
            fd = os.open(name, _READ, dir_fd=directory)
        except OSError as error:
            raise self._failed("read", rel, None, error) from None
        try:
            if not _same(before, os.fstat(fd)):
                raise self._refused("read", rel, PathRefused(
                    rel, "it changed while it was being opened"))
            chunks: builtins.list[bytes] = []
            size = 0
            while True:
                try:
                    chunk = os.read(fd, 1 << 20)
                except OSError as error:
                    raise self._failed("read", rel, None, error) from None
                if not chunk:
                    return b"".join(chunks)
                size += len(chunk)
                self._check_size(rel, size)
                chunks.append(chunk)
        finally:
            os.close(fd)

    # -- grants, limits ------------------------------------------------------------------

    def _may_read(self, rel: str) -> str | None:
        if self.human:
            return "human"
        if _inside(rel, own_subtree(self.principal)):
            return "own"
        grant = self.runtime.registry.find(self.principal, "file:read", rel)
        return None if grant is None else grant.id

    def _allow(self, access: str, rel: str, action: str) -> str:
        """The grant that lets this principal ``access`` (read, write) ``rel``: its id,
        ``own`` or ``human``; a denial (which vetoes the op) if there is none."""
        if self.human:
            return "human"
        if _inside(rel, own_subtree(self.principal)):
            return "own"
        grant = self.runtime.registry.find(self.principal, f"file:{access}", rel)
        if grant is None:
            self._record(action, rel, "denied", None)
            raise self._deny(f"file:{access}:{rel}", (
                f"no file:{access} grant covers {rel!r}; its own files are under "
                f"{own_subtree(self.principal)}/, and the human grants more with "
                f"`%kernos grant {self.principal} file:{access}:GLOB`"))
        self.op.grants_used[grant.id] = grant.capability
        return grant.id

    def _charge(self, action: str, rel: str, size: int, grant: str) -> None:
        """Count ``size`` bytes and the file ``rel`` against the op's limits, or refuse."""
        if self.human:
            return
        usage = _USAGE.setdefault(self.op, {}).setdefault(self.principal, _Usage())
        limits = self.limits
        if usage.bytes_written + size > limits.file_write_bytes:
            raise self._refused(action, rel, FileLimitExceeded(
                self.principal, "file_write_bytes", limits.file_write_bytes,
                usage.bytes_written + size, f"writing {size:,} bytes to {rel!r}"), grant)
        if rel not in usage.files_written and len(usage.files_written) >= limits.file_writes:
            raise self._refused(action, rel, FileLimitExceeded(
                self.principal, "file_writes", limits.file_writes,
                len(usage.files_written) + 1, f"changing {rel!r}"), grant)
        usage.bytes_written += size
        usage.files_written.add(rel)

    def _check_size(self, rel: str, size: int) -> None:
        if not self.human and size > self.limits.file_read_bytes:
            raise self._refused("read", rel, FileLimitExceeded(
                self.principal, "file_read_bytes", self.limits.file_read_bytes, size,
                f"reading {rel!r}"))

    def _payload(self, action: str, rel: str, data: object) -> bytes:
        if type(data) is bytes:
            assert isinstance(data, bytes)
            return data
        if type(data) is str:
            assert isinstance(data, str)
            try:
                return data.encode("utf-8")
            except UnicodeEncodeError:
                raise self._refused(action, rel, UsageError(
                    f"files.{action}({rel!r}): the text is not valid Unicode (a lone "
                    "surrogate); give bytes or valid text")) from None
        raise self._refused(action, rel, UsageError(
            f"files.{action}({rel!r}) takes str or bytes data, not {type(data).__name__}"))

    # -- refusals and the audit ----------------------------------------------------------

    def _deny(self, capability: str, detail: str) -> CapabilityDenied:
        ctx = context.running()
        if ctx is not None and ctx.op is self.op and ctx.principal == self.principal:
            return self.runtime.deny(ctx, capability, detail)  # counted with the run's
        capability, detail = capability[:120], detail[:300]
        if len(self.op.denied) < MAX_DENIALS_RECORDED:
            self.op.denied.append({"principal": self.principal, "capability": capability,
                                   "detail": detail})
        self.op.veto(f"{self.principal!r} was denied {capability!r}", status="denied")
        return CapabilityDenied(self.principal, capability, detail=detail)

    def _refused(self, action: str, rel: str, error: KernosError,
                 grant: str | None = None) -> KernosError:
        """Record a refused request, veto the op, and return ``error`` to raise.

        An agent's refused request is a denial too (as a malformed request to any other
        call is), recorded in ``op.denied``."""
        self._record(action, rel, "refused", grant, detail=str(error)[:300])
        if self.human:
            self.op.veto(f"files.{action} refused: {str(error)[:200]}")
        else:
            self._deny(f"files.{action}", str(error))
        return error

    def _failed(self, action: str, rel: str, grant: str | None,
                error: OSError) -> KernosError:
        return self._refused(action, rel, UsageError(
            f"files.{action}({rel!r}) failed: {error.strerror or error}; nothing of it is "
            "kept (the op rolls back)"), grant)

    def _missing(self, action: str, rel: str, grant: str | None) -> FileNotFoundError:
        self._record(action, rel, "missing", grant)
        return FileNotFoundError(f"there is no file {rel!r} in the files root")

    def _record(self, action: str, rel: str, outcome: str, grant: str | None, *,
                size: int | None = None, detail: str | None = None) -> None:
        entry: dict[str, Any] = {"principal": self.principal, "action": action,
                                 "path": rel[:300], "outcome": outcome}
        if grant is not None:
            entry["grant"] = grant
        if size is not None:
            entry["bytes" if action != "list" else "files"] = size
        if detail is not None:
            entry["detail"] = detail
        journal = self.op.file_access
        if len(journal) < MAX_RECORDED:
            journal.append(entry)
        elif "more" in journal[-1]:
            journal[-1]["more"] += 1
        else:
            journal.append({"more": 1})


def _inside(rel: str, directory: str) -> bool:
    return rel.startswith(directory + "/")


def _same(before: os.stat_result, after: os.stat_result) -> bool:
    return (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino) and stat.S_ISREG(
        after.st_mode)


def _listable(name: str) -> bool:
    if name.startswith(TEMPORARY_PREFIX):
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
