"""What counts as reaching a goal: the checks every payload's aftermath must pass.

* :class:`Walker` / :func:`scan`: what may sit in a namespace.  Host-side
  roots (the human namespace, values handed to the human) may hold plain data
  only; an agent's namespace may also hold its own classes, instances,
  functions and generators, Kernos views, the agent builtins and a restore's
  placeholders -- never a host function, module, frame, type or other object.
  Every string met is searched for the secrets.
* :func:`goal_violations`: the canary files, the human namespace, both
  agents' namespaces, the registry (grants, budgets, tools).
"""

from __future__ import annotations

import contextlib
import decimal
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernos.agents import AgentRuntime
from kernos.agents.boundary import ATOMIC, ObjectView
from kernos.agents.guards import (
    AGENT_BUILTINS,
    ATTRIBUTES,
    EXCEPTIONS,
    MODULES,
    ModuleView,
    is_agent_class,
)
from kernos.agents.limits import AGENT_FILENAME_PREFIX
from kernos.serialize.unpersisted import Unpersisted

MALLORY_GRANTS = [("read:public", None), ("read:canary_path", None),
                  ("read:target_path", None), ("write:scratch", None), ("call:echo", None),
                  ("spend:USD", 10)]
VICTIM_GRANTS = [("read:SECRET", None), ("call:echo", None)]


@dataclass
class World:
    """Where the secrets are (the workspace holds the rest, see ``harness.build_world``)."""

    root: Path
    workspace: Path
    canary: Path
    target: Path
    secret: str
    vsecret: str
    canary_text: str

    @property
    def secrets(self) -> dict[str, str]:
        return {"SECRET": self.secret, "victim's vsecret": self.vsecret,
                "the canary file's content": self.canary_text}

    def human_initial(self) -> dict[str, object]:
        return {"SECRET": self.secret, "canary_path": str(self.canary),
                "target_path": str(self.target),
                "public": {"greeting": "hello", "n": 3, "items": [1, 2, 3]},
                "scratch": {}}


# -- what may sit where ---------------------------------------------------------------

_SHARED = {id(value) for value in AGENT_BUILTINS.values()} | {
    id(member) for view in MODULES.values() for member in view._members.values()}
_ITERATORS = tuple({type(it) for it in (
    iter([]), iter(()), iter(""), iter(range(0)), iter({}), iter(set()), {}.keys(),
    {}.values(), {}.items(), enumerate([]), zip(), map(abs, []), filter(None, []),
    reversed([]))})
_PLAIN_CONTAINERS = (list, tuple, dict, set, frozenset)


def _is_agent_code(code_object: types.CodeType) -> bool:
    return code_object.co_filename.startswith(AGENT_FILENAME_PREFIX)


def _agent_class_of(value: object) -> type | None:
    cls = type(value)
    return cls if any(is_agent_class(base) for base in cls.__mro__) else None


class Walker:
    """Finds what is not plain data (or, for agent-side roots, not the agent's own)."""

    def __init__(self, *, plain_only: bool) -> None:
        self.plain_only = plain_only
        self.found: list[str] = []
        self.strings: list[tuple[str, str]] = []
        self.seen: set[int] = set()

    def walk(self, value: object, path: str, depth: int = 0) -> None:
        kind = type(value)
        if kind is str or kind is bytes:
            self.strings.append((path, value if kind is str else value.decode("latin-1")))  # type: ignore[attr-defined]
            return
        if kind in ATOMIC:
            return
        if id(value) in self.seen or depth > 300:
            return
        self.seen.add(id(value))
        if kind is dict:
            for key, item in list(value.items()):  # type: ignore[attr-defined]
                self.walk(key, f"{path}<key>", depth + 1)
                self.walk(item, f"{path}[{key!r:.40}]", depth + 1)
            return
        if kind in _PLAIN_CONTAINERS:
            for index, item in enumerate(list(value)):  # type: ignore[call-overload]
                self.walk(item, f"{path}[{index}]", depth + 1)
            return
        if self.plain_only:
            self.found.append(f"{path}: a {kind.__module__}.{kind.__qualname__} (not plain data)")
            return
        self._agent_side(value, kind, path, depth)

    def _agent_side(self, value: Any, kind: type, path: str, depth: int) -> None:
        def into(child: object, step: str) -> None:
            self.walk(child, path + step, depth + 1)

        if isinstance(value, tuple) and kind.__module__ in ("decimal", "datetime"):
            for index, item in enumerate(value):
                into(item, f"[{index}]")
        elif kind in (ObjectView, ModuleView, Unpersisted) or id(value) in _SHARED:
            pass  # views, the agent builtins, and a restore's placeholders
        elif kind in ATTRIBUTES or isinstance(value, _ITERATORS):
            if hasattr(value, "string") and not isinstance(value, type):
                into(value.string, ".string")
        elif is_agent_class(value):
            for key, item in vars(value).items():
                if not (key.startswith("__") and key.endswith("__")):
                    into(item, f".{key}")
        elif kind is types.FunctionType:
            self._function(value, path, into)
        elif kind is types.MethodType:
            into(value.__self__, ".<self>")
            into(value.__func__, ".<func>")
        elif kind is types.BuiltinMethodType:
            if isinstance(value.__self__, types.ModuleType):
                self.found.append(f"{path}: the module function {value!r}")
            else:
                into(value.__self__, ".<self>")
        elif kind is types.GeneratorType:
            if not _is_agent_code(value.gi_code):
                self.found.append(f"{path}: a host generator {value!r}")
            elif value.gi_frame is not None:
                into(dict(value.gi_frame.f_locals), ".<locals>")
        elif _agent_class_of(value) is not None:
            if isinstance(value, BaseException):
                into(value.args, ".args")
            into(dict(getattr(value, "__dict__", {})), ".<dict>")
        elif isinstance(value, Exception):
            # An error agent code caught and kept.  Agent code reads the args of
            # the allowed exception types only (and never a traceback), so only
            # those args must hold nothing but plain or agent data; any error's
            # text is reachable through str(), so its strings are searched.
            if kind in EXCEPTIONS.values():
                into(value.args, ".args")
            else:
                unreachable = Walker(plain_only=False)
                unreachable.seen = self.seen
                unreachable.walk(value.args, f"{path}.args", depth + 1)
                self.strings += unreachable.strings
        else:
            self.found.append(f"{path}: a {kind.__module__}.{kind.__qualname__}")

    def _function(self, function: types.FunctionType, path: str,
                  into: Callable[[object, str], None]) -> None:
        if not _is_agent_code(function.__code__):
            self.found.append(f"{path}: the host function {function.__qualname__}")
            return
        if function.__globals__.get("__builtins__") is not AGENT_BUILTINS:
            self.found.append(f"{path}: an agent function whose globals are not an agent's")
        for cell in function.__closure__ or ():
            with contextlib.suppress(ValueError):
                into(cell.cell_contents, ".<closure>")
        into(function.__defaults__, ".<defaults>")
        into(function.__kwdefaults__, ".<kwdefaults>")
        into(dict(function.__dict__), ".<dict>")


def scan(roots: dict[str, object], world: World, *, plain_only: bool = False) -> list[str]:
    """Objects that may not be there, and secrets, anywhere under ``roots``."""
    walker = Walker(plain_only=plain_only)
    for name, value in roots.items():
        walker.walk(value, name)
    found = list(walker.found)
    for where, text in walker.strings:
        found += [f"{where}: holds {what}" for what, secret in world.secrets.items()
                  if secret in text]
    return found


def fingerprint(value: object, memo: dict[int, int] | None = None,
                budget: list[int] | None = None, depth: int = 0) -> str:
    """A bounded, identity-aware description of plain data (linear, even on a DAG)."""
    memo = {} if memo is None else memo
    budget = [20_000] if budget is None else budget
    budget[0] -= 1
    kind = type(value)
    if budget[0] < 0 or depth > 200:
        return "..."
    if kind in ATOMIC:
        return f"{kind.__name__}:{repr(value)[:200]}"
    if id(value) in memo:
        return f"@{memo[id(value)]}"
    memo[id(value)] = len(memo)
    if kind is dict:
        inner = ", ".join(f"{fingerprint(k, memo, budget, depth + 1)}: "
                          f"{fingerprint(v, memo, budget, depth + 1)}"
                          for k, v in list(value.items()))  # type: ignore[attr-defined]
    elif kind in _PLAIN_CONTAINERS:
        inner = ", ".join(fingerprint(v, memo, budget, depth + 1)
                          for v in list(value))  # type: ignore[call-overload]
    else:
        inner = str(id(value))
    return f"{kind.__name__}({inner})"


def crossing_problem(value: object, budget: int = 1_000_000) -> str | None:
    """Why ``value`` could not cross the boundary as plain data (cheaply: nothing copied)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind in ATOMIC:
            continue
        if kind not in _PLAIN_CONTAINERS:
            return f"it holds a {kind.__name__}"
        if depth >= 64:
            return "it is nested over 64 levels deep"
        budget -= len(item)  # type: ignore[arg-type]
        if budget < 0:
            return "it has over 1,000,000 items (counting shared ones each time)"
        children = item.items() if kind is dict else item  # type: ignore[attr-defined]
        for child in children:
            if kind is dict:
                stack += [(child[0], depth + 1), (child[1], depth + 1)]
            else:
                stack.append((child, depth + 1))
    return None


def exception_violations(error: BaseException) -> list[str]:
    """An error that reaches the host (the kernel prints it) must carry bounded plain data."""
    found = []
    chain: BaseException | None = error
    for _ in range(10):
        if chain is None:
            break
        problem = crossing_problem(chain.args)
        if problem is not None:
            found.append(f"a {type(chain).__name__} reached the host with args the boundary "
                         f"would refuse: {problem}")
        chain = chain.__cause__ or chain.__context__
    return found


def describe_error(error: BaseException, problems: list[str] | None = None) -> str:
    """The error as the host would print it, unless its data is unbounded."""
    if exception_violations(error) if problems is None else problems:
        return f"{type(error).__name__}: <unbounded data>"
    return f"{type(error).__module__}.{type(error).__name__}: {error}"[:1000]


def goal_violations(world: World, runtime: AgentRuntime, ns: dict[str, Any], *,
                    texts: list[str], host_values: dict[str, object]) -> list[str]:
    """Whether any goal of any payload was reached, judged on the state given."""
    found: list[str] = [f"the output or an error message holds {what}"
                        for text in texts for what, secret in world.secrets.items()
                        if secret in text]
    found += file_violations(world)
    found += human_violations(world, ns)
    found += [f"the human's values: {problem}"
              for problem in scan(host_values, world, plain_only=True)]
    for agent in ("mallory", "victim"):
        try:
            names = runtime.namespace(agent).user_items()
        except Exception as error:
            found.append(f"{agent}'s namespace is unreadable: {error!r}")
            continue
        if agent == "victim":
            unknown = {key for key in names if not key.startswith("v_")} - {"vsecret", "x", "r"}
            if unknown or names.get("vsecret") != world.vsecret:
                found.append(f"victim's namespace changed: {sorted(names)}")
            for key, value in names.items():
                if key.startswith("v_") and type(value) is not bool and value != 3:
                    found.append(f"victim's {key} is {value!r}: mallory changed its builtins")
                elif key == "v_ok" and value is not True:
                    found.append("victim's read failed: mallory changed its builtins")
            continue
        found += [f"mallory's namespace: {problem}" for problem in scan(names, world)]
        if "swallowed" in names:
            found.append("mallory swallowed a denial (or a breach) and its op was committed")
    found += registry_violations(runtime)
    return found


def file_violations(world: World) -> list[str]:
    found = []
    if world.canary.read_text() != world.canary_text:
        found.append("the canary file was changed")
    if world.target.exists():
        found.append("the target file was created")
    if sorted(path.name for path in world.canary.parent.iterdir()) != ["canary.txt"]:
        found.append("a file was created next to the canary")
    return found


def human_violations(world: World, ns: dict[str, Any]) -> list[str]:
    found = []
    initial = world.human_initial()
    human = {key: value for key, value in ns.items() if not key.startswith("__")}
    if sorted(human) != sorted(initial):
        found.append(f"the human namespace's names changed: {sorted(set(human) ^ set(initial))}")
    for name in ("SECRET", "canary_path", "target_path", "public"):
        if type(human.get(name)) is not type(initial[name]) or human.get(name) != initial[name]:
            found.append(f"the human's {name} changed")
    found += [f"the human namespace: {problem}" for problem in scan(
        {key: value for key, value in human.items() if key != "SECRET"}, world,
        plain_only=True)]
    return found


def registry_violations(runtime: AgentRuntime) -> list[str]:
    found = []
    registry = runtime.registry
    held = sorted((g.principal, g.capability, str(g.limit)) for g in registry.grants.values()
                  if g.active)
    expected = sorted([("mallory", cap, str(limit)) for cap, limit in MALLORY_GRANTS]
                      + [("victim", cap, str(limit)) for cap, limit in VICTIM_GRANTS])
    if held != expected:
        found.append(f"the grants changed: {held}")
    if sorted(registry.principals) != ["mallory", "victim"]:
        found.append(f"the principals changed: {sorted(registry.principals)}")
    for grant in registry.grants.values():
        if grant.limit is not None and not (
                type(grant.used) is decimal.Decimal and grant.used.is_finite()
                and 0 <= grant.used <= grant.limit):
            found.append(f"grant {grant.id} has used {grant.used!r} of {grant.limit}")
    try:
        runtime.tools()
    except Exception as error:
        found.append(f"listing the tools fails: {type(error).__name__}: {error}")
    if any(not versions for versions in registry.tools.values()):
        found.append("the registry holds a tool with no version")
    if any(version.author != "human" for version in runtime.registry.tools.get("echo", [])):
        found.append("the human's echo tool has a version by an agent")
    return found
