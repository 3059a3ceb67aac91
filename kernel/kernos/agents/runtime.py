"""The agent runtime: runs principals' code and tools inside the image's ops.

One :class:`AgentRuntime` belongs to one :class:`~kernos.image.Image`.  It
keeps *no* state of its own that outlives an op: the registry
(``kernos:agents``) and every agent's namespace (``kernos:ns:NAME``) live in
the image, so they commit, roll back and restore with it, and the runtime
looks them up afresh on every call (a rollback may have replaced them).
Denials and the grants used are noted on the op, and so reach its audit
record (``kernos.audit``), committed or not.  Events (``kernos.events``) run
through :attr:`AgentRuntime.events`, which knows how to run an agent's
subscriber as that agent.

Every mutation goes through the op that is running (``image.current``); the
runtime tells the op which runtime names it changed (``op.touch``), and
vetoes the op (``op.veto``) on a denial or a breached limit, so the op rolls
back at commit even if agent code caught the error.
"""

from __future__ import annotations

import contextlib
import decimal
import reprlib
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernos import amounts
from kernos._time import utc_now
from kernos.agents import context
from kernos.agents.boundary import ObjectView, check_bounded, to_agent, to_host
from kernos.agents.capabilities import Grant, amount, parse_capability
from kernos.agents.context import BoundedOutput, RunContext
from kernos.agents.guards import AGENT_BUILTINS
from kernos.agents.limits import AGENT_FILENAME_PREFIX, LimitExceeded, Limits, Supervisor
from kernos.agents.policy import compile_agent, compile_agent_with_value
from kernos.agents.registry import HUMAN, Registry, ToolVersion, check_arguments, shown
from kernos.agents.supervisor import Breakers, fingerprint
from kernos.effects import EffectRunner, queue
from kernos.errors import (
    BoundaryError,
    CapabilityDenied,
    EventError,
    InvalidGrant,
    KernosError,
    OpVetoed,
    UnknownAgent,
    UnknownTool,
    UsageError,
)
from kernos.events.bus import EventBus
from kernos.image import Image
from kernos.op import Op

if TYPE_CHECKING:
    from kernos.llm import Budget, Completion, LlmClient, Request, Spent
    from kernos.memory.service import ImageMemory
    from kernos.personal import Keyring

__all__ = ["REGISTRY", "AgentNamespace", "AgentRuntime", "RunResult", "namespace_key"]

REGISTRY = "kernos:agents"
MAX_DENIALS_LOGGED = 20
"""Denials recorded per run; more are counted, and the op is vetoed anyway."""
MAX_EMBED_TEXTS = 256
"""The most texts one :meth:`AgentRuntime.embed_texts` call embeds."""


def namespace_key(agent: str) -> str:
    return f"kernos:ns:{agent}"


class AgentNamespace(dict[str, Any]):
    """An agent's globals: its own names, plus the agent builtins (never persisted)."""

    def __init__(self, owner: str, label: str | None = None) -> None:
        super().__init__()
        self.owner = owner
        self["__builtins__"] = AGENT_BUILTINS
        self["__name__"] = f"agent:{label or owner}"

    def __repr__(self) -> str:
        # Cheap and bounded: summaries of the image call repr() on every value.
        return f"<namespace of {self.owner}: {len(self) - 2} names>"

    def user_items(self) -> dict[str, Any]:
        return {key: value for key, value in self.items()
                if not (key.startswith("__") and key.endswith("__"))}

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        items = [(key, value) for key, value in self.items() if key != "__builtins__"]
        return (rebuild_namespace, (self.owner,), None, None, iter(items))


def rebuild_namespace(owner: str) -> AgentNamespace:
    """Load-side constructor (part of the on-disk format)."""
    return AgentNamespace(owner)


@dataclass(kw_only=True)
class RunResult:
    """What running agent code produced."""

    principal: str
    """Who ran."""
    op: int
    """The op it ran in."""
    output: str
    """What it printed (bounded)."""
    seconds: float
    """Wall time of the run."""
    value: object = None
    """The value of the code's final expression (with ``keep_value``), else None."""
    has_value: bool = False
    """Whether the code ended with an expression whose value is ``value``."""


class AgentRuntime:
    """Principals, grants, contained agent code and tools, over one image."""

    def __init__(self, image: Image, *, default_limits: Limits | None = None) -> None:
        self.image = image
        self.default_limits = default_limits or Limits()
        self.denials: list[dict[str, Any]] = []
        self._llm: LlmClient | None = None
        self.llm_keyring: Keyring | None = None
        """The keys the LLM recordings are sealed and opened with (default: the image's;
        a replay opens the source's recordings with the source's)."""
        self._tool_code: dict[tuple[str, int], Any] = {}
        """Compiled sources of agent-written tools, for their foreign calls."""
        self.events = EventBus(image, runner=self._run_subscriber,
                               authorize=self._authorize_event, principal=self._principal)
        self.effects = EffectRunner(self)
        self._breakers: Breakers | None = None
        self._memory: ImageMemory | None = None
        """Executes external effects after their op commits (see kernos.effects)."""

    @property
    def breakers(self) -> Breakers:
        """The circuit breakers (kernos.agents.supervisor), made on first use."""
        if self._breakers is None:
            self._breakers = Breakers(self)
        return self._breakers

    @property
    def memory(self) -> ImageMemory:
        """The image's searchable memory (kernos.memory), opened on first use."""
        if self._memory is None:
            from kernos.memory.service import ImageMemory

            self._memory = ImageMemory(self.image)
            self._memory.embed = self.embed_texts  # recall by meaning calls models as the asker
        return self._memory

    # -- state in the image ------------------------------------------------------

    @property
    def registry(self) -> Registry:
        """The registry, read-only use (an empty one if no agent was ever added)."""
        found = self.image.system.get(REGISTRY)
        return found if isinstance(found, Registry) else Registry()

    def _mutable_registry(self, op: Op) -> Registry:
        found = self.image.system.get(REGISTRY)
        if not isinstance(found, Registry):
            found = Registry()
            self.image.bind(REGISTRY, found)
        op.touch(REGISTRY)
        return found

    def _op(self) -> Op:
        op = self.image.current
        if op is None:
            raise UsageError("the agent runtime changes the image only inside an op: run "
                             "this from a cell (or an op started with image.begin())")
        return op

    def namespace(self, agent: str) -> AgentNamespace:
        self.registry.principal(agent)
        found = self.image.system.get(namespace_key(agent))
        if not isinstance(found, AgentNamespace):
            raise UsageError(f"the namespace of agent {agent!r} is missing from the image")
        return found

    def limits_for(self, principal: str) -> Limits:
        if principal == HUMAN:
            return self.default_limits
        return self.default_limits.with_overrides(self.registry.principal(principal).limits)

    # -- the human's operations --------------------------------------------------------

    def add_agent(self, name: object, *, parent: str = HUMAN,
                  limits: dict[str, int] | None = None) -> str:
        limits = dict(limits or {})
        op = self._op()
        registry = self._mutable_registry(op)
        self.default_limits.with_overrides(limits)  # validate before anything changes
        principal = registry.add_agent(name, parent=parent, op=op.id)
        principal.limits = dict(limits)
        self.image.bind(namespace_key(principal.name), AgentNamespace(principal.name))
        op.touch(namespace_key(principal.name))
        return principal.name

    def set_limits(self, agent: str, **limits: int) -> Limits:
        op = self._op()
        principal = self._mutable_registry(op).principal(agent)
        merged = {**principal.limits, **limits}
        result = self.default_limits.with_overrides(merged)
        principal.limits = merged
        return result

    def grant(self, agent: str, capability: object, limit: object = None, *,
              granter: str = HUMAN) -> dict[str, object]:
        op = self._op()
        registry = self._mutable_registry(op)
        if granter != HUMAN:
            raise CapabilityDenied(granter, shown(capability),
                                   detail="only the human grants directly; agents delegate")
        return registry.grant(agent, capability, limit=limit, granter=granter,
                              op=op.id).describe()

    def revoke(self, agent: str, capability_or_id: object) -> list[str]:
        """Revoke grants (by capability or id) and all grants derived from them."""
        op = self._op()
        registry = self._mutable_registry(op)
        registry.principal(agent)
        if type(capability_or_id) is str and capability_or_id.startswith("g"):
            targets = [registry.held(agent, capability_or_id)]
        else:
            targets = registry.matching(agent, capability_or_id)
        if not targets:
            raise UsageError(f"{agent!r} holds no active grant {capability_or_id!r}; "
                             f"`%kernos grants {agent}` lists them")
        revoked = []
        for grant in targets:
            revoked += [g.id for g in registry.revoke(grant, op=op.id)]
        return revoked

    def grants(self, agent: str | None = None) -> list[dict[str, object]]:
        registry = self.registry
        if agent is not None:
            registry.principal(agent)
        return [self._llm_described(grant) for grant in registry.of(agent)]

    def agents(self) -> list[str]:
        return sorted(self.registry.principals)

    def register_tool(self, name: str, function: Callable[..., Any], *,
                      schema: dict[str, Any], description: str, effect: str = "pure",
                      capability: str | None = None,
                      resolve: Callable[[str], tuple[bool, Any]] | None = None,
                      attempts: int = 3, backoff: float = 0.05,
                      timeout: float | None = 60.0) -> dict[str, object]:
        """Register trusted Python (the human's) as a tool.

        An ``external`` tool is called with ``idempotency_key=`` after its op
        commits (see kernos.effects); ``resolve``, ``attempts`` and ``backoff``
        say how its in-doubt calls are checked and its failures retried, and
        ``timeout`` how long an attempt may run before it is left in doubt.
        """
        if not callable(function):
            raise UsageError(f"tool {name!r}: {function!r} is not callable")
        op = self._op()
        version = self._mutable_registry(op).define_tool(
            name=name, function=function, schema=schema, description=description,
            effect=effect, author=HUMAN, op=op.id, capability=capability, resolve=resolve,
            attempts=attempts, backoff=backoff, timeout=timeout)
        return version.describe()

    def resolve_effect(self, key: object, *, executed: object,
                       result: object = None) -> dict[str, Any]:
        """Answer for an in-doubt effect (the human only); the next drain records it."""
        return self.effects.resolve(self._op(), key, executed=executed, result=result)

    def tools(self) -> list[dict[str, object]]:
        return [versions[-1].describe() for versions in self.registry.tools.values()]

    # -- running agent code ----------------------------------------------------------------

    def run(self, principal: str, source: object,
            echo: Callable[[str], object] | None = None, *,
            keep_value: bool = False,
            admit_as: Callable[[], str] | None = None) -> RunResult:
        """Run ``source`` as ``principal`` inside the current op.

        ``echo`` receives what the code printed (bounded), also when it fails.
        With ``keep_value``, the value of a final expression statement is the
        result's ``value`` (evaluated under the same supervision).  ``admit_as()``
        gives the fingerprint the supervisor counts the run as (default: the
        code's; a loop's iteration adds what the loop hands its step).
        """
        op = self._op()
        if principal == HUMAN:
            raise UsageError("the human runs ordinary cells; `%%agent NAME` runs agent code")
        self.registry.principal(principal)
        self.breakers.admit(principal, op, admit_as or (lambda: fingerprint(
            "code", source if type(source) is str else repr(source)[:10_000])))
        limits = self.limits_for(principal)
        filename = f"{AGENT_FILENAME_PREFIX}{principal}>"
        final = None
        if keep_value:
            code, final = compile_agent_with_value(
                source, principal=principal, filename=filename,
                max_source=limits.source_bytes, max_depth=limits.ast_depth)
        else:
            code = compile_agent(source, principal=principal, filename=filename,
                                 max_source=limits.source_bytes, max_depth=limits.ast_depth)
        namespace = self.namespace(principal)
        op.touch(namespace_key(principal), REGISTRY)
        self._llm_warm(principal)
        started = time.perf_counter()
        value: object = None
        output = ""
        try:
            with self._running(principal, op) as ctx:
                try:
                    exec(code, namespace)
                    if final is not None:
                        value = eval(final, namespace)
                except KernosError:
                    raise
                except Exception as error:
                    # Host code (the kernel's traceback) formats the error's args,
                    # which agent code chose: bound them first.
                    error.args = (_bounded_args(error.args),)
                    raise
                finally:
                    output = ctx.output.text()
                    namespace.pop("_print", None)  # RestrictedPython's per-run print target
        finally:
            # After supervision: the kernel's I/O is not the agent's, and runs without the
            # address-space cap an agent may have filled.
            if echo is not None and output:
                echo(output)
        return RunResult(principal=principal, op=op.id, output=output,
                         seconds=time.perf_counter() - started, value=value,
                         has_value=final is not None)

    def traceback_for_agent(self, error: BaseException, principal: str,
                            source: str) -> list[str]:
        """How an error from agent code is shown: only the frames of agent code.

        The frames of the runtime, the kernel and any host code between them
        are left out (their file names and source lines are not the agent's to
        see); the agent's own frames (``source``, the code it ran as
        ``principal``, and the tools agents wrote) keep their lines.
        """
        cell = f"{AGENT_FILENAME_PREFIX}{principal}>"
        shown = ["Traceback (agent code only; host frames are not shown):"]
        for frame, line in traceback.walk_tb(error.__traceback__):
            filename = frame.f_code.co_filename
            if not filename.startswith(AGENT_FILENAME_PREFIX):
                continue
            text = source if filename == cell else self._tool_source(filename)
            shown.append(f'  File "{filename}", line {line}, in {frame.f_code.co_name}')
            lines = text.splitlines()
            if 0 < line <= len(lines) and lines[line - 1].strip():
                shown.append(f"    {lines[line - 1].strip()[:200]}")
        message = str(error)
        shown.append(f"{type(error).__name__}: {message[:2000]}" if message
                     else type(error).__name__)
        return shown

    def _tool_source(self, filename: str) -> str:
        """The source of the agent-written tool version compiled as ``filename``."""
        label = filename[len(AGENT_FILENAME_PREFIX):-1]  # AUTHOR:tool:NAME:vN
        _, _, rest = label.partition(":tool:")
        name, _, number = rest.rpartition(":v")
        versions = self.registry.tools.get(name, [])
        if number.isdigit() and 0 < int(number) <= len(versions):
            return versions[int(number) - 1].source or ""
        return ""

    @contextlib.contextmanager
    def _running(self, principal: str, op: Op) -> Iterator[RunContext]:
        """Enter agent context under supervision, unless already inside it."""
        outer = context.running()
        if outer is not None:
            yield outer
            return
        limits = self.limits_for(principal)
        supervisor = Supervisor(limits, describe=f"op {op.id} ({principal})")
        ctx = RunContext(runtime=self, principal=principal, op=op, limits=limits,
                         output=BoundedOutput(limits.output_bytes))
        token = context.enter(ctx)
        supervisor.start()
        try:
            yield ctx
        except LimitExceeded:
            pass  # reported below, with the supervisor's message
        finally:
            supervisor.stop()
            context.leave(token)
        if supervisor.breach is not None:  # raised, or tripped and swallowed somewhere
            op.veto(supervisor.breach.message)
            raise OpVetoed(op.id, [supervisor.breach.message])

    # -- denials ----------------------------------------------------------------------

    def deny(self, ctx: RunContext, capability: str, detail: str = "") -> CapabilityDenied:
        """Record a denial, veto the op, and return the error to raise."""
        capability, detail = capability[:120], detail[:300]  # agent text is bounded
        error = CapabilityDenied(ctx.principal, capability, detail=detail)
        record = {"op": ctx.op.id, "principal": ctx.principal, "capability": capability,
                  "detail": detail, "at": utc_now()}
        ctx.denials += 1
        if ctx.denials > MAX_DENIALS_LOGGED:
            return error  # the op is vetoed already; a flood is not recorded
        del self.denials[:-1000]
        self.denials.append(record)
        ctx.op.denied.append({key: record[key] for key in ("principal", "capability", "detail")})
        ctx.op.veto(f"{ctx.principal!r} was denied {capability!r}", status="denied")
        return error

    def _require(self, ctx: RunContext, kind: str, target: str, *,
                 exempt: str | None = None) -> None:
        """Every principal of ``ctx.authority()`` (but ``exempt``) must hold ``kind:target``."""
        for principal in ctx.authority():
            if principal == exempt:
                continue
            grant = self.registry.find(principal, kind, target)
            if grant is None:
                raise self.deny(ctx, f"{kind}:{target}", detail=_bounded_by(ctx, principal))
            ctx.op.grants_used[grant.id] = grant.capability

    def _on_own_behalf(self, ctx: RunContext, action: str) -> None:
        """Refuse ``action`` inside a tool another agent wrote: it would act for the caller."""
        author = ctx.foreign()
        if author is not None:
            raise self._invalid(ctx, UsageError(
                f"a tool {author!r} wrote cannot {action} on its caller's behalf"))

    def refused(self, ctx: RunContext, error: KernosError) -> KernosError:
        """A Kernos call from agent code raised ``error``: its op must not commit.

        A denial (or a malformed request, :meth:`_invalid`) vetoed the op
        already; any other refusal (a bad spawn name, a tool definition or an LLM
        request that was not accepted) is recorded and vetoes it here.  Returns
        the error as the agent may see it (:meth:`_as_seen_by`).
        """
        if not ctx.op.vetoes:
            self.deny(ctx, "a request Kernos refused",
                      detail=f"{type(error).__name__}: {str(error)[:200]}")
        return self._as_seen_by(ctx.authority(), error)

    def _as_seen_by(self, authority: list[str], error: KernosError) -> KernosError:
        """``error``, naming only the tools and agents every one of ``authority`` may use.

        An unknown tool or agent is reported with the names the grants let the
        running code use (tools it wrote or may call; itself and its
        sub-agents), never the whole registry; inside an agent-written tool,
        its author's grants bound that too.  Only the human's own code
        (``authority`` empty) sees every name.
        """
        if not authority:
            return error
        registry = self.registry
        if isinstance(error, UnknownTool):
            usable = []
            for name, versions in registry.tools.items():
                kind, target = parse_capability(versions[-1].capability)
                if all(versions[-1].author == principal or registry.find(principal, kind, target)
                       for principal in authority):
                    usable.append(name)
            return UnknownTool(error.name, sorted(usable), detail=error.detail)
        if isinstance(error, UnknownAgent):
            return UnknownAgent(error.name, sorted(
                name for name in registry.principals
                if all(name == principal or registry.is_descendant(name, principal)
                       for principal in authority)))
        return error

    def _invalid(self, ctx: RunContext, error: KernosError) -> KernosError:
        """A malformed request from agent code counts as a denial too."""
        self.deny(ctx, "a well-formed request", detail=str(error)[:200])
        return error

    # -- calls from agent code (see kernos.agents.api) -----------------------------------

    def read(self, ctx: RunContext, name: object) -> ObjectView:
        if type(name) is not str:
            raise self._invalid(ctx, BoundaryError("read() takes a name (a str)"))
        self._require(ctx, "read", name)
        if name not in self.image.namespace or not self._is_human_name(name):
            raise KeyError(f"there is no {name!r} to read")
        return ObjectView(name)

    def write(self, ctx: RunContext, name: object, value: object) -> None:
        if (type(name) is not str or not name.isidentifier() or name.startswith("_")
                or not self._is_human_name(name)):
            raise self._invalid(ctx, BoundaryError("write() takes an identifier (a str)"))
        assert isinstance(name, str)
        self._require(ctx, "write", name)
        self.image.namespace[name] = to_host(value)
        ctx.op.touch(name)

    def resolve_view(self, ctx: RunContext, name: str, path: tuple[tuple[str, object], ...],
                     *, write: bool) -> object:
        self._require(ctx, "write" if write else "read", name)
        if name not in self.image.namespace:
            raise KeyError(f"{name!r} no longer exists")
        value = self.image.namespace[name]
        for kind, key in path:
            value = value[key] if kind == "item" else vars(value)[key]
        if write:
            ctx.op.touch(name)
        return value

    def _is_human_name(self, name: str) -> bool:
        return self.image.is_persistent(name) and not name.startswith("kernos:")

    def spend(self, ctx: RunContext, value: object, unit: object) -> object:
        if type(unit) is not str:
            raise self._invalid(ctx, InvalidGrant("spend() takes a unit (a str)"))
        try:
            checked = amount(value)
        except InvalidGrant as error:
            raise self._invalid(ctx, error) from None
        registry = self._mutable_registry(ctx.op)
        # A derived grant spends from every grant it was derived from, so
        # delegating cannot multiply a budget; inside a tool an agent wrote, the
        # author's budget is spent too, so a tool never spends more than its author.
        grants: list[Grant] = []
        for principal in ctx.authority():
            grant = registry.find(principal, "spend", unit)
            if grant is None:
                raise self.deny(ctx, f"spend:{unit}", detail=_bounded_by(ctx, principal))
            grants.append(grant)
        chain = self._chains(grants)
        for link in chain:
            remaining = link.remaining
            assert remaining is not None
            remaining = amounts.subtract(remaining, self._llm_cost_spent(link))
            if checked > remaining:
                raise self.deny(ctx, f"spend:{unit}",
                                detail=f"{checked} asked, {remaining} left of grant {link.id}")
        for link in chain:
            link.used = amounts.add(link.used, checked)
            ctx.op.grants_used[link.id] = link.capability
        return min(amounts.subtract(link.remaining, self._llm_cost_spent(link))
                   for link in chain if link.remaining is not None)

    def my_grants(self, ctx: RunContext) -> list[object]:
        return [to_agent(self._llm_described(grant))
                for grant in self.registry.of(ctx.principal) if grant.active]

    def delegate(self, ctx: RunContext, grant_id: object, to: object,
                 limit: object = None) -> object:
        self._on_own_behalf(ctx, "delegate grants")
        registry = self._mutable_registry(ctx.op)
        try:
            grant = registry.attenuate(ctx.principal, grant_id, to, limit=limit, op=ctx.op.id)
        except CapabilityDenied as denied:
            raise self.deny(ctx, denied.capability, detail=denied.detail) from None
        except (InvalidGrant, UnknownAgent) as error:
            raise self._invalid(ctx, error) from None
        return to_agent(grant.describe())

    def revoke_delegated(self, ctx: RunContext, grant_id: object) -> list[object]:
        self._on_own_behalf(ctx, "revoke grants")
        registry = self._mutable_registry(ctx.op)
        grant = registry.grants.get(grant_id) if type(grant_id) is str else None
        if grant is None or grant.granted_by != ctx.principal:
            raise self.deny(ctx, f"revoke {shown(grant_id)}",
                            detail="agents revoke only the grants they delegated")
        return [g.id for g in registry.revoke(grant, op=ctx.op.id)]

    def spawn(self, ctx: RunContext, name: object) -> object:
        self._on_own_behalf(ctx, "spawn agents")
        self._require(ctx, "agents", "spawn")
        if type(name) is not str:
            raise self._invalid(ctx, InvalidGrant("spawn() takes a name (a str)"))
        return self.add_agent(f"{ctx.principal}/{name}", parent=ctx.principal)

    def define_tool(self, ctx: RunContext, name: object, source: object, schema: object,
                    description: object) -> object:
        if ctx.principal == HUMAN:
            raise UsageError("the human registers tools with agents.register_tool()")
        self._on_own_behalf(ctx, "define tools")
        registry = self._mutable_registry(ctx.op)
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
            raise self._invalid(ctx, error) from None
        function = namespace.get(name) if type(name) is str else None
        if not callable(function):
            raise UsageError(f"the source of tool {name!r} must define a function {name}()")
        try:
            version = registry.define_tool(
                name=name, function=function, schema=to_host(schema), description=description,
                effect="pure", author=ctx.principal, op=ctx.op.id, source=str(source))
        except CapabilityDenied as denied:  # another principal's tool
            raise self.deny(ctx, denied.capability, detail=denied.detail) from None
        return version.version

    def call(self, ctx: RunContext, name: object, arguments: dict[str, object]) -> object:
        """Call a tool as ``ctx.principal``, with the version pinned for this op."""
        version = self._pinned(ctx, name)
        # A trusted tool may change human names in place: with the registry in
        # the op's reach, the commit widens it through the tool's code.
        ctx.op.touch(REGISTRY)
        kind, target = parse_capability(version.capability)
        self._require(ctx, kind, target, exempt=version.author)
        arguments = to_host(arguments)
        _check_arguments(version, arguments)
        if version.effect == "external":  # runs after the op commits, exactly once
            ticket = queue(self, ctx.op, ctx.principal, version, arguments)
            return to_agent(ticket) if ctx.principal != HUMAN else ticket
        if version.author != HUMAN:  # its author's code runs: refused if its circuit is open
            self.breakers.refuse_if_open(version.author, ctx.op, via=f"tool {version.name}")
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

    def _fresh_instance(self, version: ToolVersion) -> Callable[..., Any]:
        """The tool's function in a new instance of its module, for one foreign call.

        Its module-level code runs again (under the call's authority), so what
        the tool keeps in module state neither comes from its author's calls nor
        outlives this one: nothing passes between principals through it.
        """
        key = (version.name, version.version)
        label = _tool_label(version.author, version.name, version.version)
        code = self._tool_code.get(key)
        if code is None:
            code = compile_agent(version.source or "", principal=version.author,
                                 filename=f"{AGENT_FILENAME_PREFIX}{label}>")
            self._tool_code[key] = code
        function = _module_instance(code, version.author, label).get(version.name)
        if not callable(function):
            raise UsageError(f"tool {version.name!r} no longer defines its function")
        return function  # type: ignore[no-any-return]

    def call_as_human(self, name: object, arguments: dict[str, object]) -> object:
        return self.call_as(HUMAN, name, arguments)

    def call_as(self, principal: str, name: object, arguments: dict[str, object]) -> object:
        """Call a tool as ``principal`` (checking its grants), inside the current op."""
        op = self._op()
        if principal != HUMAN:
            self.registry.principal(principal)
            self.breakers.admit(principal, op,
                                lambda: fingerprint("tool", repr(name)[:200], arguments))
            op.touch(namespace_key(principal), REGISTRY)
        with self._running(principal, op) as ctx:
            return self.call(ctx, name, arguments)

    def _pinned(self, ctx: RunContext, name: object) -> ToolVersion:
        pins = ctx.op.facts.get("tools", {})
        registry = self.registry
        if type(name) is str and name in pins:
            number = pins[name]
            pinned: ToolVersion = registry.tools[name][number - 1]
            return pinned
        version = registry.tool_version(name, before_op=ctx.op.id)
        ctx.op.facts.setdefault("tools", {})[version.name] = version.version
        return version


    # -- events ---------------------------------------------------------------------------

    def _principal(self) -> str | None:
        ctx = context.running()
        return None if ctx is None else ctx.principal

    def _authorize_event(self, principal: str, kind: str, target: str) -> None:
        ctx = context.running()
        if ctx is None or ctx.principal != principal:
            raise UsageError(f"events are checked against {principal!r}'s grants only while "
                             "its code runs")
        self._require(ctx, kind, target)

    def _run_subscriber(self, principal: str, handler: Callable[..., Any], event: Any) -> None:
        """Run an in-image subscriber as its own principal, inside the running op."""
        op = self._op()
        outer = context.running()
        if principal == HUMAN:
            token = context.suspend()  # trusted code: not under the emitter's authority
            try:
                handler(event)
            finally:
                context.leave(token)
            return
        self.registry.principal(principal)
        trip = self.breakers.circuit(principal)
        if trip is not None and not self.breakers.replaying:
            # Not run, and the emitter's op goes on: refusing it would let a tripped
            # agent veto every op that emits what it subscribed to.  Recorded instead.
            skipped = op.facts.setdefault("circuit_skipped", [])
            if len(skipped) < 20:
                skipped.append({"agent": principal, "policy": trip.policy,
                                "topic": str(event.get("topic") if isinstance(event, dict)
                                             else getattr(event, "topic", ""))[:200],
                                "tripped_op": trip.op})
            return
        op.touch(namespace_key(principal), REGISTRY)
        if outer is None:
            with self._running(principal, op):
                handler(event)
            return
        # Already under a supervisor (an agent emitted): switch principal only.
        inner = RunContext(runtime=self, principal=principal, op=op, limits=outer.limits,
                           output=outer.output, depth=outer.depth + 1)
        token = context.enter(inner)
        try:
            handler(event)
        finally:
            outer.denials += inner.denials
            context.leave(token)

    def emit(self, ctx: RunContext, topic: object, payload: object) -> None:
        try:
            plain = to_host(payload)
            if ctx.foreign() is not None and type(topic) is str:
                self._require(ctx, "emit", topic)  # the bus checks only the principal
            self.events.emit(topic, plain, principal=ctx.principal)
        except (EventError, BoundaryError) as error:
            raise self._invalid(ctx, error) from None

    def subscribe(self, ctx: RunContext, pattern: object, handler: object) -> object:
        self._on_own_behalf(ctx, "subscribe")
        try:
            check_bounded({"the handler": handler},
                          what=f"a subscriber of {ctx.principal!r}")
        except BoundaryError as error:
            raise self._invalid(ctx, error) from None
        try:
            return self.events.subscribe(pattern, handler, principal=ctx.principal)
        except EventError as error:
            raise self._invalid(ctx, error) from None

    def unsubscribe(self, ctx: RunContext, subscription_id: object) -> None:
        self._on_own_behalf(ctx, "unsubscribe")
        try:
            self.events.unsubscribe(subscription_id, principal=ctx.principal)
        except UsageError as error:
            raise self._invalid(ctx, error) from None

    # -- LLM calls (see kernos.llm) -------------------------------------------------------
    #
    # Who may call: an agent needs an active ``llm:MODEL`` (or ``llm:*``) grant; the
    # human needs none.  What limits a call, all checked before it (its worst case)
    # and after (what it used), against the ledger in ``<workspace>/llm/``, never
    # against the image (whose ``used`` rolls back with a failed op):
    #
    # * tokens, per principal: the ``llm`` grant's limit, for it and every grant it
    #   was derived from (a delegated budget spends from the whole chain);
    # * USD, per principal: if the agent holds a ``spend:USD`` grant, a call's cost
    #   is charged to it (and its chain) too; its remaining amount is its limit less
    #   what ``spend()`` used in the image and what LLM calls cost in the ledger;
    # * tokens and USD, per op: ``Limits.llm_tokens`` and ``Limits.llm_micro_usd``.
    #
    # Any LLM error inside an op vetoes it: the op rolls back even if agent code
    # caught the error, and its audit record lists the calls and says why.
    #
    # Embeddings (``embed_texts``, the memory service's way to a model) are checked
    # and budgeted the same way (``_llm_grants``, ``_llm_budgets``), but may also be
    # asked outside an op (a harness or MCP read): then there is no op limit, no
    # journal, and only the principal's ledger key is charged.

    def llm_client(self) -> LlmClient:
        """The client over this image's ``<workspace>/llm/`` store (made on first use)."""
        from kernos.llm import LlmClient, LlmStore

        if self._llm is None:
            workspace = self.image.workspace
            self._llm = LlmClient(LlmStore(workspace.path, durable=workspace.durable,
                                           keyring=self.llm_keyring or self.image.audit.keyring))
        return self._llm

    def llm(self, ctx: RunContext, model: object, messages: object,
            params: dict[str, object]) -> object:
        """Call ``model`` as ``ctx.principal``; plain data for agent code."""
        from kernos.errors import LLMRequestInvalid
        from kernos.llm import build_request

        authority = ctx.authority()
        if not authority:  # the human's own code (no agent-written tool running)
            return self.llm_as_human(model, messages, params).to_plain()
        if type(model) is not str:
            raise self._invalid(ctx, LLMRequestInvalid("llm() takes a model name (a str)"))
        assert isinstance(model, str)
        grants = self._llm_grants(ctx, authority, model)
        try:
            plain = to_host(params)
            tools = _split_tools(plain, lambda name: self._llm_tool(ctx, name))
            request = build_request(model, to_host(messages), plain, tools=tools)
        except (LLMRequestInvalid, BoundaryError) as error:
            raise self._invalid(ctx, error) from None
        budgets = self._llm_budgets(grants, authority, ctx.op, ctx.limits)
        completion = self._llm_complete(ctx.op, ctx.principal, request, budgets,
                                        timeout=float(ctx.limits.seconds))
        return to_agent(completion.to_plain())

    def _llm_grants(self, ctx: RunContext | None, authority: list[str], model: str,
                    ) -> list[Grant]:
        """The ``llm:MODEL`` grant of each of ``authority``; a denial (through ``ctx``, which
        vetoes its op) for the first that holds none."""
        registry = self.registry
        grants: list[Grant] = []
        for principal in authority:  # inside an agent-written tool, its author's too
            found = registry.find(principal, "llm", model)
            if found is None:
                if ctx is None:  # outside any op: nothing to veto or record it in
                    raise CapabilityDenied(principal, f"llm:{model[:80]}")
                raise self.deny(ctx, f"llm:{model[:80]}", detail=_bounded_by(ctx, principal))
            grants.append(found)
        return grants

    def _llm_budgets(self, grants: list[Grant], authority: list[str], op: Op | None,
                     limits: Limits | None) -> list[Budget]:
        """Every limit an agent's LLM call (completion or embedding) must stay within (see
        above): its grants' chains, its ``spend:USD`` chains, and the op's limits (in an op).
        The grants are noted as used by ``op``."""
        from kernos.llm import Budget

        registry = self.registry
        budgets: list[Budget] = []
        for link in self._chains(grants):
            if op is not None:
                op.grants_used[link.id] = link.capability
            assert link.limit is not None
            budgets.append(Budget(key=_llm_key(link), tokens=int(link.limit),
                                  label=f"grant {link.id} ({link.capability}) of "
                                        f"{link.principal}"))
        for principal in authority:
            money = registry.find(principal, "spend", "USD")
            if money is None:
                continue
            for link in self._chain(money):
                if op is not None:
                    op.grants_used[link.id] = link.capability
                assert link.remaining is not None
                budgets.append(Budget(key="cost:" + _llm_key(link).partition(":")[2],
                                      cost=link.remaining, label=f"grant {link.id} "
                                      f"({link.capability}) of {link.principal}"))
        if op is not None and limits is not None:
            budgets.append(Budget(key=f"op:{op.id}", label=f"op {op.id}",
                                  tokens=limits.llm_tokens,
                                  cost=decimal.Decimal(limits.llm_micro_usd).scaleb(-6)))
        return budgets

    def llm_as_human(self, model: object, messages: object, params: dict[str, object], *,
                     mode: object = None) -> Completion:
        """Call ``model`` as the human, in the current op: recorded, no grant or budget."""
        from kernos.llm import Mode, build_request

        op = self._op()
        plain = dict(params)
        tools = _split_tools(plain, lambda name: _tool_spec(
            self.registry.tool_version(name, before_op=op.id)))
        request = build_request(model, messages, plain, tools=tools)
        chosen = None if mode is None else Mode(mode)
        return self._llm_complete(op, HUMAN, request, [], mode=chosen)

    def _llm_complete(self, op: Op, principal: str, request: Request,
                      budgets: list[Budget], *, timeout: float | None = None,
                      mode: Any = None) -> Completion:
        from kernos.errors import LLMError

        try:
            return self.llm_client().complete(
                request, principal=principal, op=op.id, budgets=budgets,
                charge=[f"principal:{principal}", f"op:{op.id}"], journal=op.llm_calls,
                mode=mode, timeout=timeout)
        except LLMError as error:
            _veto_for(op, error)
            raise

    def embed_texts(self, principal: str, model: str, texts: list[str], *,
                    params: dict[str, Any] | None = None) -> list[list[float]]:
        """The vector of each of ``texts`` by ``model``, asked for ``principal``: the memory
        service's way to a model (``memory.embed``).

        Recorded and budgeted like :meth:`llm` (a text already recorded is answered
        from its recording free of charge, see :mod:`kernos.llm`): an agent needs an
        active ``llm:MODEL`` (or ``llm:*``) grant and spends from the same budgets; the
        human needs none and has none.  Inside an op the calls are in its audit record
        and any LLM error vetoes it; outside one (a harness or MCP read) they are
        charged to the principal alone.  At most :data:`MAX_EMBED_TEXTS` texts.
        """
        from kernos.errors import LLMError, LLMRequestInvalid
        from kernos.llm import build_embedding_request

        if type(principal) is not str or type(model) is not str:
            raise UsageError("embed_texts() takes a principal and a model name (str)")
        if type(texts) is not list or len(texts) > MAX_EMBED_TEXTS:
            raise UsageError(f"embed_texts() takes a list of at most {MAX_EMBED_TEXTS} texts, "
                             f"not {_counted(texts)}; embed more in several calls")
        op = self.image.current
        ctx: RunContext | None = None
        authority: list[str] = []
        grants: list[Grant] = []
        limits: Limits | None = None
        if principal != HUMAN:
            self.registry.principal(principal)  # UnknownAgent: no one of that name
            running = context.running()
            if running is not None and running.op is op and running.principal == principal:
                ctx, authority, limits = running, running.authority(), running.limits
            else:  # for an agent, from host code (the human recalls as it, say)
                authority, limits = [principal], self.limits_for(principal)
                if op is not None:  # its denial is noted on the op and vetoes it
                    ctx = RunContext(runtime=self, principal=principal, op=op, limits=limits,
                                     output=BoundedOutput(0))
            grants = self._llm_grants(ctx, authority, model)
        try:
            requests = [build_embedding_request(model, text, params) for text in texts]
        except LLMRequestInvalid as error:
            if ctx is not None:
                raise self._invalid(ctx, error) from None
            raise
        budgets = self._llm_budgets(grants, authority, op, limits) if authority else []
        try:
            found = self.llm_client().embed(
                requests, principal=principal, op=None if op is None else op.id,
                budgets=budgets,
                charge=[f"principal:{principal}", *([] if op is None else [f"op:{op.id}"])],
                journal=None if op is None else op.llm_calls,
                timeout=None if limits is None else float(limits.seconds))
        except LLMError as error:
            if op is not None:
                _veto_for(op, error)
            raise
        return [list(embedding.vector) for embedding in found]

    def _llm_tool(self, ctx: RunContext, name: str) -> dict[str, Any]:
        """A registered tool offered to a model: the caller must be able to call it."""
        version = self._pinned(ctx, name)
        kind, target = parse_capability(version.capability)
        self._require(ctx, kind, target, exempt=version.author)
        return _tool_spec(version)

    def _chains(self, grants: list[Grant]) -> list[Grant]:
        """Every grant of each one's chain, each once (an author's and a caller's may meet)."""
        return list({id(link): link for grant in grants for link in self._chain(grant)}.values())

    def _chain(self, grant: Grant) -> list[Grant]:
        chain = [grant]
        while chain[-1].parent is not None:
            chain.append(self.registry.grants[chain[-1].parent])
        return chain

    def _llm_ledger_spent(self, key: str) -> Spent | None:
        """What the ledger charged ``key``; None if this workspace never made a call."""
        from kernos.llm import LEDGER_FILE

        if self._llm is None and not (self.image.workspace.path / LEDGER_FILE).exists():
            return None
        return self.llm_client().store.ledger.spent(key)

    def _llm_cost_spent(self, grant: Grant) -> decimal.Decimal:
        spent = self._llm_ledger_spent("cost:" + _llm_key(grant).partition(":")[2])
        return decimal.Decimal(0) if spent is None else spent.cost

    def _llm_described(self, grant: Grant) -> dict[str, object]:
        """``grant.describe()``, with an ``llm`` grant's use taken from the ledger."""
        described = grant.describe()
        if grant.kind == "llm" and grant.limit is not None:
            spent = self._llm_ledger_spent(_llm_key(grant))
            if spent is not None:
                described["used"] = str(spent.tokens)
                described["remaining"] = str(amounts.subtract(grant.limit, spent.tokens))
        return described

    def _llm_warm(self, principal: str) -> None:
        """Import litellm before an agent that may call it starts its deadline (it is slow);
        for an agent that may recall, open the memory index too."""
        held = [grant for grant in self.registry.of(principal) if grant.active]
        if any(grant.kind == "llm" for grant in held):
            from kernos.llm import _provider

            with contextlib.suppress(KernosError):  # no litellm: its first call says so
                _provider.warm()
        if any(grant.capability == "memory:read" for grant in held):  # context() counts
            from kernos.memory import context as memory_context  # with litellm's counter

            memory_context.warm()
            if self.memory.replaying is None:  # a replay answers from the records
                self.memory.index()  # opened (or rebuilt) and caught up before the deadline


def _tool_label(author: str, name: object, version: int) -> str:
    """How an agent-written tool's module is named (its code's file name is built on it)."""
    return f"{author}:tool:{name}:v{version}"


def _module_instance(code: Any, author: str, label: str) -> AgentNamespace:
    """A new instance of an agent-written tool's module: its code run in fresh globals."""
    namespace = AgentNamespace(author, label=label)
    exec(code, namespace)
    namespace.pop("_print", None)  # RestrictedPython's per-run print target
    return namespace


def _bounded_by(ctx: RunContext, principal: str) -> str:
    """Why ``principal``'s grants count in a check of ``ctx.principal``'s, if they do."""
    if principal == ctx.principal:
        return ""
    return (f"inside a tool {principal!r} wrote, {principal!r}'s grants bound it too, and "
            f"{principal!r} does not hold it")


def _bounded_args(args: tuple[object, ...]) -> str:
    shown = reprlib.Repr()
    shown.maxlevel, shown.maxstring, shown.maxother = 3, 200, 60
    text = ", ".join(arg if type(arg) is str else shown.repr(arg)
                     for arg in args[:3])
    return text[:1000]


def _check_arguments(version: ToolVersion, arguments: dict[str, object]) -> None:
    check_arguments(version.name, version.schema, arguments)


def _veto_for(op: Op, error: KernosError) -> None:
    """An LLM call failed inside ``op``: it rolls back (a budget's refusal is a veto)."""
    from kernos.errors import LLMBudgetExceeded

    status = "vetoed" if isinstance(error, LLMBudgetExceeded) else "failed"
    op.veto(f"{type(error).__name__}: {str(error)[:300]}", status=status)


def _counted(texts: object) -> str:
    if type(texts) is list:
        assert isinstance(texts, list)
        return f"{len(texts):,} of them"
    return f"a {type(texts).__name__}"


def _llm_key(grant: Grant) -> str:
    """The ledger key of a grant: ids are reused after a rollback, the op that made it not."""
    return f"grant:{grant.id}@{grant.op}"


def _tool_spec(version: ToolVersion) -> dict[str, Any]:
    return {"type": "function", "function": {"name": version.name,
                                             "description": version.description,
                                             "parameters": version.schema}}


def _split_tools(params: dict[str, Any],
                 resolve: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Resolve the tool *names* in ``params["tools"]`` (registered tools); specs stay there."""
    from kernos.errors import LLMRequestInvalid

    offered = params.pop("tools", None)
    if offered is None:
        return []
    if type(offered) not in (list, tuple):
        raise LLMRequestInvalid("tools must be a list of tool names or function specs")
    specs = [item for item in offered if type(item) is not str]
    if specs:
        params["tools"] = specs
    return [resolve(item) for item in offered if type(item) is str]
