"""What the sidebar's History and Objects tabs read beyond the metadata: a value's shape, a
placeholder as one, the code of an op that wrote no snapshot, the newest ops of a long
session, and an agent's cell by its own code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness_support import Harness
from kernos.audit.oplog import headline
from kernos.harness.inspection import shape_of
from kernos.serialize.unpersisted import Unpersisted


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    opened = Harness(tmp_path / "ws")
    yield opened
    opened.env.close()


def described(harness: Harness) -> dict[str, dict[str, object]]:
    return {entry["name"]: entry for entry in harness.ok(action="objects")["objects"]}


def test_objects_carry_the_shape_of_builtins_and_arrays_and_none_of_anything_else(
        harness: Harness) -> None:
    harness.op("import numpy\nrows = [1, 2, 3]\nword = 'hello'\nby = {'a': 1}\n"
               "grid = numpy.zeros((3, 4))\nn = 5\n"
               "class Sized:\n    def __len__(self):\n        raise RuntimeError('ran')\n"
               "odd = Sized()\nclass Listy(list):\n    pass\nsub = Listy([1])")
    shapes = {name: entry["shape"] for name, entry in described(harness).items()}
    assert shapes == {"rows": [3], "word": [5], "by": [1], "grid": [3, 4], "n": None,
                      "numpy": None, "Sized": None, "odd": None, "Listy": None, "sub": None}
    detail = harness.ok(action="object", name="grid")
    assert detail["shape"] == [3, 4] and detail["preview"]["repr"].startswith("array(")


def test_shape_of_runs_no_code_of_the_images() -> None:
    class Trap(dict):  # type: ignore[type-arg]
        def __len__(self) -> int:
            raise AssertionError("ran the image's __len__")

    assert shape_of(Trap()) is None
    assert shape_of(b"abc") == [3] and shape_of(frozenset({1})) == [1]


def test_a_restored_placeholder_is_listed_as_one_not_as_what_it_stood_for(
        harness: Harness) -> None:
    harness.op("kept = 1")
    harness.env.ns["handle"] = Unpersisted(name="handle", path="handle",
                                           type_name="_io.TextIOWrapper",
                                           reason="open files cannot be persisted")
    with harness.env.op("handle = handle"):
        pass
    entry = described(harness)["handle"]
    assert entry["type"] == "Unpersisted" and entry["shape"] is None
    assert entry["summary"] == ("placeholder for _io.TextIOWrapper: could not be persisted "
                                "(open files cannot be persisted)")
    detail = harness.ok(action="object", name="handle")
    assert detail["type"] == "Unpersisted"
    assert detail["preview"]["repr"].startswith("<unpersisted _io.TextIOWrapper")


def test_show_of_an_op_without_a_snapshot_answers_from_its_audit_record(
        harness: Harness) -> None:
    harness.op("a = 1")
    assert harness.op("b = 2\nraise ValueError('no')")["status"] == "failed"
    harness.op("a + 1")  # read-only
    failed = harness.ok(action="show", ref="@2")
    assert failed["commit"] is None and failed["op"] == 2
    assert failed["code"] == "b = 2\nraise ValueError('no')"
    assert failed["outcome"] == "failed" and "ValueError" in failed["error"]
    read = harness.ok(action="show", ref="@3")
    assert (read["code"], read["outcome"], read["error"]) == ("a + 1", "read-only", None)
    assert harness.ok(action="show", ref="@1")["code"] == "a = 1"  # a snapshot, as before
    assert harness.error(action="show", ref="@99")["kind"] == "unknown_ref"


def test_log_all_with_a_limit_lists_the_newest_ops_of_any_kind(harness: Harness) -> None:
    harness.op("a = 1")
    for _ in range(6):
        harness.op("a + 1")
    harness.op("a = 2")
    assert harness.op("a = 3\n1 / 0")["status"] == "failed"
    newest = harness.ok(action="log", all=True, limit=4)["snapshots"]
    assert [(entry["op"], entry["outcome"]) for entry in newest] == [
        (9, "failed"), (8, "committed"), (7, "read-only"), (6, "read-only")]
    every = harness.ok(action="log", all=True)["snapshots"]
    assert [entry["op"] for entry in every] == list(range(9, 0, -1))
    assert every[:4] == newest


def test_an_agent_cell_is_named_by_the_agents_code_not_the_magic(harness: Harness) -> None:
    with harness.env.op("%%agent analyst\ntotal = 3\nshown = total") as op:
        harness.env.ns["total"] = 3
        op.act_as("analyst", "agent")
    [entry] = harness.ok(action="log")["snapshots"]
    assert entry["message"] == "total = 3 (+1 lines)" and entry["principal"] == "analyst"
    record = {"kind": "cell", "code": {"text": "%%agent analyst\nx = 1\ny = 2\n"}}
    assert headline(record) == "x = 1 (+1 lines)"
    assert headline({"kind": "cell", "code": {"text": "%%agent analyst"}}) == "%%agent analyst"
