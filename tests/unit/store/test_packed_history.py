"""A history that git has packed (``git gc``) restores like a loose one.

Kernos writes one small pack per commit, but a person may run ``git gc`` on
a workspace (which deltifies and merges them), and a replay or a clone
brings packs of git's making.  Large values are read chunk by chunk on
reader threads, straight from the memory-mapped packs.
"""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

import numpy as np

from kernos import Image, Workspace


def test_a_packed_history_restores_every_chunk(tmp_path: Path) -> None:
    path = tmp_path / "ws"
    arrays = {f"a{n}": np.random.default_rng(n).random(2**17 + 1000) for n in range(4)}
    with Workspace.open(path, purpose="test") as workspace:
        image = Image(workspace, {})
        image.restore()
        op = image.begin(source="arrays")
        image.namespace.update(arrays)
        op.commit()
    subprocess.run(["git", "--git-dir", str(path / "history.git"), "gc", "--quiet",
                    "--prune=now"], check=True)
    assert not any((path / "history.git" / "objects").glob("[0-9a-f][0-9a-f]/*"))
    for _ in range(2):
        with Workspace.open(path, purpose="test") as workspace:
            module = types.ModuleType("__main__")
            image = Image(workspace, module.__dict__, module=module)
            report = image.restore()
            assert report.failed == {}
            for name, array in arrays.items():
                assert np.array_equal(module.__dict__[name], array), name
