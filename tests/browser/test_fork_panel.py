"""Fork from a history row of the Kernos sidebar, in a real JupyterLab and chromium.

The user expands a row of the History tab, clicks its *Fork*, types a name in
the dialog and accepts: the fork must exist on disk beside the notebook's
workspace, start at that row's snapshot, and verify (``kernos audit verify``,
the real CLI); the panel says where it is and offers *Open*, which opens a new
notebook whose kernel runs on the fork.  A name that is a path is refused and
nothing is made.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from audit_support import cli, verify
from browser.pages import STEP_TIMEOUT_MS, KernosPanel, NotebookPage

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]


def _fork(panel: KernosPanel, op: int, name: str) -> None:
    detail = panel.expand(op)
    dialog = panel.page.locator(".jp-Dialog")
    panel.click(detail.get_by_test_id("kernos-fork"),
                dialog.filter(has_text=re.compile(rf"from op {op}\b")), f"fork-{op}")
    dialog.get_by_test_id("kernos-fork-name").fill(name)
    panel.notebook.shot(f"fork-dialog-op-{op}-{name.replace('/', '_')}")
    dialog.locator(".jp-Dialog-button", has_text="Fork").click()
    expect(dialog).to_have_count(0)


def test_fork_from_a_history_row(open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("forking")
    panel = notebook.panel
    panel.open()
    notebook.run_cell("plan = 'A'")
    panel.wait_for_versions({"plan": "1"})
    first_op = panel.status_op()
    notebook.run_cell("plan = 'B'")
    panel.wait_for_status_op(first_op + 1)
    workspace = notebook.server.workspace

    _fork(panel, first_op, "../escape")
    expect(panel.testid("kernos-status")).to_contain_text("failed", timeout=STEP_TIMEOUT_MS)
    assert "not 1-100 letters" in panel.status()
    assert not (workspace.parent.parent / "escape").exists()

    _fork(panel, first_op, "trial-a")
    dest = workspace.parent / "trial-a"
    expect(panel.testid("kernos-forked")).to_contain_text(f"into {dest}",
                                                         timeout=STEP_TIMEOUT_MS)
    # The result offers Open (a notebook bound to the fork: tests/browser/test_fork_open.py).
    expect(panel.testid("kernos-open-fork")).to_be_visible()
    assert f"into {dest}" in panel.status()
    notebook.shot("forked")
    verdict = verify(dest)
    assert verdict.ok, verdict.problems()
    assert "confirmed" in verdict.report["origin"]
    shown = cli("show", "-w", str(dest), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["op"] == first_op

    # Open: the panel runs kernos:open-fork, a new notebook bound to the fork whose
    # kernel sees the fork's state (op first_op: plan is 'A').
    panel.testid("kernos-open-fork").click()
    expect(notebook.page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current",
                                 has_text="trial-a.ipynb")).to_be_visible(
        timeout=STEP_TIMEOUT_MS)
    notebook.wait_for_idle_kernel()
    notebook.server.remember_kernels()
    seen = notebook.run_cell("print(plan)")
    assert notebook.output(seen).strip() == "A"
    notebook.shot("fork-opened")
    # The sidebar follows the fork's notebook: its head, and no word of the other's fork.
    panel.wait_for_status_op(first_op)
    expect(panel.testid("kernos-forked")).to_have_text("")
