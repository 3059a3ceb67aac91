"""I1 atomicity as a property, through one real kernel.

Hypothesis writes random cells: a sequence of in-place mutations (list, dict,
set, attributes), rebindings, deletions and new names over a small namespace
whose objects are shared (``b['ref'] is a``, ``obj.items is a``, ``t[0] is
a``...), then a raise.  Whatever the cell did, the namespace afterwards must
be the one before it, compared through a canonical dump computed in the
kernel that includes the identity of every object (``#n`` labels an object
the first time it is met, ``@n`` every later time).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import CANON

pytestmark = pytest.mark.kernel


CLASS = "class Holder:\n    pass\n"

SETUP = """
[globals().pop(name) for name in list(globals()) if name.startswith('new_')]
a = [1, 2, 3]
b = {'ref': a, 'k': 0}
s = {1, 2}
obj = Holder()
obj.items = a
obj.meta = b
t = (a, s)
n = 0
word = 'w'
"""

NAMES = ["a", "b", "s", "obj", "t", "n", "word"]
LISTS = ["a", "b['ref']", "obj.items", "t[0]"]
DICTS = ["b", "obj.meta"]
SETS = ["s", "t[1]"]
KEYS = ["'ref'", "'k'", "'z'", "1"]
ATTRIBUTES = ["items", "meta", "extra"]
ENDINGS = ["raise RuntimeError('planned failure')", "raise SystemExit(1)",
           "raise KeyboardInterrupt"]

atoms = st.one_of(st.integers(-3, 3).map(repr), st.sampled_from(["'u'", "'v'"]))
# A value may be an existing object, so cells also create new sharing.
values = st.one_of(atoms, st.sampled_from(NAMES), st.sampled_from(NAMES).map("[{}]".format))


def _statement(template: str, **parts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.fixed_dictionaries(parts).map(lambda chosen: template.format(**chosen))


lists, dicts, sets = st.sampled_from(LISTS), st.sampled_from(DICTS), st.sampled_from(SETS)
statements = st.one_of(
    _statement("{l}.append({v})", l=lists, v=values),
    _statement("{l}.pop()", l=lists),
    _statement("{l}[0] = {v}", l=lists, v=values),
    _statement("{l}.extend([{v}, {w}])", l=lists, v=values, w=values),
    _statement("{l}.insert(0, {v})", l=lists, v=values),
    _statement("{l}.clear()", l=lists),
    _statement("{d}[{k}] = {v}", d=dicts, k=st.sampled_from(KEYS), v=values),
    _statement("del {d}[{k}]", d=dicts, k=st.sampled_from(KEYS)),
    _statement("{d}.update({{{k}: {v}}})", d=dicts, k=st.sampled_from(KEYS), v=values),
    _statement("{s}.add({v})", s=sets, v=atoms),
    _statement("{s}.discard({v})", s=sets, v=atoms),
    _statement("obj.{attr} = {v}", attr=st.sampled_from(ATTRIBUTES), v=values),
    _statement("del obj.{attr}", attr=st.sampled_from(ATTRIBUTES)),
    _statement("{name} = {v}", name=st.sampled_from(NAMES), v=values),
    _statement("n += {v}", v=st.integers(1, 3).map(repr)),
    _statement("del {name}", name=st.sampled_from(NAMES)),
    _statement("new_{i} = {v}", i=st.integers(0, 2).map(repr), v=values),
)


def cell_of(body: list[str], ending: str) -> str:
    """Each statement runs whatever the earlier ones did (a deleted name, a missing key...)."""
    guarded = [f"try:\n    {line}\nexcept Exception:\n    pass" for line in body]
    return "\n".join([*guarded, "print('REACHED')\nprint(__canon__(), flush=True)", ending])


def canon(kernel: Any) -> str:
    result = kernel.run("print(__canon__())")
    assert result.status == "ok", result.errors
    return result.stdout


def define(kernel: Any, code: str) -> None:
    result = kernel.run(code)
    assert result.committed, (result.errors, result.kernos)


def test_random_mutations_then_raise_leave_the_namespace_unchanged(
    kernel_factory: Any,
) -> None:
    kernel = kernel_factory()
    define(kernel, CANON)
    define(kernel, CLASS)
    reference: list[str] = []
    mutated: list[bool] = []

    @settings(max_examples=40, deadline=None, database=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow])
    @given(body=st.lists(statements, min_size=1, max_size=12), ending=st.sampled_from(ENDINGS))
    def check(body: list[str], ending: str) -> None:
        result = kernel.run(SETUP)
        assert result.committed, (result.errors, result.kernos)
        before = canon(kernel)
        reference.append(before)
        assert before == reference[0]  # every example starts from the same image

        code = cell_of(body, ending)
        result = kernel.run(code)

        assert "REACHED" in result.stdout, result.errors
        mutated.append(result.stdout.split("REACHED\n", 1)[1] != before)
        assert result.status == "error"
        assert result.kernos["status"] == "rolled back", result.kernos
        assert canon(kernel) == before, code

    check()
    assert len(reference) >= 35, "hypothesis ran fewer examples than asked"
    # Most cells did change the image before raising: there was something to roll back.
    assert sum(mutated) > len(mutated) / 2, mutated

    # The history agrees: a new kernel after kill -9 has the same image.
    kernel.kill9()
    again = kernel_factory(kernel.workspace)
    define(again, CANON)  # only the probe: the class is restored, not redefined
    assert canon(again) == reference[0]
