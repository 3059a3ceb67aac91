"""The Kernos sidebar in a real JupyterLab, driven by chromium as a person would drive it.

The main flow, on a kernos notebook: cells that commit show their objects (with
versions) in the panel; a cell that fails leaves panel and namespace exactly as they
were; checking out an earlier snapshot from the History tab changes both; a kernel
restart repopulates the panel.  Then: a plain ``python3`` notebook gets the "not
Kernos" message; the objects pages, filter and preview, and the events,
capabilities, plot and diff views; the panel following the active notebook.

Screenshots of every step land in ``tests/browser/artifacts/latest/<test>/``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from browser.pages import STEP_TIMEOUT_MS, KernosPanel, LabServer, NotebookPage, write_notebook

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]

QUIET_MS = 2_000
"""How long a panel must stay unchanged after a rolled-back op (notices come within ms)."""


def rows_shown(first: int, last: int, total: int) -> str:
    """The pager's text: FIRST, an en dash, LAST, " of ", TOTAL."""
    return f"{first}\N{EN DASH}{last} of {total}"


def assert_holds_still(panel: KernosPanel, versions: dict[str, str], status: str) -> None:
    """For QUIET_MS: the same rows, versions and status line, and no row redrawn."""
    deadline = time.monotonic() + QUIET_MS / 1000
    while time.monotonic() < deadline:
        assert panel.versions() == versions
        assert panel.status() == status
        assert panel.redrawn_rows() == []
        panel.page.wait_for_timeout(100)


def test_panel_follows_the_image(open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("image")
    panel = notebook.panel
    panel.open()
    panel.tab("objects")
    notebook.shot("opened-with-panel")

    # Cells that commit: their names appear, with versions.
    notebook.run_cell("x = 1; items = [1, 2, 3]")
    panel.wait_for_versions({"items": "1", "x": "1"})
    first_op = panel.status_op()
    notebook.shot("first-cell-committed")

    notebook.run_cell('x = 2; label = "two"')
    versions = {"items": "1", "label": "1", "x": "2"}
    panel.wait_for_versions(versions)
    panel.wait_for_status_op(first_op + 1)
    status = panel.status()
    notebook.shot("second-cell-committed")
    # The panel is settled: nothing redraws while no op runs.
    panel.mark_rows()
    assert_holds_still(panel, versions, status)

    # A failed cell rolls back: the panel holds still (not even redrawn), and so does
    # the namespace.
    failed = notebook.run_cell("x = 999; 1/0")
    assert "ZeroDivisionError" in notebook.output(failed)
    # The panel says so in a note, and that is all it does.
    expect(panel.testid("kernos-note")).to_contain_text("rolled back", timeout=STEP_TIMEOUT_MS)
    notebook.wait_for_idle_kernel()
    assert_holds_still(panel, versions, status)
    notebook.shot("failed-cell-panel-unchanged")
    check = notebook.run_cell("print(x, label, items)")
    assert notebook.output(check).strip() == "2 two [1, 2, 3]"
    # That cell only read (op first_op + 3, after the failed first_op + 2): it wrote no
    # snapshot, so the header still names the head snapshot's op and commit.
    panel.page.wait_for_timeout(500)  # a notice would arrive within milliseconds
    assert panel.status() == status, (panel.status(), status)
    assert panel.versions() == versions
    notebook.shot("namespace-unchanged")

    # Check out the first snapshot from the History tab: x is 1 again and label is gone,
    # and the progress bar showed the checkout to its end.
    panel.record_progress()
    panel.check_out(first_op)
    panel.tab("objects")
    # The checkout is an op of its own: x changes (back to 1) and gets a new version.
    checked_out = {"items": "1", "x": "3"}
    panel.wait_for_versions(checked_out)
    shown = [state for state in panel.progress_seen() if not state["hidden"]]
    assert shown and {state["what"] for state in shown} == {"checkout"}, shown
    assert shown[-1]["percent"] == 100, shown
    expect(panel.testid("kernos-progress")).to_be_hidden()
    panel.select("x")
    expect(panel.testid("kernos-preview")).to_contain_text("version 3")
    expect(panel.testid("kernos-preview").locator("pre")).to_have_text("1")
    notebook.shot("checked-out-first-op")
    check = notebook.run_cell("print(x, items, 'label' in globals())")
    assert notebook.output(check).strip() == "1 [1, 2, 3] False"
    notebook.shot("namespace-checked-out")

    # A restarted kernel restores the image, and the panel reads it again (every row is
    # drawn anew) and follows it.
    panel.tab("objects")
    panel.mark_rows()
    notebook.restart_kernel()
    panel.wait_for_redrawn("x", "items")
    panel.wait_for_versions(checked_out)
    notebook.shot("restarted")
    notebook.run_cell("after_restart = x + 1")
    panel.wait_for_versions({**checked_out, "after_restart": "1"})
    notebook.shot("after-restart-cell")


def test_plain_python_notebook_is_not_kernos(open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("plain", "python3")
    notebook.panel.open()
    expect(notebook.panel.testid("kernos-not-kernos")).to_be_visible(timeout=STEP_TIMEOUT_MS)
    notebook.shot("not-kernos")
    expect(notebook.panel.objects).to_be_hidden()
    expect(notebook.panel.testid("kernos-tab-objects")).to_be_hidden()


def test_views_page_filter_preview_events_grants_plot_and_diff(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("views")
    panel = notebook.panel
    panel.open()
    panel.tab("objects")

    # Sixty names: two pages of fifty.
    notebook.run_cell('globals().update({f"v{n:02d}": n for n in range(60)})')
    panel.wait_for_names("v00", "v49", absent=("v50",))
    first_op = panel.status_op()
    page = panel.testid("kernos-page")
    expect(page).to_have_text(rows_shown(1, 50, 60))
    expect(panel.testid("kernos-prev")).to_be_disabled()
    notebook.shot("page-1")
    panel.testid("kernos-next").click()
    expect(page).to_have_text(rows_shown(51, 60, 60))
    panel.wait_for_names("v50", "v59", absent=("v00", "v49"))
    expect(panel.testid("kernos-next")).to_be_disabled()
    notebook.shot("page-2")
    panel.testid("kernos-prev").click()
    expect(page).to_have_text(rows_shown(1, 50, 60))

    # The filter asks the kernel; the pages follow it.
    panel.testid("kernos-filter").fill("v5")
    expect(page).to_have_text(rows_shown(1, 10, 10))
    assert sorted(panel.versions()) == [f"v5{n}" for n in range(10)]
    notebook.shot("filtered")
    panel.testid("kernos-filter").fill("")
    expect(page).to_have_text(rows_shown(1, 50, 60))

    # A row's preview; a change to it (with an event) is shown in place.
    panel.select("v07")
    preview = panel.testid("kernos-preview")
    expect(preview.locator("pre")).to_have_text("7")
    expect(preview).to_contain_text("version 1")
    notebook.run_cell('v07 = 700\nevents.emit("orders.created", {"id": 7})')
    panel.wait_for_status_op(first_op + 1)
    expect(preview.locator("pre")).to_have_text("700")
    expect(preview).to_contain_text("version 2")
    notebook.shot("preview-updated")

    panel.tab("events")
    expect(panel.testid("kernos-events")).to_contain_text("orders.created")
    notebook.shot("events")

    notebook.run_cell("%kernos agent add alice\n%kernos grant alice read:v07")
    panel.tab("capabilities")
    grants = panel.testid("kernos-capabilities")
    expect(grants).to_contain_text("alice")
    expect(grants).to_contain_text("read:v07")
    notebook.shot("capabilities")

    panel.tab("plot")
    expect(panel.testid("kernos-plot").locator("svg")).to_be_visible()
    notebook.shot("plot")

    # Compare the first two snapshots: v07 changed from 7 to 700.
    panel.tab("history")
    for op in (first_op, first_op + 1):
        panel.history.locator(f'tr[data-op="{op}"]').get_by_test_id("kernos-diff-select").check()
    changed = panel.testid("kernos-diff").locator('li[data-name="v07"]')
    expect(changed).to_have_attribute("data-change", "changed")
    expect(changed).to_contain_text("7")
    expect(changed).to_contain_text("700")
    notebook.shot("diff")


def test_panel_follows_the_active_notebook(open_notebook: Callable[..., NotebookPage],
                                           lab_server: LabServer) -> None:
    notebook = open_notebook("kernos-side")
    panel = notebook.panel
    panel.open()
    notebook.run_cell("shown = 1")
    panel.wait_for_names("shown")
    notebook.shot("kernos-notebook")

    # A python3 notebook opened beside it takes the panel over: "not Kernos".
    write_notebook(lab_server.root / "python-side.ipynb", "python3")
    notebook.open_from_file_browser("python-side.ipynb", "python3")
    panel.open()
    expect(panel.testid("kernos-not-kernos")).to_be_visible(timeout=STEP_TIMEOUT_MS)
    expect(panel.objects).to_be_hidden()
    notebook.shot("python-notebook-active")

    # Back on the Kernos notebook, the panel shows its image again, and follows it.
    notebook.switch_to("kernos-side.ipynb")
    expect(panel.testid("kernos-not-kernos")).to_be_hidden(timeout=STEP_TIMEOUT_MS)
    panel.wait_for_names("shown")
    notebook.run_cell("shown_again = 2")
    panel.wait_for_names("shown", "shown_again")
    notebook.shot("kernos-notebook-again")
