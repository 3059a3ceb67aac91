"""The reads an inspector needs: objects filtered, sorted and paged; sizes in log; stats."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness_support import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    opened = Harness(tmp_path / "ws")
    yield opened
    opened.env.close()


def names(result: dict[str, object]) -> list[str]:
    return [entry["name"] for entry in result["objects"]]  # type: ignore[index, union-attr]


def test_objects_filter_by_name_type_or_principal_and_count_what_is_left(
        harness: Harness) -> None:
    harness.op("alpha = 1\nbeta = 'text'\nGamma = [1, 2, 3]\nbetamax = 2.5")
    result = harness.ok(action="objects", query="BETA")
    assert names(result) == ["beta", "betamax"] and result["total"] == 2
    assert names(harness.ok(action="objects", query="list")) == ["Gamma"]
    assert harness.ok(action="objects", query="human")["total"] == 4
    assert harness.ok(action="objects", query="nothing-like-it")["objects"] == []


def test_objects_sort_by_any_column_both_ways_with_ties_by_name(harness: Harness) -> None:
    harness.op("small = 1\nbig = list(range(10_000))\nmid = 'x' * 500")
    harness.op("small = 2")
    by_size = names(harness.ok(action="objects", sort="size"))
    assert by_size[-1] == "big" and by_size.index("small") < by_size.index("mid")
    assert names(harness.ok(action="objects", sort="-size"))[0] == "big"
    assert names(harness.ok(action="objects", sort="-version"))[0] == "small"
    assert names(harness.ok(action="objects", sort="version")) == ["big", "mid", "small"]
    assert names(harness.ok(action="objects", sort="-name")) == ["small", "mid", "big"]


def test_objects_pages_after_filtering_and_sorting(harness: Harness) -> None:
    harness.op("\n".join(f"v{i:03d} = {i}" for i in range(120)))
    page = harness.ok(action="objects", sort="-name", limit=50, offset=50)
    assert page["total"] == 120
    assert names(page) == [f"v{i:03d}" for i in range(69, 19, -1)]
    last = harness.ok(action="objects", query="v1", limit=50, offset=0)
    assert last["total"] == 20 and names(last)[0] == "v100"


@pytest.mark.parametrize("sort", ["size;", "-", "--name", "summary", "NAME"])
def test_a_bad_sort_key_is_refused_naming_the_keys(harness: Harness, sort: str) -> None:
    error = harness.error(action="objects", sort=sort)
    assert error["kind"] == "malformed"
    assert "changed_at" in error["message"] and "descending" in error["message"]


def test_log_entries_carry_the_image_size_at_their_snapshot(harness: Harness) -> None:
    harness.op("a = 'x' * 1000")
    harness.op("b = 'y' * 5000")
    harness.op("del a")
    snapshots = harness.ok(action="log")["snapshots"]
    sizes = {entry["op"]: entry["bytes"] for entry in snapshots}
    objects = {entry["name"]: entry["size"] for entry in
               harness.ok(action="objects")["objects"]}
    newest, middle, oldest = (entry["bytes"] for entry in snapshots)
    assert newest == sum(objects.values()) == objects["b"]
    assert middle > oldest >= 1000 and middle - newest >= 1000, sizes


def test_stats_has_every_op_with_its_latency_and_sizes_after_commits(harness: Harness) -> None:
    harness.op("import os\na = os.urandom(100_000)")  # incompressible: as big on disk
    assert harness.op("boom = 1\n1 / 0")["status"] == "failed"
    harness.op("b = list(range(1000))")
    stats = harness.ok(action="stats")
    ops = stats["ops"]
    assert [entry["status"] for entry in ops] == ["committed", "failed", "committed"]
    assert all(entry["ms"] is not None and entry["ms"] >= 0 for entry in ops)
    first, failed, last = ops
    assert failed["image_bytes"] is None and failed["history_bytes"] is None
    assert first["image_bytes"] >= 100_000
    assert last["image_bytes"] > first["image_bytes"]
    assert last["history_bytes"] > first["history_bytes"] >= first["image_bytes"] // 2
    assert stats["image_bytes"] == last["image_bytes"]
    assert stats["history_bytes"] == last["history_bytes"]
    assert [entry["op"] for entry in harness.ok(action="stats", limit=2)["ops"]] == [
        failed["op"], last["op"]]


def test_stats_history_size_is_what_the_history_takes_on_disk(harness: Harness) -> None:
    """A megabyte of one letter compresses to a few kilobytes: the history grows by those."""
    before = harness.ok(action="stats")["history_bytes"]
    disk_before = harness.env.workspace.disk_usage()
    harness.op("a = 'x' * 1_000_000")
    grown = harness.ok(action="stats")["history_bytes"] - before
    on_disk = harness.env.workspace.disk_usage() - disk_before
    assert grown < 50_000
    assert abs(grown - on_disk) <= 4096 + on_disk // 10  # the ref and the journal aside


def test_stats_history_size_survives_a_restart_measured_on_disk(harness: Harness) -> None:
    harness.op("a = bytes(200_000)")
    before = harness.ok(action="stats")["history_bytes"]
    harness.reopen()
    after = harness.ok(action="stats")["history_bytes"]
    assert after > 0 and abs(after - before) < before  # on disk now: same order of size
    harness.op("b = 1")
    assert harness.ok(action="stats")["ops"][-1]["history_bytes"] >= after


def test_objects_leave_the_images_own_names_out_when_asked(harness: Harness) -> None:
    harness.op("import random\ndraw = random.random()")
    everything = names(harness.ok(action="objects"))
    assert "kernos:random" in everything  # the default keeps every name, as before
    mine = harness.ok(action="objects", internal=False)
    assert names(mine) == ["draw", "random"] and mine["total"] == 2
    assert harness.error(action="objects", internal="no")["kind"] == "malformed"


def test_log_all_lists_the_ops_that_wrote_no_snapshot_with_their_outcome(
        harness: Harness) -> None:
    harness.op("a = 1")
    assert harness.op("b = 2\n1 / 0")["status"] == "failed"
    harness.op("a + 1")  # read-only: no snapshot
    harness.op("c = 3")
    entries = harness.ok(action="log", all=True)["snapshots"]
    assert [(entry["op"], entry["outcome"], entry["commit"] is None) for entry in entries] == [
        (4, "committed", False), (3, "read-only", True), (2, "failed", True),
        (1, "committed", False)]
    assert "ZeroDivisionError" in entries[2]["error"]
    assert [entry["op"] for entry in harness.ok(action="log")["snapshots"]] == [4, 1]
    harness.ok(action="add_agent", agent="bob")
    assert harness.error(action="log", all=True, principal="bob")["kind"] == "denied"
