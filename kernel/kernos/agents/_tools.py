"""Tools for the agent runtime: defined by agents, pinned per op, called under authority.

One :class:`Toolbox` belongs to one :class:`~kernos.agents.runtime.AgentRuntime`
(``runtime.toolbox``), which delegates to it the names other modules call
(``define_tool``, ``call``, ``call_as``, ``call_as_human``).  The tools
themselves live in the registry (``kernos:agents``), so they commit and roll
back with the image; the toolbox keeps only a cache of compiled sources.  It
knows the runtime only as :class:`kernos.agents.context.Runtime`.

The contract:

* **Defining.** Agent code defines tools (the human registers trusted Python
  with ``AgentRuntime.register_tool``).  The source is compiled restricted,
  run in a module of its own (an :class:`~kernos.agents.namespace.AgentNamespace`
  labelled ``AUTHOR:tool:NAME:vN``, which names its code's file), and its
  module state must be plain, bounded data.  Not inside a tool another agent
  wrote (it would act on its caller's behalf).
* **Pinning.** An op sees one version of each tool, the one committed when
  it started, for all its calls (:meth:`Toolbox.pinned`).
* **Calling.** The caller needs the tool's capability; inside an
  agent-written tool its author's grants bound every check too, and that
  author's open circuit refuses the call.  Arguments cross the boundary as
  plain data and are checked against the schema.  An ``external`` tool is
  queued, to run once after the op commits (``kernos.effects``).  A tool an
  agent wrote, called by anyone else, runs in a fresh instance of its module,
  so nothing passes between principals through its module state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernos.agents.boundary import check_bounded, to_agent, to_host
from kernos.agents.capabilities import parse_capability
from kernos.agents.limits import AGENT_FILENAME_PREFIX
from kernos.agents.namespace import REGISTRY, AgentNamespace, namespace_key
from kernos.agents.policy import compile_agent
from kernos.agents.registry import HUMAN, check_arguments, shown
from kernos.agents.supervisor import fingerprint
from kernos.effects import queue
from kernos.errors import BoundaryError, CapabilityDenied, UsageError

if TYPE_CHECKING:
    from kernos.agents.context import RunContext, Runtime
    from kernos.agents.registry import ToolVersion

__all__ = ["Toolbox"]


class Toolbox:
    """The runtime's tools: agent-written ones defined, every one pinned and called."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._code: dict[tuple[str, int], Any] = {}
        """Compiled sources of agent-written tools, for their foreign calls."""

    def define(self, ctx: RunContext, name: object, source: object, schema: object,
               description: object) -> object:
        """Define (a new version of) tool ``name`` from agent code; its version number."""
        runtime = self.runtime
        if ctx.principal == HUMAN:
            raise UsageError("the human registers tools with agents.register_tool()")
        runtime.on_own_behalf(ctx, "define tools")
        registry = runtime.mutable_registry(ctx.op)
        version_number = len(registry.tools.get(name, [])) + 1 if type(name) is str else 0
        label = _tool_label(ctx.principal, name, version_number)
        code = compile_agent(source, principal=ctx.principal,
                             filename=f"{AGENT_FILENAME_PREFIX}{label}>",
                             max_source=ctx.limits.source_bytes, max_depth=ctx.limits.ast_depth)
        namespace = _module_instance(code, ctx.principal, label)
        try:
            check_bounded(namespace.user_items(),
                          what=f"the module state of tool {shown(name)!r} by {ctx.principal!r}")
        except BoundaryError as error:
            raise runtime.invalid(ctx, error) from None
        function = namespace.get(name) if type(name) is str else None
        if not callable(function):
            raise UsageError(f"the source of tool {name!r} must define a function {name}()")
        try:
            version = registry.define_tool(
                name=name, function=function, schema=to_host(schema), description=description,
                effect="pure", author=ctx.principal, op=ctx.op.id, source=str(source))
        except CapabilityDenied as denied:  # another principal's tool
            raise runtime.deny(ctx, denied.capability, detail=denied.detail) from None
        return version.version

    def call(self, ctx: RunContext, name: object, arguments: dict[str, object]) -> object:
        """Call a tool as ``ctx.principal``, with the version pinned for this op."""
        runtime = self.runtime
        version = self.pinned(ctx, name)
        # A trusted tool may change human names in place: with the registry in
        # the op's reach, the commit widens it through the tool's code.
        ctx.op.touch(REGISTRY)
        kind, target = parse_capability(version.capability)
        runtime.require(ctx, kind, target, exempt=version.author)
        arguments = to_host(arguments)
        check_arguments(version.name, version.schema, arguments)
        if version.effect == "external":  # runs after the op commits, exactly once
            ticket = queue(runtime, ctx.op, ctx.principal, version, arguments)
            return to_agent(ticket) if ctx.principal != HUMAN else ticket
        if version.author != HUMAN:  # its author's code runs: refused if its circuit is open
            runtime.breakers.refuse_if_open(version.author, ctx.op, via=f"tool {version.name}")
        outer = ctx.bounds
        if version.author != HUMAN:  # agent code: bounded by its author's grants too
            ctx.bounds = (*outer, version.author)
        ctx.depth += 1
        try:
            function = version.function
            if version.author != HUMAN and ctx.foreign() is not None:
                function = self._fresh_instance(version)
            result = function(**arguments)
        finally:
            ctx.depth -= 1
            ctx.bounds = outer
        if ctx.principal != HUMAN:
            return to_agent(result)
        return result if version.author == HUMAN else to_host(result)

    def call_as(self, principal: str, name: object, arguments: dict[str, object]) -> object:
        """Call a tool as ``principal`` (checking its grants), inside the current op."""
        runtime = self.runtime
        op = runtime.current_op()
        if principal != HUMAN:
            runtime.registry.principal(principal)
            runtime.breakers.admit(principal, op,
                                   lambda: fingerprint("tool", repr(name)[:200], arguments))
            op.touch(namespace_key(principal), REGISTRY)
        with runtime.running(principal, op) as ctx:
            return self.call(ctx, name, arguments)

    def pinned(self, ctx: RunContext, name: object) -> ToolVersion:
        """The version of tool ``name`` that ``ctx.op`` sees (pinned at its first use)."""
        pins = ctx.op.facts.get("tools", {})
        registry = self.runtime.registry
        if type(name) is str and name in pins:
            number = pins[name]
            pinned: ToolVersion = registry.tools[name][number - 1]
            return pinned
        version = registry.tool_version(name, before_op=ctx.op.id)
        ctx.op.facts.setdefault("tools", {})[version.name] = version.version
        return version

    def source_of(self, filename: str) -> str:
        """The source of the agent-written tool version compiled as ``filename``."""
        label = filename[len(AGENT_FILENAME_PREFIX):-1]  # AUTHOR:tool:NAME:vN
        _, _, rest = label.partition(":tool:")
        name, _, number = rest.rpartition(":v")
        versions = self.runtime.registry.tools.get(name, [])
        if number.isdigit() and 0 < int(number) <= len(versions):
            return versions[int(number) - 1].source or ""
        return ""

    def _fresh_instance(self, version: ToolVersion) -> Callable[..., Any]:
        """The tool's function in a new instance of its module, for one foreign call.

        Its module-level code runs again (under the call's authority), so what
        the tool keeps in module state neither comes from its author's calls nor
        outlives this one: nothing passes between principals through it.
        """
        key = (version.name, version.version)
        label = _tool_label(version.author, version.name, version.version)
        code = self._code.get(key)
        if code is None:
            code = compile_agent(version.source or "", principal=version.author,
                                 filename=f"{AGENT_FILENAME_PREFIX}{label}>")
            self._code[key] = code
        function = _module_instance(code, version.author, label).get(version.name)
        if not callable(function):
            raise UsageError(f"tool {version.name!r} no longer defines its function")
        return function  # type: ignore[no-any-return]


def _tool_label(author: str, name: object, version: int) -> str:
    """How an agent-written tool's module is named (its code's file name is built on it)."""
    return f"{author}:tool:{name}:v{version}"


def _module_instance(code: Any, author: str, label: str) -> AgentNamespace:
    """A new instance of an agent-written tool's module: its code run in fresh globals."""
    namespace = AgentNamespace(author, label=label)
    exec(code, namespace)
    namespace.pop("_print", None)  # RestrictedPython's per-run print target
    return namespace
