"""The ipywidgets inspector, rendered by JupyterLab's widget manager in a real browser.

``kernos.inspect()`` in a cell draws the inspector under it; a committed cell
adds its name to the Objects table, a rolled-back cell adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from browser.pages import STEP_TIMEOUT_MS, NotebookPage

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]


def test_the_inspector_widget_renders_and_follows_commits(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("widget")
    notebook.run_cell("alpha_value = 1")
    cell = notebook.run_cell("import kernos\nkernos.inspect()")
    widget = cell.locator(".jp-OutputArea-output .lm-TabBar, .jp-OutputArea-output "
                          ".widget-tab").first
    expect(widget).to_be_visible(timeout=STEP_TIMEOUT_MS)
    output = cell.locator(".jp-OutputArea")
    expect(output).to_contain_text("alpha_value", timeout=STEP_TIMEOUT_MS)
    for tab in ("Objects", "Events", "Capabilities", "History", "Plot"):
        expect(output).to_contain_text(tab)
    notebook.shot("widget-rendered")

    notebook.run_cell("beta_value = [1, 2]")
    expect(output).to_contain_text("beta_value", timeout=STEP_TIMEOUT_MS)
    notebook.run_cell("gamma_value = 3\n1 / 0")
    notebook.page.wait_for_timeout(1_500)  # a notice would arrive within milliseconds
    expect(output).not_to_contain_text("gamma_value")
    expect(output).to_contain_text("beta_value")
    notebook.shot("widget-after-rollback")
