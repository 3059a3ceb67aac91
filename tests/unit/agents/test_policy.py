"""The agent dialect: what compile_agent refuses before anything runs, and what it accepts."""

from __future__ import annotations

import dis
import time
import types

import pytest

from kernos.agents.policy import DEFAULT_MAX_DEPTH, DEFAULT_MAX_SOURCE, compile_agent
from kernos.errors import AgentCodeRejected, UsageError


def compile_(source: object, **limits: int) -> types.CodeType:
    return compile_agent(source, principal="alice", filename="<agent:alice>", **limits)


def rejected(source: object, **limits: int) -> list[str]:
    with pytest.raises(AgentCodeRejected) as raised:
        compile_(source, **limits)
    assert raised.value.principal == "alice"
    assert raised.value.problems
    assert "The code for agent 'alice' was refused before it ran" in str(raised.value)
    return raised.value.problems


REJECTED = {
    "import": ("import os", "imports are not available"),
    "import-as": ("import json as j", "imports are not available"),
    "from-import": ("from os import path", "imports are not available"),
    "from-import-star": ("from math import *", "imports are not available"),
    "nested-import": ("def f():\n    import os", "imports are not available"),
    "bare-except": ("try:\n    x = 1\nexcept:\n    pass", "bare 'except:'"),
    "finally": ("try:\n    x = 1\nfinally:\n    y = 2", "'finally' is not available"),
    "except-unknown-name": ("try:\n    x = 1\nexcept BaseException:\n    pass",
                            "may name only the exceptions"),
    "except-expression": ("try:\n    x = 1\nexcept (ValueError, 5):\n    pass",
                          "may name only the exceptions"),
    "rebind-exception": ("ValueError = 5", "'ValueError' is a builtin"),
    "rebind-builtin-def": ("def len(x):\n    return 0", "'len' is a builtin"),
    "rebind-builtin-arg": ("def f(read):\n    return read", "'read' is a builtin"),
    "rebind-except-as": ("try:\n    x = 1\nexcept ValueError as TypeError:\n    pass",
                         "'TypeError' is a builtin"),
    "rebind-loop-target": ("for Exception in [1]:\n    pass", "'Exception' is a builtin"),
    "rebind-class": ("class call:\n    pass", "'call' is a builtin"),
    "global": ("def f():\n    global x\n    x = 1", "'global' is not allowed"),
    "global-top": ("global x\nx = 1", "'global' is not allowed"),
    "__eq__": ("class A:\n    def __eq__(self, other):\n        return True",
               "special method '__eq__'"),
    "__del__": ("class A:\n    def __del__(self):\n        pass", "special method '__del__'"),
    "__hash__": ("class A:\n    def __hash__(self):\n        return 1", "'__hash__'"),
    "__getattr__": ("class A:\n    def __getattr__(self, name):\n        return 1",
                    "'__getattr__'"),
    "__repr__": ("class A:\n    def __repr__(self):\n        return 'a'", "'__repr__'"),
    "__iter__": ("class A:\n    def __iter__(self):\n        return iter([])", "'__iter__'"),
    "__init_subclass__": ("class A:\n    def __init_subclass__(cls):\n        pass",
                          "'__init_subclass__'"),
    "dunder-assign": ("class A:\n    __eq__ = None", "starts with \"_\""),
    "underscore-name": ("_x = 1", "\"_x\" is an invalid variable name"),
    "underscore-attr": ("y = [].__class__", "\"__class__\" is an invalid attribute name"),
    "private-attr": ("y = x._private", "\"_private\" is an invalid attribute name"),
    "underscore-arg": ("def f(_a):\n    pass", "_a"),
    "exec": ("exec('x = 1')", "Exec calls are not allowed"),
    "eval": ("eval('1')", "Eval calls are not allowed"),
    "async-def": ("async def f():\n    pass", "AsyncFunctionDef statements are not allowed"),
    "async-for": ("async def f():\n    async for x in y:\n        pass", "not allowed"),
    "try-star": ("try:\n    pass\nexcept* ValueError:\n    pass",
                 "TryStar statements are not allowed"),
    "nonlocal": ("def f():\n    x = 1\n    def g():\n        nonlocal x\n        x = 2",
                 "Nonlocal statements are not allowed"),
    "metaclass": ("class A(metaclass=int):\n    pass", "metaclass"),
    "syntax": ("def f(:\n    pass", "line 1"),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_refused_constructs(case: str) -> None:
    source, words = REJECTED[case]
    problems = rejected(source)
    assert any(words in problem for problem in problems), problems


def test_every_problem_is_reported() -> None:
    problems = rejected("import os\n_x = 1\ndef f():\n    global y")
    assert len(problems) == 3


def test_agent_code_rejected_is_a_usage_error() -> None:
    assert issubclass(AgentCodeRejected, UsageError)


@pytest.mark.parametrize("source", [None, b"x = 1", 5, ["x = 1"], compile("1", "s", "eval")])
def test_source_must_be_a_str(source: object) -> None:
    problems = rejected(source)
    assert problems == [f"the code is a {type(source).__name__}, not a string"]


def test_a_str_subclass_is_not_source() -> None:
    class Source(str):
        pass

    assert rejected(Source("x = 1")) == ["the code is a Source, not a string"]


def test_the_source_size_is_capped() -> None:
    assert DEFAULT_MAX_SOURCE == 64 * 1024
    fits = "x = 1\n" * (DEFAULT_MAX_SOURCE // 6)
    compile_(fits)
    problems = rejected(fits + "y = 22\n")
    assert problems == [f"the code is {len(fits) + 7:,} bytes, over the limit of 65,536"]
    assert rejected("x = 'éé'", max_source=8)[0].startswith("the code is 10 bytes")  # bytes


def test_a_1000_term_chain_is_rejected_cleanly() -> None:
    started = time.perf_counter()
    problems = rejected("x = " + " + ".join(["1"] * 1000))
    assert problems == [f"the code is nested {DEFAULT_MAX_DEPTH + 1}+ levels deep, over the "
                        f"limit of {DEFAULT_MAX_DEPTH}"]
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize("source", [
    "x = " + "(" * 300 + "1" + ")" * 300,
    "x = " + "[" * 300 + "]" * 300,
    "x = " + "+".join(["1"] * 30_000),
    "x = " + "-" * 30_000 + "1",
    "x = " + "not " * 15_000 + "1",
    "x = a" + ".b" * 20_000,
    "x = f" + "(1)" * 20_000,
    "if x:\n" + "".join("    " * level + "if x:\n" for level in range(1, 150))
    + "    " * 150 + "pass",
])
def test_pathological_nesting_is_rejected_cleanly(source: str) -> None:
    assert len(source) <= DEFAULT_MAX_SOURCE
    rejected(source)  # an AgentCodeRejected: no RecursionError, no crash


def test_the_depth_limit_is_configurable() -> None:
    chain = "x = " + " + ".join(["1"] * 20)
    compile_(chain)
    assert "over the limit of 10" in rejected(chain, max_depth=10)[0]


def test_a_lone_surrogate_is_rejected_cleanly() -> None:
    rejected("x = '\udc80'")


def test_a_nul_byte_is_rejected_cleanly() -> None:
    rejected("x = 1\0")


ACCEPTED = {
    "functions": "def f(a, b=2, *args, c=3, **kw):\n    return a + b + c\ny = f(1)",
    "lambda": "f = lambda x: x + 1",
    "class-with-init": "class A:\n    def __init__(self, x):\n        self.x = x\n"
                       "    def get(self):\n        return self.x\na = A(1).get()",
    "subclass": "class A:\n    pass\nclass B(A):\n    pass",
    "exception-class": "class Oops(ValueError):\n    pass",
    "comprehensions": "a = [i * i for i in range(3)]\nb = {i: i for i in a}\n"
                      "c = {i for i in a}\nd = sum(i for i in a)",
    "try-except": "try:\n    int('x')\nexcept ValueError as error:\n    r = error.args\n"
                  "except (TypeError, KeyError):\n    pass\nelse:\n    q = 1",
    "f-strings": "x = 1\ny = f'{x} {x!r} {x:>5} {x + 1:03d}'",
    "generators": "def g():\n    yield 1\n    yield from [2]\nz = list(g())",
    "while": "n = 0\nwhile n < 3:\n    n += 1\nelse:\n    pass",
    "unpacking": "a, *b = [1, 2, 3]\nfor x, y in [(1, 2)]:\n    pass",
    "walrus": "if (n := 3) > 2:\n    pass",
    "raise": "def f():\n    raise ValueError('no')",
    "assert": "assert 1 == 1, 'fine'",
    "single-underscore": "for _ in range(2):\n    pass",
    "decorators": "def deco(f):\n    return f\n@deco\ndef g():\n    pass",
    "print": "print('hello', 1, sep='-')",
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_ordinary_code_compiles(case: str) -> None:
    code = compile_(ACCEPTED[case])
    assert isinstance(code, types.CodeType)
    assert code.co_filename == "<agent:alice>"


def test_binary_operators_are_routed_through_the_size_guard() -> None:
    code = compile_("a = 2 ** 8\nb = 'x' * 3\nc = 1 << 4\nd = 1 + 2\ne = 7 // 2")
    loads = [instruction for instruction in dis.get_instructions(code)
             if instruction.argval == "_binop_"]
    assert len(loads) == 3
