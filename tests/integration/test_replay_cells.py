"""``kernos replay`` of notebook cells that define code: functions, lambdas, classes,
generators, coroutines and ``from __future__ import annotations``, run by a real kernel
(IPython's compiler) and replayed by the real CLI, must come out equal, down to each
function's ``__code__.co_flags``; a real difference in a function is still reported."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from audit_support import cli

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

CELLS = (
    "def double(x): return 2 * x",
    "triple = lambda x: 3 * x\nscale = {'by': lambda x, k=2: k * x}",
    "class Point:\n"
    "    def __init__(self, x):\n"
    "        self.x = x\n"
    "    def norm(self):\n"
    "        return abs(self.x)\n"
    "    @staticmethod\n"
    "    def origin():\n"
    "        return Point(0)\n"
    "    @classmethod\n"
    "    def unit(cls):\n"
    "        return cls(1)\n"
    "    @property\n"
    "    def twice(self):\n"
    "        return 2 * self.x\n"
    "p = Point(-3)",
    "def count(n):\n    yield from range(n)",
    "async def fetch(x):\n    return x\n"
    "async def ticks(n):\n    for i in range(n):\n        yield i",
    "def outer(k):\n    def inner(x):\n        return k * x\n    return inner\nquad = outer(4)",
    "from __future__ import annotations\n"
    "def typed(x: int) -> list[int]:\n    return [x]",
    # A later cell: the kernel's compiler keeps the __future__ in force.
    "def later(point: Point) -> Point:\n    return point\n"
    "class Typed:\n    size: int = 0\n    def grow(self, by: int) -> Typed:\n        return self",
    # Top-level await (IPython's autoawait), ending in an expression.
    "import asyncio\nawaited = await fetch(5)\nticked = [i async for i in ticks(3)]\n"
    "await asyncio.sleep(0)\nawait fetch(awaited)",
)


def _replay(workspace: Path, into: Path, *options: str) -> dict[str, Any]:
    done = cli("replay", "-w", str(workspace), "--into", str(into), "--json", *options)
    assert done.returncode in (0, 1), done.stderr  # 1: it diverged (reported, not failed)
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_cells_that_define_functions_classes_and_coroutines_replay_equal(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    kernel = kernel_factory(workspace)
    here = kernel.run("import kernos; print(kernos.__file__)")
    assert here.stdout.strip() == str(Path(__file__).parents[2] / "kernel/kernos/__init__.py")
    defining = []
    for cell in CELLS:
        done = kernel.run(cell)
        assert done.committed, (cell, done.errors)
        defining.append(done.kernos["op"])
    # What the kernel compiled: plain functions have no __future__ flag, later ones do.
    flags = kernel.value("[f.__code__.co_flags for f in (double, triple, Point.norm, count, "
                         "fetch, ticks, quad, typed, later, Typed.grow)]")
    annotations = 0x1000000  # CO_FUTURE_ANNOTATIONS
    assert [flag & annotations for flag in flags] == [0] * 7 + [annotations] * 3
    assert kernel.value("later.__annotations__") == {"point": "Point", "return": "Point"}
    assert kernel.value("[awaited, ticked]") == [5, [0, 1, 2]]
    kernel.stop()

    report = _replay(workspace, tmp_path / "replayed")
    assert report["divergence"] is None and report["ok"], report["divergence"]
    compared = {step["op"] for step in report["steps"] if step["matches"] and step["digest"]}
    assert set(defining) <= compared  # each defining cell's snapshot was compared, equal

    # From the snapshot of the __future__ cell: the cells after it still compile under it.
    future = defining[CELLS.index(next(cell for cell in CELLS if "__future__" in cell))]
    report = _replay(workspace, tmp_path / "replayed-later", "--from", f"@{future}")
    assert report["divergence"] is None and report["ok"], report["divergence"]
    assert min(step["op"] for step in report["steps"]) == future + 1


def test_a_function_that_really_differs_at_replay_is_still_reported(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    source = tmp_path / "helpers.py"
    source.write_text("def double(x):\n    return 2 * x\n")
    kernel = kernel_factory(workspace)
    assert kernel.run("from __future__ import annotations").committed
    defined = kernel.run(f"exec(open({str(source)!r}).read())")
    assert defined.committed, defined.errors
    kernel.stop()

    source.write_text("def double(x):\n    return 3 * x\n")  # the file changed since
    report = _replay(workspace, tmp_path / "replayed")
    divergence = report["divergence"]
    assert divergence is not None and divergence["op"] == defined.kernos["op"]
    assert list(divergence["names"]) == ["double"]
    assert divergence["names"]["double"].startswith("double.__code__")


def _killed_mid_cell(kernel: Kernel) -> None:
    """kill -9 the kernel while a cell runs (its audit log gets a ``died`` record)."""
    kernel.client.execute("print('started', flush=True)\nimport time\ntime.sleep(600)")
    while True:
        message = kernel.client.get_iopub_msg(timeout=60)
        if message["msg_type"] == "stream" and "started" in message["content"]["text"]:
            break
    kernel.kill9()


def test_a_kernel_that_died_takes_its_future_flags_with_it(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    kernel = kernel_factory(workspace)
    assert kernel.run("from __future__ import annotations\n"
                      "def typed(x: int) -> int:\n    return x").committed
    _killed_mid_cell(kernel)
    again = kernel_factory(workspace)  # a new process: IPython's compiler starts afresh
    fresh = again.run("def fresh(x: int) -> int:\n    return x")
    assert fresh.committed, fresh.errors
    assert again.value("[typed.__code__.co_flags & 0x1000000, "
                       "fresh.__code__.co_flags & 0x1000000]") == [0x1000000, 0]
    again.stop()
    assert '"type":"died"' in (workspace / "audit" / "chain.jsonl").read_text()

    report = _replay(workspace, tmp_path / "replayed")
    assert report["divergence"] is None and report["ok"], report["divergence"]
    assert fresh.kernos["op"] in {step["op"] for step in report["steps"] if step["matches"]}
