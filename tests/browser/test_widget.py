"""The inspector that ``kernos.inspect()`` displays, in a real browser.

In JupyterLab the extension draws it (``application/vnd.kernos.inspector+json``,
ahead of the ipywidget in the same bundle) as a Kernos panel bound to the
notebook's session: a committed cell adds its name to the Objects table, a
rolled-back cell adds nothing; it keeps working after the kernel restarts, and
renders again when the notebook is reopened on a new kernel, where a widget's
model would be gone ("model not found").
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from browser.pages import STEP_TIMEOUT_MS, NotebookPage

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]


def test_the_inspector_follows_commits_and_survives_a_restart_and_a_reopen(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("widget")
    notebook.run_cell("alpha_value = 1")
    cell = notebook.run_cell("import kernos\nkernos.inspect()")
    inline = cell.locator('[data-testid="kernos-inline"]')
    expect(inline).to_be_visible(timeout=STEP_TIMEOUT_MS)
    expect(inline).to_contain_text("alpha_value", timeout=STEP_TIMEOUT_MS)
    for tab in ("Objects", "Events", "History"):
        expect(inline).to_contain_text(tab)
    expect(cell.locator(".jp-OutputArea")).not_to_contain_text("Error displaying widget")
    notebook.shot("inspector-rendered")

    notebook.run_cell("beta_value = [1, 2]")
    expect(inline).to_contain_text("beta_value", timeout=STEP_TIMEOUT_MS)
    notebook.run_cell("gamma_value = 3\n1 / 0")
    notebook.page.wait_for_timeout(1_500)  # a notice would arrive within milliseconds
    expect(inline).not_to_contain_text("gamma_value")
    expect(inline).to_contain_text("beta_value")
    notebook.shot("inspector-after-rollback")

    # A restart: the same output follows the new kernel, which restored the image.
    notebook.restart_kernel()
    notebook.run_cell("delta_value = 4")
    expect(inline).to_contain_text("delta_value", timeout=STEP_TIMEOUT_MS)
    expect(inline).to_contain_text("beta_value")
    expect(inline.locator(".jp-icon-warn0, .fa-chain-broken")).to_have_count(0)
    notebook.shot("inspector-after-restart")

    # Saved, closed, its kernel shut down, reopened: it renders on the new kernel.
    notebook.page.keyboard.press("Control+s")
    expect(notebook.page.locator("#jp-main-dock-panel .lm-TabBar-tab.jp-mod-dirty")).to_have_count(
        0, timeout=STEP_TIMEOUT_MS)
    server = notebook.server
    for kernel in server.api("/api/kernels"):
        server.api(f"/api/kernels/{kernel['id']}", method="DELETE")
    notebook.page.reload()
    notebook.open()
    cell = notebook.cells.nth(1)
    inline = cell.locator('[data-testid="kernos-inline"]')
    expect(inline).to_be_visible(timeout=STEP_TIMEOUT_MS)
    expect(inline).to_contain_text("delta_value", timeout=STEP_TIMEOUT_MS)
    expect(cell.locator(".jp-OutputArea")).not_to_contain_text("model not found")
    notebook.run_cell("epsilon_value = 5")
    expect(inline).to_contain_text("epsilon_value", timeout=STEP_TIMEOUT_MS)
    notebook.shot("inspector-after-reopen")


def test_a_value_that_cannot_persist_is_a_quiet_notice_not_stderr(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("notice")
    cell = notebook.run_cell("handle = open('notice.ipynb')\nprint('opened')")
    notice = cell.locator('[data-testid="kernos-notice"]')
    expect(notice).to_contain_text("handle (_io.TextIOWrapper) cannot be persisted",
                                   timeout=STEP_TIMEOUT_MS)
    expect(notice).to_have_attribute("data-kind", "unpersisted")
    expect(cell.locator('[data-mime-type="application/vnd.jupyter.stderr"]')).to_have_count(0)
    outputs = cell.locator(".jp-OutputArea-output")
    expect(outputs.first).to_contain_text("opened")  # the cell's own output comes first
    notebook.shot("notice")
