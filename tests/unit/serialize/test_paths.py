"""find_path names where an object sits inside a variable, readably and within bounds."""

from __future__ import annotations

import collections
import functools
import types

import pytest

from kernos.serialize import paths
from kernos.serialize.paths import find_chain, find_path


class Target:
    """A distinct object to look for."""

    def __repr__(self) -> str:
        return "<target>"


@pytest.fixture
def target() -> Target:
    return Target()


def test_the_root_itself(target):
    assert find_path(target, target, "x") == "x"


def test_dict_values_lists_and_tuples(target):
    value = {"rows": [0, (1, 2, {"conn": target})]}
    assert find_path(value, target, "data") == "data['rows'][1][2]['conn']"


def test_non_string_keys_use_their_repr(target):
    assert find_path({3: target}, target, "d") == "d[3]"
    assert find_path({("a", 1): [target]}, target, "d") == "d[('a', 1)][0]"


def test_an_object_used_as_a_dict_key(target):
    assert find_path({target: 1}, target, "lookup") == "lookup.<key <target>>"


def test_long_keys_are_shortened(target):
    key = "k" * 100
    path = find_path({key: target}, target, "d")
    assert path == "d['" + "k" * 36 + "...]"
    assert len(path) < 50


def test_key_whose_repr_raises_is_named_by_its_type(target):
    class NoRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    value = {NoRepr(): [target]}
    assert find_path(value, target, "d") == "d[<NoRepr>][0]"


def test_set_elements(target):
    assert find_path([{1, target}], target, "s") == "s[0].<set element>"


def test_instance_attributes_and_nested_instances(target):
    session = types.SimpleNamespace(_sock=target, retries=3)
    client = types.SimpleNamespace(session=session, url="u")
    assert find_path(client, target, "client") == "client.session._sock"


def test_slots_including_inherited_ones(target):
    class Base:
        __slots__ = ("base",)

    class Derived(Base):
        __slots__ = ("own",)

    value = Derived()
    value.own = 1
    value.base = target
    assert find_path(value, target, "v") == "v.base"


def test_unset_slots_are_skipped(target):
    class Slotted:
        __slots__ = ("empty", "full")

    value = Slotted()
    value.full = target
    assert find_path(value, target, "v") == "v.full"


def test_function_closure_defaults_and_attributes(target):
    def make():
        held = target

        def inner():
            return held

        return inner

    def with_default(x=target):
        return x

    def plain():
        return None

    plain.attached = {"t": target}  # type: ignore[attr-defined]
    assert find_path(make(), target, "f") == "f.__closure__[0].cell_contents"
    assert find_path(with_default, target, "g") == "g.__defaults__[0]"
    assert find_path(plain, target, "h") == "h.__dict__['attached']['t']"


def test_class_attributes(target):
    klass = type("Holder", (), {"resource": target})
    assert find_path(klass, target, "Holder") == "Holder.resource"


def test_objects_without_dict_or_slots_are_searched_through_their_referents(target):
    assert find_path(iter([1, target]), target, "i") == "i.<internal>[1]"


def test_deque_items_are_elements(target):
    queue = collections.deque([1, target])
    assert find_path(queue, target, "q") == "q[1]"
    chain = find_chain(queue, target, "q")
    assert chain is not None and [step.element for step in chain.steps] == [True]


def test_partial_arguments_are_named(target):
    assert find_path(functools.partial(print, target), target, "p") == "p.args[0]"
    assert find_path(functools.partial(print, end=target), target, "p") == "p.keywords['end']"


def test_steps_into_attributes_are_not_elements(target):
    value = {"client": types.SimpleNamespace(_sock=target)}
    chain = find_chain(value, target, "v")
    assert chain is not None and chain.path == "v['client']._sock"
    assert [(step.label, step.element) for step in chain.steps] == [
        ("['client']", True), ("._sock", False)]
    assert chain.path_to(1) == "v['client']"


def test_object_array_cells_are_elements(target):
    np = pytest.importorskip("numpy")
    grid = np.empty((2, 2), dtype=object)
    grid[1, 0] = target
    assert find_path(grid, target, "grid") == "grid[1, 0]"
    assert find_path(np.arange(3), target, "numbers") is None


def test_pandas_containers_are_searched_through_their_cells_only(target):
    pd = pytest.importorskip("pandas")
    series = pd.Series([1, target, 3], dtype=object)
    frame = pd.DataFrame({"n": [1, 2], "held": [None, target]})
    assert find_path(series, target, "s") == "s.iloc[1]"
    assert find_path(frame, target, "frame") == "frame.iloc[1, 1]"
    described = pd.DataFrame({"n": [1]})
    described.attrs["source"] = {"handle": target}
    assert find_path(described, target, "d") == "d.attrs['source']['handle']"
    labelled = pd.Series([1], index=pd.Index([target], dtype=object))
    assert find_path(labelled, target, "s") == "s.index[0]"
    chain = find_chain(frame, target, "frame")
    assert chain is not None and all(step.element for step in chain.steps)


def test_objects_skipped_are_not_searched(target):
    holder = types.SimpleNamespace(inner=types.SimpleNamespace(t=target))
    assert find_chain(holder, target, "h", skip=lambda obj: obj is holder.inner) is None
    assert find_chain(holder, target, "h", opaque=frozenset({id(holder.inner)})) is None


def test_shortest_path_wins(target):
    deep = {"a": {"b": {"c": target}}}
    value = {"long": deep, "short": target}
    assert find_path(value, target, "v") == "v['short']"


def test_cycles_do_not_loop(target):
    loop: list[object] = []
    loop.append(loop)
    loop.append({"again": loop, "t": target})
    assert find_path(loop, target, "loop") == "loop[1]['t']"


def test_missing_target_gives_none(target):
    loop: list[object] = [1, "two", {"three": 3}]
    loop.append(loop)
    assert find_path(loop, target, "x") is None


def test_strings_and_modules_are_not_searched(target):
    module = types.ModuleType("fake")
    module.hidden = target  # type: ignore[attr-defined]
    assert find_path({"m": module}, target, "x") is None


def test_search_is_bounded(target, monkeypatch):
    monkeypatch.setattr(paths, "_MAX_VISITS", 50)
    wide: list[object] = [[i] for i in range(1000)]
    wide.append(target)
    assert find_path(wide, target, "w") == "w[1000]"  # found while listing the root
    deep: list[object] = [[i] for i in range(1000)]
    deep.append([target])
    assert find_path(deep, target, "w") is None  # one level further: past the bound


def test_an_object_whose_attributes_raise_is_searched_no_further(target):
    class Proxy:
        def __getattribute__(self, name: str) -> object:
            raise RuntimeError("no attributes here")

    value = {"proxy": Proxy(), "list": [target]}
    assert find_path(value, target, "v") == "v['list'][0]"
