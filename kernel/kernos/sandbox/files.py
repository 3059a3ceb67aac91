"""``sandbox.files``: the workspace's files root, as E2B's ``Filesystem``.

Every call is one file request of the harness protocol (``read_file``,
``write_file``, ``list_files``, ``delete_file``, ``file_exists`` of
:class:`~kernos.client.AsyncKernosClient`), made as the sandbox's principal,
so it is one op: checked against that principal's ``file:`` grants, audited,
and (for a write or a removal) committed in the history, where it rolls back
and travels with the workspace like any other change.

Paths.  There is one tree, the workspace's files root; there is no
``/home/user``.  A path that starts with ``/`` is taken from the files root
(``/reports/r.md`` is ``reports/r.md``); any other path is taken from the
sandbox's working directory, :attr:`AsyncFilesystem.cwd`: ``agents/NAME/``
for an agent principal (its own subtree, which needs no grant) and the root
itself for the human.  So ``files.write("data.csv", ...)`` always works, and
an agent's code reads the same file as ``files.read("agents/NAME/data.csv")``
(agent code's ``files`` takes paths from the root).  A path with ``..`` or a
NUL byte is refused (:class:`~kernos.sandbox.errors.InvalidArgumentException`),
a missing file is :class:`~kernos.sandbox.errors.NotFoundException`, a path
outside the principal's grants
:class:`~kernos.sandbox.errors.PermissionDeniedException`.

Kernos keeps files, not directories: :meth:`AsyncFilesystem.list` shows a
directory for each path prefix under the one listed, ``exists`` is true for a
directory that holds a file, and ``remove`` of a directory removes the files
under it (one op each).  ``make_dir``, ``rename`` and ``watch_dir`` are not
provided (a rename would be three ops, not one).
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, TypeVar, overload

from kernos.client import AsyncKernosClient, KernelDied, RequestError
from kernos.sandbox.errors import (
    InvalidArgumentException,
    NotFoundException,
    PermissionDeniedException,
    SandboxDied,
    SandboxException,
)

__all__ = ["AsyncFilesystem", "EntryInfo", "FileType", "Filesystem", "WriteInfo"]

Returned = TypeVar("Returned")


class FileType(Enum):
    FILE = "file"
    DIR = "dir"


@dataclass
class WriteInfo:
    """A file written: its name, type and path (``/``-rooted: the files root)."""

    name: str
    type: FileType | None
    path: str


@dataclass
class EntryInfo(WriteInfo):
    """One entry of :meth:`AsyncFilesystem.list`."""


class AsyncFilesystem:
    """The files of one sandbox (see the module docstring)."""

    def __init__(self, client: Callable[[], AsyncKernosClient], principal: str,
                 cwd: str) -> None:
        self._client = client
        self.principal = principal
        self.cwd = cwd
        """The working directory relative paths start from (``""``: the files root)."""

    def resolve(self, path: str) -> str:
        """``path`` relative to the files root (see the module docstring)."""
        if not isinstance(path, str):
            raise InvalidArgumentException(f"a path is a str, not {type(path).__name__}")
        if path.startswith("/"):
            joined = path.lstrip("/")
        else:
            joined = f"{self.cwd}/{path}" if self.cwd else path
        parts = [part for part in joined.split("/") if part not in ("", ".")]
        return "/".join(parts)

    @overload
    async def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    async def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    async def read(self, path: str, format: Literal["text", "bytes"] = "text") -> str | bytes:
        """The file's content: text (UTF-8) or, with ``format="bytes"``, bytes."""
        if format not in ("text", "bytes"):
            raise InvalidArgumentException(f"files.read: format is 'text' or 'bytes', not "
                                           f"{format!r} (streams are not provided)")
        target = self.resolve(path)
        if format == "bytes":
            return await self._call(path, self._client().read_file(
                target, principal=self.principal, binary=True))
        return await self._call(path, self._client().read_file(target,
                                                               principal=self.principal))

    async def write(self, path: str, data: str | bytes) -> WriteInfo:
        """Write ``data`` (text as UTF-8, or bytes) to ``path``, as one op."""
        if not isinstance(data, (str, bytes, bytearray, memoryview)):
            raise InvalidArgumentException(
                f"files.write: data is str or bytes, not {type(data).__name__} (read a "
                "file-like object first; streams are not provided)")
        target = self.resolve(path)
        payload = data if isinstance(data, str) else bytes(data)
        await self._call(path, self._client().write_file(target, payload,
                                                         principal=self.principal))
        return WriteInfo(name=target.rsplit("/", 1)[-1], type=FileType.FILE,
                         path="/" + target)

    async def write_files(self, files: Iterable[Mapping[str, Any]]) -> builtins.list[WriteInfo]:
        """Write each ``{"path": ..., "data": ...}``, one op each, in order."""
        return [await self.write(str(entry["path"]), entry["data"]) for entry in files]

    async def list(self, path: str = "", depth: int | None = 1) -> builtins.list[EntryInfo]:
        """The files and directories under ``path``, ``depth`` levels deep (None: all)."""
        if depth is not None and depth < 1:
            raise InvalidArgumentException("files.list: depth is at least 1 (or None)")
        base = self.resolve(path)
        prefix = f"{base}/" if base else ""
        paths = await self._call(path, self._client().list_files(prefix,
                                                                 principal=self.principal))
        entries: dict[str, EntryInfo] = {}
        for found in paths:
            if not found.startswith(prefix):
                continue
            parts = found[len(prefix):].split("/")
            for level in range(1, len(parts) + 1):
                if depth is not None and level > depth:
                    break
                relative = "/".join(parts[:level])
                kind = FileType.FILE if level == len(parts) else FileType.DIR
                entries.setdefault(relative, EntryInfo(name=parts[level - 1], type=kind,
                                                       path="/" + prefix + relative))
        return [entries[name] for name in sorted(entries)]

    async def exists(self, path: str) -> bool:
        """Whether a file, or a directory holding one, is at ``path``."""
        target = self.resolve(path)
        if not target:
            return True
        if await self._call(path, self._client().file_exists(target,
                                                             principal=self.principal)):
            return True
        under = await self._call(path, self._client().list_files(
            target + "/", principal=self.principal, limit=1))
        return bool(under)

    async def remove(self, path: str) -> None:
        """Remove the file at ``path`` (or every file under the directory ``path``)."""
        target = self.resolve(path)
        client = self._client()
        if target:
            is_file: bool = await self._call(path, client.file_exists(
                target, principal=self.principal))
            if is_file:
                await self._call(path, client.delete_file(target, principal=self.principal))
                return
        prefix = f"{target}/" if target else ""
        for found in await self._call(path, client.list_files(prefix,
                                                              principal=self.principal)):
            await self._call(found, client.delete_file(found, principal=self.principal))

    async def _call(self, path: str, request: Awaitable[Returned]) -> Returned:
        """``request``'s answer; a refusal as E2B's exception, naming ``path``."""
        try:
            return await request
        except KernelDied as died:
            raise SandboxDied(f"the sandbox's kernel died ({died}); make a new sandbox on "
                              "the same workspace to go on") from None
        except RequestError as error:
            message = f"{path!r}: {error.message}"
            if error.kind == "unknown_file":
                raise NotFoundException(message) from None
            if error.kind == "denied":
                raise PermissionDeniedException(
                    f"{message} (the sandbox runs as {self.principal!r}; grant it "
                    "file:read:GLOB or file:write:GLOB, or use paths under its working "
                    f"directory {self.cwd or '/'!r})") from None
            if error.kind in ("invalid", "malformed", "oversized"):
                raise InvalidArgumentException(message) from None
            raise SandboxException(message) from error


class Filesystem:
    """The blocking form of :class:`AsyncFilesystem` (``Sandbox.files``)."""

    def __init__(self, files: AsyncFilesystem,
                 run: Callable[[Awaitable[Any]], Any]) -> None:
        self._files = files
        self._run = run

    @property
    def cwd(self) -> str:
        return self._files.cwd

    def resolve(self, path: str) -> str:
        return self._files.resolve(path)

    @overload
    def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    def read(self, path: str, format: Literal["text", "bytes"] = "text") -> str | bytes:
        result: str | bytes = self._run(self._files.read(path, format))
        return result

    def write(self, path: str, data: str | bytes) -> WriteInfo:
        result: WriteInfo = self._run(self._files.write(path, data))
        return result

    def write_files(self, files: Iterable[Mapping[str, Any]]) -> builtins.list[WriteInfo]:
        result: builtins.list[WriteInfo] = self._run(self._files.write_files(files))
        return result

    def list(self, path: str = "", depth: int | None = 1) -> builtins.list[EntryInfo]:
        result: builtins.list[EntryInfo] = self._run(self._files.list(path, depth))
        return result

    def exists(self, path: str) -> bool:
        return bool(self._run(self._files.exists(path)))

    def remove(self, path: str) -> None:
        self._run(self._files.remove(path))
