"""The MCP file tools: ``kernos-files-read``, ``-list``, ``-exists``, ``-write``, ``-append``,
``-delete``, as the server's principal.

Each sends the harness request of the same name (``files_read``, ...; see
``kernos.harness.file_requests``) with the server's principal, never one
the MCP client chose: the kernel checks the principal's ``file:read:GLOB`` /
``file:write:GLOB`` grants, runs the request as one op of it, and refuses a
bad path, a denial or a missing file with an error that this server passes
on (``denied``, ``invalid``, ``unknown_file``).  The arguments were checked
against the tool's schema (``kernos.mcp.tools``) before a handler runs.

A handler answers the text for the model and the structured content (the
kernel's result); :class:`~kernos.mcp.server.KernosMCP` wraps them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["FILE_TOOLS", "FileHarness", "FileTool"]


class FileHarness(Protocol):
    """The part of the harness client the file tools use."""

    async def request(self, action: str, **fields: Any) -> dict[str, Any]: ...


FileTool = Callable[[FileHarness, str, dict[str, Any]], Awaitable[tuple[str, dict[str, Any]]]]
"""``(harness, principal, checked arguments) -> (text, structured content)``."""


def _where(result: dict[str, Any]) -> str:
    return f"op {result.get('op')}, commit {str(result.get('commit'))[:12]}"


async def _read(harness: FileHarness, principal: str,
                arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    result = await harness.request("files_read", path=arguments["path"], principal=principal,
                                   encoding=arguments.get("encoding", "utf-8"))
    if result.get("encoding") == "base64":
        return (f"{result.get('path')}: {result.get('bytes')} bytes, base64-encoded:\n"
                f"{result.get('data')}", result)
    return str(result.get("data")), result


async def _list(harness: FileHarness, principal: str,
                arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    prefix = arguments.get("prefix") or None
    result = await harness.request("files_list", prefix=prefix, principal=principal,
                                   limit=arguments.get("limit"))
    paths = [str(path) for path in result.get("paths") or []]
    total = result.get("total", len(paths))
    if not paths:
        return (f"no files that {principal!r} may read" +
                (f" start with {prefix!r}" if prefix else "")), result
    text = "\n".join(paths)
    if total != len(paths):
        text += f"\n({len(paths)} of {total} shown: raise 'limit' or narrow 'prefix')"
    return text, result


async def _exists(harness: FileHarness, principal: str,
                  arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    result = await harness.request("files_exists", path=arguments["path"], principal=principal)
    path = result.get("path")
    return (f"{path} exists" if result.get("exists") else f"there is no file {path}"), result


def _put(action: str, verb: str, participle: str) -> FileTool:
    async def put(harness: FileHarness, principal: str,
                  arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        result = await harness.request(action, path=arguments["path"], data=arguments["data"],
                                       encoding=arguments.get("encoding", "utf-8"),
                                       key=arguments.get("key"), principal=principal)
        if result.get("duplicate"):
            return (f"a duplicate: an op with this key had already committed "
                    f"({_where(result)}), so nothing was {participle} again"), result
        return (f"{verb} {result.get('bytes')} bytes to {result.get('path')} as {principal} "
                f"({_where(result)})"), result
    return put


async def _delete(harness: FileHarness, principal: str,
                  arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    result = await harness.request("files_delete", path=arguments["path"],
                                   key=arguments.get("key"), principal=principal)
    if result.get("duplicate"):
        return (f"a duplicate: an op with this key had already committed ({_where(result)}), "
                "so nothing was deleted again"), result
    return f"deleted {result.get('path')} as {principal} ({_where(result)})", result


FILE_TOOLS: dict[str, FileTool] = {
    "kernos-files-read": _read,
    "kernos-files-list": _list,
    "kernos-files-exists": _exists,
    "kernos-files-write": _put("files_write", "wrote", "written"),
    "kernos-files-append": _put("files_append", "appended", "appended"),
    "kernos-files-delete": _delete,
}
"""The file tools' handlers, by MCP tool name."""
