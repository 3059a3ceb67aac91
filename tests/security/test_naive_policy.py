"""The corpus catches a weakened sandbox: against plain RestrictedPython, goals are reached.

The naive configuration is what a first attempt at "agents run restricted
Python" looks like: ``compile_restricted_exec`` with RestrictedPython's own
transformer, its ``safe_builtins``, ``safer_getattr`` and pass-through item,
iteration and write guards, ``__metaclass__ = type``, an ``__import__`` for the
same modules, the raw modules themselves in scope, and a ``read()`` that
checks the grant and then hands over the human's object.  Nothing else: no
views, no boundary copies, no exact type checks, no ops to roll back, no
limits (so the bombs are not run against it).

The goal checks are the ones ``test_escapes`` holds Kernos to (``goals``):
the canary files, the secrets in output and namespaces, host objects where
only plain or agent data may be, the human namespace, the budget, and a
denial swallowed while the code's other effects stay.
"""

from __future__ import annotations

import decimal
import importlib
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from RestrictedPython import compile_restricted_exec
from RestrictedPython.Guards import (
    guarded_iter_unpack_sequence,
    guarded_unpack_sequence,
    safe_builtins,
    safer_getattr,
)
from RestrictedPython.PrintCollector import PrintCollector

from kernos.errors import BoundaryError, CapabilityDenied
from security.corpus import CORPUS, ids
from security.goals import Walker, World, file_violations, human_violations
from security.harness import Report, echo, peek, run_isolated
from security.payload import Payload

MODULES = ("math", "json", "re", "datetime", "decimal")
NAIVE_MODULE = "agent:mallory"
_INPLACE: dict[str, Callable[[Any, Any], Any]] = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow,
    "<<=": operator.ilshift, ">>=": operator.irshift, "&=": operator.iand,
    "|=": operator.ior, "^=": operator.ixor,
}


def naive_import(name: str, *args: object, **kwargs: object) -> object:
    if name not in MODULES:
        raise ImportError(f"{name} is not allowed")
    return importlib.import_module(name)


@dataclass
class Budget:
    limit: int = 10
    used: Any = 0


@dataclass
class NaiveWorld:
    """mallory's (and victim's) grants over the human's raw objects, checked naively."""

    human: dict[str, Any]
    reads: dict[str, list[str]]
    writes: dict[str, list[str]]
    calls: dict[str, list[str]]
    budget: Budget = field(default_factory=Budget)
    tools: dict[str, Callable[..., Any]] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)

    def api(self, who: str) -> dict[str, object]:
        def deny(capability: str) -> CapabilityDenied:
            return CapabilityDenied(who, capability)

        def read(name: Any) -> Any:
            if name not in self.reads[who]:
                raise deny(f"read:{name}")
            return self.human[name]

        def write(name: Any, value: Any) -> None:
            if name not in self.writes[who]:
                raise deny(f"write:{name}")
            self.human[name] = value

        def call(tool: Any, /, **arguments: Any) -> Any:
            if tool not in self.calls[who] and tool not in self.tools:
                raise deny(f"call:{tool}")
            return {"echo": echo, "peek": peek, **self.tools}[tool](**arguments)

        def spend(amount: Any, unit: Any) -> Any:
            if unit != "USD" or who != "mallory":
                raise deny(f"spend:{unit}")
            if amount > self.budget.limit - self.budget.used:
                raise deny("spend:USD")
            self.budget.used += amount
            return self.budget.limit - self.budget.used

        def define_tool(name: Any, source: Any, schema: Any, description: Any) -> int:
            scope = naive_globals(self, who)
            exec(naive_compile(source), scope)
            self.tools[name] = scope[name]
            return 1

        def refuse(*args: object, **kwargs: object) -> None:
            raise deny("delegation")

        return {"read": read, "write": write, "call": call, "spend": spend,
                "define_tool": define_tool, "grants": lambda: list(self.reads[who]),
                "whoami": lambda: who, "delegate": refuse, "revoke": refuse, "spawn": refuse}


def naive_compile(source: str) -> Any:
    result = compile_restricted_exec(source, filename=f"<{NAIVE_MODULE}>")
    if result.errors or result.code is None:
        raise SyntaxError("; ".join(result.errors))
    return result.code


def naive_globals(world: NaiveWorld, who: str) -> dict[str, Any]:
    builtins = dict(safe_builtins)
    builtins.update({
        "_getattr_": safer_getattr, "_getitem_": lambda obj, key: obj[key],
        "_getiter_": iter, "_write_": lambda obj: obj, "_print_": PrintCollector,
        "__metaclass__": type, "__import__": naive_import,
        "_inplacevar_": lambda op, x, y: _INPLACE[op](x, y),
        "_apply_": lambda function, *a, **k: function(*a, **k),
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
    })
    scope: dict[str, Any] = {"__builtins__": builtins, "__name__": NAIVE_MODULE,
                             "Decimal": decimal.Decimal, "CapabilityDenied": CapabilityDenied,
                             "BoundaryError": BoundaryError}
    scope.update({name: importlib.import_module(name) for name in MODULES})
    scope.update(world.api(who))
    return scope


class NaiveWalker(Walker):
    """The agent side of the naive sandbox: its classes are plain ``type``s of its module."""

    def _agent_side(self, value: Any, kind: type, path: str, depth: int) -> None:
        if isinstance(value, type) and value.__module__ == NAIVE_MODULE:
            for key, item in vars(value).items():
                if not (key.startswith("__") and key.endswith("__")):
                    self.walk(item, f"{path}.{key}", depth + 1)
        elif kind.__module__ == NAIVE_MODULE and not isinstance(value, type):
            self.walk(dict(getattr(value, "__dict__", {})), f"{path}.<dict>", depth + 1)
            if isinstance(value, BaseException):
                self.walk(value.args, f"{path}.args", depth + 1)
        else:
            super()._agent_side(value, kind, path, depth)

    def _function(self, function: Any, path: str, into: Callable[[object, str], None]) -> None:
        if function.__globals__.get("__name__") == NAIVE_MODULE:
            for cell in function.__closure__ or ():
                into(cell.cell_contents, ".<closure>")
            into(function.__defaults__, ".<defaults>")
        else:
            super()._function(function, path, into)


def run_stage(world: NaiveWorld, scope: dict[str, Any], source: str) -> None:
    try:
        exec(naive_compile(source), scope)
    except BaseException as error:
        world.texts.append(f"{type(error).__name__}: {str(error)[:1000]}")
        if not isinstance(error, Exception):
            world.texts.append("NOT-AN-EXCEPTION")
    printed = scope.pop("_print", None)
    if printed is not None:
        world.texts.append(printed())


def run_naive(world: World, payload: Payload) -> Report:
    """The payload against the naive sandbox; the goals it reached (run in a child)."""
    naive = NaiveWorld(human=world.human_initial(),
                       reads={"mallory": ["public", "canary_path", "target_path", "scratch"],
                              "victim": ["SECRET"]},
                       writes={"mallory": ["scratch"], "victim": []},
                       calls={"mallory": ["echo"], "victim": ["echo"]})
    naive.human["SECRET"] = world.secret
    mallory = naive_globals(naive, "mallory")
    victim = naive_globals(naive, "victim")
    victim["vsecret"] = world.vsecret
    initial = {key: id(value) for key, value in mallory.items()}
    run_stage(naive, mallory, payload.source)
    if payload.followup is not None:
        run_stage(naive, mallory, payload.followup)
    if payload.victim is not None:
        run_stage(naive, victim, payload.victim)
    return Report(violations=naive_goals(world, naive, mallory, victim, initial))


def naive_goals(world: World, naive: NaiveWorld, mallory: dict[str, Any],
                victim: dict[str, Any], initial: dict[str, int]) -> list[str]:
    """The goals of ``goals.goal_violations``, read off the naive sandbox's state."""
    found = [f"the output or an error message holds {what}" for text in naive.texts
             for what, secret in world.secrets.items() if secret in text]
    if "NOT-AN-EXCEPTION" in naive.texts:
        found.append("a BaseException that is not an Exception escaped to the host")
    found += file_violations(world)
    found += human_violations(world, naive.human)
    walker = NaiveWalker(plain_only=False)
    for name, value in mallory.items():
        if initial.get(name) != id(value) and not name.startswith("_"):
            walker.walk(value, name)
    found += walker.found
    found += [f"{where}: holds {what}" for where, text in walker.strings
              for what, secret in world.secrets.items() if secret in text]
    if "swallowed" in mallory:
        found.append("mallory swallowed a denial and kept its other effects")
    used = naive.budget.used
    if not (isinstance(used, (int, decimal.Decimal)) and not isinstance(used, bool)
            and 0 <= used <= naive.budget.limit):
        found.append(f"the budget's used amount is {used!r}")
    found += [f"victim's {key} is {value!r}" for key, value in victim.items()
              if key.startswith("v_") and value not in (3, True)]
    return found


NAIVE = [payload for payload in CORPUS if payload.naive]
NAIVE_IDS = [name for payload, name in zip(CORPUS, ids(CORPUS), strict=True) if payload.naive]


@pytest.fixture(scope="module")
def naive_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    from security.harness import build_world

    results = {}
    for payload, name in zip(NAIVE, NAIVE_IDS, strict=True):
        world = build_world(tmp_path_factory.mktemp(name))
        report = run_isolated(world, payload, runner=run_naive, timeout=10)
        assert report.crashed is None, (name, report.crashed)
        results[name] = report.violations
    return results


def test_the_naive_sandbox_lets_many_payloads_reach_their_goals(
        naive_results: dict[str, list[str]]) -> None:
    reached = {name: problems for name, problems in naive_results.items() if problems}
    categories = {name.rsplit("-", 1)[0] for name in reached}
    assert len(reached) >= 10, reached
    assert len(categories) >= 3, categories


@pytest.mark.parametrize("name, expected", [
    ("imports-3", "holds the canary file's content"),
    ("imports-5", "holds the canary file's content"),
    ("namespaces-5", "the human's public changed"),
    ("swallow-1", "swallowed a denial"),
    ("typeconfusion-5", "the budget's used amount"),
    ("timebombs-1", "not plain data"),
    ("baseexception-1", "not an Exception"),
])
def test_named_payloads_escape_the_naive_sandbox(naive_results: dict[str, list[str]],
                                                 name: str, expected: str) -> None:
    assert any(expected in problem for problem in naive_results[name]), naive_results[name]


def test_a_harmless_payload_reaches_nothing_even_in_the_naive_sandbox(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    from security.harness import build_world

    harmless = Payload(category="none", goal="none",
                       source="p = read('public')\nx = [p['n'], 2]\nprint(x)\n")
    report = run_isolated(build_world(tmp_path_factory.mktemp("harmless")), harmless,
                          runner=run_naive, timeout=10)
    assert (report.crashed, report.violations) == (None, [])
