"""I3 fidelity on real kernels: what a cell defines comes back exactly after ``kill -9``.

Every test builds state in one kernel, kills it with SIGKILL (no shutdown, no
flush), starts a new kernel on the same workspace and checks the restored
namespace from the inside.  Checks are batched into one expression per kernel
round trip, so a failure message shows every check at once.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel


def restart(kernel: Kernel, kernel_factory: Callable[..., Kernel]) -> Kernel:
    """Kill ``kernel`` with SIGKILL and start a new one on its workspace."""
    kernel.kill9()
    return kernel_factory(kernel.workspace)


def run_ok(kernel: Kernel, code: str) -> None:
    result = kernel.run(code)
    assert result.status == "ok", result.errors
    assert result.committed, result.kernos


CHECKS_CELL = """\
__checks__ = {{}}
for __check_name__, __check_source__ in {checks!r}:
    try:
        __checks__[__check_name__] = bool(eval(__check_source__, globals()))
    except BaseException as __check_error__:
        __checks__[__check_name__] = f"{{type(__check_error__).__name__}}: {{__check_error__}}"
print(repr(__checks__))
"""


def all_true(kernel: Kernel, checks: dict[str, str]) -> None:
    """Evaluate every expression in the kernel; each must be exactly True.

    Each check runs on its own, so one that raises is reported with the others
    instead of hiding them.  The helper names are dunder names, which the image
    does not persist.
    """
    result = kernel.run(CHECKS_CELL.format(checks=list(checks.items())))
    assert result.status == "ok", result.errors
    values = ast.literal_eval(result.stdout.strip())
    failed = {name: values[name] for name in checks if values[name] is not True}
    assert not failed, f"checks that are not True after the restore: {failed}"


FUNCTIONS_AND_CLASSES = '''
import functools

def add(a, b=10, *, scale=1):
    """Adds."""
    return (a + b) * scale

square = lambda x: x * x
table = {"cube": lambda x: x ** 3}

def make_counter(start):
    count = start
    def increment(step=1):
        nonlocal count
        count += step
        return count
    def current():
        return count
    return increment, current

increment, current = make_counter(100)
increment()                        # count is 101 at commit

def memo(function):
    @functools.wraps(function)
    def wrapper(*args):
        return function(*args) + 0
    return wrapper

@memo
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

class Shape:
    sides = 0
    def __init__(self, name):
        self.name = name
    def describe(self):
        return f"{self.name} with {self.sides} sides"
    @property
    def label(self):
        return self.name.upper()
    @staticmethod
    def kind():
        return "shape"
    @classmethod
    def make(cls, name):
        return cls(name)

class Square(Shape):
    sides = 4
    def __init__(self, name, size):
        super().__init__(name)
        self.size = size
    def describe(self):
        return super().describe() + f" of size {self.size}"
    @property
    def area(self):
        return self.size ** 2
    @area.setter
    def area(self, value):
        self.size = int(value ** 0.5)

sq = Square("box", 3)
sq.extra = [1, 2]
'''

DATA_CLASSES_AND_ENUMS = '''
import dataclasses, enum

@dataclasses.dataclass(order=True)
class Point:
    x: int
    y: int = 0
    tags: list = dataclasses.field(default_factory=list)

@dataclasses.dataclass(frozen=True)
class Frozen:
    key: str

class Color(enum.Enum):
    RED = 1
    GREEN = 2

class Perm(enum.IntFlag):
    R = 4
    W = 2

p = Point(1, 2, ["a"])
points = sorted([Point(3), Point(1, 5)])
frozen = Frozen("k")
favourite = Color.GREEN
palette = {Color.RED: "warm", Color.GREEN: "cool"}
mode = Perm.R | Perm.W
'''


def test_functions_closures_and_classes_survive_kill9(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    run_ok(kernel, FUNCTIONS_AND_CLASSES)
    before = kernel.value("(add(1), square(7), fib(15), sq.describe(), sq.area)")
    kernel = restart(kernel, kernel_factory)
    assert kernel.value("(add(1), square(7), fib(15), sq.describe(), sq.area)") == before
    all_true(kernel, {
        "function": "add(2, scale=3) == 36 and add.__doc__ == 'Adds.'",
        "defaults": "add.__defaults__ == (10,) and add.__kwdefaults__ == {'scale': 1}",
        "lambda": "square(9) == 81 and square.__name__ == '<lambda>'",
        "lambda in a dict": "table['cube'](3) == 27",
        "decorated": "fib(20) == 6765 and fib.__name__ == 'fib' and fib.__wrapped__(1) == 1",
        "closure state": "current() == 101",
        # Two closures over one nonlocal must still share the one cell.
        "closures share": "increment(5) == 106 and current() == 106",
        "class": "Shape('t').describe() == 't with 0 sides' and Shape.kind() == 'shape'",
        "classmethod": "type(Shape.make('q')) is Shape and Shape.make('q').name == 'q'",
        "inheritance": "issubclass(Square, Shape) and Square.__mro__[1] is Shape",
        "super": "Square('s', 2).describe() == 's with 4 sides of size 2'",
        "instance class": "type(sq) is Square and isinstance(sq, Shape)",
        "instance state": "sq.extra == [1, 2] and sq.name == 'box' and sq.label == 'BOX'",
        "property setter": "(setattr(sq, 'area', 49), sq.size)[1] == 7",
    })
    # The restored definitions are themselves persistent: a second generation
    # (new instances, a mutated closure cell) survives another kill -9.
    run_ok(kernel, "sq2 = Square('again', 5)\nincrement(10)")
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {
        "second generation instance": "type(sq2) is Square and sq2.area == 25",
        "second generation closure": "current() == 116 and increment() == 117",
        "mutation persisted": "sq.size == 7",
    })


def test_dataclasses_and_enums_survive_kill9(kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    run_ok(kernel, DATA_CLASSES_AND_ENUMS)
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {
        "dataclass value": "p == Point(1, 2, ['a']) and type(p) is Point",
        "dataclass fields": "[f.name for f in dataclasses.fields(p)] == ['x', 'y', 'tags']",
        "dataclass default factory": "Point(0).tags == [] and Point(0).tags is not Point(0).tags",
        "dataclass order": "points == [Point(1, 5), Point(3)] and Point(1) < Point(2)",
        "frozen": "frozen == Frozen('k') and hash(frozen) == hash(Frozen('k'))",
        "frozen refuses": "dataclasses.is_dataclass(frozen) and type(frozen) is Frozen",
        # Enum members are singletons: a restored member must be *the* member.
        "enum identity": "favourite is Color.GREEN and Color(2) is favourite",
        "enum keys": "palette[Color.RED] == 'warm' and list(palette)[0] is Color.RED",
        "enum iteration": "[c.name for c in Color] == ['RED', 'GREEN']",
        "int flag": "mode == 6 and Perm.R in mode and type(mode) is Perm",
    })
    result = kernel.run("Frozen('a').key = 'b'")
    assert result.status == "error"
    assert result.errors[0]["ename"] == "FrozenInstanceError"


def test_aliasing_survives_kill9_within_and_across_cells(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    run_ok(kernel, "a = [1, 2, 3]\nb = {'ref': a}\nc = (a, a)")
    run_ok(kernel, "d = {'later': a, 'b': b}")            # a reference from a later cell
    run_ok(kernel, "node = {'name': 'n'}\nnode['self'] = node")   # a cycle
    run_ok(kernel, "x = [0]\ny = [0]")                      # equal but distinct
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {
        "same cell": "b['ref'] is a and c[0] is a and c[1] is a",
        "across cells": "d['later'] is a and d['b'] is b",
        "cycle": "node['self'] is node",
        "distinct stay distinct": "x == y and x is not y",
    })
    # Sharing is real after the restore: one mutation is seen everywhere, and
    # is itself persisted.
    run_ok(kernel, "a.append(4)")
    all_true(kernel, {"mutation through the alias": "b['ref'] == [1, 2, 3, 4] == d['later']"})
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {
        "after a second restart": "a == [1, 2, 3, 4] and b['ref'] is a and d['later'] is a",
    })


def test_identity_of_classes_and_members_across_cells(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    run_ok(kernel, "import enum\nclass Account:\n    def __init__(self, owner):\n"
                   "        self.owner = owner\nclass Level(enum.Enum):\n    LOW = 1\n"
                   "    HIGH = 2")
    run_ok(kernel, "alice = Account('alice')\nlevel = Level.HIGH")
    run_ok(kernel, "old_account_class = Account\nclass Account:\n    version = 2")
    run_ok(kernel, "bob = Account()")
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {
        "instance of a class from an earlier cell": "type(alice) is old_account_class",
        "redefined class is a new class": "type(bob) is Account and Account is not "
                                          "old_account_class and Account.version == 2",
        "old instance keeps its class": "alice.owner == 'alice' and not isinstance(alice, "
                                        "Account)",
        "enum member from a later cell": "level is Level.HIGH and Level['HIGH'] is level",
    })


def test_indirect_mutations_are_persisted(kernel_factory: Callable[..., Kernel]) -> None:
    """A cell that mutates a global through earlier-defined code, without naming it."""
    kernel = kernel_factory()
    run_ok(kernel, """
journal = []
totals = {'sum': 0}
def record(entry):
    journal.append(entry)
class Adder:
    def add(self, value):
        totals['sum'] += value
adder = Adder()
actions = {'push': lambda value: journal.append(('lambda', value))}
""")
    run_ok(kernel, "record('first')")
    run_ok(kernel, "adder.add(5)")
    run_ok(kernel, "actions['push'](7)")
    kernel = restart(kernel, kernel_factory)
    assert kernel.value("(journal, totals)") == (["first", ("lambda", 7)], {"sum": 5})


def test_modules_come_back_as_the_imported_modules(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    run_ok(kernel, "import json, sys\nimport os.path as osp\nfrom collections import "
                   "OrderedDict\nimport xml.etree.ElementTree as ET\nmods = {'j': json}")
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {
        "module": "json is sys.modules['json'] and json.dumps([1]) == '[1]'",
        "aliased submodule": "osp is sys.modules['os.path'] and osp.join('a', 'b') == 'a/b'",
        "imported class": "OrderedDict is sys.modules['collections'].OrderedDict",
        "dotted module": "ET is sys.modules['xml.etree.ElementTree']",
        "module inside a container": "mods['j'] is json",
    })


def test_numpy_arrays_survive_kill9(kernel_factory: Callable[..., Kernel]) -> None:
    pytest.importorskip("numpy")
    kernel = kernel_factory()
    run_ok(kernel, """
import numpy as np
ints = np.arange(12, dtype=np.int16).reshape(3, 4)
floats = np.linspace(0, 1, 1000, dtype=np.float32)
fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))
record = np.array([(1, 2.5), (2, 3.5)], dtype=[('id', 'i4'), ('v', 'f8')])
big = np.random.default_rng(0).standard_normal(300_000)
big_sum = float(big.sum())
frozen = np.ones(5)
frozen.flags.writeable = False
empty = np.zeros((0, 3), dtype=complex)
objects = np.array([{'k': 1}, None, 'text'], dtype=object)
""")
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {
        "values": "np.array_equal(ints, np.arange(12).reshape(3, 4))",
        "dtype": "ints.dtype == np.int16 and floats.dtype == np.float32",
        "shape": "ints.shape == (3, 4) and floats.shape == (1000,) and empty.shape == (0, 3)",
        "float values": "np.array_equal(floats, np.linspace(0, 1, 1000, dtype=np.float32))",
        "large": "big.shape == (300_000,) and float(big.sum()) == big_sum",
        "fortran order": "fortran.flags.f_contiguous and fortran[1, 2] == 5.0",
        "structured": "record.dtype.names == ('id', 'v') and record['v'][1] == 3.5",
        "empty complex": "empty.dtype == complex",
        "object dtype": "objects[0] == {'k': 1} and objects[1] is None",
        # A restored array must be usable like the original: writeable unless
        # it was made read-only on purpose.
        "writeable": "ints.flags.writeable and big.flags.writeable and floats.flags.writeable",
        "read-only stays read-only": "not frozen.flags.writeable",
    })
    run_ok(kernel, "big[7] = 123.0\nints += 1")
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {
        "edits persisted": "big[7] == 123.0 and ints[0, 0] == 1 and ints.dtype == np.int16",
    })


def test_pandas_frames_survive_kill9(kernel_factory: Callable[..., Kernel]) -> None:
    pytest.importorskip("pandas")
    kernel = kernel_factory()
    run_ok(kernel, """
import pandas as pd, numpy as np
frame = pd.DataFrame({
    "n": np.arange(5, dtype="int32"),
    "x": [0.5, 1.5, np.nan, 3.5, 4.5],
    "s": list("abcde"),
    "c": pd.Categorical(["lo", "hi", "lo", "hi", "lo"]),
    "t": pd.date_range("2024-01-01", periods=5, freq="D", tz="UTC"),
    "b": [True, False, True, False, True],
}, index=pd.Index([10, 20, 30, 40, 50], name="key"))
multi = frame.set_index(["s", "c"])
series = pd.Series([1, 2], index=["p", "q"], name="prices")
expected = frame.copy(deep=True)
view_of = {"frame": frame}
""")
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {
        "equal": "frame.equals(expected)",
        "dtypes": "frame.dtypes.astype(str).to_dict() == expected.dtypes.astype(str).to_dict()",
        "index": "frame.index.equals(expected.index) and frame.index.name == 'key'",
        "columns": "list(frame.columns) == ['n', 'x', 's', 'c', 't', 'b']",
        "categorical": "list(frame['c'].cat.categories) == ['hi', 'lo']",
        "multiindex": "multi.index.names == ['s', 'c'] and multi.shape == (5, 4)",
        "series": "series.name == 'prices' and series['q'] == 2",
        "aliasing": "view_of['frame'] is frame",
    })
    # An in-place cell edit is a change like any other (Kishu restores it wrong).
    run_ok(kernel, "frame.loc[30, 'x'] = 99.0")
    kernel = restart(kernel, kernel_factory)
    all_true(kernel, {"in-place edit": "frame.loc[30, 'x'] == 99.0 and frame['n'].sum() == 10"})


def test_restored_functions_read_the_live_namespace(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    run_ok(kernel, """
setting = 'old'
def read_setting():
    return setting
def call_helper():
    return helper()
def helper():
    return 'first helper'
class Reader:
    def read(self):
        return setting
""")
    kernel = restart(kernel, kernel_factory)
    run_ok(kernel, "setting = 'new'\ndef helper():\n    return 'second helper'")
    all_true(kernel, {
        "function sees the rebound global": "read_setting() == 'new'",
        "function calls the redefined function": "call_helper() == 'second helper'",
        "method sees the rebound global": "Reader().read() == 'new'",
        "same globals": "read_setting.__globals__ is globals()",
    })


def test_restore_never_reruns_code(kernel_factory: Callable[..., Kernel],
                                   tmp_path: Path) -> None:
    log = tmp_path / "side-effects.log"
    kernel = kernel_factory()
    run_ok(kernel, f"with open({str(log)!r}, 'a') as handle:\n    handle.write('ran\\n')\n"
                   "marker = 'set by the cell'")
    run_ok(kernel, "class Loud:\n    def __init__(self):\n"
                   f"        open({str(log)!r}, 'a').write('init\\n')\nloud = Loud()")
    assert log.read_text() == "ran\ninit\n"
    kernel = restart(kernel, kernel_factory)
    assert kernel.value("(marker, type(loud).__name__)") == ("set by the cell", "Loud")
    kernel = restart(kernel, kernel_factory)
    assert kernel.value("marker") == "set by the cell"
    assert log.read_text() == "ran\ninit\n", "a restore ran cell code again"
