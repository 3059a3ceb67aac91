"""The reach of an op: which names its code can touch, before it runs."""

from __future__ import annotations

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from kernos.analysis import Reach, reach_of_source
from kernos.kernel.reach import cell_reach

transform = TransformerManager().transform_cell


def test_reach_is_the_global_names_of_the_code_and_its_nested_code() -> None:
    reach = reach_of_source("def f():\n    return helper(data)\nresult = [x for x in items]")
    assert not reach.everything
    assert {"helper", "data", "result", "items"} <= reach.names


def test_code_that_does_not_compile_reaches_nothing() -> None:
    assert reach_of_source("def (:") == Reach()


@pytest.mark.parametrize("source", [
    "globals()['x'] = 1", "eval('x')", "exec('x = 1')", "import __main__",
    "import sys\nsys.modules['__main__'].x = 1", "vars()['x']",
    "import inspect\ninspect.currentframe().f_globals['x'] = 1",
])
def test_dynamic_namespace_access_reaches_everything(source: str) -> None:
    reach = reach_of_source(source)
    assert reach.everything and reach.why


def cell(source: str) -> Reach:
    return cell_reach(transform(source), transform)


def test_read_only_magics_and_shell_escapes_reach_nothing_extra() -> None:
    assert cell("%kernos log\n%who\n!ls") == Reach()
    assert cell("files = !ls").names == frozenset({"files"})


def test_code_running_magics_reach_their_code() -> None:
    assert cell("%time data.append(1)").names >= {"data"}
    assert cell("%timeit -n 3 -r 2 total(xs)").names >= {"total", "xs"}
    assert cell("%%time\nrows.append(2)\n").names >= {"rows"}


def test_unknown_magics_reach_everything() -> None:
    assert cell("%load_ext something").everything
    assert cell("%%bash\necho hi\n").everything
    assert cell("%time -q weird $$ syntax").everything
