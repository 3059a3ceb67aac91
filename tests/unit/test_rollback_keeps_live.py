"""A rollback never makes a usable value unusable, nor swaps a value for a copy on a guess.

Two cases where the stored copy must not replace the live value: the copy
cannot be loaded (it would be a placeholder), and the value pickles to other
bytes each time, so whether the op changed it cannot be told.  Both stay live,
and the rollback report says which names and why.
"""

from __future__ import annotations

from pathlib import Path

from core_support import CoreEnv, abort

FRAGILE = """
import itertools
class Fragile:
    broken = False
    def __init__(self):
        self.items = [1, 2]
    def __setstate__(self, state):
        if Fragile.broken:
            raise RuntimeError('cannot load now')
        self.__dict__.update(state)
value = Fragile()
"""

RESTLESS = """
import itertools
class Restless:
    ticks = itertools.count()
    def __init__(self):
        self.items = [1, 2]
    def __getstate__(self):
        return {**self.__dict__, 'pickled': next(Restless.ticks)}
value = Restless()
"""


def test_a_value_whose_stored_copy_cannot_load_stays_live(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(FRAGILE)
    live = env.ns["value"]
    env.ns["Fragile"].broken = True
    undone = abort(env, "value.items.append(3)\n1/0")
    assert env.ns["value"] is live and live.items == [1, 2, 3]
    assert undone.reloaded == []
    assert sorted(undone.left_live) == ["Fragile", "value"]  # the class is stored with it
    assert "cannot load now" in undone.left_live["value"]
    assert "left as the cell left them: Fragile, value (its stored value could not be loaded" in (
        undone.summary())
    env.ns["Fragile"].broken = False
    kept = env.run("print(value.items)")
    assert "value" in kept.changed  # written as the cell left it
    env.close()


def test_a_value_that_pickles_differently_each_time_is_not_swapped_for_a_copy(
        tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(RESTLESS)
    live = env.ns["value"]
    undone = abort(env, "print(value.items)\n1/0")
    assert env.ns["value"] is live
    assert undone.reloaded == [] and sorted(undone.left_live) == ["Restless", "value"]
    assert "pickles differently each time" in undone.left_live["value"]
    env.close()


def test_a_value_that_pickles_the_same_each_time_and_changed_is_reloaded(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(FRAGILE)
    live = env.ns["value"]
    undone = abort(env, "value.items.append(3)\n1/0")
    assert undone.reloaded == ["Fragile", "value"] and undone.left_live == {}
    assert env.ns["value"] is not live and env.ns["value"].items == [1, 2]
    env.close()
