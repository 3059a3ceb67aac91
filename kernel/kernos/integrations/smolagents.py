"""smolagents on Kernos: ``KernosExecutor``, a ``CodeAgent`` executor whose every action is an op.

Install with ``pip install 'kernos[smolagents]'``.  smolagents' ``CodeAgent``
takes any ``PythonExecutor`` as ``executor=``, its supported plug-in point (no
subclassing, no ``executor_type``).  With ``kernos`` a ``KernosClient`` and
``analyst`` an agent of its image (``kernos.add_agent``, ``kernos.grant``)::

    from smolagents import CodeAgent
    from kernos.integrations.smolagents import KernosExecutor, kernos_tools

    executor = KernosExecutor(kernos, "analyst")
    agent = CodeAgent(tools=kernos_tools(kernos, "analyst"), model=model,
                      executor=executor, instructions=executor.instructions())
    answer = agent.run("What is the mean price?")

How the ``PythonExecutor`` interface maps onto Kernos:

* ``executor(code_action)`` runs the code action as **one op of the Kernos
  agent** (``Kernel.op``: the executor is called from CodeAgent's sync step):
  the restricted agent dialect, in the agent's own persistent namespace
  ``kernos:ns:AGENT``, under its grants, limits and circuit breaker.  The
  variables a step assigns are there for the next step, and for the next run,
  and after ``kill -9`` of the kernel: the agent's variables *are* its Kernos
  namespace, not a copy.  What it returns is smolagents' ``CodeOutput``:
  ``logs`` is what the code printed, ``output`` the value of a final
  expression (as JSON data when it is plain data, else a bounded repr).
* A step that raised, was denied a capability (which vetoes the op, caught or
  not), breached a limit, or was refused in a way the model can act on (a
  circuit open, code over the size limit) is **rolled back whole** and raises
  :class:`CodeActionFailed`; CodeAgent turns it into the step's error, so the
  model's next step reads the error, that nothing of the step was kept, and
  what it printed before failing.  Any other refusal (an unknown agent, a
  kernel that died) raises the client's error: CodeAgent feeds every
  executor error to the model (an executor cannot stop its run), so
  ``send_tools`` checks the agent exists before the first step.
* ``final_answer(x)``, the rule chosen: restricted agent code cannot stop
  itself without raising, and raising rolls the op back; so ``final_answer``
  is not a function in the namespace but a form of the code action.  When
  its **last top-level statement** is ``final_answer(x)`` (or
  ``final_answer(answer=x)``), that statement is sent as the expression ``(x)``
  and the code runs as one op: if it commits, ``x``'s value (JSON data, else
  its repr) is the run's answer and ``is_final_answer`` is True; if it fails,
  nothing is kept and there is no answer.  ``final_answer`` anywhere else (in
  an ``if``, twice, not last, as a name) is refused before anything runs,
  with a message telling the model to compute the answer first and end with
  one ``final_answer(...)`` call.  The ``final_answer`` tool's own ``forward``
  is not run (as with smolagents' remote executors): the argument is the
  answer.
* ``send_variables(variables)`` (CodeAgent sends its ``state``, i.e. a run's
  ``additional_args``) writes them into the agent's namespace as one op of
  the agent, as literals: only plain data (None, bool, int, finite float,
  str, bytes, and lists, tuples, sets and str-keyed dicts of those) under
  names agent code may use; anything else is refused before a request is
  sent, naming the variable.  None given, no op.
* ``send_tools(tools)``: smolagents tools are Python objects of this process,
  which the agent's restricted code cannot reach (that is the point of the
  sandbox), so a ``Tool`` of smolagents (``@tool``, ``Tool`` subclasses, Hub
  and MCP tools) or a managed agent is **refused** with a
  :class:`UsageError` naming it, raised from ``agent.run`` before the model
  is asked anything.  What the code may call are the **Kernos tools** its
  agent is granted (register one with the client's ``register_tool`` or agent
  code's ``define_tool``, then grant ``call:NAME``), always as
  ``call("NAME", **args)``.  :func:`kernos_tools` gives them as
  :class:`KernosTool` objects for ``CodeAgent(tools=...)``: CodeAgent's prompt
  lists them as functions, and ``send_tools`` defines each in the agent's
  namespace (one op per run) as ``def NAME(**arguments): return call("NAME",
  **arguments)``, so the code calls ``NAME(x=1)`` (keyword arguments, as
  smolagents' prompt asks) under the same ``call:NAME`` grant.  The
  ``final_answer`` tool is accepted and handled as above.
  :meth:`KernosExecutor.instructions` tells the model the dialect's rules and
  the tools it may call; pass it as CodeAgent's ``instructions``.

Each step is an ordinary op of the agent: it shows in ``kernos log`` (when
it changed the namespace), the sidebar and the audit chain, with the code
as sent as its source (a final ``final_answer(x)`` as ``(x)``).  Ops carry
no idempotency key (CodeAgent gives the executor no stable call id): a run
resumed after a crash runs its steps again.
"""

from __future__ import annotations

import ast
import keyword
import math
from dataclasses import dataclass
from typing import Any, NoReturn

try:
    from smolagents.local_python_executor import CodeOutput, PythonExecutor
    from smolagents.tools import Tool
except ImportError as missing:
    raise ImportError(
        "kernos.integrations.smolagents needs smolagents, an optional extra: "
        f"pip install 'kernos[smolagents]' (the import failed: {missing})") from missing

from kernos.agents.guards import AGENT_BUILTINS
from kernos.client import RequestError
from kernos.errors import KernosError, UsageError

from . import _code
from ._kernel import Client, Kernel

__all__ = ["FINAL_ANSWER", "CodeAction", "CodeActionFailed", "KernosExecutor", "KernosTool",
           "kernos_tools", "prepare", "tools_code", "variables_code"]

FINAL_ANSWER = "final_answer"
"""The name of smolagents' final-answer tool, and the call that ends a code action."""
_PLACEMENT = (
    "final_answer(...) ends a code action: call it once, as the last statement of the "
    "code, at the top level (not inside an if, a loop or a function). Compute the answer "
    "first, e.g. `answer = a if ok else b`, then end with `final_answer(answer)`.")


class CodeActionFailed(KernosError):
    """A code action that did not commit: rolled back, refused, or malformed.

    Its message is what the model reads as the step's error; ``answer`` is the
    plain dict of :mod:`kernos.integrations._code` (status, op, stdout, error).
    """

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        error = answer.get("error") or {}
        where = f", op {answer['op']}" if answer.get("op") is not None else ""
        message = f"[{answer['status']}{where}] {error.get('message', '')}"
        if answer.get("stdout"):
            message += f"\nPrinted before the error:\n{answer['stdout']}"
        super().__init__(message)


@dataclass(frozen=True, kw_only=True)
class CodeAction:
    """A code action as it is sent to the kernel."""

    code: str
    """The code the op runs (a final ``final_answer(x)`` sent as ``(x)``)."""
    final: bool
    """Whether the action ends with ``final_answer``: its value is the answer."""


def prepare(code: str) -> CodeAction:
    """``code`` as the op runs it, with its ``final_answer`` call (see the module docstring).

    Raises :class:`CodeActionFailed` (status ``refused``, nothing ran) for a
    ``final_answer`` anywhere but the last top-level statement.  Code that does
    not parse is sent unchanged, for the kernel to refuse with its message.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return CodeAction(code=code, final=False)
    last = tree.body[-1] if tree.body else None
    argument = _final_argument(last)
    if argument is None and last is not None and _is_final_call(last):
        _refuse("final_answer takes one argument, the answer: final_answer(answer).")
    elsewhere = [node for node in ast.walk(tree)
                 if isinstance(node, ast.Name) and node.id == FINAL_ANSWER]
    if len(elsewhere) > (argument is not None):
        _refuse(_PLACEMENT)
    if argument is None or last is None:
        return CodeAction(code=code, final=False)
    segment = ast.get_source_segment(code, argument)
    if segment is None:  # pragma: no cover - ast gives positions for parsed source
        _refuse(_PLACEMENT)
    return CodeAction(code=_before(code, last) + f"({segment})\n", final=True)


def _is_final_call(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == FINAL_ANSWER)


def _final_argument(node: ast.stmt | None) -> ast.expr | None:
    """The answer's expression, if ``node`` is ``final_answer(x)`` or ``(answer=x)``."""
    if node is None or not _is_final_call(node):
        return None
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)  # _is_final_call
    call = node.value
    if len(call.args) == 1 and not call.keywords and not isinstance(call.args[0], ast.Starred):
        return call.args[0]
    if not call.args and len(call.keywords) == 1 and call.keywords[0].arg == "answer":
        return call.keywords[0].value
    return None


def _before(code: str, node: ast.stmt) -> str:
    """The source before ``node`` (its column is a UTF-8 byte offset)."""
    lines = code.splitlines(keepends=True)
    line = lines[node.lineno - 1].encode("utf-8")[:node.col_offset].decode("utf-8")
    return "".join(lines[:node.lineno - 1]) + line


def _refuse(message: str) -> NoReturn:
    raise CodeActionFailed(_code.answer(status="refused", error={
        "kind": "malformed", "message": f"{message} Nothing ran, nothing was kept."}))


# -- variables ---------------------------------------------------------------------------

_ATOMS = (type(None), bool, int, str, bytes)


def variables_code(variables: dict[str, Any]) -> str:
    """Agent code that binds each of ``variables`` to a literal of its value.

    Raises :class:`UsageError` naming the first variable whose name agent code
    cannot use or whose value is not plain data.
    """
    if not isinstance(variables, dict):
        raise UsageError(f"variables are a dict of names to values, not "
                         f"{type(variables).__name__}")
    lines = []
    for name, value in variables.items():
        if (not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name)
                or name.startswith("_") or name == FINAL_ANSWER):
            raise UsageError(
                f"variable {name!r:.80} cannot be sent to a Kernos agent: a name is an "
                "identifier that is not a keyword, does not start with '_' and is not "
                "'final_answer'. Nothing was sent.")
        try:
            lines.append(f"{name} = {_literal(value)}")
        except ValueError as problem:
            raise UsageError(
                f"variable {name!r} cannot be sent to a Kernos agent: {problem}. Only plain "
                "data crosses into its namespace (None, bool, int, finite float, str, bytes, "
                "and lists, tuples, sets and str-keyed dicts of them). Nothing was "
                "sent.") from None
    return "\n".join(lines)


def _literal(value: Any, depth: int = 0) -> str:
    if depth > 50:
        raise ValueError("it is nested more than 50 deep")
    kind = type(value)
    if kind in _ATOMS:
        return repr(value)
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite float")
        return repr(value)
    if kind in (list, tuple, set, frozenset):
        items = [_literal(item, depth + 1) for item in value]
        if kind is list:
            return f"[{', '.join(items)}]"
        if kind is tuple:
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        inner = f"{{{', '.join(items)}}}" if items else ""
        return f"{kind.__name__}({inner})"
    if kind is dict:
        if not all(type(key) is str for key in value):
            raise ValueError("a dict's keys must be str")
        pairs = [f"{key!r}: {_literal(item, depth + 1)}" for key, item in value.items()]
        return f"{{{', '.join(pairs)}}}"
    raise ValueError(f"a {kind.__name__} is not plain data")


# -- Kernos tools, as CodeAgent lists them ------------------------------------------------

_INPUT_TYPES = frozenset({"string", "boolean", "integer", "number", "array", "object", "null"})


def _usable_name(name: object) -> bool:
    """Whether agent code can define a function ``name`` (a tool's, from :func:`tools_code`)."""
    return (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)
            and not name.startswith("_") and name != FINAL_ANSWER
            and name not in AGENT_BUILTINS)


def _inputs(schema: object) -> dict[str, dict[str, Any]]:
    """smolagents ``inputs`` for a Kernos tool's JSON schema (unknown types: ``any``)."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return {}
    required = schema.get("required") if isinstance(schema, dict) else None
    inputs: dict[str, dict[str, Any]] = {}
    for name, given in properties.items():
        spec = given if isinstance(given, dict) else {}
        kind = spec.get("type")
        entry: dict[str, Any] = {
            "type": kind if isinstance(kind, str) and kind in _INPUT_TYPES else "any",
            "description": str(spec.get("description") or name)}
        if not isinstance(required, list) or name not in required:
            entry["nullable"] = True
        inputs[str(name)] = entry
    return inputs


class KernosTool(Tool):  # type: ignore[misc]  # smolagents is untyped (see KernosExecutor)
    """A Kernos tool as CodeAgent lists it; it runs only inside the agent's code.

    Built by :func:`kernos_tools` from the kernel's tool registry (``name``,
    ``description``, ``schema``).  Sent to a :class:`KernosExecutor`, it becomes a
    function of the agent's namespace that calls the tool with ``call``; called in
    this process, it raises.
    """

    skip_forward_signature_validation = True
    output_type = "any"

    def __init__(self, record: dict[str, Any]) -> None:
        name = record.get("name") if isinstance(record, dict) else None
        if not _usable_name(name):
            raise UsageError(f"the Kernos tool {name!r:.80} cannot be a function of agent "
                             "code (its name is a keyword, a builtin of agent code such as "
                             "read or len, or final_answer): call it with "
                             "call(NAME, **args)")
        self.name = str(name)
        self.description = str(record.get("description") or f"The Kernos tool {name}.")
        self.inputs = _inputs(record.get("schema"))
        super().__init__()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError(f"the Kernos tool {self.name!r} runs inside a Kernos agent's code "
                         "(CodeAgent(..., executor=KernosExecutor(...))), not in this process")


def kernos_tools(client: Client, agent: str) -> list[KernosTool]:
    """The Kernos tools ``agent`` may call, for ``CodeAgent(tools=...)`` with a
    :class:`KernosExecutor` of the same agent (see the module docstring).

    A tool whose name cannot be a function of agent code (a keyword such as
    ``class``, a builtin of agent code such as ``read`` or ``len``) is left out:
    the code calls it with ``call("len", ...)``, and
    :meth:`KernosExecutor.instructions` lists it."""
    agent = _code.check_agent(agent)
    kernel = Kernel(client, owner="kernos_tools")
    return [KernosTool(record)
            for record in kernel.request("tools", principal=agent)["tools"]
            if _usable_name(record.get("name"))]


def tools_code(tools: list[KernosTool]) -> str:
    """Agent code that defines a function per tool, calling it with ``call``."""
    return "\n".join(f"def {tool.name}(**arguments):\n"
                     f"    return call({tool.name!r}, **arguments)\n" for tool in tools)


# -- the executor ------------------------------------------------------------------------


# smolagents ships no type information (no py.typed): its base class is Any to mypy.
class KernosExecutor(PythonExecutor):  # type: ignore[misc]
    """A smolagents ``PythonExecutor`` running each code action as one op of Kernos agent
    ``agent`` (see the module docstring).  ``client``: a ``KernosClient`` (or an
    ``AsyncKernosClient`` whose loop runs in another thread)."""

    def __init__(self, client: Client, agent: str) -> None:
        self.agent = _code.check_agent(agent)
        self._kernel = Kernel(client, owner="a KernosExecutor")

    def __call__(self, code_action: str) -> CodeOutput:
        """Run ``code_action`` as one op; raises :class:`CodeActionFailed` if it did not
        commit (nothing of it was kept)."""
        if not isinstance(code_action, str):
            raise UsageError(f"a code action is a str of Python, not "
                             f"{type(code_action).__name__}")
        action = prepare(code_action)
        answer = self._run(action.code)
        if answer["status"] != "committed":
            raise CodeActionFailed(answer)
        return CodeOutput(output=answer["result"], logs=answer["stdout"],
                          is_final_answer=action.final)

    def _run(self, code: str) -> dict[str, Any]:
        try:
            result = self._kernel.op(code, principal=self.agent)
        except RequestError as refused:
            return _code.refusal(refused)
        return _code.op_answer(result)

    def send_variables(self, variables: dict[str, Any]) -> None:
        """Bind ``variables`` in the agent's namespace, as one op of the agent (none if
        there are none); a UsageError if they cannot be sent or the op did not commit."""
        code = variables_code(variables)
        if not code:
            return
        answer = self._run(code)
        if answer["status"] != "committed":
            raise UsageError(f"the variables {sorted(variables)} were not written to "
                             f"{self.agent!r}'s namespace: {answer['error']['message']}")

    def send_tools(self, tools: dict[str, Any]) -> None:
        """Define the :class:`KernosTool`s in the agent's namespace (one op), accept
        ``final_answer``, refuse every other tool (see the module docstring).  Checks
        that the agent exists before the run's first step."""
        host = sorted(name for name, tool in tools.items()
                      if name != FINAL_ANSWER and not isinstance(tool, KernosTool))
        if host:
            raise UsageError(
                f"smolagents tools cannot be sent to a Kernos agent: {', '.join(host)}. "
                "They are Python objects of this process, which the agent's restricted code "
                "cannot reach. Make each a Kernos tool instead (client.register_tool, or "
                "define_tool from agent code), grant the agent call:NAME, and the code calls "
                "call('NAME', **args); kernos_tools(client, agent) lists them for CodeAgent's "
                "tools=[...]. Give CodeAgent no other tools and no managed agents.")
        final = tools.get(FINAL_ANSWER)
        if final is not None and not isinstance(final, Tool):
            raise UsageError(f"the final_answer tool is a smolagents Tool, not "
                             f"{type(final).__name__}")
        kernos = [tool for tool in tools.values() if isinstance(tool, KernosTool)]
        if not kernos:
            self._kernel.request("grants", agent=self.agent)  # an unknown agent raises here
            return
        answer = self._run(tools_code(kernos))
        if answer["status"] != "committed":
            raise UsageError(f"the Kernos tools {[tool.name for tool in kernos]} could not be "
                             f"defined in {self.agent!r}'s namespace: "
                             f"{answer['error']['message']}")

    def instructions(self) -> str:
        """What the model needs to know to write code for this executor: the dialect,
        ``final_answer`` and the Kernos tools its agent may call.  Pass it as
        CodeAgent's ``instructions``."""
        tools = self._kernel.request("tools", principal=self.agent)["tools"]
        lines = [
            f"Your code runs as the Kernos agent {self.agent!r}, in its persistent "
            "namespace: the variables you define stay for the next step. Each step is "
            "atomic: if it raises, is denied a capability or runs over a limit, nothing it "
            "did is kept. It reaches only what the agent was granted: read(name), "
            "write(name, value), call(tool, **args), spend(amount, unit), grants().",
            "Do not import anything: imports are refused; math, json, re, datetime and "
            "decimal are already in scope. Names starting with '_' are refused.",
            _PLACEMENT,
        ]
        if tools:
            lines.append("The tools you may call, as call('NAME', **arguments):")
            lines.extend(f"- {tool.get('name')}: {tool.get('description') or ''} "
                         f"(arguments: {tool.get('schema') or {}})" for tool in tools)
        else:
            lines.append("You may call no tools: call(...) is denied.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"KernosExecutor(agent={self.agent!r})"
