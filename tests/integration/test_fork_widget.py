"""The inspector widget's "Fork" action in a real kernel, driven as a frontend drives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from audit_support import verify
from integration.test_inspector_widget import Frontend, committed, kernel_value

pytestmark = [pytest.mark.kernel]


def _described(frontend: Frontend, model: str, description: str) -> str:
    [found] = [model_id for model_id in frontend.find(model)
               if frontend.models[model_id].get("description") == description]
    return found


def test_fork_from_a_history_row_makes_a_workspace_that_verifies(kernel: Any) -> None:
    frontend = Frontend(kernel)
    first = frontend.run("plan = 'A'")
    committed(first)
    committed(frontend.run("plan = 'B'"))
    committed(frontend.run("import kernos\nkernos.inspect()"))
    status, tabs = frontend.children(frontend.views[0])
    frontend.set(tabs, selected_index=3)
    target = _described(frontend, "DropdownModel", "Snapshot")
    labels = frontend.models[target]["_options_labels"]
    op = first["metadata"]["kernos"]["op"]
    frontend.set(target, index=next(index for index, label in enumerate(labels)
                                    if label.startswith(f"op {op}:")))
    name = _described(frontend, "TextModel", "Fork as")
    button = _described(frontend, "ButtonModel", "Fork")
    workspace = Path(kernel.workspace)

    # A path is refused, and nothing is made.
    frontend.set(name, value="../escape")
    frontend.click(button)
    assert "fork failed (invalid)" in frontend.models[status]["value"]
    assert not (workspace.parent.parent / "escape").exists()

    frontend.set(name, value="trial-1")
    frontend.click(button)
    dest = workspace.parent / "trial-1"
    assert f"into {dest}" in frontend.models[status]["value"]
    [shown] = frontend.find("HTMLModel", f"KERNOS_WORKSPACE={dest}")
    assert "Forked op" in frontend.models[shown]["value"]
    verdict = verify(dest)
    assert verdict.ok, verdict.problems()
    assert "confirmed" in verdict.report["origin"]
    assert kernel_value(frontend, "plan") == "B"  # this image is as it was
