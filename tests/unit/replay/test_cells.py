"""``CellCompiler``: the ``__future__`` flags a kernel's IPython compiler keeps from cell to
cell, and cells that await at their top level (the kernel-level proof is
``tests/integration/test_replay_cells.py``)."""

from __future__ import annotations
import __future__

import asyncio
from typing import Any

from kernos.replay.cells import CellCompiler

ANNOTATIONS = __future__.annotations.compiler_flag


def test_a_future_import_stays_in_force_for_later_cells_until_a_restart() -> None:
    cells = CellCompiler()
    assert cells.ran("def plain(x: int): return x") == 0
    assert cells.ran("from __future__ import annotations\nx = 1") == ANNOTATIONS
    assert cells.ran("def later(x: int): return x") == ANNOTATIONS
    namespace: dict[str, Any] = {}
    cells.run("def later(x: Undefined) -> int: return x", namespace)
    assert namespace["later"].__annotations__ == {"x": "Undefined", "return": "int"}
    assert namespace["later"].__code__.co_flags & ANNOTATIONS
    cells.restarted()
    assert cells.ran("def fresh(x: int): return x") == 0
    cells.run("def fresh(x: int): return x", namespace)
    assert namespace["fresh"].__annotations__ == {"x": int}
    assert not namespace["fresh"].__code__.co_flags & ANNOTATIONS


def test_a_cell_that_does_not_compile_changes_no_flag() -> None:
    cells = CellCompiler()
    assert cells.ran("from __future__ import annotations\ndef broken(:") == 0


def test_the_callers_own_future_flags_never_reach_a_cell() -> None:
    # This test module has `from __future__ import annotations`, as the driver has.
    namespace: dict[str, Any] = {}
    assert CellCompiler().run("def f(x: int): return x", namespace) == (False, None)
    assert namespace["f"].__annotations__ == {"x": int}


def test_a_top_level_await_cell_runs_to_its_end_and_gives_its_value() -> None:
    cells = CellCompiler()
    code = ("import asyncio\nasync def fetch(x):\n    return x\n"
            "got = await fetch(2)\nawait asyncio.sleep(0)\nawait fetch(got + 1)")
    namespace: dict[str, Any] = {}
    assert cells.run(code, namespace) == (True, 3)
    assert namespace["got"] == 2


def test_a_top_level_await_cell_runs_while_an_event_loop_runs_in_this_thread() -> None:
    # A replay started from a notebook: the kernel's loop is running.
    async def inside() -> tuple[bool, object]:
        namespace: dict[str, Any] = {}
        return CellCompiler().run("import asyncio\nawait asyncio.sleep(0)\n7", namespace)

    assert asyncio.run(inside()) == (True, 7)
