"""The boundary: only plain data crosses, as copies, within size and depth limits."""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import pickle
import time
from decimal import Decimal

import pytest

from kernos.agents.boundary import MAX_DEPTH, MAX_ITEMS, ObjectView, to_agent, to_host
from kernos.errors import BoundaryError

CROSSINGS = [to_host, to_agent]


class MyStr(str):
    pass


class MyInt(int):
    pass


class MyDict(dict):  # type: ignore[type-arg]
    pass


class MyList(list):  # type: ignore[type-arg]
    pass


class MyTuple(tuple):  # type: ignore[type-arg]
    pass


class MyDecimal(decimal.Decimal):
    pass


class MyDate(datetime.date):
    pass


class Color(enum.IntEnum):
    RED = 1


class Sneaky:
    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


def all_containers(value: object) -> list[object]:
    found: list[object] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple, set, frozenset)):
            found.append(item)
            stack.extend(item)
        elif isinstance(item, dict):
            found.append(item)
            stack.extend(item.keys())
            stack.extend(item.values())
    return found


@pytest.mark.parametrize("cross", CROSSINGS)
@pytest.mark.parametrize("value", [
    None, True, False, 0, -5, 2**64, 1.5, float("inf"), "text", "", b"bytes", Decimal("1.25"),
    datetime.datetime(2026, 1, 2, 3, 4, 5), datetime.date(2026, 1, 2), datetime.time(3, 4),
    datetime.timedelta(days=2),
])
def test_atoms_cross_as_they_are(cross, value: object) -> None:  # type: ignore[no-untyped-def]
    result = cross(value)
    assert type(result) is type(value)
    assert result == value


@pytest.mark.parametrize("cross", CROSSINGS)
def test_containers_are_copied_at_every_level(cross) -> None:  # type: ignore[no-untyped-def]
    inner = [1, 2]
    original = {"a": [inner, {"b": (3, [4], frozenset({5}))}], "s": {6, 7}, (8, 9): inner,
                "t": (inner,)}
    result = cross(original)
    assert result == original
    originals = {id(container) for container in all_containers(original)
                 if not isinstance(container, (tuple, frozenset))}
    copies = [container for container in all_containers(result)
              if not isinstance(container, (tuple, frozenset))]
    assert copies and not any(id(container) in originals for container in copies)
    assert result is not original
    assert result["a"][0] is not inner and result[(8, 9)] is not inner
    assert result["a"][0] is not result[(8, 9)]  # a copy never shares, even within itself
    result["a"][0].append(99)
    assert inner == [1, 2]
    assert type(result["s"]) is set and type(result["a"][1]["b"][2]) is frozenset


@pytest.mark.parametrize("cross", CROSSINGS)
@pytest.mark.parametrize("value", [
    MyStr("x"), MyInt(1), Color.RED, MyDict(), MyList(), MyTuple(), MyDecimal(1),
    MyDate(2026, 1, 1), Sneaky(), object(), collections.OrderedDict(),
    collections.defaultdict(list), collections.namedtuple("P", "x")(1), bytearray(b"x"),
    1 + 2j, len, type, ObjectView("data"), range(3), iter([1]), memoryview(b"x"),
    {"ok": [1, MyStr("nested")]}, [1, (2, Sneaky())], {Color.RED: 1},
])
def test_anything_but_plain_data_is_refused(cross, value: object) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BoundaryError, match="cannot pass"):
        cross(value)


def test_the_message_names_the_type_and_the_direction() -> None:
    with pytest.raises(BoundaryError, match="a MyStr cannot pass from agent code to the host"):
        to_host([MyStr("x")])
    with pytest.raises(BoundaryError, match="a Sneaky cannot pass from the host to agent code"):
        to_agent({"k": Sneaky()})


def test_views_cross_to_the_host_only_when_allowed() -> None:
    view = ObjectView("data")
    assert to_host([view], views=True)[0] is view  # type: ignore[index]
    with pytest.raises(BoundaryError):
        to_host([view])
    with pytest.raises(BoundaryError):
        to_agent([view])


def nested(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("cross", CROSSINGS)
def test_depth_is_limited(cross) -> None:  # type: ignore[no-untyped-def]
    assert cross(nested(MAX_DEPTH)) == nested(MAX_DEPTH)
    with pytest.raises(BoundaryError, match=f"nested over {MAX_DEPTH} levels"):
        cross(nested(MAX_DEPTH + 1))
    with pytest.raises(BoundaryError):
        cross(nested(10_000))  # no RecursionError


@pytest.mark.parametrize("cross", CROSSINGS)
def test_a_cycle_is_refused_cleanly(cross) -> None:  # type: ignore[no-untyped-def]
    loop: list[object] = [1]
    loop.append(loop)
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic
    for value in (loop, cyclic):
        with pytest.raises(BoundaryError, match="nested over"):
            cross(value)


@pytest.mark.parametrize("cross", CROSSINGS)
def test_size_is_limited(cross) -> None:  # type: ignore[no-untyped-def]
    assert len(cross([0] * MAX_ITEMS)) == MAX_ITEMS
    with pytest.raises(BoundaryError, match="over 1,000,000 items"):
        cross([0] * (MAX_ITEMS + 1))
    half = [0] * (MAX_ITEMS // 2)
    with pytest.raises(BoundaryError, match="items"):
        cross([half, half])  # the items of every level count


@pytest.mark.parametrize("cross", CROSSINGS)
def test_a_shared_list_counts_every_time_it_is_reached(cross) -> None:  # type: ignore[no-untyped-def]
    shared = [0] * 1000
    started = time.perf_counter()
    with pytest.raises(BoundaryError, match="items"):
        cross([shared] * 2000)  # 2,000,000 items through one list
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("cross", CROSSINGS)
def test_huge_ints_are_refused(cross) -> None:  # type: ignore[no-untyped-def]
    assert cross(2**99_999) == 2**99_999
    assert cross(-(2**99_999)) == -(2**99_999)
    for huge in (2**100_000, -(2**100_000), 10**100_000):
        with pytest.raises(BoundaryError, match="bits cannot pass"):
            cross(huge)
        with pytest.raises(BoundaryError):
            cross({"deep": [huge]})


def test_a_view_pickles_as_its_name_and_path() -> None:
    view = ObjectView("data", (("item", "k"), ("field", "count"), ("item", 0)))
    data = pickle.dumps(view)
    assert b"ObjectView" in data
    copy = pickle.loads(data)
    assert type(copy) is ObjectView
    assert copy.name == "data"
    assert copy.path == "data['k'].count[0]"
    assert repr(copy) == "<view of data['k'].count[0]>"

