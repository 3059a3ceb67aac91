"""Open a fork from JupyterLab: a new notebook whose kernel runs on the fork.

``kernos:open-fork {path}`` (what the sidebar's *Open* on a fork runs) writes a
notebook with ``metadata.kernos.workspace`` = the fork and a Kernos kernelspec,
and opens it; its kernel reads the binding at start-up.  A cell there sees the
fork's state, and what it does stays on the fork: the original notebook's image
is unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from audit_support import cli
from browser.pages import STEP_TIMEOUT_MS, NotebookPage

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]


@pytest.fixture(scope="module")
def lab_options() -> dict[str, Any]:
    """The test runs JupyterLab's commands, as the sidebar does: expose the app."""
    return {"args": ["--LabApp.expose_app_in_browser=True"], "env": {}}


def test_a_fork_opens_in_a_new_notebook_that_runs_on_it(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("origin")
    first = notebook.run_cell("plan = 'A'")
    expect(notebook.badge(first)).to_have_attribute("data-op", re.compile(r"^\d+$"))
    op = int(str(notebook.badge(first).get_attribute("data-op")))
    notebook.run_cell("plan = 'B'")
    workspace = notebook.server.workspace
    fork = workspace.parent / "trial-a"
    made = cli("fork", f"{workspace}@@{op}", str(fork))
    assert made.returncode == 0, made.stderr

    opened = notebook.lab("(app, arg) => app.commands.execute('kernos:open-fork', arg)",
                          {"path": str(fork)})
    assert opened == "trial-a.ipynb"
    expect(notebook.page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current",
                                 has_text="trial-a.ipynb")).to_be_visible()
    notebook.wait_for_idle_kernel()
    notebook.server.remember_kernels()
    saved = json.loads((notebook.server.root / "trial-a.ipynb").read_text())
    assert saved["metadata"]["kernos"] == {"workspace": str(fork)}
    assert saved["metadata"]["kernelspec"]["name"] == "kernos"
    expect(notebook.cells.first).to_contain_text(f"runs on the fork {fork}")

    seen = notebook.run_cell("print(plan)")
    assert notebook.output(seen).strip() == "A"
    status = notebook.run_cell("%kernos status")
    assert re.search(rf"workspace\s+{re.escape(str(fork))}\n", notebook.output(status))
    tried = notebook.run_cell("plan = 'tried on the fork'")
    expect(notebook.badge(tried)).to_contain_text("committed", timeout=STEP_TIMEOUT_MS)
    tried_op = int(str(notebook.badge(tried).get_attribute("data-op")))
    notebook.shot("fork-notebook")

    # The original notebook's image is untouched.
    notebook.switch_to("origin.ipynb")
    notebook.wait_for_idle_kernel()
    check = notebook.run_cell("print(plan)")
    assert notebook.output(check).strip() == "B"
    shown = cli("show", "-w", str(fork), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["op"] == tried_op
    notebook.shot("origin-unchanged")

    # Opening the same fork again shows its notebook, rather than a second one whose
    # kernel would find the fork in use.
    again = notebook.lab("(app, arg) => app.commands.execute('kernos:open-fork', arg)",
                         {"path": str(fork)})
    assert again == "trial-a.ipynb"
    expect(notebook.page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current",
                                 has_text="trial-a.ipynb")).to_be_visible()
    assert sorted(path.name for path in notebook.server.root.glob("*.ipynb")) == [
        "origin.ipynb", "trial-a.ipynb"]

