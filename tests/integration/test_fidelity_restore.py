"""Fidelity of what real notebooks hold, through real kernels and ``kill -9``: no silent type
change, quiet values with nothing to lose, notices that name the user's value, memmaps
backed by their file, and methods of the global generators bound to the live ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel


def restart(kernel: Kernel, kernel_factory: Callable[..., Kernel]) -> Kernel:
    kernel.kill9()
    return kernel_factory(kernel.workspace)


def test_values_with_nothing_left_to_lose_are_not_announced_and_come_back(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    path = tmp_path / "input.txt"
    path.write_text("a\nb\n")
    kernel = kernel_factory()
    result = kernel.run(f"""
with open({str(path)!r}) as f:
    lines = f.readlines()
squares = (n * n for n in range(3))
total = sum(squares)
keys = iter({{"x": 1, "y": 2}})
next(keys)
""")
    assert result.status == "ok" and result.committed, (result.errors, result.kernos)
    assert result.stderr == ""
    assert result.kernos["unpersisted"] == []
    restored = restart(kernel, kernel_factory)
    assert restored.value("(type(f).__name__, f.closed, f.name, f.mode)") == (
        "TextIOWrapper", True, str(path), "r")
    assert restored.value("(type(squares).__name__, squares.__qualname__, list(squares))") == (
        "generator", "<genexpr>", [])
    assert restored.value("(type(keys).__name__, list(keys))") == ("dict_keyiterator", ["y"])


def test_a_library_object_holding_a_file_is_one_notice_and_its_cell_restores(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    pytest.importorskip("tables")
    kernel = kernel_factory()
    result = kernel.run(f"""
import pandas as pd
frame = pd.DataFrame({{"a": [1.0, 2.0]}})
store = pd.HDFStore({str(tmp_path / "data.h5")!r})
store["frame"] = frame
both = {{"store": store, "frame": frame}}
""")
    assert result.status == "ok" and result.committed, (result.errors, result.kernos)
    paths = sorted(info["path"] for info in result.kernos["unpersisted"])
    assert paths == ["both['store']", "store"]
    assert "_handle._node_manager" not in result.stderr
    assert "store (pandas.HDFStore) cannot be persisted: it holds an open file" in result.notices
    restored = restart(kernel, kernel_factory)
    assert restored.value("list(both['frame']['a'])") == [1.0, 2.0]
    assert restored.value("both['frame'] is frame") is True
    assert restored.value("type(store).__name__") == "Unpersisted"


def test_a_memmap_is_restored_backed_by_its_file(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    kernel = kernel_factory()
    created = kernel.run(f"""
import numpy as np
m = np.memmap({str(path)!r}, dtype="float64", mode="w+", shape=(2_000_000,))
m[:] = 1.0
""")
    assert created.committed, (created.errors, created.kernos)
    edit = kernel.run("m[5] = 5.0\nm.flush()")
    assert edit.committed and edit.kernos.get("bytes_written", 0) < 50_000, edit.kernos
    restored = restart(kernel, kernel_factory)
    assert restored.value("(type(m).__name__, str(m.filename), float(m[5]), float(m[6]))") == (
        "memmap", str(path), 5.0, 1.0)
    assert restored.run("m[6] = 6.0\nm.flush()").committed
    import numpy as np

    assert np.fromfile(path, dtype="float64")[6] == 6.0


def test_methods_of_the_global_generators_are_repeatable_after_a_restart(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    result = kernel.run("from numpy.random import randn\nfrom random import normalvariate")
    assert result.committed, result.kernos
    restored = restart(kernel, kernel_factory)
    first = restored.value("(__import__('numpy').random.seed(0), float(randn()))[1]")
    again = restored.value("(__import__('numpy').random.seed(0), float(randn()))[1]")
    assert first == again
    assert restored.value("randn.__self__ is __import__('numpy').random.mtrand._rand") is True
    assert restored.value("normalvariate.__self__ is __import__('random')._inst") is True
