"""The OpenAI Agents SDK on Kernos: a ``Session`` in the image, and Python as an agent op.

Install with ``pip install 'kernos[openai-agents]'`` (the SDK is the
``openai-agents`` package, imported as ``agents``; Kernos's own
``kernos.agents`` is namespaced and does not clash).  Both pieces talk to a
real Kernos kernel through ``kernos.client`` (an :class:`AsyncKernosClient`
used on its own event loop, or a blocking :class:`KernosClient` from any
loop, ``Runner.run_sync`` included)::

    from agents import Agent, Runner
    from kernos.client import KernosClient
    from kernos.integrations.openai_agents import KernosSession, kernos_python_tool

    with KernosClient.start("./ws") as kernos:
        kernos.add_agent("analyst")
        kernos.grant("analyst", "read:prices")
        agent = Agent(name="analyst", tools=[kernos_python_tool(kernos, "analyst")])
        session = KernosSession("chat-1", kernos, principal="analyst")
        result = Runner.run_sync(agent, "What is the mean price?", session=session)

**KernosSession** is the SDK's ``Session`` protocol (``session_id``,
``session_settings``, ``get_items``, ``add_items``, ``pop_item``,
``clear_session``; the semantics of the SDK's own ``SQLiteSession``), kept in
the image as the session requests of ``kernos.harness.session_requests``:

* the items are plain JSON data under the session's *principal* (``human``
  unless named; usually the agent whose conversation it is), in the names
  ``kernos:session:PRINCIPAL:ID...``: they commit, roll back, restore after
  ``kill -9``, show in ``kernos log`` and the audit, and travel with the
  history;
* ``add_items`` of one turn is **one op** of the principal: the turn's items
  are all there or none is, whatever dies when (the runner, the kernel);
  ``pop_item`` and ``clear_session`` are one op each; ``get_items`` is a read
  (no op).  An empty ``add_items``, a ``pop_item`` of an empty session and a
  ``clear_session`` of a missing one run no op;
* an op's cost follows the items it adds, not the conversation's length
  (the items are stored in pages: an append re-stores the last page only);
* ``get_items(limit)``: the latest ``limit`` items, oldest first; ``limit``
  None takes ``session_settings.limit``; 0 gives none and a negative limit
  all (as ``SQLiteSession`` does);
* items must be JSON data (the SDK's input items are): anything else is
  refused before a request is sent, naming the item.  A turn larger than the
  kernel's request limit (``KERNOS_MAX_SOURCE_BYTES``, 4 MiB) is refused by
  the kernel (``RequestError``, kind ``oversized``) and nothing is added.

As the SDK's sessions do, a mutation runs to its end even if the caller is
cancelled meanwhile (the caller then sees the cancellation): the runner never
loses track of what a half-seen op did.

**kernos_python_tool** builds the SDK's ``FunctionTool`` (named ``run_python``
unless told otherwise) whose one argument, ``code``, runs as **one op of a
Kernos agent**: the restricted dialect, in that agent's own persistent
namespace, under its grants, limits and circuit breaker.  What comes back to
the model is a JSON string: ``{"status", "op", "stdout", "result", "error"}``
(``result`` is the value of a final expression, as JSON when it is plain data,
else a bounded repr).  Code that raises, is denied a capability (which vetoes
the op, caught or not) or breaches a limit is rolled back whole, and the model
reads the error and that nothing was kept; a refusal it can act on (a circuit
open, code over the size limit) comes back the same way.  A kernel that died
or a request the kernel refused for another reason (an unknown agent) raises:
the run stops, because the model cannot fix it.  The human cannot be the
tool's principal: the model's code would run unrestricted.

Each call's op carries an idempotency key made of the agent, the session
(when the tool is given one) and the model's tool-call id: a call delivered
again, after the runner died between the tool's op and the session's save of
that turn, is answered as a ``duplicate`` and does **not** run again (its
output was not kept, and the model is told so).  That holds when the resumed
run's model issues the same call id, as a recorded or scripted model does; a
live model asked again may decide anew, with a new id, and its call is a new
op.  Effects meant to happen once belong in Kernos effects
(``register_tool(..., effect="external")``), queued by the op and run once
after it commits.

Resuming a run killed with ``kill -9``: the session holds every turn the
runner saved; ``Runner.run(agent, [], session=session)`` continues from the
last committed turn.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

try:
    from agents import FunctionTool
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.tool_context import ToolContext
except ImportError as missing:
    raise ImportError(
        "kernos.integrations.openai_agents needs the OpenAI Agents SDK (the openai-agents "
        "package), an optional extra: pip install 'kernos[openai-agents]' "
        f"(the import failed: {missing})") from missing

from kernos.errors import UsageError
from kernos.harness.results import OpResult

from . import _code
from ._kernel import Client, Conversation, Kernel, to_the_end

__all__ = ["DEFAULT_TOOL_NAME", "KernosSession", "kernos_python_tool"]

DEFAULT_TOOL_NAME = _code.TOOL_NAME
_KEY_PREFIX = "openai-agents:"


class KernosSession(Conversation):
    """The Agents SDK's ``Session``, kept in a Kernos image (see the module docstring).

    ``KernosSession(session_id, client, principal="analyst")``: ``session_id`` is any
    string of 1 to 200 characters; ``principal`` owns the session (an agent of the
    image, or ``human``); ``session_settings`` as for the SDK's sessions.
    """

    session_settings: SessionSettings | None = None

    def __init__(self, session_id: str, client: Client, *, principal: str = "human",
                 session_settings: SessionSettings | None = None) -> None:
        super().__init__(session_id, client, principal=principal)
        self.session_settings = session_settings or SessionSettings()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The latest ``limit`` items, oldest first (``limit`` None: the session
        settings' limit; 0: none; negative: all).  A read: no op."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit == 0:
            return []
        result = await self._kernel.arequest("session_items", **self._fields(),
                                            limit=limit if limit is not None and limit > 0
                                            else None)
        return cast("list[TResponseInputItem]", list(result["items"]))

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` (one turn) as one op of the principal: all of them, or none."""
        if not items:
            return
        plain = _json_items(items)
        await to_the_end(self._kernel.arequest("session_add", **self._fields(), items=plain))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (one op); None if the session is empty."""
        result = await to_the_end(self._kernel.arequest("session_pop", **self._fields()))
        item = result.get("item")
        return None if item is None else cast("TResponseInputItem", item)

    async def clear_session(self) -> None:
        """Remove every item (one op; none if the session holds nothing)."""
        await to_the_end(self._kernel.arequest("session_clear", **self._fields()))

    def __repr__(self) -> str:
        return f"KernosSession({self.session_id!r}, principal={self.principal!r})"


def _json_items(items: list[TResponseInputItem]) -> list[dict[str, Any]]:
    """The items as plain JSON objects, or a clear error naming the first that is not."""
    plain: list[dict[str, Any]] = []
    for position, item in enumerate(items):
        try:
            copied = json.loads(json.dumps(item, allow_nan=False))
        except (TypeError, ValueError) as error:
            raise UsageError(f"session item {position} is not JSON data ({error}); a session "
                             "keeps the SDK's input items, which are plain dicts: nothing was "
                             "added") from None
        if not isinstance(copied, dict):
            raise UsageError(f"session item {position} is a {type(item).__name__}; every "
                             "item is a dict (a message, a tool call, a tool output): nothing "
                             "was added")
        plain.append(copied)
    return plain


# -- the tool --------------------------------------------------------------------------



def kernos_python_tool(client: Client, agent: str, *, name: str = DEFAULT_TOOL_NAME,
                       description: str | None = None, session: KernosSession | None = None,
                       idempotent: bool = True) -> FunctionTool:
    """A ``FunctionTool`` that runs the model's Python as one op of Kernos agent ``agent``.

    ``session``: the run's session, whose id goes into each call's idempotency key
    (give it when tool-call ids may repeat across sessions, as a scripted model's
    do).  ``idempotent=False`` gives the ops no key: a call delivered again runs
    again.  See the module docstring for what the model gets back.
    """
    agent = _code.check_agent(agent)
    kernel = Kernel(client, owner="kernos_python_tool")
    scope = "" if session is None else f"{session.principal}/{session.session_id}"

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        try:
            code = _code_of(arguments)
        except ValueError as problem:
            return _answer(status="refused", error={"kind": "malformed",
                                                    "message": str(problem)})
        key = _call_key(agent, scope, context.tool_call_id) if idempotent else None
        return json.dumps(await _code.run_code(kernel, code, agent=agent, key=key),
                          default=str)

    on_invoke: Callable[[ToolContext[Any], str], Awaitable[Any]] = invoke
    return FunctionTool(name=name, description=description or _code.describe(agent),
                        params_json_schema=_code.PARAMETERS, on_invoke_tool=on_invoke,
                        strict_json_schema=True)


def _code_of(arguments: str) -> str:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        raise ValueError(f"the arguments are not JSON ({arguments[:80]!r}); send "
                         '{"code": "..."}') from None
    code = parsed.get("code") if isinstance(parsed, dict) else None
    if not isinstance(code, str) or not code.strip():
        raise ValueError('the arguments need "code", a non-empty string of Python')
    return code


def _call_key(agent: str, scope: str, call_id: str) -> str:
    return _code.call_key(_KEY_PREFIX, agent, scope, call_id)


def _tool_output(result: OpResult) -> str:
    return json.dumps(_code.op_answer(result), default=str)


def _answer(**fields: Any) -> str:
    return json.dumps(_code.answer(**fields), default=str)
