"""A restore in the background (``Image.restore(background=True)``): small values first,
ops that do not name the big ones run meanwhile, and nothing is lost either way."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np

from kernos import Image, Workspace
from kernos.analysis import reach_of_source
from kernos.image import EARLY_BYTES


def build(path: Path) -> None:
    with Workspace.open(path) as workspace:
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        image.restore()
        source = ("import numpy as np\nbig = np.arange(1_000_000, dtype=float)\n"
                  "def total():\n    return float(big.sum())\nsmall = [1, 2]\nn = 3")
        op = image.begin(source=source)
        exec(source, module.__dict__)
        op.commit()


def opened(path: Path) -> tuple[Workspace, Image, dict[str, object]]:
    workspace = Workspace.open(path)
    module = types.ModuleType("__main__")
    return workspace, Image(workspace, module.__dict__, module=module), module.__dict__


def run(image: Image, ns: dict[str, object], source: str) -> None:
    op = image.begin(source=source)
    exec(source, ns)
    op.commit()


def test_small_values_first_and_ops_that_need_none_of_the_rest_commit(tmp_path: Path) -> None:
    build(tmp_path / "ws")
    workspace, image, ns = opened(tmp_path / "ws")
    report = image.restore(background=True)
    assert "big" in image.pending_names and "big" not in ns and not image.restored.is_set()
    assert ns["small"] == [1, 2] and ns["n"] == 3 and report.names < 5
    assert not image.needs_pending(reach_of_source("n += 1\nfresh = small + [3]"))
    assert image.needs_pending(reach_of_source("big[0] = 5"))
    assert image.needs_pending(reach_of_source("print(total())"))  # stored code names big
    assert image.needs_pending(reach_of_source("exec('x = 1')"))
    run(image, ns, "n += 1\nfresh = small + [3]")
    head = image.head
    assert image.finish_restore() == 1 and image.restored.is_set()
    assert float(ns["big"][-1]) == 999_999.0 and ns["n"] == 4  # type: ignore[index]
    run(image, ns, "big[0] = -1.0")
    workspace.close()

    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    assert ns["n"] == 4 and ns["fresh"] == [1, 2, 3] and float(ns["big"][0]) == -1.0  # type: ignore[index]
    assert image.head != head
    from kernos import history

    entries = history.log(workspace)
    # The op that ran while big was loading kept its metadata in its manifest.
    assert entries[1].bytes >= 8_000_000 > EARLY_BYTES
    workspace.close()


def test_a_workspace_closed_before_the_big_values_load_keeps_them(tmp_path: Path) -> None:
    build(tmp_path / "ws")
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore(background=True)
    run(image, ns, "n = 10")
    workspace.close()
    workspace, image, ns = opened(tmp_path / "ws")
    image.restore()
    assert ns["n"] == 10 and np.array_equal(ns["big"], np.arange(1_000_000, dtype=float))
    workspace.close()
