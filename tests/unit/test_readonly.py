"""Ops that only read big values skip checking them (``kernos.readonly``), and only those.

Each "still saved" case runs code that changes a value while looking much like
a read, then restores the workspace: the change must be there.  Each "skipped"
case shows a read-only op writing no snapshot without pickling the value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core_support import CoreEnv
from kernos.analysis import NONCONSTANT, Read, reach_of_source, reads_of_tree
from kernos.readonly import unchanged_by


def reads(source: str) -> dict[str, frozenset[Read]]:
    import ast

    return reads_of_tree(ast.parse(source))


@pytest.mark.parametrize("source", [
    "arr.shape == (3,)", "arr[5] == 1.0", "print(arr)", "len(d)", "d['k']['v'] == -1",
    "x = 1 if arr.any() else 2", "f'{arr.sum():.2f}'", "int(df['a'].iloc[-1]) == 3",
    "assert df.iat[1, 1] != 0", "arr.mean(axis=0) + 1", "arr[i] < 0", "-arr[0]",
    "x = arr[:10].copy()", "total = df['b'].sum()", "x = y = arr.mean(axis=0)",
])
def test_these_only_read_the_name(source: str) -> None:
    name = next(n for n in ("arr", "df", "d") if n in source)
    assert name in reads(source), source


@pytest.mark.parametrize("source", [
    "arr.sort()", "arr[0] = 1", "arr[0] += 1", "x = arr[0]", "x = arr", "f(arr)",
    "arr + other", "arr == other", "max(arr, other)", "min(arr, key=k)", "arr.sum(out=o)",
    "arr.sum(0, None, o)", "df.fillna(0, inplace=True)", "arr.resize(3)", "del arr[0]",
    "arr.shape = (3,)", "for x in arr: pass", "[x for x in arr]", "g(*arr)", "y = (arr and 1)",
    "arr.flags.writeable", "d.setdefault('k', [])", "lambda: arr", "(z := arr)",
    "x = arr[:10]", "x = arr.T", "x = df.copy(False)", "x = df.head()", "x = arr.to_numpy()",
    "x.attr = arr.sum()", "x[0] = arr.copy()", "x, y = arr.copy(), 1", "x = d.get('k')",
])
def test_these_may_change_the_name(source: str) -> None:
    assert "arr" not in reads(source) and "d" not in reads(source) \
        and "df" not in reads(source), source


def test_an_unknown_key_is_recorded_as_such() -> None:
    (read,) = reads("d[k] == 1")["d"]
    assert read.steps == (("item", NONCONSTANT),)


def test_reads_are_kept_only_where_every_part_of_a_reach_only_reads() -> None:
    one = reach_of_source("print(arr[0])")
    assert one.union(reach_of_source("arr[1] == 2")).reads.keys() == {"arr"}
    assert "arr" not in one.union(reach_of_source("arr.sort()")).reads


def test_the_types_whose_reads_change_nothing() -> None:
    compare = [Read((("item", 0),), "compare")]
    assert unchanged_by(np.arange(5.0), compare, {})
    assert not unchanged_by(np.array([[1], 2], dtype=object), compare, {})
    assert not unchanged_by(np.zeros(2, dtype=[("a", "f8")]), compare, {})
    assert unchanged_by(pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]}), compare, {})
    assert not unchanged_by(pd.DataFrame({"a": [1, 2], "s": ["x", "y"]}), compare, {})
    assert unchanged_by(pd.Series([1.0]), compare, {})
    assert unchanged_by(7, [Read((), "call:f")], {})  # an int cannot change at all

    class Box(list):  # type: ignore[type-arg]
        pass

    assert not unchanged_by(Box([1]), compare, {})
    keyed = [Read((("item", "k"), ("item", "v")), "compare")]
    assert unchanged_by({"k": {"v": 1}}, keyed, {})
    assert not unchanged_by({"k": {"v": Box()}}, keyed, {})  # not plain data
    assert not unchanged_by({"k": {"w": 1}}, keyed, {})  # a key not there now
    assert unchanged_by([1, 2], [Read((), "call:len")], {})
    assert not unchanged_by([1, 2], [Read((), "call:print")], {})  # would read every entry
    assert not unchanged_by(np.arange(3.0), [Read((), "call:print")], {"print": print})


@pytest.fixture
def env(tmp_path: Path) -> CoreEnv:
    opened = CoreEnv(tmp_path / "ws")
    opened.run("import numpy as np\nimport pandas as pd\n"
               "arr = np.arange(100_000, dtype=float)\n"
               "df = pd.DataFrame({'a': np.arange(1000), 'b': np.ones(1000)})\n"
               "d = {f'k{i}': {'v': i} for i in range(5000)}\n"
               "objs = np.array([[1], [2]] + [None], dtype=object)[:2]\n"
               "lst = [1, 2, 3]")
    return opened


def test_a_read_only_cell_pickles_nothing_and_writes_no_snapshot(env: CoreEnv) -> None:
    from kernos.image import Image

    calls = []
    dump = env.image.serializer.dump

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return dump(*args, **kwargs)  # type: ignore[arg-type]

    env.image.serializer.dump = counting  # type: ignore[method-assign]
    report = env.run("print(arr.shape, arr[5] == 5.0, len(d), d['k7']['v'], df.iat[3, 1],\n"
                     "      int(df['a'].iloc[-1]))")
    assert report.unchanged and calls == [] and isinstance(env.image, Image)


def test_binding_a_fresh_result_of_a_big_value_checks_only_the_new_name(env: CoreEnv) -> None:
    calls: list[list[str]] = []
    dump = env.image.serializer.dump

    def counting(roots: list[tuple[str, object]], **kwargs: object) -> object:
        calls.append([name for name, _ in roots])
        return dump(roots, **kwargs)  # type: ignore[arg-type]

    env.image.serializer.dump = counting  # type: ignore[method-assign]
    report = env.run("head = arr[:10].copy()\ntotal = df['a'].sum()")
    assert report.added == ["head", "total"] and calls == [["head"], ["total"]]
    assert not unchanged_by({"k": [1]}, reads("x = d.copy()")["d"], {})  # shares its lists


class Meddler:
    def __init__(self) -> None:
        self.seen = 0

    def __getitem__(self, key: object) -> int:
        self.seen += 1
        return 0

    def __eq__(self, other: object) -> bool:
        self.seen += 1
        return False

    __hash__ = object.__hash__


@pytest.mark.parametrize(("setup", "change", "check"), [
    ("", "arr.sort()\narr[::-1].sort()", "arr[0] == 99_999.0"),
    ("", "view = arr[:5]\nview[0] = -1.0\ndel view", "arr[0] == -1.0"),
    ("", "np.add(arr, 1, out=arr)", "arr[0] == 1.0"),
    ("", "df.iloc[0, 0] = 42", "df.iat[0, 0] == 42"),
    ("", "objs[0].append(5)", "objs[0] == [1, 5]"),
    ("", "d['k7']['v'] = -7", "d['k7']['v'] == -7"),
    ("m = Meddler()", "m[0] == 0", "m.seen == 1"),
    ("d['m'] = Meddler()", "d['m'] == 1", "d['m'].seen == 1"),
    ("def print(x):\n    x.append(4)", "print(lst)", "lst == [1, 2, 3, 4]"),
    ("", "first = arr[:5]\nfirst[0] = -1.0\ndel first", "arr[0] == -1.0"),
    ("", "rows = d.copy()\nrows['k7']['v'] = -7", "d['k7']['v'] == -7"),
])
def test_a_change_that_looks_like_a_read_is_still_saved(env: CoreEnv, setup: str, change: str,
                                                        check: str) -> None:
    env.ns["Meddler"] = Meddler
    env.hidden["Meddler"] = Meddler  # a class from outside the image, like an import
    if setup:
        env.run(setup)
    env.run(change)
    env.reopen()
    assert eval(check, env.ns), check
