"""The guards agent code runs under: attribute, item, iteration and write allowlists,
the operator size guards, bounded print, and the agent builtins."""

from __future__ import annotations

import datetime
import decimal
import re
import time

import pytest

from kernos.agents import guards
from kernos.agents.boundary import ObjectView
from kernos.agents.context import BoundedOutput
from kernos.agents.guards import (
    AGENT_BUILTINS,
    EXCEPTIONS,
    MODULES,
    ModuleView,
    guarded_binop,
    guarded_getattr,
    guarded_getitem,
    guarded_getiter,
    guarded_hasattr,
    guarded_inplacevar,
    guarded_pow,
    guarded_write,
)
from kernos.errors import OpVetoed


class MyStr(str):
    pass


class MyList(list):  # type: ignore[type-arg]
    pass


class MyDict(dict):  # type: ignore[type-arg]
    pass


class Host:
    def __init__(self) -> None:
        self.x = 1

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter([1])

    def __getitem__(self, key: object) -> object:
        return key


# -- attributes ----------------------------------------------------------------------


@pytest.mark.parametrize(("obj", "name"), [
    ("abc", "upper"), ("abc", "split"), ("abc", "join"), (b"ab", "decode"), (5, "bit_length"),
    (True, "bit_length"), (1.5, "is_integer"), (decimal.Decimal(1), "quantize"),
    ([], "append"), ({}, "items"), ({1}, "union"), (frozenset(), "union"), ((1,), "count"),
    (range(3), "stop"), (datetime.date(2026, 1, 1), "year"),
    (datetime.datetime(2026, 1, 1), "isoformat"), (datetime.timedelta(1), "total_seconds"),
    (re.compile("a"), "search"), (re.match("a", "a"), "group"), (ValueError("x"), "args"),
    (datetime.datetime, "fromisoformat"), (datetime.date, "fromordinal"),
])
def test_getattr_allows_the_allowlisted_attributes(obj: object, name: str) -> None:
    assert guarded_getattr(obj, name) == getattr(obj, name)
    assert guarded_hasattr(obj, name)


@pytest.mark.parametrize(("obj", "name"), [
    ("abc", "format"), ("abc", "format_map"), ("abc", "maketrans"), (MyStr("abc"), "upper"),
    (MyList(), "append"), (5, "from_bytes"),
    (datetime.datetime, "now"), (datetime.datetime, "today"), (datetime.date, "today"),
    (decimal.Decimal, "from_float"), (dict, "fromkeys"), (str, "upper"), (str, "format"),
    (int, "from_bytes"), (object(), "x"), (Host(), "x"), (len, "self"),
    (lambda: 1, "func_globals"), (ValueError("x"), "with_traceback"),
    (OSError("x"), "args"), (KeyboardInterrupt(), "args"), ((i for i in []), "gi_frame"),
    ((i for i in []), "send"), (re.compile("a"), "scanner"), (type, "mro"),
])
def test_getattr_refuses_everything_else(obj: object, name: str) -> None:
    with pytest.raises(AttributeError):
        guarded_getattr(obj, name)
    assert guarded_getattr(obj, name, "default") == "default"
    assert not guarded_hasattr(obj, name)


@pytest.mark.parametrize("name", [5, None, MyStr("upper"), "_upper", "__class__"])
def test_getattr_names_must_be_plain_public_strings(name: object) -> None:
    with pytest.raises(AttributeError, match="plain strings not starting with '_'"):
        guarded_getattr("abc", name)


@pytest.mark.parametrize(("module", "name"), [
    ("datetime", "sys"), ("re", "enum"), ("json", "codecs"), ("json", "decoder"),
    ("json", "JSONDecoder"), ("math", "os"), ("re", "sre_compile"), ("re", "functools"),
    ("decimal", "getcontext"), ("decimal", "setcontext"), ("datetime", "timezone"),
])
def test_module_views_expose_only_their_members(module: str, name: str) -> None:
    view = MODULES[module]
    assert type(view) is ModuleView
    with pytest.raises(AttributeError, match=f"cannot read ModuleView.{name}"):
        guarded_getattr(view, name)
    with pytest.raises(AttributeError):
        guarded_getattr(view, "_members")


def test_module_views_members() -> None:
    import json
    import math

    assert guarded_getattr(MODULES["json"], "loads") is json.loads
    assert guarded_getattr(MODULES["math"], "sqrt") is math.sqrt
    assert guarded_getattr(MODULES["datetime"], "datetime") is datetime.datetime
    assert guarded_getattr(MODULES["decimal"], "Decimal") is decimal.Decimal
    assert sorted(MODULES) == ["datetime", "decimal", "files", "json", "math", "re"]


def test_module_views_pickle_by_name() -> None:
    import pickle

    for name, view in MODULES.items():
        data = pickle.dumps(view)
        assert pickle.loads(data) is view
        assert len(data) < 200, name


# -- items, iteration, writes -------------------------------------------------------------


def test_getitem_allowlist() -> None:
    assert guarded_getitem([1, 2], 1) == 2
    assert guarded_getitem({"a": 1}, "a") == 1
    assert guarded_getitem("abc", slice(1, None)) == "bc"
    assert guarded_getitem((1, 2), -1) == 2
    assert guarded_getitem(range(5), 2) == 2
    assert guarded_getitem(b"ab", 0) == 97
    for obj in (MyList([1]), MyDict(a=1), Host(), MyStr("abc"), object()):
        with pytest.raises(TypeError, match="agent code cannot index"):
            guarded_getitem(obj, 0)


def test_getiter_allowlist() -> None:
    generator = (i for i in range(2))
    pairs = zip([1], [2], strict=True)
    for obj, expected in (([1, 2], [1, 2]), ("ab", ["a", "b"]), ({"k": 1}.items(), [("k", 1)]),
                          (generator, [0, 1]), (range(2), [0, 1]), (pairs, [(1, 2)])):
        assert list(guarded_getiter(obj)) == expected
    for obj in (MyList([1]), MyDict(a=1), Host(), 5, MyStr("ab"), None):
        with pytest.raises(TypeError, match="agent code cannot iterate"):
            guarded_getiter(obj)


def test_write_allowlist() -> None:
    for obj in ([], {}, set(), bytearray(), ObjectView("data")):
        assert guarded_write(obj) is obj
    for obj in ((), "s", 5, frozenset(), MyList(), MyDict(), Host(), datetime.date.today(),
                str, guards):
        with pytest.raises(TypeError, match="agent code cannot change"):
            guarded_write(obj)


# -- operator size guards -------------------------------------------------------------


@pytest.mark.parametrize(("symbol", "left", "right"), [
    ("**", 10, 10**6), ("**", -10, 10**6), ("**", 2, 10**7), ("**", 10**6, 10**5),
    ("*", "x", 10**8), ("*", 10**8, "x"), ("*", b"x", 10**8), ("*", [0], 10**8),
    ("*", (0,), 10**8), ("*", "ab", 6_000_000), ("*", 10**200_000, 10**200_000),
    ("<<", 1, 10**7), ("<<", 1, 1_000_001), ("<<", True, 10**9),
], ids=lambda value: str(value)[:20] if not isinstance(value, int) or value < 10**20 else "big")
def test_binop_refuses_results_too_large_to_build(symbol: str, left: object,
                                                  right: object) -> None:
    started = time.perf_counter()
    with pytest.raises(OverflowError, match="the result would have over"):
        guarded_binop(symbol, left, right)
    assert time.perf_counter() - started < 1


@pytest.mark.parametrize(("symbol", "left", "right", "expected"), [
    ("**", 2, 10, 1024), ("**", 2, -1, 0.5), ("**", 1, 10**9, 1), ("**", 0, 10**9, 0),
    ("**", -1, 10**9 + 1, -1), ("**", 2.0, 3, 8.0), ("**", 10, 1000, 10**1000),
    ("*", "ab", 3, "ababab"), ("*", [0], 3, [0, 0, 0]), ("*", 3, 4, 12),
    ("*", "x", -5, ""), ("*", 10**100, 10**100, 10**200), ("*", 1.5, 2, 3.0),
    ("<<", 1, 5, 32), ("<<", 0, 10**9, 0),
    ("*", decimal.Decimal("1.5"), 2, decimal.Decimal("3.0")),
], ids=lambda value: str(value)[:20] if not isinstance(value, int) or value < 10**20 else "big")
def test_binop_keeps_normal_arithmetic(symbol: str, left: object, right: object,
                                       expected: object) -> None:
    assert guarded_binop(symbol, left, right) == expected


def test_inplace_and_pow_are_guarded_too() -> None:
    with pytest.raises(OverflowError):
        guarded_inplacevar("**=", 10, 10**7)
    with pytest.raises(OverflowError):
        guarded_inplacevar("*=", "x", 10**8)
    with pytest.raises(OverflowError):
        guarded_inplacevar("<<=", 1, 10**7)
    half = "x" * 6_000_000
    with pytest.raises(OverflowError, match=r"\+="):
        guarded_inplacevar("+=", half, half)
    items = [1]
    assert guarded_inplacevar("+=", items, [2]) is items and items == [1, 2]
    assert guarded_inplacevar("-=", 5, 2) == 3
    with pytest.raises(OverflowError):
        guarded_pow(10, 10**6)
    assert guarded_pow(2, 10) == 1024
    assert guarded_pow(2, 10**6, 1000) == pow(2, 10**6, 1000)


@pytest.mark.parametrize("expression", [
    "10 ** 10 ** 6", "'x' * 10 ** 8", "1 << 10 ** 7", "pow(10, 10 ** 6)", "[0] * 10 ** 8",
])
def test_agent_code_hits_the_size_guards(env, expression: str) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
    started = time.perf_counter()
    out = env.run("alice", f"""
try:
    big = {expression}
    print('BUILT')
except OverflowError as error:
    print('refused')
n = 10
n **= 3
print(2 ** 10, 'ab' * 3, [0] * 3, 3 * 4, 1 << 5, n, 7 // 2, divmod(7, 2))
""")
    assert out.splitlines() == ["refused", "1024 ababab [0, 0, 0] 12 32 1000 3 (3, 1)"]
    assert time.perf_counter() - started < 2


def test_agent_code_cannot_reach_around_the_allowlists(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
    out = env.run("alice", """
probes = [
    lambda: '{0}'.format(1),
    lambda: '{x}'.format_map({'x': 1}),
    lambda: getattr('a', 'format'),
    lambda: datetime.sys,
    lambda: re.enum,
    lambda: json.codecs,
    lambda: getattr(json, 'codecs'),
    lambda: datetime.datetime.now(),
    lambda: math.sqrt.self,
    lambda: json.loads.globals,
]
for probe in probes:
    try:
        probe()
        print('LEAKED')
    except AttributeError:
        print('no')
print('a'.upper(), getattr('b', 'upper')(), json.loads('[1]'), math.floor(2.5))
""")
    assert out.splitlines() == ["no"] * 10 + ["A B [1] 2"]


def test_agent_classes_are_confined(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
    out = env.run("alice", """
class Point:
    def __init__(self, x):
        self.x = x
    def double(self):
        return self.x * 2
class Oops(ValueError):
    pass
p = Point(3)
p.y = 4
print(p.double(), p.x, p.y, isinstance(p, Point))
try:
    raise Oops('bad')
except ValueError as error:
    print('caught', error.args)
for base in (dict, list, str, int):
    try:
        class Bad(base):
            pass
        print('SUBCLASSED', base)
    except TypeError:
        print('refused')
for name in ('mro', 'missing'):
    try:
        getattr(Point, name)
        print('LEAKED', name)
    except AttributeError:
        print('no')
""")
    assert out.splitlines() == ["6 3 4 True", "caught ('bad',)", "refused", "refused",
                                "refused", "refused", "no", "no"]


def test_the_agent_builtins() -> None:
    # C code (datetime's strftime) imports through the caller's builtins: only
    # what it needs, and agent code cannot name it.
    importer = AGENT_BUILTINS["__import__"]
    assert importer("time").__name__ == "time"  # type: ignore[operator]
    for module in ("os", "sys", "builtins", "importlib", "subprocess"):
        with pytest.raises(ImportError):
            importer(module)  # type: ignore[operator]
    for missing in ("type", "object", "open", "BaseException", "eval", "exec",
                    "compile", "globals", "locals", "vars", "dir", "setattr", "delattr",
                    "input", "breakpoint", "memoryview", "bytearray", "super", "classmethod",
                    "staticmethod", "property", "help", "exit", "quit", "KeyboardInterrupt",
                    "SystemExit", "GeneratorExit", "OSError", "Warning", "id", "hash"):
        assert missing not in AGENT_BUILTINS, missing
    for present in ("read", "write", "call", "spend", "grants", "delegate", "revoke", "spawn",
                    "define_tool", "whoami", "Decimal", "math", "json", "re", "datetime",
                    "decimal", "len", "_print_", "_getattr_", "_getitem_", "_getiter_",
                    "_write_", "_binop_", "_inplacevar_"):
        assert present in AGENT_BUILTINS, present
    assert AGENT_BUILTINS["getattr"] is guarded_getattr
    assert AGENT_BUILTINS["iter"] is guarded_getiter
    assert all(issubclass(error, Exception) for error in EXCEPTIONS.values())
    assert set(EXCEPTIONS) <= set(AGENT_BUILTINS)


# -- print --------------------------------------------------------------------------


def test_bounded_output() -> None:
    output = BoundedOutput(10)
    output.write("12345")
    output.write("67890abc")
    output.write("more")
    assert output.parts == ["12345", "67890"]
    assert (output.size, output.dropped) == (10, 7)
    assert output.text() == "1234567890\n... (7 more bytes not shown)\n"
    assert BoundedOutput(10).text() == ""


def test_print_is_bounded(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice", output_bytes=1000)
    out = env.run("alice", "for i in range(2000):\n    print('x' * 99)\nprint('end', sep='')")
    kept, _, tail = out.partition("\n... ")
    assert len(kept) == 1000
    assert tail == f"({2000 * 100 + 4 - 1000:,} more bytes not shown)\n"


def test_print_takes_only_sep_and_end(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
    out = env.run("alice", """
print(1, 2, sep='-', end='!\\n')
for kwargs in ({'file': None}, {'sep': 5}, {'end': b'x'}, {'flush': True}):
    try:
        print(1, **kwargs)
        print('ACCEPTED', kwargs)
    except TypeError:
        print('refused')
""")
    assert out.splitlines() == ["1-2!", "refused", "refused", "refused", "refused"]


def test_the_output_limit_is_in_bytes(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice", output_bytes=100)
    out = env.run("alice", "print('€' * 1000)")
    kept, _, _ = out.partition("\n... ")
    assert len(kept.encode("utf-8")) <= 100


def test_print_does_not_keep_what_it_drops(env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    printers: list[guards._Printer] = []

    class Recording(guards._Printer):
        def __init__(self, *args: object) -> None:
            super().__init__(*args)
            printers.append(self)

    monkeypatch.setitem(AGENT_BUILTINS, "_print_", Recording)
    with env.op():
        env.agents.add("alice", output_bytes=1000)
    env.run("alice", "for i in range(2000):\n    print('x' * 99)")
    assert printers
    assert sum(printer.kept.size for printer in printers) <= 10_000


def test_a_caught_denial_still_vetoes(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
    op = env.image.begin(source="")
    out = env.runtime.run("alice", "try:\n    read('x')\nexcept CapabilityDenied:\n"
                                   "    print('caught')").output
    assert out == "caught\n"
    with pytest.raises(OpVetoed, match="'alice' was denied 'read:x'"):
        op.commit()
