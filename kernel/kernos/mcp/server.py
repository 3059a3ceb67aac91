"""The MCP face of one Kernos workspace, as one principal fixed when the server starts.

:class:`KernosMCP` answers MCP requests by sending harness requests
(``kernos.harness.protocol``) through a client (``kernos.client``).  It holds
no state of the image: every listing asks the kernel, so grants, tools and
objects are always current.

What a client of this server can do is bounded by the principal's grants, as
the kernel enforces them; on top of that, this server

- never lets a tool choose the principal: every request names the one it was
  started with;
- offers no grant, revoke or add-agent tool;
- offers the history (log, show, diff) and checkout only to ``human``, because
  they show every name and every op's code, beyond what an agent may read; an
  agent's events are those its own ops emitted;
- lets only ``human`` start, pause, resume or stop a loop (``kernos-loop``), as
  the harness ``loop`` action does (only the human changes a loop); an agent
  reads its own loop's status, no other;
- offers the files root (``kernos-files-*``, ``kernos.mcp.files``) as the principal,
  under its ``file:`` grants, which the kernel checks;
- offers a registry tool only when the kernel lists it for the principal, and
  refuses (without sending anything) a call of one it does not list;
- checks every call's arguments against the tool's schema before anything is
  sent, so a bad call changes nothing.
"""

from __future__ import annotations

import functools
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, Protocol

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from kernos._version import __version__
from kernos.client.errors import ClientError, KernelDied, RequestError
from kernos.harness.results import ObjectInfo, OpResult
from kernos.mcp.arguments import BadArguments, check_arguments
from kernos.mcp.constants import HUMAN
from kernos.mcp.files import FILE_TOOLS, FileTool
from kernos.mcp.tools import BUILTINS, PREFIX, Builtin

__all__ = ["OBJECT_URI", "Harness", "KernosMCP", "object_uri", "render_op"]

OBJECT_URI = "kernos://objects/"
"""Resources: ``kernos://objects/{name}``, the name percent-encoded."""

_RESOURCE_PAGE = 500
_DEFAULT_OBJECTS = 100
_DEFAULT_LOG = 20
_DEFAULT_EVENTS = 100
_TEXT_LIMIT = 20_000

logger = logging.getLogger(__name__)


class Harness(Protocol):
    """The part of ``kernos.client.AsyncKernosClient`` this server uses."""

    async def hello(self) -> dict[str, Any]: ...

    async def op(self, code: str | None = None, *, principal: str = ...,
                 tool: str | None = None, arguments: dict[str, Any] | None = None,
                 key: str | None = None, expect_versions: dict[str, int] | None = None,
                 predicate: str | None = None) -> OpResult: ...

    async def objects(self, *, principal: str | None = None, prefix: str | None = None,
                      limit: int | None = None, offset: int | None = None
                      ) -> list[ObjectInfo]: ...

    async def object(self, name: str, *, principal: str | None = None,
                     preview_bytes: int | None = None) -> ObjectInfo: ...

    async def tools(self, principal: str | None = None) -> list[dict[str, Any]]: ...

    async def log(self, limit: int | None = None, *,
                  principal: str | None = None) -> list[dict[str, Any]]: ...

    async def show(self, ref: str = ...) -> dict[str, Any]: ...

    async def diff(self, a: str, b: str | None = None) -> dict[str, Any]: ...

    async def checkout(self, ref: str) -> OpResult: ...

    async def events(self, *, since: int | None = None, op: int | None = None,
                     topic: str | None = None, principal: str | None = None,
                     limit: int | None = None) -> tuple[list[dict[str, Any]], int]: ...

    async def refused(self, *, principal: str, via: str, what: str,
                      problem: str) -> dict[str, Any]: ...

    async def recall(self, query: str, *, principal: str | None = None, k: int | None = None,
                     kinds: list[str] | None = None) -> list[dict[str, Any]]: ...

    async def remember(self, fact: str, *, principal: str | None = None,
                       tags: list[str] | None = None) -> dict[str, Any]: ...

    async def request(self, action: str, **fields: Any) -> dict[str, Any]: ...


def object_uri(name: str) -> str:
    return OBJECT_URI + urllib.parse.quote(name, safe=":")


def object_json(info: ObjectInfo) -> dict[str, Any]:
    """An ObjectInfo as the protocol's OBJECT (``preview`` as ``{"repr", "json"?}``)."""
    out = asdict(info)
    out["preview"] = None if info.preview is None else info.preview.to_json()
    if info.preview is None:
        del out["preview"]
    return out


def _bounded(text: str) -> str:
    if len(text) <= _TEXT_LIMIT:
        return text
    return text[:_TEXT_LIMIT] + f"\n... ({len(text) - _TEXT_LIMIT} more characters)"


def _result(text: str, structured: dict[str, Any], *, error: bool = False
            ) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=_bounded(text))],
                                structured_content=structured, is_error=error)


def refusal(kind: str, message: str, data: dict[str, Any] | None = None
            ) -> types.CallToolResult:
    """An error result: the message for the model, and the same facts as structured content."""
    return _result(message, {"error": {"kind": kind, "message": message, "data": data or {}}},
                   error=True)


def render_op(result: OpResult) -> str:
    """An OpResult as a few readable lines."""
    lines: list[str] = []
    if result.committed:
        commit = (result.commit or "")[:12]
        lines.append(f"committed as op {result.op} (commit {commit}), as {result.principal}")
        if result.duplicate:
            lines.append("a duplicate: an op with this idempotency key had already committed, "
                         "so nothing ran again")
        changes = [f"{label}: {', '.join(names)}" for label, names in (
            ("added", result.added), ("changed", result.changed),
            ("deleted", result.deleted)) if names]
        if changes:
            lines.append("; ".join(changes))
        elif not result.duplicate:
            lines.append("no names changed")
    else:
        where = f" (op {result.op})" if result.op is not None else ""
        lines.append(f"{result.status}{where}, as {result.principal}: nothing was changed")
        if result.error is not None:
            lines.append(f"{result.error.kind}: {result.error.message}")
        if result.versions:
            lines.append("current versions: " + ", ".join(
                f"{name}={version}" for name, version in result.versions.items()))
    if result.value is not None:
        lines.append(f"value: {result.value.repr}")
    if result.output:
        lines.append("output:\n" + result.output.rstrip("\n"))
    if result.events:
        topics = ", ".join(str(event.get("topic")) for event in result.events[:10])
        lines.append(f"events: {len(result.events)} ({topics})")
    return "\n".join(lines)


def _op_result(result: OpResult) -> types.CallToolResult:
    return _result(render_op(result), result.to_json(), error=not result.committed)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     .rstrip() for row in [header, *rows])


def _cell(value: object, limit: int = 60) -> str:
    text = "" if value is None else str(value).replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


class KernosMCP:
    """MCP tools and resources over a harness client, as ``principal``."""

    def __init__(self, harness: Harness, *, principal: str, workspace: str) -> None:
        self.harness = harness
        self.principal = principal
        """Who every request runs as; fixed for the life of the server."""
        self.workspace = workspace
        self._handlers: dict[str, Callable[[dict[str, Any]],
                                           Awaitable[types.CallToolResult]]] = {
            "kernos-op": self._op,
            "kernos-objects": self._objects,
            "kernos-object": self._object,
            "kernos-log": self._log,
            "kernos-show": self._show,
            "kernos-diff": self._diff,
            "kernos-checkout": self._checkout,
            "kernos-events": self._events,
            "kernos-recall": self._recall,
            "kernos-remember": self._remember,
            "kernos-loop": self._loop,
            **{name: functools.partial(self._files, tool) for name, tool in FILE_TOOLS.items()},
        }
        assert set(self._handlers) == {builtin.name for builtin in BUILTINS}

    @property
    def is_human(self) -> bool:
        return self.principal == HUMAN

    def builtins(self) -> list[Builtin]:
        """The built-in tools this principal is offered."""
        return [builtin for builtin in BUILTINS if self.is_human or not builtin.human_only]

    def server(self) -> Server[Any]:
        """A low-level MCP server whose handlers are this object's."""
        return Server(
            "kernos", version=__version__,
            instructions=(
                f"This server drives the Kernos image of the workspace {self.workspace} as "
                f"the principal {self.principal!r}. Each kernos-op call (and each registry "
                "tool call) is one transaction: it commits completely, as a new snapshot, or "
                "changes nothing. Read objects with kernos-objects and kernos-object, or as "
                "the resources kernos://objects/{name}."),
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_resource_templates,
            on_read_resource=self.read_resource,
        )

    # -- tools -----------------------------------------------------------------------

    async def registry_tools(self) -> dict[str, dict[str, Any]]:
        """The registry tools the kernel lists for this principal, by name."""
        listed = await self.harness.tools(principal=self.principal)
        return {str(tool["name"]): tool for tool in listed}

    def _registry_tool(self, tool: dict[str, Any]) -> types.Tool:
        effect = str(tool.get("effect", ""))
        about = (f"(Kernos registry tool v{tool.get('version')} by {tool.get('author')}, "
                 f"effect {effect}; each call is one op, run as {self.principal}.)")
        description = str(tool.get("description") or "").strip()
        return types.Tool(
            name=str(tool["name"]),
            description=f"{description} {about}" if description else about,
            input_schema=dict(tool.get("schema") or {"type": "object"}),
            annotations=types.ToolAnnotations(read_only_hint=effect == "pure",
                                              open_world_hint=effect == "external"))

    async def list_tools(self, ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        tools = [types.Tool(name=builtin.name, description=builtin.description,
                            input_schema=builtin.schema,
                            annotations=types.ToolAnnotations(read_only_hint=builtin.read_only,
                                                              open_world_hint=False))
                 for builtin in self.builtins()]
        try:
            registry = await self.registry_tools()
        except ClientError as error:
            raise MCPError(types.INTERNAL_ERROR, f"the registry tools could not be listed: "
                           f"{error}") from error
        tools.extend(self._registry_tool(tool) for tool in registry.values())
        return types.ListToolsResult(tools=tools)

    async def call_tool(self, ctx: ServerRequestContext[Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        return await self.call(params.name, params.arguments)

    async def call(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        """Call one tool by its MCP name; every failure is an error result saying why."""
        try:
            if name.startswith(PREFIX):
                return await self._call_builtin(name, arguments)
            return await self._call_registry(name, arguments)
        except BadArguments as problem:
            await self._record_refusal(name, str(problem))
            return refusal("bad_arguments", f"{problem} Nothing was run.")
        except RequestError as error:
            return refusal(error.kind, f"{name}: {error.message}", error.data)
        except KernelDied as error:
            return refusal("kernel_died", f"{name}: {error} Restart the kernel on "
                           f"{self.workspace}, or restart this server.")
        except ClientError as error:
            return refusal("client", f"{name}: {error}")
        except Exception as error:  # a bug here: say so, and keep serving
            logger.exception("kernos mcp: %s failed", name)
            return refusal("internal", f"{name}: an internal error in kernos mcp "
                           f"({type(error).__name__}: {error}). Whether the request reached the "
                           "kernel is not known; please report this with the server's log.")

    async def _record_refusal(self, name: str, problem: str) -> None:
        """Refused here, before the kernel: recorded in its audit log like its own refusals."""
        try:
            await self.harness.refused(principal=self.principal, via="mcp", what=name[:200],
                                       problem=problem[:1000])
        except ClientError as error:  # the refusal stands; only its record is missing
            logger.warning("kernos mcp: the refusal of %s could not be recorded: %s",
                           name[:80], error)

    async def _call_builtin(self, name: str,
                            arguments: dict[str, Any] | None) -> types.CallToolResult:
        builtin = next((item for item in BUILTINS if item.name == name), None)
        if builtin is None:
            return await self._unknown(name)
        if builtin.human_only and not self.is_human:
            return refusal("denied", (
                f"{name} is offered only to the human principal, and this server runs as "
                f"{self.principal!r} (it was started with --principal {self.principal}). "
                + ("A checkout replaces the whole image" if name == "kernos-checkout" else
                   "The history shows every name and the code of every op, beyond what "
                   f"{self.principal!r} may read")
                + f". Nothing was run. Use kernos-objects and kernos-object to read what "
                f"{self.principal!r} may read."), {"tool": name, "principal": self.principal})
        checked = check_arguments(name, builtin.schema, arguments)
        return await self._handlers[name](checked)

    async def _call_registry(self, name: str,
                             arguments: dict[str, Any] | None) -> types.CallToolResult:
        registry = await self.registry_tools()
        tool = registry.get(name)
        if tool is None:
            return await self._unknown(name, registry)
        checked = check_arguments(name, dict(tool.get("schema") or {}), arguments)
        return _op_result(await self.harness.op(principal=self.principal, tool=name,
                                                arguments=checked))

    async def _unknown(self, name: str, registry: dict[str, dict[str, Any]] | None = None
                       ) -> types.CallToolResult:
        if registry is None:
            registry = await self.registry_tools()
        offered = [builtin.name for builtin in self.builtins()] + sorted(registry)
        if name.startswith(PREFIX):
            why = "there is no such built-in tool"
        else:
            why = "it is not in the workspace's registry" + ("" if self.is_human else (
                f", or {self.principal!r} holds no call:{name[:80]} grant for it (a human "
                f"grants it with: %kernos grant {self.principal} call:{name[:80]})"))
        return refusal("unknown_tool", (
            f"there is no tool {name[:80]!r} for {self.principal!r}: {why}. Nothing was run. "
            f"The tools are: {', '.join(offered)}."), {"tool": name[:80], "tools": offered})

    # -- built-in tools ------------------------------------------------------------------

    async def _op(self, arguments: dict[str, Any]) -> types.CallToolResult:
        code, tool = arguments.get("code"), arguments.get("tool")
        if (code is None) == (tool is None):
            raise BadArguments("kernos-op: give exactly one of 'code' (Python source to run) "
                               "or 'tool' (a registry tool to call, with 'arguments').")
        if "arguments" in arguments and tool is None:
            raise BadArguments("kernos-op: 'arguments' go with 'tool', not with 'code'.")
        result = await self.harness.op(
            code, principal=self.principal, tool=tool,
            arguments=arguments.get("arguments") if tool is not None else None,
            key=arguments.get("key"), expect_versions=arguments.get("expect_versions"),
            predicate=arguments.get("predicate"))
        return _op_result(result)

    async def _objects(self, arguments: dict[str, Any]) -> types.CallToolResult:
        limit = arguments.get("limit", _DEFAULT_OBJECTS)
        offset = arguments.get("offset", 0)
        infos = await self.harness.objects(principal=self.principal,
                                           prefix=arguments.get("prefix"),
                                           limit=limit, offset=offset)
        rows = [[info.name, _cell(info.type, 30), str(info.version), str(info.op),
                 _cell(info.summary)] for info in infos]
        text = _table(rows, ["name", "type", "version", "op", "summary"]) if rows else \
            f"no objects that {self.principal!r} may read" + (
                f" start with {arguments['prefix']!r}" if arguments.get("prefix") else "")
        if len(infos) == limit:
            text += f"\n(more may follow: call again with offset={offset + limit})"
        return _result(text, {"objects": [object_json(info) for info in infos],
                              "offset": offset, "count": len(infos)})

    async def _object(self, arguments: dict[str, Any]) -> types.CallToolResult:
        info = await self.harness.object(arguments["name"], principal=self.principal,
                                         preview_bytes=arguments.get("preview_bytes"))
        lines = [f"{info.name}: {info.type}, version {info.version}, {info.size} bytes stored, "
                 f"last changed by op {info.op} ({info.principal}, {info.changed_at})"]
        if info.preview is not None:
            lines.append(info.preview.repr)
        return _result("\n".join(lines), object_json(info))

    async def _log(self, arguments: dict[str, Any]) -> types.CallToolResult:
        snapshots = await self.harness.log(limit=arguments.get("limit", _DEFAULT_LOG),
                                           principal=None if self.is_human else self.principal)
        rows = [[_cell(entry.get("op")), str(entry.get("commit"))[:12], _cell(entry.get("when")),
                 _cell(entry.get("principal")), _cell(_changes(entry.get("changes")), 40),
                 _cell(entry.get("message"))] for entry in snapshots]
        text = _table(rows, ["op", "commit", "when", "who", "changes", "what"]) if rows else \
            "no snapshots yet"
        return _result(text, {"snapshots": snapshots})

    async def _show(self, arguments: dict[str, Any]) -> types.CallToolResult:
        shown = await self.harness.show(arguments.get("ref", "HEAD"))
        names = shown.get("names") or {}
        text = (f"op {shown.get('op')} (commit {str(shown.get('commit'))[:12]}) by "
                f"{shown.get('principal')} at {shown.get('committed_at')}\n"
                f"names: {', '.join(sorted(names)) or '(none)'}\ncode:\n{shown.get('code', '')}")
        return _result(text, shown)

    async def _diff(self, arguments: dict[str, Any]) -> types.CallToolResult:
        found = await self.harness.diff(arguments["a"], arguments.get("b"))
        lines = [f"diff {found.get('a')} -> {found.get('b')}"]
        for mark, key in (("+", "added"), ("-", "deleted")):
            lines.extend(f"  {mark} {entry.get('name')}  {entry.get('type')}  "
                         f"{_cell(entry.get('summary'))}" for entry in found.get(key) or [])
        lines.extend(f"  ~ {entry.get('name')}  {entry.get('type')}  "
                     f"{_cell(entry.get('before'), 30)} -> {_cell(entry.get('after'), 30)}"
                     for entry in found.get("changed") or [])
        if len(lines) == 1:
            lines.append("  no differences")
        return _result("\n".join(lines), found)

    async def _checkout(self, arguments: dict[str, Any]) -> types.CallToolResult:
        result = await self.harness.checkout(arguments["ref"])
        text = render_op(result)
        if result.committed and result.checkout:
            text = (f"checked out {arguments['ref']} ({str(result.checkout.get('commit'))[:12]}"
                    f", op {result.checkout.get('op')}); history is not rewritten\n{text}")
        return _op_result(result).model_copy(update={
            "content": [types.TextContent(type="text", text=_bounded(text))]})

    async def _events(self, arguments: dict[str, Any]) -> types.CallToolResult:
        if "since" in arguments and "op" in arguments:
            raise BadArguments("kernos-events: give either 'since' (a cursor) or 'op', "
                               "not both.")
        found, cursor = await self.harness.events(
            since=arguments.get("since"), op=arguments.get("op"), topic=arguments.get("topic"),
            principal=None if self.is_human else self.principal,
            limit=arguments.get("limit", _DEFAULT_EVENTS))
        lines = [f"{event.get('seq')}  op {event.get('op')}  {event.get('topic')}  "
                 f"{_cell(json.dumps(event.get('payload'), default=str), 80)}"
                 for event in found]
        lines.append(f"{len(found)} events; next cursor: since={cursor}")
        return _result("\n".join(lines), {"events": found, "cursor": cursor})

    async def _recall(self, arguments: dict[str, Any]) -> types.CallToolResult:
        found = await self.harness.recall(arguments["query"], principal=self.principal,
                                          k=arguments.get("k"), kinds=arguments.get("kinds"))
        lines = [f"{memory.get('kind')}  {_cell(memory.get('title'), 40)}  "
                 f"{_cell(memory.get('text'), 120)}" for memory in found]
        text = "\n".join(lines) if lines else f"nothing that {self.principal!r} may recall"
        return _result(text, {"memories": found})

    async def _remember(self, arguments: dict[str, Any]) -> types.CallToolResult:
        stored = await self.harness.remember(arguments["fact"], principal=self.principal,
                                             tags=arguments.get("tags"))
        fact = stored.get("fact") or {}
        return _result(f"remembered fact {fact.get('id')} (op {stored.get('op')})", stored)

    async def _files(self, tool: FileTool, arguments: dict[str, Any]) -> types.CallToolResult:
        text, structured = await tool(self.harness, self.principal, arguments)
        return _result(text, structured)

    async def _loop(self, arguments: dict[str, Any]) -> types.CallToolResult:
        do, agent = arguments["do"], arguments.get("agent")
        takes = {"start": {"step", "every_ms", "max_iterations", "pending"}, "stop": {"reason"}}
        extra = sorted(set(arguments) - {"do", "agent"} - takes.get(do, set()))
        if extra:
            raise BadArguments(f"kernos-loop: {', '.join(extra)} do not go with do={do!r}.")
        if do != "status" and agent is None:
            raise BadArguments(f"kernos-loop: do={do!r} needs 'agent' (whose loop).")
        if do == "start" and "step" not in arguments:
            raise BadArguments("kernos-loop: do='start' needs 'step' (the agent code each "
                               "iteration runs).")
        if not self.is_human:
            if do != "status":
                await self._record_refusal("kernos-loop", f"do={do} as {self.principal}")
                return refusal("denied", (
                    f"kernos-loop: only the human may {do} a loop, and this server runs as "
                    f"{self.principal!r}. Nothing was changed. Read your loop with "
                    "do='status'."), {"tool": "kernos-loop", "principal": self.principal})
            if agent not in (None, self.principal):
                return refusal("denied", (
                    f"kernos-loop: {self.principal!r} may read its own loop only, not "
                    f"{str(agent)[:80]!r}'s. Nothing was read."),
                    {"tool": "kernos-loop", "principal": self.principal})
            agent = self.principal
        fields = {key: value for key, value in arguments.items() if key != "do"}
        fields["agent"] = agent
        result = await self.harness.request("loop", do=do, **fields)
        if do == "status":
            found = result.get("loops") or []
            text = "\n".join(_loop_line(entry) for entry in found) or (
                "no loops" if agent is None else f"{agent!r} has no loop")
            return _result(text, {"loops": found})
        changed = result.get("loop") or {}
        return _result(f"{_loop_line(changed)} (op {result.get('op')})", result)

    # -- resources -----------------------------------------------------------------------

    async def list_resources(self, ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        cursor = (params.cursor if params is not None else None) or ""
        try:
            offset = int(cursor) if cursor else 0
            if offset < 0:
                raise ValueError(cursor)
        except ValueError:
            raise MCPError(types.INVALID_PARAMS, f"the cursor {cursor[:40]!r} is not one this "
                           "server gave; list from the start (no cursor)") from None
        try:
            infos = await self.harness.objects(principal=self.principal, limit=_RESOURCE_PAGE,
                                               offset=offset)
        except ClientError as error:
            raise MCPError(types.INTERNAL_ERROR, f"the objects could not be listed: "
                           f"{error}") from error
        return types.ListResourcesResult(
            resources=[types.Resource(uri=object_uri(info.name), name=info.name,
                                      title=info.name, description=f"{info.type}: {info.summary}",
                                      mime_type="application/json") for info in infos],
            next_cursor=str(offset + len(infos)) if len(infos) == _RESOURCE_PAGE else None)

    async def list_resource_templates(self, ctx: ServerRequestContext[Any],
                                      params: types.PaginatedRequestParams | None
                                      ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            uri_template=OBJECT_URI + "{name}", name="object",
            description="An object of the Kernos image (its name percent-encoded): type, "
                        "version, summary and a preview of its value, as JSON.",
            mime_type="application/json")])

    async def read_resource(self, ctx: ServerRequestContext[Any],
                            params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        if not uri.startswith(OBJECT_URI) or len(uri) == len(OBJECT_URI):
            raise MCPError(types.INVALID_PARAMS, f"no resource {uri[:120]!r}: this server "
                           f"serves {OBJECT_URI}{{name}} (list them with resources/list)")
        name = urllib.parse.unquote(uri[len(OBJECT_URI):])
        try:
            info = await self.harness.object(name, principal=self.principal)
        except RequestError as error:
            raise MCPError(types.INVALID_PARAMS, f"{uri[:120]}: {error.message}",
                           {"kind": error.kind, "uri": uri[:200]}) from error
        except ClientError as error:
            raise MCPError(types.INTERNAL_ERROR, f"{uri[:120]}: {error}") from error
        text = json.dumps(object_json(info), default=str, indent=1)
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type="application/json", text=text)])


def _loop_line(loop: dict[str, Any]) -> str:
    """One loop as a line, then what its last committed iteration printed."""
    line = (f"{loop.get('agent')}: {loop.get('status')} at iteration {loop.get('iteration')}, "
            f"{loop.get('pending')} pending, last op {loop.get('last_op')}")
    if loop.get("reason"):
        line += f" ({_cell(loop.get('reason'), 200)})"
    output = loop.get("output")
    if isinstance(output, dict) and output.get("text"):
        line += f"\n  last output (op {output.get('op')}):\n" + "\n".join(
            "    " + text for text in str(output["text"]).splitlines())
        if output.get("cut"):
            line += f"\n    [cut: {output['cut']} more characters]"
    return line


def _changes(changes: object) -> str:
    """A log entry's changes (``{"added": [...], "changed": [...], "deleted": [...]}``)
    as ``+added ~changed -deleted``."""
    if not isinstance(changes, dict):
        return "" if changes is None else str(changes)
    marked = [f"{mark}{name}" for mark, key in (("+", "added"), ("~", "changed"),
                                                 ("-", "deleted"))
              for name in changes.get(key) or []]
    return " ".join(marked) or "(none)"
