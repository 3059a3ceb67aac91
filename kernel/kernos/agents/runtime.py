"""The agent runtime: runs principals' code and tools inside the image's ops.

One :class:`AgentRuntime` belongs to one :class:`~kernos.image.Image`.  It
keeps *no* state of its own that outlives an op: the registry
(``kernos:agents``) and every agent's namespace (``kernos:ns:NAME``) live in
the image, so they commit, roll back and restore with it, and the runtime
looks them up afresh on every call (a rollback may have replaced them).
Denials and the grants used are noted on the op, and so reach its audit
record (``kernos.audit``), committed or not.

Here: the human's operations, running agent code, denials, and the calls
from agent code on grants and the image.  The image names it keeps (the
registry's, each agent's namespace) are :mod:`kernos.agents.namespace`.  Its
seams live in modules below it, each with its contract in its docstring, and
the runtime composes them and delegates to them the names other modules call:

* ``_tools``: tools defined, pinned per op and called (:attr:`AgentRuntime.toolbox`);
* ``_llm``: LLM calls and embeddings, granted and budgeted (:attr:`AgentRuntime.models`);
* ``_events``: agents on the event bus (:attr:`AgentRuntime.events`), which
  runs an agent's subscriber as that agent;
* ``_memory``: agent code's ``recall``, ``remember`` and ``context``;
* ``supervisor``: the circuit breakers (:attr:`AgentRuntime.breakers`).

The seams know the runtime only as :class:`kernos.agents.context.Runtime`, the
protocol it implements (its public checks: ``current_op``, ``require``,
``deny``, ``invalid``, ``on_own_behalf``, ``running``, ``mutable_registry``),
never this module: arrows point down.

Every mutation goes through the op that is running (``image.current``); the
runtime tells the op which runtime names it changed (``op.touch``), and
vetoes the op (``op.veto``) on a denial or a breached limit, so the op rolls
back at commit even if agent code caught the error.
"""

from __future__ import annotations

import contextlib
import reprlib
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernos import amounts
from kernos._time import utc_now
from kernos.agents import _events, context
from kernos.agents._llm import Models
from kernos.agents._tools import Toolbox
from kernos.agents.boundary import ObjectView, to_agent, to_host
from kernos.agents.capabilities import Grant, amount
from kernos.agents.context import BoundedOutput, RunContext
from kernos.agents.limits import AGENT_FILENAME_PREFIX, LimitExceeded, Limits, Supervisor
from kernos.agents.namespace import (
    REGISTRY,
    AgentNamespace,
    namespace_key,
    namespace_of,
    rebuild_namespace,
)
from kernos.agents.policy import compile_agent, compile_agent_with_value
from kernos.agents.registry import HUMAN, Registry, shown
from kernos.agents.supervisor import Breakers, fingerprint
from kernos.effects import EffectRunner
from kernos.errors import (
    BoundaryError,
    CapabilityDenied,
    InvalidGrant,
    KernosError,
    OpVetoed,
    UnknownAgent,
    UsageError,
)
from kernos.image import Image
from kernos.op import Op

if TYPE_CHECKING:
    from kernos.llm import Completion, LlmClient
    from kernos.memory.service import ImageMemory
    from kernos.personal import Keyring

__all__ = ["REGISTRY", "AgentNamespace", "AgentRuntime", "RunResult", "namespace_key",
           "rebuild_namespace"]

MAX_DENIALS_LOGGED = 20
"""Denials recorded per run; more are counted, and the op is vetoed anyway."""


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
        self.models = Models(self)
        """LLM calls and embeddings, granted and budgeted (see kernos.agents._llm)."""
        self.toolbox = Toolbox(self)
        """Tools defined, pinned and called (see kernos.agents._tools)."""
        self.events = _events.bus_for(self)
        """The image's event bus, which runs an agent's subscriber as that agent."""
        self.effects = EffectRunner(self)
        """Executes external effects after their op commits (see kernos.effects)."""
        self._breakers: Breakers | None = None
        self._memory: ImageMemory | None = None

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

    def mutable_registry(self, op: Op) -> Registry:
        found = self.image.system.get(REGISTRY)
        if not isinstance(found, Registry):
            found = Registry()
            self.image.bind(REGISTRY, found)
        op.touch(REGISTRY)
        return found

    def current_op(self) -> Op:
        op = self.image.current
        if op is None:
            raise UsageError("the agent runtime changes the image only inside an op: run "
                             "this from a cell (or an op started with image.begin())")
        return op

    def namespace(self, agent: str) -> AgentNamespace:
        return namespace_of(self.image, self.registry, agent)

    def limits_for(self, principal: str) -> Limits:
        if principal == HUMAN:
            return self.default_limits
        return self.default_limits.with_overrides(self.registry.principal(principal).limits)

    # -- the human's operations --------------------------------------------------------

    def add_agent(self, name: object, *, parent: str = HUMAN,
                  limits: dict[str, int] | None = None) -> str:
        limits = dict(limits or {})
        op = self.current_op()
        registry = self.mutable_registry(op)
        self.default_limits.with_overrides(limits)  # validate before anything changes
        principal = registry.add_agent(name, parent=parent, op=op.id)
        principal.limits = dict(limits)
        self.image.bind(namespace_key(principal.name), AgentNamespace(principal.name))
        op.touch(namespace_key(principal.name))
        return principal.name

    def set_limits(self, agent: str, **limits: int) -> Limits:
        op = self.current_op()
        principal = self.mutable_registry(op).principal(agent)
        merged = {**principal.limits, **limits}
        result = self.default_limits.with_overrides(merged)
        principal.limits = merged
        return result

    def grant(self, agent: str, capability: object, limit: object = None, *,
              granter: str = HUMAN) -> dict[str, object]:
        op = self.current_op()
        registry = self.mutable_registry(op)
        if granter != HUMAN:
            raise CapabilityDenied(granter, shown(capability),
                                   detail="only the human grants directly; agents delegate")
        return registry.grant(agent, capability, limit=limit, granter=granter,
                              op=op.id).describe()

    def revoke(self, agent: str, capability_or_id: object) -> list[str]:
        """Revoke grants (by capability or id) and all grants derived from them."""
        op = self.current_op()
        registry = self.mutable_registry(op)
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
        return [self.models.described(grant) for grant in registry.of(agent)]

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
        op = self.current_op()
        version = self.mutable_registry(op).define_tool(
            name=name, function=function, schema=schema, description=description,
            effect=effect, author=HUMAN, op=op.id, capability=capability, resolve=resolve,
            attempts=attempts, backoff=backoff, timeout=timeout)
        return version.describe()

    def resolve_effect(self, key: object, *, executed: object,
                       result: object = None) -> dict[str, Any]:
        """Answer for an in-doubt effect (the human only); the next drain records it."""
        return self.effects.resolve(self.current_op(), key, executed=executed, result=result)

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
        op = self.current_op()
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
        self.models.warm(principal)
        started = time.perf_counter()
        value: object = None
        output = ""
        try:
            with self.running(principal, op) as ctx:
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
            text = source if filename == cell else self.toolbox.source_of(filename)
            shown.append(f'  File "{filename}", line {line}, in {frame.f_code.co_name}')
            lines = text.splitlines()
            if 0 < line <= len(lines) and lines[line - 1].strip():
                shown.append(f"    {lines[line - 1].strip()[:200]}")
        message = str(error)
        shown.append(f"{type(error).__name__}: {message[:2000]}" if message
                     else type(error).__name__)
        return shown

    @contextlib.contextmanager
    def running(self, principal: str, op: Op) -> Iterator[RunContext]:
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

    def require(self, ctx: RunContext, kind: str, target: str, *,
                 exempt: str | None = None) -> None:
        """Every principal of ``ctx.authority()`` (but ``exempt``) must hold ``kind:target``."""
        for principal in ctx.authority():
            if principal == exempt:
                continue
            grant = self.registry.find(principal, kind, target)
            if grant is None:
                raise self.deny(ctx, f"{kind}:{target}", detail=ctx.bounded_by(principal))
            ctx.op.grants_used[grant.id] = grant.capability

    def on_own_behalf(self, ctx: RunContext, action: str) -> None:
        """Refuse ``action`` inside a tool another agent wrote: it would act for the caller."""
        author = ctx.foreign()
        if author is not None:
            raise self.invalid(ctx, UsageError(
                f"a tool {author!r} wrote cannot {action} on its caller's behalf"))

    def refused(self, ctx: RunContext, error: KernosError) -> KernosError:
        """A Kernos call from agent code raised ``error``: its op must not commit.

        A denial (or a malformed request, :meth:`invalid`) vetoed the op
        already; any other refusal (a bad spawn name, a tool definition or an LLM
        request that was not accepted) is recorded and vetoes it here.  Returns
        the error as the agent may see it (:meth:`Registry.as_seen_by
        <kernos.agents.registry.Registry.as_seen_by>`).
        """
        if not ctx.op.vetoes:
            self.deny(ctx, "a request Kernos refused",
                      detail=f"{type(error).__name__}: {str(error)[:200]}")
        return self.registry.as_seen_by(ctx.authority(), error)

    def invalid(self, ctx: RunContext, error: KernosError) -> KernosError:
        """A malformed request from agent code counts as a denial too."""
        self.deny(ctx, "a well-formed request", detail=str(error)[:200])
        return error

    # -- calls from agent code (see kernos.agents.api) -----------------------------------

    def read(self, ctx: RunContext, name: object) -> ObjectView:
        if type(name) is not str:
            raise self.invalid(ctx, BoundaryError("read() takes a name (a str)"))
        self.require(ctx, "read", name)
        if name not in self.image.namespace or not self._is_human_name(name):
            raise KeyError(f"there is no {name!r} to read")
        return ObjectView(name)

    def write(self, ctx: RunContext, name: object, value: object) -> None:
        if (type(name) is not str or not name.isidentifier() or name.startswith("_")
                or not self._is_human_name(name)):
            raise self.invalid(ctx, BoundaryError("write() takes an identifier (a str)"))
        assert isinstance(name, str)
        self.require(ctx, "write", name)
        self.image.namespace[name] = to_host(value)
        ctx.op.touch(name)

    def resolve_view(self, ctx: RunContext, name: str, path: tuple[tuple[str, object], ...],
                     *, write: bool) -> object:
        self.require(ctx, "write" if write else "read", name)
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
            raise self.invalid(ctx, InvalidGrant("spend() takes a unit (a str)"))
        try:
            checked = amount(value)
        except InvalidGrant as error:
            raise self.invalid(ctx, error) from None
        registry = self.mutable_registry(ctx.op)
        # A derived grant spends from every grant it was derived from, so
        # delegating cannot multiply a budget; inside a tool an agent wrote, the
        # author's budget is spent too, so a tool never spends more than its author.
        grants: list[Grant] = []
        for principal in ctx.authority():
            grant = registry.find(principal, "spend", unit)
            if grant is None:
                raise self.deny(ctx, f"spend:{unit}", detail=ctx.bounded_by(principal))
            grants.append(grant)
        chain = registry.chains(grants)
        for link in chain:
            remaining = link.remaining
            assert remaining is not None
            remaining = amounts.subtract(remaining, self.models.cost_spent(link))
            if checked > remaining:
                raise self.deny(ctx, f"spend:{unit}",
                                detail=f"{checked} asked, {remaining} left of grant {link.id}")
        for link in chain:
            link.used = amounts.add(link.used, checked)
            ctx.op.grants_used[link.id] = link.capability
        return min(amounts.subtract(link.remaining, self.models.cost_spent(link))
                   for link in chain if link.remaining is not None)

    def my_grants(self, ctx: RunContext) -> list[object]:
        return [to_agent(self.models.described(grant))
                for grant in self.registry.of(ctx.principal) if grant.active]

    def delegate(self, ctx: RunContext, grant_id: object, to: object,
                 limit: object = None) -> object:
        self.on_own_behalf(ctx, "delegate grants")
        registry = self.mutable_registry(ctx.op)
        try:
            grant = registry.attenuate(ctx.principal, grant_id, to, limit=limit, op=ctx.op.id)
        except CapabilityDenied as denied:
            raise self.deny(ctx, denied.capability, detail=denied.detail) from None
        except (InvalidGrant, UnknownAgent) as error:
            raise self.invalid(ctx, error) from None
        return to_agent(grant.describe())

    def revoke_delegated(self, ctx: RunContext, grant_id: object) -> list[object]:
        self.on_own_behalf(ctx, "revoke grants")
        registry = self.mutable_registry(ctx.op)
        grant = registry.grants.get(grant_id) if type(grant_id) is str else None
        if grant is None or grant.granted_by != ctx.principal:
            raise self.deny(ctx, f"revoke {shown(grant_id)}",
                            detail="agents revoke only the grants they delegated")
        return [g.id for g in registry.revoke(grant, op=ctx.op.id)]

    def spawn(self, ctx: RunContext, name: object) -> object:
        self.on_own_behalf(ctx, "spawn agents")
        self.require(ctx, "agents", "spawn")
        if type(name) is not str:
            raise self.invalid(ctx, InvalidGrant("spawn() takes a name (a str)"))
        return self.add_agent(f"{ctx.principal}/{name}", parent=ctx.principal)

    # -- tools (see kernos.agents._tools) ---------------------------------------------------

    def define_tool(self, ctx: RunContext, name: object, source: object, schema: object,
                    description: object) -> object:
        return self.toolbox.define(ctx, name, source, schema, description)

    def call(self, ctx: RunContext, name: object, arguments: dict[str, object]) -> object:
        """Call a tool as ``ctx.principal``, with the version pinned for this op."""
        return self.toolbox.call(ctx, name, arguments)

    def call_as_human(self, name: object, arguments: dict[str, object]) -> object:
        return self.toolbox.call_as(HUMAN, name, arguments)

    def call_as(self, principal: str, name: object, arguments: dict[str, object]) -> object:
        """Call a tool as ``principal`` (checking its grants), inside the current op."""
        return self.toolbox.call_as(principal, name, arguments)


    # -- events (see kernos.agents._events) -------------------------------------------------

    def emit(self, ctx: RunContext, topic: object, payload: object) -> None:
        _events.emit(self, ctx, topic, payload)

    def subscribe(self, ctx: RunContext, pattern: object, handler: object) -> object:
        return _events.subscribe(self, ctx, pattern, handler)

    def unsubscribe(self, ctx: RunContext, subscription_id: object) -> None:
        _events.unsubscribe(self, ctx, subscription_id)

    # -- LLM calls and embeddings (see kernos.agents._llm) ----------------------------------

    @property
    def llm_keyring(self) -> Keyring | None:
        """The keys the LLM recordings are sealed and opened with (default: the image's;
        a replay opens the source's recordings with the source's)."""
        return self.models.keyring

    @llm_keyring.setter
    def llm_keyring(self, keyring: Keyring | None) -> None:
        self.models.keyring = keyring

    def llm_client(self) -> LlmClient:
        """The client over this image's ``<workspace>/llm/`` store (made on first use)."""
        return self.models.client()

    def llm(self, ctx: RunContext, model: object, messages: object,
            params: dict[str, object]) -> object:
        """Call ``model`` as ``ctx.principal``; plain data for agent code."""
        return self.models.call(ctx, model, messages, params)

    def llm_as_human(self, model: object, messages: object, params: dict[str, object], *,
                     mode: object = None) -> Completion:
        """Call ``model`` as the human, in the current op: recorded, no grant or budget."""
        return self.models.as_human(model, messages, params, mode=mode)

    def embed_texts(self, principal: str, model: str, texts: list[str], *,
                    params: dict[str, Any] | None = None) -> list[list[float]]:
        """The vector of each of ``texts`` by ``model``, asked for ``principal``: the memory
        service's way to a model (``memory.embed``); see :meth:`Models.embed
        <kernos.agents._llm.Models.embed>`."""
        return self.models.embed(principal, model, texts, params=params)



def _bounded_args(args: tuple[object, ...]) -> str:
    shown = reprlib.Repr()
    shown.maxlevel, shown.maxstring, shown.maxother = 3, 200, 60
    text = ", ".join(arg if type(arg) is str else shown.repr(arg)
                     for arg in args[:3])
    return text[:1000]
