"""Model-written Python as one op of a Kernos agent: the part every framework shares.

Each framework has its own way to hand a model a code tool (a function tool,
a toolset, a code executor); behind each is the same act, built here once:

* the code runs as **one op of a Kernos agent** (never ``human``, which runs
  unrestricted Python): the restricted dialect, in the agent's own persistent
  namespace, under its grants, limits and circuit breaker;
* what comes back is an :func:`answer`, a plain dict ``{"status", "op",
  "stdout", "result", "error"}``: ``result`` is a final expression's value, as
  JSON data when it is plain data, else a bounded repr; code that raised, was
  denied a capability (which vetoes the op, caught or not) or breached a limit
  was rolled back whole, and ``error`` says so, for the model to read;
* a refusal the model can act on (``denied``, ``oversized``, ``invalid``: a
  circuit open, code over the size limit) comes back the same way, as status
  ``refused``; any other refusal (an unknown agent, a kernel that died) raises,
  because the model cannot fix it;
* :func:`call_key` makes an idempotency key of the agent, a scope and the
  framework's call id, within the kernel's limit: a call delivered again after
  a crash is answered as a ``duplicate`` and does not run again.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kernos.client import RequestError
from kernos.errors import UsageError
from kernos.harness.results import OpResult

from ._kernel import Kernel, to_the_end

__all__ = ["FOR_THE_MODEL", "MAX_KEY_CHARS", "PARAMETERS", "TOOL_NAME", "answer", "call_key",
           "check_agent", "describe", "op_answer", "run_code"]

FOR_THE_MODEL = frozenset({"denied", "oversized", "invalid"})
"""Refusals the model can act on (answered to it); any other refusal raises."""
MAX_KEY_CHARS = 200
"""The longest idempotency key the kernel takes (``kernos.harness.protocol``)."""
TOOL_NAME = "run_python"
"""The code tool's name, unless the caller gives another."""
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string",
                            "description": "The Python code to run; print what you need to "
                                           "see, or end with an expression."}},
    "required": ["code"],
    "additionalProperties": False,
}
"""The code tool's arguments, as a JSON schema: one string, ``code``."""


def check_agent(agent: object) -> str:
    """``agent`` if it names an agent the model's code may run as; else a UsageError."""
    if not isinstance(agent, str) or not agent:
        raise UsageError(f"agent names the Kernos agent the code runs as, not {agent!r:.80}")
    if agent == "human":
        raise UsageError("the model's code cannot run as 'human', which runs ordinary, "
                         "unrestricted Python: add an agent (client.add_agent('NAME')), grant "
                         "it what the code may use, and name it here")
    return agent


def describe(agent: str) -> str:
    """What the model is told the code tool does."""
    return (
        f"Run Python code as the agent {agent!r} in its persistent Kernos namespace: the "
        "variables you define stay for the next call. The code runs restricted, reaching "
        "only what the agent was granted: read(name), write(name, value), call(tool, **args), "
        "spend(amount, unit), grants(), and the modules math, json, re, datetime and decimal. "
        "Each call is atomic: if the code raises or is denied a capability, nothing it did is "
        "kept. Returns JSON: status, stdout, result (the value of a final expression), error.")


def call_key(prefix: str, agent: str, scope: str, call_id: str) -> str:
    """An idempotency key naming the agent, the scope and the call (hashed when long)."""
    key = f"{prefix}{agent}:{scope}:{call_id}"
    if len(key) <= MAX_KEY_CHARS:
        return key
    return prefix + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


async def run_code(kernel: Kernel, code: str, *, agent: str,
                   key: str | None = None) -> dict[str, Any]:
    """Run ``code`` as one op of ``agent`` (to its end, even if cancelled); its answer."""
    try:
        result = await to_the_end(kernel.aop(code, principal=agent, key=key))
    except RequestError as refused:
        return refusal(refused)
    return op_answer(result)


def refusal(refused: RequestError) -> dict[str, Any]:
    """The answer for a refusal the model can act on; any other is raised again (the
    model cannot fix an unknown agent or a kernel that died)."""
    if refused.kind not in FOR_THE_MODEL:
        raise refused
    return answer(status="refused", error={
        "kind": refused.kind, "message": f"{refused} Nothing ran, nothing was kept."})


def op_answer(result: OpResult) -> dict[str, Any]:
    """The answer for an op's result: committed, duplicate, or rolled back and why."""
    if result.duplicate:
        return answer(status="committed", op=result.op, duplicate=True, note=(
            f"this tool call already ran as op {result.op} and committed; it was not run "
            "again (its output was not kept: read the state it left)"))
    value: Any = None
    if result.value is not None:
        value = result.value.json if result.value.has_json else result.value.repr
    if result.committed:
        return answer(status="committed", op=result.op, stdout=result.output, result=value)
    error = result.error
    message = error.message if error is not None else result.status
    return answer(status=result.status, op=result.op, stdout=result.output, error={
        "kind": error.kind if error is not None else result.status,
        "message": f"{message} The op was rolled back: nothing this code did was kept."})


def answer(*, status: str, op: int | None = None, stdout: str = "", result: Any = None,
           error: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """The answer's one shape: status, op, stdout, result, error (and any ``more``)."""
    return {"status": status, "op": op, "stdout": stdout, "result": result, "error": error,
            **more}
