"""Pydantic AI on Kernos: a toolset of agent ops, and the message history in the image.

Install with ``pip install 'kernos[pydantic-ai]'`` (the ``pydantic-ai-slim``
package, imported as ``pydantic_ai``).  Both pieces talk to a real Kernos
kernel through ``kernos.client`` (a blocking :class:`KernosClient` from any
loop, ``Agent.run_sync`` included, or an :class:`AsyncKernosClient` on its
own event loop)::

    from pydantic_ai import Agent
    from kernos.integrations.pydantic_ai import KernosHistory, KernosToolset

    toolset = KernosToolset(kernos, "analyst")          # run_python + analyst's Kernos tools
    history = KernosHistory("chat-1", kernos, principal="analyst")
    agent = Agent(model, toolsets=[toolset])
    result = agent.run_sync("Mean price?", message_history=history.load_sync())
    history.save_sync(result)                            # the run's new messages: one op

**KernosToolset** is a Pydantic AI toolset (``AbstractToolset``: ``get_tools``,
``call_tool``) of one Kernos agent (never ``human``, whose code runs
unrestricted).  It offers the model:

* ``run_python`` (the name can be changed): its one argument, ``code``, runs
  as **one op of the agent** (``kernos.integrations._code``): the restricted
  dialect, in the agent's own persistent namespace (variables stay for the next
  call, and survive ``kill -9``), under its grants, limits and circuit breaker;
* every **Kernos tool** the agent may call, as the kernel lists it for that
  principal (``client.tools(principal=agent)``: the tools it holds ``call:``
  grants for, and those it wrote), with the tool's own JSON schema and
  description.  The list is asked for at every step of a run, so a grant or a
  revocation takes effect at the next model request.  Each call is **one op of
  the agent** (the harness ``op`` request with ``tool``): the kernel checks the
  grant again when the call runs, so a call refused there (a grant revoked after
  the list was made) is denied and its op rolled back.  A tool the agent was not
  granted is not listed, so the model cannot call it (Pydantic AI answers an
  unknown tool name with a retry prompt; no op runs).

What a call returns to the model is the answer of ``kernos.integrations._code``,
a dict that Pydantic AI sends as JSON: ``{"status", "op", "stdout", "result",
"error"}``.  Code or a tool that raised, was denied a capability (which vetoes
the op, caught or not) or breached a limit was rolled back whole; ``error``
says so, for the model to read and act on (a result, not an exception, so it
costs the model no retry).  A refusal it can act on (a circuit open, code over
the size limit) comes back the same way, as ``refused``.  A kernel that died or
a refusal the model cannot fix (an unknown agent) raises and stops the run.
``run_python`` arguments that are not ``{"code": str}`` are refused by Pydantic
AI's own validation (a retry prompt to the model; no op).  A Kernos tool named
like the code tool is an error naming both (rename one, or pass ``python_tool=``).

Each call's op carries an idempotency key of the agent, the toolset's ``scope``
(given, or the history's when the toolset is made with ``history=``) and the
model's tool-call id: a call delivered again (a resumed run whose model repeats
the id, as a recorded model does) is answered as a ``duplicate`` and does not
run again.  ``idempotent=False`` sends no key.

**KernosHistory** keeps a conversation's Pydantic AI messages in the image, as
the session requests of ``kernos.harness.session_requests`` (as the Agents
SDK's ``KernosSession`` does): each ``ModelMessage`` is stored as the JSON
object Pydantic AI's own ``ModelMessagesTypeAdapter`` dumps, and loaded back
through it, so the history is exactly what the run produced.  Pydantic AI
takes a history as ``message_history=`` and gives a run's additions as
``result.new_messages()``; so:

* ``load()`` / ``load_sync()`` return the stored messages, oldest first (a read,
  no op; ``limit`` keeps the latest ones);
* ``save(result)`` / ``save_sync(result)`` append the run's new messages as
  **one op of the principal** (``human`` unless named; usually the agent whose
  conversation it is): all of them or none, whatever dies when.  Given a run
  result, the op's idempotency key names the run (``result.run_id``), so saving
  one run twice (a retry after a lost answer) adds it once; given a list of
  messages, pass ``key=`` for the same.  An empty list runs no op;
* ``clear()`` / ``clear_sync()`` remove them (one op).

One op per run: a run is saved when it ends.  A run killed in the middle
leaves the history at the last saved run; the ops its tools committed stay
committed (they are in the log and the agent's namespace), and the resumed run
starts again from the saved history.  The stored messages commit, roll back,
restore after ``kill -9``, show in ``kernos log`` and the audit, and travel with
the history like any other name.  Pydantic AI's ``ConversationStore`` (entries
linked by id, branches, revisions) is not mapped: it needs compare-and-swap
writes the session requests do not offer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

try:
    from pydantic_ai import RunContext
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_core import SchemaValidator, core_schema
except ImportError as missing:
    raise ImportError(
        "kernos.integrations.pydantic_ai needs Pydantic AI (the pydantic-ai-slim package), "
        "an optional extra: pip install 'kernos[pydantic-ai]' "
        f"(the import failed: {missing})") from missing

from kernos.client import RequestError
from kernos.errors import UsageError
from kernos.harness.results import OpResult

from . import _code
from ._kernel import Client, Conversation, Kernel, to_the_end

__all__ = ["DEFAULT_TOOL_NAME", "KernosHistory", "KernosToolset"]

DEFAULT_TOOL_NAME = _code.TOOL_NAME
_KEY_PREFIX = "pydantic-ai:"
_SAVE_KEY_PREFIX = "pydantic-ai-history:"

_CODE_VALIDATOR = SchemaValidator(core_schema.typed_dict_schema(
    {"code": core_schema.typed_dict_field(core_schema.str_schema(min_length=1, strict=True))},
    extra_behavior="forbid"))
_ANY_ARGUMENTS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(),
                                                         core_schema.any_schema()))


class KernosHistory(Conversation):
    """A Pydantic AI conversation's messages, kept in a Kernos image (see the module docstring).

    ``KernosHistory(session_id, client, principal="analyst")``: ``session_id`` is any
    string of 1 to 200 characters; ``principal`` owns it (an agent of the image, or
    ``human``).
    """

    def __init__(self, session_id: str, client: Client, *, principal: str = "human") -> None:
        super().__init__(session_id, client, principal=principal,
                         async_way="await history.load() and await history.save(result)")

    # -- async -------------------------------------------------------------------------

    async def load(self, limit: int | None = None) -> list[ModelMessage]:
        """The stored messages, oldest first (only the latest ``limit`` with it).  No op."""
        result = await self._kernel.arequest("session_items", **self._load_fields(limit))
        return _messages_of(result["items"], self)

    async def save(self, run: AgentRunResult[Any] | Sequence[ModelMessage], *,
                   key: str | None = None) -> int | None:
        """Append a run's new messages (or ``run``, a list of messages) as one op; its op
        number (None when there was nothing to add, or the run was saved before)."""
        items, key = self._save_fields(run, key)
        if not items:
            return None
        result = await to_the_end(self._kernel.arequest("session_add", **self._fields(),
                                                       items=items, key=key))
        return None if result.get("duplicate") else result.get("op")

    async def clear(self) -> int:
        """Remove every stored message (one op, none if there are none); how many."""
        result = await to_the_end(self._kernel.arequest("session_clear", **self._fields()))
        return int(result["cleared"])

    # -- sync ----------------------------------------------------------------------------

    def load_sync(self, limit: int | None = None) -> list[ModelMessage]:
        """:meth:`load`, from sync code."""
        result = self._kernel.request("session_items", **self._load_fields(limit))
        return _messages_of(result["items"], self)

    def save_sync(self, run: AgentRunResult[Any] | Sequence[ModelMessage], *,
                  key: str | None = None) -> int | None:
        """:meth:`save`, from sync code."""
        items, key = self._save_fields(run, key)
        if not items:
            return None
        result = self._kernel.request("session_add", **self._fields(), items=items, key=key)
        return None if result.get("duplicate") else result.get("op")

    def clear_sync(self) -> int:
        """:meth:`clear`, from sync code."""
        return int(self._kernel.request("session_clear", **self._fields())["cleared"])

    # -- the stored form -------------------------------------------------------------------

    def _load_fields(self, limit: int | None) -> dict[str, Any]:
        if limit is not None and (type(limit) is not int or limit < 0):
            raise UsageError(f"limit is how many of the latest messages to load (an int >= 0, "
                             f"or None for all), not {limit!r:.40}")
        return {**self._fields(), "limit": limit}

    def _save_fields(self, run: AgentRunResult[Any] | Sequence[ModelMessage],
                     key: str | None) -> tuple[list[dict[str, Any]], str | None]:
        if isinstance(run, AgentRunResult):
            messages = run.new_messages()
            if key is None:
                key = _code.call_key(_SAVE_KEY_PREFIX, self.principal, self.session_id,
                                     str(run.run_id))
        elif isinstance(run, (list, tuple)):
            messages = list(run)
        else:
            raise UsageError(f"save takes an agent run's result (what agent.run returned) or "
                             f"a list of ModelMessage (result.new_messages()), not "
                             f"{type(run).__name__}; nothing was saved")
        if key is not None and (not isinstance(key, str) or not key
                                or len(key) > _code.MAX_KEY_CHARS):
            raise UsageError(f"key is an idempotency key of 1 to {_code.MAX_KEY_CHARS} "
                             f"characters, not {key!r:.80}; nothing was saved")
        return dump_messages(messages), key

    def __repr__(self) -> str:
        return f"KernosHistory({self.session_id!r}, principal={self.principal!r})"


def dump_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Messages as the JSON objects Pydantic AI dumps (or an error naming the bad one)."""
    for position, message in enumerate(messages):
        if getattr(message, "kind", None) not in ("request", "response"):
            raise UsageError(f"message {position} is a {type(message).__name__}, not a "
                             "Pydantic AI ModelMessage (a ModelRequest or ModelResponse, as "
                             "result.new_messages() gives); nothing was saved")
    dumped = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    return json.loads(json.dumps(dumped))  # type: ignore[no-any-return]


def _messages_of(items: list[Any], history: KernosHistory) -> list[ModelMessage]:
    try:
        return ModelMessagesTypeAdapter.validate_python(items)
    except ValueError as error:
        raise UsageError(f"the session {history.session_id!r} of {history.principal!r} holds "
                         "items that are not Pydantic AI messages (was it written by another "
                         f"framework?): {str(error)[:300]}") from None


# -- the toolset --------------------------------------------------------------------------


class KernosToolset(AbstractToolset[Any]):
    """``run_python`` and the Kernos tools of agent ``agent``, each call one op of it.

    ``python_tool``: the code tool's name (None: no code tool, only the Kernos tools).
    ``history``: the conversation the toolset serves, whose id scopes the calls'
    idempotency keys (or ``scope=``); ``idempotent=False`` sends no keys.
    ``max_retries``: how often the model may resend malformed arguments.
    """

    def __init__(self, client: Client, agent: str, *,
                 python_tool: str | None = DEFAULT_TOOL_NAME, kernos_tools: bool = True,
                 history: KernosHistory | None = None, scope: str | None = None,
                 idempotent: bool = True, max_retries: int = 1,
                 id: str | None = None) -> None:
        self.agent = _code.check_agent(agent)
        if python_tool is not None and (not isinstance(python_tool, str) or not python_tool):
            raise UsageError(f"python_tool names the code tool (or is None for none), not "
                             f"{python_tool!r:.80}")
        if history is not None and scope is not None:
            raise UsageError("give history= or scope=, not both: the history's id is the scope")
        self.python_tool = python_tool
        self.kernos_tools = kernos_tools
        self.scope = scope if history is None else f"{history.principal}/{history.session_id}"
        self.idempotent = idempotent
        self.max_retries = max_retries
        self._id = id
        self._kernel = Kernel(client, owner="a KernosToolset")

    @property
    def id(self) -> str | None:
        return self._id

    @property
    def label(self) -> str:
        return f"KernosToolset of {self.agent!r}"

    def history(self, session_id: str) -> KernosHistory:
        """A :class:`KernosHistory` of this toolset's agent (``principal=agent``)."""
        return KernosHistory(session_id, self._kernel.client, principal=self.agent)

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools: dict[str, ToolsetTool[Any]] = {}
        if self.python_tool is not None:
            tools[self.python_tool] = ToolsetTool(
                toolset=self, max_retries=self.max_retries, args_validator=_CODE_VALIDATOR,
                tool_def=ToolDefinition(name=self.python_tool,
                                        description=_code.describe(self.agent),
                                        parameters_json_schema=_code.PARAMETERS,
                                        metadata={"kernos": "code"}))
        if not self.kernos_tools:
            return tools
        listed = await self._kernel.arequest("tools", principal=self.agent)
        for described in listed["tools"]:
            name = str(described["name"])
            if name in tools:
                raise UsageError(
                    f"the Kernos tool {name!r} has the name of this toolset's code tool: pass "
                    f"KernosToolset(..., python_tool='another_name') or rename the tool")
            tools[name] = ToolsetTool(
                toolset=self, max_retries=self.max_retries, args_validator=_ANY_ARGUMENTS,
                tool_def=tool_definition(described))
        return tools

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        key = self._key(name, ctx.tool_call_id)
        if name == self.python_tool and (tool.tool_def.metadata or {}).get("kernos") == "code":
            return await _code.run_code(self._kernel, tool_args["code"], agent=self.agent,
                                        key=key)
        return await call_kernos_tool(self._kernel, name, tool_args, agent=self.agent, key=key)

    def _key(self, name: str, call_id: str | None) -> str | None:
        if not self.idempotent or not call_id:
            return None
        return _code.call_key(_KEY_PREFIX, self.agent, f"{self.scope or ''}/{name}", call_id)

    def __repr__(self) -> str:
        return f"KernosToolset({self.agent!r}, python_tool={self.python_tool!r})"


def tool_definition(described: dict[str, Any]) -> ToolDefinition:
    """The Pydantic AI definition of a Kernos tool, as the ``tools`` request describes it."""
    schema = described.get("schema")
    if not isinstance(schema, dict):
        schema = {"type": "object", "properties": {}}
    return ToolDefinition(
        name=str(described["name"]),
        description=str(described.get("description") or "") or None,
        parameters_json_schema=schema,
        metadata={"kernos": "tool", "effect": described.get("effect"),
                  "capability": described.get("capability"),
                  "author": described.get("author"), "version": described.get("version")})


async def call_kernos_tool(kernel: Kernel, tool: str, arguments: dict[str, Any], *,
                           agent: str, key: str | None = None) -> dict[str, Any]:
    """Call Kernos tool ``tool`` as one op of ``agent`` (to its end); the answer."""
    try:
        reply = await to_the_end(kernel.arequest("op", principal=agent, tool=tool,
                                                 arguments=dict(arguments), key=key))
    except RequestError as refused:
        return _code.refusal(refused)
    return _code.op_answer(OpResult.from_json(reply))
