"""The Kernos calls in agent code's builtins.

Each is a thin function over :class:`~kernos.agents.runtime.AgentRuntime`,
acting as the principal that is running (``context.current()``).  Agent
code never holds the runtime, a grant or the image: only these functions.

============================================  ===============================
``read(name)``                                a read-only view (``read:NAME``)
``write(name, value)``                        rebind NAME to plain data
                                              (``write:NAME``)
``call(tool, **arguments)``                   call a tool (``call:TOOL``)
``spend(amount, unit)``                       spend from a budget (``spend:UNIT``);
                                              returns what is left
``grants()``                                  your active grants, as plain data
``delegate(grant_id, to, limit=None)``        attenuate a grant to a sub-agent
``revoke(grant_id)``                          revoke a grant you delegated
``spawn(name)``                               create sub-agent ``you/name``
                                              (``agents:spawn``)
``define_tool(name, source, schema, doc)``    define (a new version of) a tool
``whoami()``                                  your principal name
``emit(topic, payload=None)``                 emit an event (``emit:TOPIC``)
``subscribe(pattern, handler)``               run your function on matching
                                              events (``subscribe:PATTERN``)
``unsubscribe(subscription_id)``              remove one of your subscriptions
``llm(model, messages, **params)``            call a language model
                                              (``llm:MODEL``, within budgets);
                                              returns content, tool_calls,
                                              usage, cost, model, cached
``recall(query, k=5, kinds=None)``           search your memory (``memory:read``):
                                              your ops, facts and names, and the
                                              names you may read (kernos.memory)
``remember(fact, tags=())``                   store a fact (``memory:write``), in
                                              the image with this op
``context(max_tokens, query=None)``           the most relevant memories within
                                              ``max_tokens`` (``memory:read``)
``files.read(path, binary=False)``            a file's text (or bytes), path
                                              relative to the files root
                                              (``file:read:GLOB``)
``files.write(path, data)``                   make a file hold str or bytes
                                              (``file:write:GLOB``); returns
                                              the bytes written
``files.append(path, data)``                  add to a file (``file:write``)
``files.list(prefix="")``                     the files under ``prefix`` you
                                              may read, sorted
``files.delete(path)``                        remove a file (``file:write``)
``files.exists(path)``                        whether a file is there
                                              (``file:read``)
============================================  ===============================

``files`` needs no grant under ``agents/NAME/`` (NAME your principal name);
links, devices, FIFOs, ``..`` and absolute paths are refused, and each op has
file limits (kernos.agents.files).  Like memory, it refuses to run inside a
tool another agent wrote (it would act for the caller).

Every refusal vetoes the op: whatever Kernos error one of these calls raises
(a denial, a malformed request, a bad spawn name, a tool definition or an LLM
request it will not accept), the op rolls back even if the agent catches the
error, exactly as for a capability denial.  Errors the agent's own code raises
(``ValueError``, ``KeyError`` for a missing name...) are the agent's to handle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernos.agents import context
from kernos.agents.files import FileAccess
from kernos.agents.guards import AGENT_BUILTINS, MODULES, ModuleView
from kernos.errors import KernosError

__all__ = ["install", "refusals_veto"]


def read(name: object) -> object:
    ctx = context.current()
    return ctx.runtime.read(ctx, name)


def write(name: object, value: object) -> None:
    ctx = context.current()
    ctx.runtime.write(ctx, name, value)


def call(tool: object, /, **arguments: object) -> object:
    ctx = context.current()
    return ctx.runtime.call(ctx, tool, arguments)


def spend(amount: object, unit: object) -> object:
    ctx = context.current()
    return ctx.runtime.spend(ctx, amount, unit)


def grants() -> list[object]:
    ctx = context.current()
    return ctx.runtime.my_grants(ctx)


def delegate(grant_id: object, to: object, limit: object = None) -> object:
    ctx = context.current()
    return ctx.runtime.delegate(ctx, grant_id, to, limit)


def revoke(grant_id: object) -> list[object]:
    ctx = context.current()
    return ctx.runtime.revoke_delegated(ctx, grant_id)


def spawn(name: object) -> object:
    ctx = context.current()
    return ctx.runtime.spawn(ctx, name)


def define_tool(name: object, source: object, schema: object, description: object) -> object:
    ctx = context.current()
    return ctx.runtime.define_tool(ctx, name, source, schema, description)


def whoami() -> str:
    return context.current().principal


def emit(topic: object, payload: object = None) -> None:
    ctx = context.current()
    ctx.runtime.emit(ctx, topic, payload)


def subscribe(pattern: object, handler: object) -> object:
    ctx = context.current()
    return ctx.runtime.subscribe(ctx, pattern, handler)


def unsubscribe(subscription_id: object) -> None:
    ctx = context.current()
    ctx.runtime.unsubscribe(ctx, subscription_id)


def llm(model: object, messages: object, /, **params: object) -> object:
    ctx = context.current()
    return ctx.runtime.llm(ctx, model, messages, params)


def recall(query: object, k: object = 5, kinds: object = None) -> list[object]:
    from kernos.agents import _memory

    return _memory.recall(context.current(), query, k, kinds)


def remember(fact: object, tags: object = ()) -> object:
    from kernos.agents import _memory

    return _memory.remember(context.current(), fact, tags)


def memory_context(max_tokens: object, query: object = None) -> str:
    from kernos.agents import _memory

    return _memory.context(context.current(), max_tokens, query)


memory_context.__name__ = "context"


def _files() -> FileAccess:
    ctx = context.current()
    ctx.runtime.on_own_behalf(ctx, "use files")
    return FileAccess(ctx.runtime, ctx.principal, ctx.op)


def files_read(path: object, binary: bool = False) -> str | bytes:
    return _files().read(path, binary=binary)


def files_write(path: object, data: object) -> int:
    return _files().write(path, data)


def files_append(path: object, data: object) -> int:
    return _files().append(path, data)


def files_list(prefix: object = "") -> list[str]:
    return _files().list(prefix)


def files_delete(path: object) -> None:
    _files().delete(path)


def files_exists(path: object) -> bool:
    return _files().exists(path)


def refusals_veto(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, whose Kernos errors veto the running op before they reach the agent."""
    def refusing(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except KernosError as error:
            ctx = context.current()
            raise ctx.runtime.refused(ctx, error) from None

    refusing.__name__ = refusing.__qualname__ = function.__name__
    refusing.__doc__ = function.__doc__
    return refusing


CALLS = {function.__name__: refusals_veto(function) for function in (
    read, write, call, spend, grants, delegate, revoke, spawn, define_tool, whoami,
    emit, subscribe, unsubscribe, llm, recall, remember, memory_context)}


FILES = ModuleView("files", {
    function.__name__.removeprefix("files_"): refusals_veto(function) for function in (
        files_read, files_write, files_append, files_list, files_delete, files_exists)})
"""Agent code's ``files``: a view whose members act as the running principal."""


def install() -> None:
    AGENT_BUILTINS.update(CALLS)
    MODULES["files"] = FILES  # so a value holding it pickles (ModuleView.__reduce__)
    AGENT_BUILTINS["files"] = FILES


install()
