"""The harness requests on files: the files root, under the principal's grants.

:class:`FileRequests` carries out ``files_read``, ``files_exists``,
``files_list``, ``files_write``, ``files_append`` and ``files_delete``
through :class:`kernos.agents.files.FileAccess`, the same checks agent code
gets: paths relative to the workspace's files root (``kernos.files.root()``;
``..``, absolute paths and NUL bytes are refused), ``file:read:GLOB`` and
``file:write:GLOB`` grants (an agent's own ``agents/NAME/`` subtree needs
none; the human may do anything), per-op limits, an audit record.

Every file request is one op of its principal, the reads too.  A read must
be checked and audited like a write, and the audit log records ops: a read
commits as an op that changed nothing (an audit record, which lists the
grants it used, and no snapshot of its own; ``commit`` is then the head's).
An agent's op passes its circuit first (``runtime.breakers.admit``), as every
op of an agent does.  A write, append or delete commits its file change in
its op's snapshot; the reply carries ``op``, ``commit`` and ``files`` (the
paths the op ``added``, ``changed`` or ``deleted``, as in ``kernos log``).

Refusals.  Every field is checked before the op begins (types, lengths, the
``encoding``, base64 that does not decode); such a request is refused
(``malformed``) and recorded as a rejected request.  Inside the op, a denial
(no grant), a bad path (``invalid``), a missing file (``unknown_file``) or a
breached limit (``oversized``) rolls the op back (nothing is written, the
audit record says why) and answers an error reply of that kind.

Data over JSON.  ``data`` is text: with ``encoding: "utf-8"`` (the default)
it is the text to write, stored as UTF-8; with ``"base64"`` it is any bytes,
base64-encoded (RFC 4648, with padding; whitespace or other characters are
refused).  ``files_read`` answers in the ``encoding`` asked for: a file that
is not UTF-8 text, read as ``utf-8``, is refused (``invalid``) and says to ask
for ``base64``.  A request is at most ``max_request_bytes`` (4 MiB by
default), so one write carries at most about 3 MiB of base64-encoded bytes:
append a longer file in parts (one op each; give each a ``key``).  A read
answers at most :data:`MAX_READ_BYTES`.

Idempotency.  A write, append or delete may carry a ``key``, as an ``op``
may: when a committed op already carries it, nothing runs and the answer is
that op's, with ``duplicate: true`` (an append resent after a lost reply is
not appended twice).

What the audit record's source holds: the action, the path, and for a write
or an append the size and SHA-256 of the bytes, never the bytes themselves
(the file's contents are in the snapshot, where erasure can reach them).
Replay: ``kernos replay`` therefore does not send these ops again: it takes
each op's changes to the files root from the original's snapshot of that op,
as an op of the same principal, kind and source, and compares its snapshot
as every op's (:mod:`kernos.replay._taken`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos.agents.files import FileAccess, FileLimitExceeded
from kernos.agents.limits import LimitExceeded
from kernos.agents.supervisor import fingerprint
from kernos.errors import KernosError
from kernos.files.paths import relative_path
from kernos.harness.protocol import ProtocolError, Request
from kernos.harness.serving import Handled, ServiceBase

if TYPE_CHECKING:
    from kernos.op import CommitReport

__all__ = ["DEFAULT_LIST_LIMIT", "MAX_READ_BYTES", "FileRequests"]

MAX_READ_BYTES = 16 * 1024 * 1024
"""The most bytes one ``files_read`` answers (before base64); a longer file is refused."""
DEFAULT_LIST_LIMIT = 10_000
"""The most paths ``files_list`` answers when no ``limit`` is given (``total`` counts all)."""

_Body = Callable[[FileAccess], dict[str, Any]]


class FileRequests(ServiceBase):
    """The file requests, each one op of its principal through ``FileAccess``."""

    # -- reads: ops that change nothing -------------------------------------------------

    def _files_read(self, request: Request) -> Handled:
        path: str = request.get("path")
        encoding: str = request.get("encoding", "utf-8")

        def body(files: FileAccess) -> dict[str, Any]:
            # The human has no read limit: look at the size first, not after reading 1 GB.
            # (Not for an agent: it would learn the size of a file it may not read; its
            # file_read_bytes limit stops its read early.)
            size = _size_on_disk(files.root, path) if files.human else None
            data = b""
            if size is None or size <= MAX_READ_BYTES:
                read = files.read(path, binary=True)
                assert isinstance(read, bytes)
                data, size = read, len(read)
            if size > MAX_READ_BYTES:
                raise ProtocolError(
                    "oversized", f"files_read: {path[:200]!r} holds {size:,} bytes, over "
                    f"the {MAX_READ_BYTES:,} one reply carries; read it from a short op "
                    "instead", {"bytes": size, "limit": MAX_READ_BYTES})
            return {"path": path, "encoding": encoding, "data": _encode(path, data, encoding),
                    "bytes": len(data)}

        return self._file_op(request, "read", path, body)

    def _files_exists(self, request: Request) -> Handled:
        path: str = request.get("path")
        return self._file_op(request, "exists", path, lambda files: {
            "path": path, "exists": files.exists(path)})

    def _files_list(self, request: Request) -> Handled:
        prefix: str = request.get("prefix", "")
        limit: int = request.get("limit", DEFAULT_LIST_LIMIT)

        def body(files: FileAccess) -> dict[str, Any]:
            paths = sorted(files.list(prefix))
            return {"prefix": prefix, "paths": paths[:limit], "total": len(paths)}

        return self._file_op(request, "list", prefix, body)

    # -- changes ----------------------------------------------------------------------

    def _files_write(self, request: Request) -> Handled:
        return self._files_put(request, "write")

    def _files_append(self, request: Request) -> Handled:
        return self._files_put(request, "append")

    def _files_put(self, request: Request, verb: str) -> Handled:
        path: str = request.get("path")
        data = _decode(request.action, request.get("data"), request.get("encoding", "utf-8"))
        digest = hashlib.sha256(data).hexdigest()

        def body(files: FileAccess) -> dict[str, Any]:
            put = files.write if verb == "write" else files.append
            return {"path": path, "bytes": put(path, data)}

        return self._file_op(request, verb, path, body,
                             recorded={"bytes": len(data), "sha256": digest})

    def _files_delete(self, request: Request) -> Handled:
        path: str = request.get("path")

        def body(files: FileAccess) -> dict[str, Any]:
            files.delete(path)
            return {"path": path, "deleted": True}

        return self._file_op(request, "delete", path, body)

    # -- one file request, one op ---------------------------------------------------------

    def _file_op(self, request: Request, verb: str, path: str, body: _Body, *,
                 recorded: dict[str, Any] | None = None) -> Handled:
        """Run ``body`` as one op of the request's principal, with its FileAccess."""
        principal = self._principal(request.get("principal"))
        key: str | None = request.get("key")
        if key is not None:
            earlier = self.image.audit.committed_with_key(key)
            if earlier is not None:  # a redelivery: answer it, run nothing, record nothing
                return self._ok(request, {"path": path, "op": earlier.get("op"),
                                          "commit": earlier.get("commit"),
                                          "duplicate": True})
        what = {"action": request.action, "path": path, **(recorded or {})}
        changes = request.action not in ("files_read", "files_exists", "files_list")
        return self._principal_op(
            request, principal=principal, source=json.dumps(what, sort_keys=True),
            note=f"files {verb} {path[:80]} ({principal})",
            body=lambda op: body(FileAccess(self.runtime, principal, op)),
            same=lambda: fingerprint(request.action, path, recorded), key=key,
            refusal=lambda error: _refusal(request.action, path, error),
            reported=_file_changes if changes else None)


def _file_changes(report: CommitReport) -> dict[str, Any]:
    return {"files": {change: list(report.files.get(change, []))
                      for change in ("added", "changed", "deleted")}}


def _refusal(action: str, path: str, error: BaseException) -> ProtocolError | None:
    """How a file op's failure is answered (its op rolled back already); None: as it is."""
    shown = {"path": path[:200]}
    if isinstance(error, FileLimitExceeded):
        return ProtocolError("oversized", str(error)[:2000], {
            "type": "FileLimitExceeded", "limit": error.limit, "value": error.value,
            "asked": error.asked})
    if isinstance(error, KernosError):
        return None  # a denial, a refused path: the kernel's own answer says what it was
    if isinstance(error, FileNotFoundError):
        return ProtocolError("unknown_file", f"{action}: there is no file {path[:200]!r} in "
                             "the files root; list them with files_list", shown)
    if isinstance(error, (IsADirectoryError, NotADirectoryError)):
        return ProtocolError("invalid", f"{action}: {path[:200]!r}: {error.strerror or error}; "
                             "name a file, not a directory", shown)
    if isinstance(error, OSError):
        return ProtocolError("workspace", f"{action} {path[:200]!r} failed on the kernel's "
                             f"disk: {error}; nothing was changed", shown)
    if isinstance(error, LimitExceeded):
        return ProtocolError("oversized", f"{action}: {error}; nothing was changed", shown)
    if isinstance(error, Exception):  # a bug, here or below: the op rolled back; answer
        return ProtocolError(
            "internal", f"{action}: an internal error in Kernos ({type(error).__name__}: "
            f"{str(error)[:500]}); the op rolled back and nothing was changed. Please report "
            "it.", {"type": type(error).__name__})
    return None


def _size_on_disk(root: Path, path: str) -> int | None:
    """The size of the file ``path`` names under ``root``; None when that cannot be told
    (FileAccess then reads, or refuses, it)."""
    try:
        return os.stat(root / relative_path(path, root), follow_symlinks=False).st_size
    except (OSError, KernosError):
        return None


def _decode(action: str, data: str, encoding: str) -> bytes:
    """The bytes ``data`` stands for, checked before anything runs."""
    if encoding == "utf-8":
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (JSON "\\ud800")
            raise ProtocolError("malformed", f"{action}: 'data' is not valid text (it holds "
                                "a lone surrogate); send bytes as base64 with "
                                "\"encoding\": \"base64\"") from None
    try:
        return base64.b64decode(data.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError) as error:
        raise ProtocolError("malformed", f"{action}: 'data' is not base64 ({error}); encode "
                            "the bytes with base64 (RFC 4648, with '=' padding, no line "
                            "breaks), or send text with \"encoding\": \"utf-8\"") from None


def _encode(path: str, data: bytes, encoding: str) -> str:
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ProtocolError("invalid", f"files_read: {path[:200]!r} is not UTF-8 text (byte "
                            f"{error.start} is {data[error.start]:#04x}); ask for it with "
                            "\"encoding\": \"base64\"", {"path": path[:200]}) from None
