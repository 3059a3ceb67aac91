"""LLM calls and embeddings for the agent runtime (see kernos.llm): :class:`Models`.

One :class:`Models` belongs to one :class:`~kernos.agents.runtime.AgentRuntime`
(``runtime.models``), which delegates to it the names other modules call
(``llm``, ``llm_as_human``, ``embed_texts``, ``llm_client``, ``llm_keyring``).
It knows the runtime only as :class:`kernos.agents.context.Runtime`.

Who may call: an agent needs an active ``llm:MODEL`` (or ``llm:*``) grant
(inside a tool another agent wrote, its author needs one too); the human needs
none.  What limits a call, all checked before it (its worst case) and after
(what it used), against the ledger in ``<workspace>/llm/``, never against the
image (whose ``used`` rolls back with a failed op):

* tokens, per principal: the ``llm`` grant's limit, for it and every grant it
  was derived from (a delegated budget spends from the whole chain);
* USD, per principal: if the agent holds a ``spend:USD`` grant, a call's cost
  is charged to it (and its chain) too; its remaining amount is its limit less
  what ``spend()`` used in the image and what LLM calls cost in the ledger;
* tokens and USD, per op: ``Limits.llm_tokens`` and ``Limits.llm_micro_usd``.

Any LLM error inside an op vetoes it: the op rolls back even if agent code
caught the error, and its audit record lists the calls and says why.  A
missing grant or a malformed request is a denial (noted on the op, which it
vetoes) like any other.

Embeddings (:meth:`Models.embed`, the memory service's way to a model) are
checked and budgeted the same way, but may also be asked outside an op (a
harness or MCP read): then there is no op limit, no journal, and only the
principal's ledger key is charged.
"""

from __future__ import annotations

import contextlib
import decimal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernos import amounts
from kernos.agents import context
from kernos.agents.boundary import to_agent, to_host
from kernos.agents.capabilities import parse_capability
from kernos.agents.context import BoundedOutput, RunContext
from kernos.agents.registry import HUMAN
from kernos.errors import BoundaryError, CapabilityDenied, KernosError, UsageError

if TYPE_CHECKING:
    from kernos.agents.capabilities import Grant
    from kernos.agents.context import Runtime
    from kernos.agents.limits import Limits
    from kernos.agents.registry import ToolVersion
    from kernos.llm import Budget, Completion, LlmClient, Request, Spent
    from kernos.op import Op
    from kernos.personal import Keyring

__all__ = ["MAX_EMBED_TEXTS", "Models"]

MAX_EMBED_TEXTS = 256
"""The most texts one :meth:`Models.embed` call embeds."""


class Models:
    """The runtime's way to models: LLM completions and embeddings, granted and budgeted."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.keyring: Keyring | None = None
        """The keys the LLM recordings are sealed and opened with (default: the image's;
        a replay opens the source's recordings with the source's)."""
        self._client: LlmClient | None = None

    def client(self) -> LlmClient:
        """The client over this image's ``<workspace>/llm/`` store (made on first use)."""
        from kernos.llm import LlmClient, LlmStore

        if self._client is None:
            image = self.runtime.image
            workspace = image.workspace
            self._client = LlmClient(LlmStore(workspace.path, durable=workspace.durable,
                                              keyring=self.keyring or image.audit.keyring))
        return self._client

    # -- completions ----------------------------------------------------------------------

    def call(self, ctx: RunContext, model: object, messages: object,
             params: dict[str, object]) -> object:
        """Call ``model`` as ``ctx.principal``; plain data for agent code."""
        from kernos.errors import LLMRequestInvalid
        from kernos.llm import build_request

        runtime = self.runtime
        authority = ctx.authority()
        if not authority:  # the human's own code (no agent-written tool running)
            return self.as_human(model, messages, params).to_plain()
        if type(model) is not str:
            raise runtime.invalid(ctx, LLMRequestInvalid("llm() takes a model name (a str)"))
        assert isinstance(model, str)
        grants = self._grants(ctx, authority, model)
        try:
            plain = to_host(params)
            tools = _split_tools(plain, lambda name: self._offered_tool(ctx, name))
            request = build_request(model, to_host(messages), plain, tools=tools)
        except (LLMRequestInvalid, BoundaryError) as error:
            raise runtime.invalid(ctx, error) from None
        budgets = self._budgets(grants, authority, ctx.op, ctx.limits)
        completion = self._complete(ctx.op, ctx.principal, request, budgets,
                                    timeout=float(ctx.limits.seconds))
        return to_agent(completion.to_plain())

    def as_human(self, model: object, messages: object, params: dict[str, object], *,
                 mode: object = None) -> Completion:
        """Call ``model`` as the human, in the current op: recorded, no grant or budget."""
        from kernos.llm import Mode, build_request

        op = self.runtime.current_op()
        plain = dict(params)
        tools = _split_tools(plain, lambda name: _tool_spec(
            self.runtime.registry.tool_version(name, before_op=op.id)))
        request = build_request(model, messages, plain, tools=tools)
        chosen = None if mode is None else Mode(mode)
        return self._complete(op, HUMAN, request, [], mode=chosen)

    def _complete(self, op: Op, principal: str, request: Request,
                  budgets: list[Budget], *, timeout: float | None = None,
                  mode: Any = None) -> Completion:
        from kernos.errors import LLMError

        try:
            return self.client().complete(
                request, principal=principal, op=op.id, budgets=budgets,
                charge=[f"principal:{principal}", f"op:{op.id}"], journal=op.llm_calls,
                mode=mode, timeout=timeout)
        except LLMError as error:
            _veto_for(op, error)
            raise

    def _offered_tool(self, ctx: RunContext, name: str) -> dict[str, Any]:
        """A registered tool offered to a model: the caller must be able to call it."""
        version = self.runtime.toolbox.pinned(ctx, name)
        kind, target = parse_capability(version.capability)
        self.runtime.require(ctx, kind, target, exempt=version.author)
        return _tool_spec(version)

    # -- embeddings -----------------------------------------------------------------------

    def embed(self, principal: str, model: str, texts: list[str], *,
              params: dict[str, Any] | None = None) -> list[list[float]]:
        """The vector of each of ``texts`` by ``model``, asked for ``principal``: the memory
        service's way to a model (``memory.embed``).

        Recorded and budgeted like :meth:`call` (a text already recorded is answered
        from its recording free of charge, see :mod:`kernos.llm`): an agent needs an
        active ``llm:MODEL`` (or ``llm:*``) grant and spends from the same budgets; the
        human needs none and has none.  Inside an op the calls are in its audit record
        and any LLM error vetoes it; outside one (a harness or MCP read) they are
        charged to the principal alone.  At most :data:`MAX_EMBED_TEXTS` texts.
        """
        from kernos.errors import LLMError, LLMRequestInvalid
        from kernos.llm import build_embedding_request

        runtime = self.runtime
        if type(principal) is not str or type(model) is not str:
            raise UsageError("embed_texts() takes a principal and a model name (str)")
        if type(texts) is not list or len(texts) > MAX_EMBED_TEXTS:
            raise UsageError(f"embed_texts() takes a list of at most {MAX_EMBED_TEXTS} texts, "
                             f"not {_counted(texts)}; embed more in several calls")
        op = runtime.image.current
        ctx: RunContext | None = None
        authority: list[str] = []
        grants: list[Grant] = []
        limits: Limits | None = None
        if principal != HUMAN:
            runtime.registry.principal(principal)  # UnknownAgent: no one of that name
            running = context.running()
            if running is not None and running.op is op and running.principal == principal:
                ctx, authority, limits = running, running.authority(), running.limits
            else:  # for an agent, from host code (the human recalls as it, say)
                authority, limits = [principal], runtime.limits_for(principal)
                if op is not None:  # its denial is noted on the op and vetoes it
                    ctx = RunContext(runtime=runtime, principal=principal, op=op,
                                     limits=limits, output=BoundedOutput(0))
            grants = self._grants(ctx, authority, model)
        try:
            requests = [build_embedding_request(model, text, params) for text in texts]
        except LLMRequestInvalid as error:
            if ctx is not None:
                raise runtime.invalid(ctx, error) from None
            raise
        budgets = self._budgets(grants, authority, op, limits) if authority else []
        try:
            found = self.client().embed(
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

    # -- grants and budgets ---------------------------------------------------------------

    def _grants(self, ctx: RunContext | None, authority: list[str], model: str,
                ) -> list[Grant]:
        """The ``llm:MODEL`` grant of each of ``authority``; a denial (through ``ctx``, which
        vetoes its op) for the first that holds none."""
        registry = self.runtime.registry
        grants: list[Grant] = []
        for principal in authority:  # inside an agent-written tool, its author's too
            found = registry.find(principal, "llm", model)
            if found is None:
                if ctx is None:  # outside any op: nothing to veto or record it in
                    raise CapabilityDenied(principal, f"llm:{model[:80]}")
                raise self.runtime.deny(ctx, f"llm:{model[:80]}",
                                        detail=ctx.bounded_by(principal))
            grants.append(found)
        return grants

    def _budgets(self, grants: list[Grant], authority: list[str], op: Op | None,
                 limits: Limits | None) -> list[Budget]:
        """Every limit an agent's LLM call (completion or embedding) must stay within (see
        the module docstring): its grants' chains, its ``spend:USD`` chains, and the op's
        limits (in an op).  The grants are noted as used by ``op``."""
        from kernos.llm import Budget

        registry = self.runtime.registry
        budgets: list[Budget] = []
        for link in registry.chains(grants):
            if op is not None:
                op.grants_used[link.id] = link.capability
            assert link.limit is not None
            budgets.append(Budget(key=_ledger_key(link), tokens=int(link.limit),
                                  label=f"grant {link.id} ({link.capability}) of "
                                        f"{link.principal}"))
        for principal in authority:
            money = registry.find(principal, "spend", "USD")
            if money is None:
                continue
            for link in registry.chain(money):
                if op is not None:
                    op.grants_used[link.id] = link.capability
                assert link.remaining is not None
                budgets.append(Budget(key="cost:" + _ledger_key(link).partition(":")[2],
                                      cost=link.remaining, label=f"grant {link.id} "
                                      f"({link.capability}) of {link.principal}"))
        if op is not None and limits is not None:
            budgets.append(Budget(key=f"op:{op.id}", label=f"op {op.id}",
                                  tokens=limits.llm_tokens,
                                  cost=decimal.Decimal(limits.llm_micro_usd).scaleb(-6)))
        return budgets

    def _ledger_spent(self, key: str) -> Spent | None:
        """What the ledger charged ``key``; None if this workspace never made a call."""
        from kernos.llm import LEDGER_FILE

        if self._client is None and not (
                self.runtime.image.workspace.path / LEDGER_FILE).exists():
            return None
        return self.client().store.ledger.spent(key)

    def cost_spent(self, grant: Grant) -> decimal.Decimal:
        """What LLM calls cost ``grant`` (a ``spend:USD`` one) in the ledger."""
        spent = self._ledger_spent("cost:" + _ledger_key(grant).partition(":")[2])
        return decimal.Decimal(0) if spent is None else spent.cost

    def described(self, grant: Grant) -> dict[str, object]:
        """``grant.describe()``, with an ``llm`` grant's use taken from the ledger."""
        described = grant.describe()
        if grant.kind == "llm" and grant.limit is not None:
            spent = self._ledger_spent(_ledger_key(grant))
            if spent is not None:
                described["used"] = str(spent.tokens)
                described["remaining"] = str(amounts.subtract(grant.limit, spent.tokens))
        return described

    def warm(self, principal: str) -> None:
        """Import litellm before an agent that may call it starts its deadline (it is slow);
        for an agent that may recall, open the memory index too."""
        held = [grant for grant in self.runtime.registry.of(principal) if grant.active]
        if any(grant.kind == "llm" for grant in held):
            from kernos.llm import _provider

            with contextlib.suppress(KernosError):  # no litellm: its first call says so
                _provider.warm()
        if any(grant.capability == "memory:read" for grant in held):  # context() counts
            from kernos.memory import context as memory_context  # with litellm's counter

            memory_context.warm()
            memory = self.runtime.memory
            if memory.replaying is None:  # a replay answers from the records
                memory.index()  # opened (or rebuilt) and caught up before the deadline


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


def _ledger_key(grant: Grant) -> str:
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
