"""Big lists and dicts are stored in segments; an op rewrites only the segments it touched.

Every test checks what a restart gives back (``reopen``), since a segment
that was wrongly left as it was would only show there: the live value is
always right.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core_support import CoreEnv
from kernos.serialize.segments import SEGMENT_ENTRIES, SEGMENTED_FROM
from kernos.store.snapshots import read_group, read_snapshot

SIZE = SEGMENTED_FROM + 3 * SEGMENT_ENTRIES + 17  # the last segment is partial
SEGMENTS = SIZE // SEGMENT_ENTRIES + 1
RECORDS = f"memory = [{{'op': i, 'text': f'record {{i}}'}} for i in range({SIZE})]"
TABLE = f"table = {{k: {{'v': 0, 'name': f'entry {{k}}'}} for k in range({SIZE})}}"


def group_of(env: CoreEnv, name: str):  # type: ignore[no-untyped-def]
    image = env.image
    head = read_snapshot(image.workspace, image.head)
    return read_group(image.workspace, name, head.group_trees[name])


def segments_pickled(env: CoreEnv, name: str, code: str) -> int:
    """Run ``code``; how many segments of ``name`` it pickled (-1: stored whole)."""
    before = env.image.segmented.get(name)
    old = {id(piece) for piece in before.segments} if before is not None else set()
    env.run(code)
    after = env.image.segmented.get(name)
    if after is None:
        return -1
    return sum(id(piece) not in old for piece in after.segments)


def test_appends_pickle_the_tail_only_and_restore_exactly(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    first = env.run(RECORDS).bytes_written
    assert len(group_of(env, "memory").buffers) == SEGMENTS
    pickled = [segments_pickled(env, "memory", f"memory.append({{'op': -{n}}})")
               for n in range(5)]
    assert pickled == [1, 1, 1, 1, 1]
    written = env.run("memory.append({'op': 'last'})").bytes_written
    assert written < first / 20, (first, written)
    expected = list(env.ns["memory"])
    env.reopen()
    assert env.ns["memory"] == expected


def test_a_keyed_edit_of_a_big_dict_pickles_one_segment(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(TABLE)
    env.run("table[7]['v'] += 1")  # the first op after the first commit may pickle all
    assert segments_pickled(env, "table", "table[7]['v'] += 1") == 1
    assert segments_pickled(env, "table", f"table[{SIZE - 1}]['v'] = 5") == 1
    assert segments_pickled(env, "table", "print(len(table), table.get(3))") == 1
    report = env.run("table[9000]['name'] = 'renamed'")
    assert report.changed == ["table"] and report.bytes_written < 16_384
    # New keys go to the end, as in the dict itself.
    assert segments_pickled(env, "table", "table['new'] = {'v': 1}\ntable[-5] = 'neg'") >= 1
    expected = dict(env.ns["table"])
    env.reopen()
    assert env.ns["table"] == expected
    assert list(env.ns["table"]) == list(expected)
    assert env.ns["table"][7]["v"] == 2 and env.ns["table"][9000]["name"] == "renamed"


def test_any_other_use_pickles_every_segment(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(RECORDS)
    env.run("memory.append(0)")
    count = SIZE // SEGMENT_ENTRIES + 1
    assert segments_pickled(env, "memory", "[r.update(seen=True) for r in memory[:-1]]") == count
    assert segments_pickled(env, "memory", "helper = memory\nhelper[5]['x'] = 1\ndel helper"
                            ) == count
    env.reopen()
    assert all(record["seen"] for record in env.ns["memory"][:-1])
    assert env.ns["memory"][5]["x"] == 1


def test_code_stored_with_another_value_that_names_it_is_followed(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(RECORDS)
    env.run("def bump():\n    memory[0]['op'] = 'bumped'\n    memory[-1]['op'] = 'tail'")
    env.run("memory.append({'op': 'new'})")
    env.run("bump()\nmemory.append(1)")  # the call mutates entries the code does not name
    env.reopen()
    assert env.ns["memory"][0]["op"] == "bumped" and env.ns["memory"][-2] == {"op": "tail"}
    assert env.ns["memory"][-1] == 1


def test_negative_indices_after_appends_reach_the_right_segment(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(f"memory = list(range({2 * SEGMENTED_FROM}))")  # the end of a segment
    env.run("memory.append(-1)")
    env.run(f"memory[-2] = 'was last'\nmemory.extend(range({SEGMENT_ENTRIES}))\n"
            f"memory[-{SEGMENT_ENTRIES + 3}] = 'before'")
    expected = list(env.ns["memory"])
    env.reopen()
    assert env.ns["memory"] == expected


def test_objects_shared_across_segments_keep_their_identity(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(TABLE)
    env.run("table[1]['v'] = 0")
    env.run(f"table[1] = table[{SIZE - 1}]")  # two segments hold one dict
    assert "table" not in env.image.segmented  # stored whole
    env.reopen()
    assert env.ns["table"][1] is env.ns["table"][SIZE - 1]
    env.run("table[1] = {'v': 'own'}")  # shared no more: segments again
    assert "table" in env.image.segmented
    env.reopen()
    assert env.ns["table"][1] is not env.ns["table"][SIZE - 1]


def test_sharing_with_another_name_groups_them(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(RECORDS)
    env.run("memory.append({'op': 'x'})")
    env.run("first = memory[3]\nmemory.append(first)")
    env.reopen()
    assert env.ns["first"] is env.ns["memory"][3] is env.ns["memory"][-1]


def test_another_name_holding_the_container_keeps_its_identity(tmp_path: Path) -> None:
    """Entries that carry no identity (numbers) leave only the container to meet."""
    env = CoreEnv(tmp_path / "ws")
    env.run(f"numbers = list(range({SIZE}))\nflat = dict.fromkeys(range({SIZE}), 0)")
    env.run("alias = numbers")
    env.run("holder = {'t': flat}")
    env.reopen()
    assert env.ns["alias"] is env.ns["numbers"] and env.ns["holder"]["t"] is env.ns["flat"]


def test_a_cycle_through_the_container_is_stored_whole(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(RECORDS)
    env.run("memory[4]['all'] = memory")
    assert "memory" not in env.image.segmented
    env.reopen()
    assert env.ns["memory"][4]["all"] is env.ns["memory"]


def test_values_that_are_not_plain_data_are_stored_whole(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(f"def f(x):\n    return x\nitems = [f] * {SEGMENTED_FROM}")
    assert "items" not in env.image.segmented
    env.reopen()
    assert env.ns["items"][0] is env.ns["items"][-1] is env.ns["f"]


def test_a_rolled_back_append_leaves_the_stored_segments_right(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(RECORDS)
    env.run("memory.append('kept')")
    with pytest.raises(ZeroDivisionError):
        env.run("memory.append('lost')\nmemory[0]['op'] = 'lost'\n1 / 0")
    assert env.ns["memory"][-1] == "kept" and env.ns["memory"][0]["op"] == 0
    env.run("memory.append('after')")
    expected = list(env.ns["memory"])
    env.reopen()
    assert env.ns["memory"] == expected and expected[-2:] == ["kept", "after"]


def test_the_layout_depends_on_the_value_not_on_how_it_was_built(tmp_path: Path) -> None:
    """A replay, or a restart, writes the very trees the original session wrote."""
    step = CoreEnv(tmp_path / "step")
    step.run(RECORDS)
    step.run(TABLE)
    for n in range(SEGMENT_ENTRIES + 5):  # crosses into a new segment
        step.run(f"memory.append({n})") if n % 500 else step.run(
            f"memory.append({n}); table[{n}]['v'] = {n}; table['k{n}'] = {n}")
    once = CoreEnv(tmp_path / "once")
    once.run(f"memory = {step.ns['memory']!r}\ntable = {step.ns['table']!r}")
    for name in ("memory", "table"):
        assert group_of(step, name).tree == group_of(once, name).tree, name
