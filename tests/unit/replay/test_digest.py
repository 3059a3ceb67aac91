"""Canonical digests: equal states digest equally in any process, different states differ."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import hashlib
import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import pandas
import pytest

from kernos.replay.difference import describe_difference, describe_state_difference
from kernos.replay.digest import digest, state_digest
from kernos.serialize.pickler import Serializer

KERNEL = Path(__file__).resolve().parents[3] / "kernel"

# One cell, compiled under a file name holding the PID, as ipykernel does.
CELL = textwrap.dedent('''
    import dataclasses
    import numpy
    import pandas

    words = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"}
    frozen = frozenset({"x", "y", ("t", 1), frozenset({"inner", "set"})})
    table = {"b": 2, "a": [1, 2.5, None], "c": {"nested": (True, b"raw")}}

    def add(x, y=3, *, z=4):
        """Adds."""
        return x + y + z + len(words)

    def counter():
        count = [0]
        def step(by=1):
            count[0] += by
            return count[0]
        return step

    tick = counter()
    tick()

    class Account:
        kind = "savings"
        def deposit(self, amount):
            self.balance += amount
            return self.balance

    account = Account()
    account.balance = 10
    account.deposit(5)

    @dataclasses.dataclass
    class Point:
        x: int
        y: float = 0.5
        tags: list = dataclasses.field(default_factory=list)

    point = Point(1, tags=["a"])
    array = numpy.arange(12, dtype="<i4").reshape(3, 4)
    objects = numpy.array([words, "s", 3], dtype=object)
    frame = pandas.DataFrame({"n": [1, 2, 3], "s": ["p", "q", "r"]})
    frame["f"] = frame["n"] * 0.5
''')

CHILD = textwrap.dedent('''
    import json, os, sys
    from kernos.replay.digest import state_digest
    namespace = {"__name__": "__main__"}
    filename = f"/tmp/ipykernel_{os.getpid()}/cell.py"
    exec(compile(sys.argv[1], filename, "exec", dont_inherit=True), namespace)
    names = {name: value for name, value in namespace.items() if not name.startswith("__")}
    print(json.dumps(state_digest(names)))
''')


def run_cell(source: str = CELL) -> dict[str, object]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    filename = f"/tmp/ipykernel_{os.getpid()}/cell.py"
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)
    return {name: value for name, value in namespace.items() if not name.startswith("__")}


@pytest.mark.slow
def test_digests_agree_across_processes_and_hash_seeds() -> None:
    whole, each = state_digest(run_cell())
    seeds = ["0", "1", "12345", str(random.randrange(1, 2**32))]
    environment = {**os.environ, "PYTHONPATH": str(KERNEL)}
    for seed in seeds:
        result = subprocess.run(
            [sys.executable, "-c", CHILD, CELL], env={**environment, "PYTHONHASHSEED": seed},
            capture_output=True, text=True, check=True, timeout=120)
        child_whole, child_each = json.loads(result.stdout)
        assert child_each == each, f"PYTHONHASHSEED={seed}"
        assert child_whole == whole, f"PYTHONHASHSEED={seed}"


def test_the_cross_process_namespace_is_not_trivially_equal() -> None:
    # Guards the test above: its names digest differently from each other and change
    # when the cell does.
    names = run_cell()
    _, each = state_digest(names)
    assert len(set(each.values())) == len(each)
    _, changed = state_digest(run_cell(CELL.replace("count[0] += by", "count[0] += 2 * by")))
    assert changed["tick"] != each["tick"]
    # counter's code holds step's code as a constant.
    assert {name for name in each if changed[name] != each[name]} == {"counter", "tick"}


def test_sets_digest_alike_whatever_their_insertion_order() -> None:
    words = [f"word{index}" for index in range(200)]
    shuffled = random.Random(7).sample(words, len(words))
    assert digest(set(words)) == digest(set(shuffled))
    assert digest(frozenset(words)) == digest(frozenset(shuffled))
    assert digest({"k": set(words), "n": {(1, "a"), (2, "b")}}) == \
        digest({"k": set(shuffled), "n": {(2, "b"), (1, "a")}})
    assert digest(set(words)) != digest(set(words[1:]))
    assert digest(set(words)) != digest(frozenset(words))


def test_dict_order_is_state() -> None:
    assert digest({"a": 1, "b": 2}) != digest({"b": 2, "a": 1})


def build(spec: Any) -> Any:
    """A fresh object graph from a spec: ("list"|"tuple"|"set"|"dict", items) or an atom."""
    if isinstance(spec, tuple) and spec and spec[0] in ("list", "tuple", "set", "dict"):
        kind, items = spec
        if kind == "dict":
            return {key: build(value) for key, value in items}
        built = [build(item) for item in items]
        return {"list": list, "tuple": tuple, "set": set}[kind](built)
    return spec


def random_spec(rng: random.Random, depth: int = 0) -> Any:
    if depth > 3 or rng.random() < 0.3:
        return rng.choice([rng.randint(-5, 5), rng.random(), f"s{rng.randint(0, 9)}", None,
                           True, b"b", 2**70 + rng.randint(0, 3)])
    kind = rng.choice(["list", "tuple", "set", "dict"])
    count = rng.randint(0, 4)
    if kind == "set":
        return kind, list({f"e{rng.randint(0, 20)}": None for _ in range(count)})
    if kind == "dict":
        return kind, [(f"k{index}", random_spec(rng, depth + 1)) for index in range(count)]
    return kind, [random_spec(rng, depth + 1) for _ in range(count)]


def mutate(spec: Any, rng: random.Random) -> Any:
    """The spec with exactly one change: a leaf replaced, or a container grown."""
    if not (isinstance(spec, tuple) and spec and spec[0] in ("list", "tuple", "set", "dict")):
        return ("list", [spec]) if rng.random() < 0.2 else ("changed", spec)
    kind, items = spec
    if not items or rng.random() < 0.25:
        extra = ("extra", None) if kind == "dict" else "extra"
        return kind, [*items, extra]
    index = rng.randrange(len(items))
    if kind == "dict":
        key, value = items[index]
        items = [*items[:index], (key, mutate(value, rng)), *items[index + 1:]]
    elif kind == "set":
        items = [*items[:index], f"{items[index]}!", *items[index + 1:]]
    else:
        items = [*items[:index], mutate(items[index], rng), *items[index + 1:]]
    return kind, items


def test_equal_structures_digest_alike_and_one_change_differs() -> None:
    rng = random.Random(20261123)
    for _ in range(300):
        spec = random_spec(rng)
        assert digest(build(spec)) == digest(build(spec)), spec
        changed = mutate(spec, rng)
        assert digest(build(changed)) != digest(build(spec)), (spec, changed)


def test_atoms_are_told_apart() -> None:
    values = [0, 0.0, -0.0, False, None, "", b"", 1, 1.0, True, "1", b"1", 1j, 2**100,
              -(2**100), float("inf"), decimal.Decimal("1.0"), decimal.Decimal("1.00"),
              fractions.Fraction(1, 3), (), [], {}, set(), frozenset(), bytearray(b"1"),
              range(3), slice(1, 2), Ellipsis, datetime.date(2026, 1, 1),
              datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC), numpy.float64(1.0),
              numpy.int64(1)]
    digests = [digest(value) for value in values]
    assert len(set(digests)) == len(values)
    assert digest(float("nan")) == digest(float("-nan"))


def test_string_identity_is_not_state() -> None:
    text = "".join(["shared ", "text"])
    assert digest([text, text]) == digest(["shared text", "".join(["shared ", "text"])])
    big = "x" * 100_000
    assert digest([big, big]) == digest([big, "".join(["x" * 50_000, "x" * 50_000])])


def test_aliasing_is_state() -> None:
    shared = [1, 2]
    assert digest([shared, shared]) != digest([[1, 2], [1, 2]])
    a = {"v": 1}
    assert digest({"a": a, "ref": a}) != digest({"a": a, "ref": {"v": 1}})
    assert state_digest({"a": a, "b": a})[0] != state_digest({"a": a, "b": {"v": 1}})[0]
    # Per-name digests describe values alone.
    assert state_digest({"a": a, "b": a})[1] == state_digest({"a": a, "b": {"v": 1}})[1]


def test_cycles_terminate_and_their_shape_is_state() -> None:
    loop: list[Any] = []
    loop.append(loop)
    outer: list[Any] = [[]]
    outer[0].append(outer)
    assert digest(loop) != digest(outer)
    node: dict[str, Any] = {"name": "n"}
    node["self"] = node
    other: dict[str, Any] = {"name": "n"}
    other["self"] = other
    assert digest(node) == digest(other)
    assert digest(node) != digest({"name": "n", "self": {"name": "n"}})


def test_a_hundred_thousand_deep_list() -> None:
    deep: list[Any] = []
    tip = deep
    for _ in range(100_000):
        tip.append([])
        tip = tip[0]
    twin: list[Any] = []
    tip = twin
    for _ in range(100_000):
        tip.append([])
        tip = tip[0]
    assert digest(deep) == digest(twin)
    tip.append(1)
    assert digest(deep) != digest(twin)


def test_shared_immutable_tuples_are_walked_once() -> None:
    chain: tuple[Any, ...] = ()
    for _ in range(20):  # 2**20 paths: quick only if a tuple's digest is reused
        chain = (chain, chain)
    started = time.perf_counter()
    assert digest(chain) != digest((chain,))
    assert time.perf_counter() - started < 1


def compile_function(source: str, filename: str = "<cell>", first_line: int = 1) -> Any:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    padded = "\n" * (first_line - 1) + textwrap.dedent(source)
    exec(compile(padded, filename, "exec", dont_inherit=True), namespace)
    return namespace["f"]


def test_functions_by_code_not_by_place() -> None:
    source = "def f(x):\n    return x * 2 + len(str(x))\n"
    here = compile_function(source, "/tmp/ipykernel_1/a.py", 1)
    elsewhere = compile_function(source, "/tmp/ipykernel_2/b.py", 40)
    assert digest(here) == digest(elsewhere)
    assert digest(here) != digest(compile_function(source.replace("2", "3")))
    assert digest(here) != digest(compile_function(source.replace("len", "abs")))
    assert digest(here) != digest(compile_function(source.replace("(x):", "(x=1):")))
    for _ in range(2000):  # Python 3.11 specialises hot bytecode in place
        here(3)
    assert digest(here) == digest(elsewhere)


def test_closures_are_walked() -> None:
    def make(start: int) -> Callable[[], int]:
        def read() -> int:
            return start
        return read

    assert digest(make(1)) == digest(make(1))
    assert digest(make(1)) != digest(make(2))


def test_classes_defined_in_cells_by_value() -> None:
    source = "class f:\n    __slots__ = ('a',)\n    def m(self):\n        return 1\n"
    first = compile_function(source, "/tmp/ipykernel_1/a.py")
    second = compile_function(source, "/tmp/ipykernel_2/a.py", 9)
    assert digest(first) == digest(second)
    assert digest(first) != digest(compile_function(source.replace("return 1", "return 2")))
    before = digest(first)
    instance = first()
    instance.a = 1
    instance.__reduce_ex__(4)  # copyreg caches __slotnames__ in the class
    assert "__slotnames__" in vars(first)
    assert digest(first) == before
    assert digest(instance) != digest(second())


def test_enums_dataclasses_and_namedtuples() -> None:
    class Colour(enum.Enum):
        RED = 1
        BLUE = 2

    Pair = collections.namedtuple("Pair", "left right")

    @dataclasses.dataclass
    class Box:
        content: Any

    assert digest(Colour.RED) != digest(Colour.BLUE)
    assert digest(Pair(1, 2)) != digest(Pair(1, 3))
    assert digest(Pair(1, 2)) != digest((1, 2))
    assert digest(Box([1])) == digest(Box([1]))
    assert digest(Box([1])) != digest(Box([2]))


def test_live_resources_are_a_marker(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("contents")
    with path.open() as handle, open(os.devnull) as other:
        handle.read(3)
        assert digest(handle) == digest(other)
        assert handle.tell() == 3
    assert digest(threading.Lock()) == digest(threading.Lock())
    # A thread's attributes are not walked: it is not state Kernos keeps.
    assert digest(threading.Thread(name="one")) == digest(threading.Thread(name="two"))
    generator = (index for index in range(3))
    assert digest(generator) == digest(index for index in range(5))
    assert next(generator) == 0


def test_describe_difference_names_the_path() -> None:
    @dataclasses.dataclass
    class Account:
        balance: int

    first = {"accounts": {"alice": Account(3), "bob": Account(5)}, "log": [1, 2, (3, 4)]}
    second = {"accounts": {"alice": Account(3), "bob": Account(7)}, "log": [1, 2, (3, 4)]}
    assert describe_difference(first, first) is None
    assert describe_difference(first, second, root="ns") == \
        "ns['accounts']['bob'].balance: 5 != 7"
    third = {"accounts": first["accounts"], "log": [1, 2, (3, 5)]}
    assert describe_difference(first, third) == "value['log'][2][1]: 4 != 5"
    assert describe_difference([1, 2], [1, 2, 3]) == "value[2]: (nothing) != 3"
    assert "only in the first 'a'" in (describe_difference({"a", "b"}, {"b", "c"}) or "")
    shared = [0]
    assert describe_state_difference({"a": shared, "b": shared}, {"a": shared, "b": [0]}) == \
        "b: is the same object as a in the first, a separate object in the second"
    long = describe_difference(["x" * 1000], ["y" * 1000])
    assert long is not None and len(long) <= 300


def test_numpy_arrays() -> None:
    array = numpy.arange(24, dtype="<f8").reshape(4, 6)
    assert digest(array) == digest(array.copy())
    assert digest(array) != digest(array.astype("<f4"))
    assert digest(array) != digest(array.reshape(6, 4))
    changed = array.copy()
    changed[3, 5] = -1
    assert digest(array) != digest(changed)
    assert digest(array.T) == digest(numpy.ascontiguousarray(array.T))
    assert digest(numpy.array([[1], "a"], dtype=object)) != \
        digest(numpy.array([[2], "a"], dtype=object))


def test_a_large_array_digests_at_about_sha256_speed() -> None:
    array = numpy.random.default_rng(0).random(4 * 1024 * 1024)  # 32 MB
    started = time.perf_counter()
    hashlib.sha256(memoryview(array)).digest()
    baseline = time.perf_counter() - started
    started = time.perf_counter()
    digest(array)
    assert time.perf_counter() - started < 3 * baseline + 0.1


def test_pandas_frames_by_columns_not_blocks() -> None:
    together = pandas.DataFrame({"a": [1, 2], "b": [3, 4]})
    apart = pandas.DataFrame({"a": [1, 2]})
    apart["b"] = [3, 4]
    assert digest(together) == digest(apart)
    together["a"].sum()
    assert digest(together) == digest(apart)
    apart.loc[1, "b"] = 5
    assert digest(together) != digest(apart)
    assert digest(together) != digest(together.rename(columns={"a": "z"}))
    assert digest(together) != digest(together.set_index(pandas.Index([5, 6])))
    assert digest(together["a"]) != digest(together["b"])


def test_a_restore_keeps_the_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", module)
    filename = f"/tmp/ipykernel_{os.getpid()}/cell.py"
    exec(compile(CELL, filename, "exec", dont_inherit=True), module.__dict__)
    names = sorted(name for name in module.__dict__ if not name.startswith("__")
                   and not isinstance(module.__dict__[name], types.ModuleType))
    pickled = Serializer(module.__dict__, module=module).dump(
        [(name, module.__dict__[name]) for name in names], op=1)
    fresh = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", fresh)
    buffers = [memoryview(bytes(view)) if view.readonly else bytearray(view)
               for view in pickled.buffers]
    loaded = Serializer(fresh.__dict__, module=fresh).load(pickled.stream, buffers)
    original = {name: module.__dict__[name] for name in names}
    restored = dict(zip(names, loaded, strict=True))
    assert describe_state_difference(original, restored) is None
    assert state_digest(original) == state_digest(restored)


def test_an_exhausted_iterator_digests_as_the_one_its_pickle_rebuilds() -> None:
    # Stopping on its first iterator, zip leaves that one exhausted: it reduces to
    # iter([]) with no index, and the iterator pickle rebuilds says index 0.
    zipped = zip(["foo", "bar"], ["one", "two", "three"], strict=False)
    assert list(zipped) == [("foo", "one"), ("bar", "two")]
    assert digest(pickle.loads(pickle.dumps(zipped))) == digest(zipped)
    exhausted = iter((1, 2))
    list(exhausted)
    assert digest(pickle.loads(pickle.dumps(exhausted))) == digest(exhausted)
    # ... and where an iterator stands is still state
    started, fresh = iter([1, 2]), iter([1, 2])
    next(started)
    assert digest(started) != digest(fresh)
    assert digest(exhausted) != digest(iter((1, 2)))


def test_a_matplotlib_figure_digests_stably_and_as_its_pickle_rebuilds_it() -> None:
    figure_module = pytest.importorskip("matplotlib.figure")
    import numpy as np

    figure = figure_module.Figure()
    axes = figure.add_subplot(2, 2, 1)
    axes.plot(np.arange(10))
    axes.scatter(np.arange(5), np.arange(5) * 2.0)  # offsets: a masked array
    first = digest(figure)
    assert digest(figure) == first  # reading the callbacks' state must not change it
    # Rebuilt as a restore rebuilds it: what matplotlib holds as module globals (its
    # transforms' and artists' shared objects) is referenced, and so digested by name.
    module = types.ModuleType("__main__")
    serializer = Serializer(module.__dict__, module=module)
    pickled = serializer.dump([("figure", figure)])
    (rebuilt,) = serializer.load(pickled.stream, [bytes(view) for view in pickled.buffers])
    assert digest(rebuilt) == first
    axes.plot(np.arange(3))
    assert digest(figure) != first  # a new line is state


def test_a_masked_arrays_unasked_fill_value_is_its_default() -> None:
    import numpy as np

    masked = np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False])
    assert digest(pickle.loads(pickle.dumps(masked))) == digest(masked)
    other = np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False], fill_value=-1.0)
    assert digest(other) != digest(masked)
