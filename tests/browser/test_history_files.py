"""The sidebar's history shows the tracked files an op changed (issue 36).

A cell writes ``out.csv`` into ``kernos.files.root()``; its history row counts
the file (``files +1``) and, expanded, lists its path, its size and a folded
text diff; a cell that writes many files lists the first ones and folds the
rest; at 250 px and 600 px nothing spills.  Screenshots go to the test's
artifacts.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from browser.pages import STEP_TIMEOUT_MS, NotebookPage
from browser.test_sidebar_width import assert_fits, set_sidebar_width

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]


def test_an_expanded_op_lists_the_files_it_wrote(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("history-files")
    panel = notebook.panel
    panel.open()
    notebook.run_cell("import kernos.files\n"
                      "kernos.files.path('out.csv').write_text('a,b\\n1,2\\n')")
    wrote = panel.status_op()
    notebook.run_cell("kernos.files.path('out.csv').write_text('a,b\\n1,3\\n')\n"
                      "d = kernos.files.path('plots/a-rather-long-directory-name-for-the-"
                      "narrow-sidebar')\n"
                      "d.mkdir(parents=True)\n"
                      "for i in range(12):\n"
                      "    (d / f'figure-{i:02d}.svg').write_text(f'<svg>{i}</svg>')")
    many = panel.status_op()
    assert many == wrote + 1

    set_sidebar_width(notebook, 250)
    panel.tab("history")
    history = panel.history
    row = history.locator(f'tr[data-op="{wrote}"]')
    expect(row.get_by_test_id("kernos-change-files")).to_have_text(
        "files +1", timeout=STEP_TIMEOUT_MS)
    expect(history.locator(f'tr[data-op="{many}"]').get_by_test_id("kernos-change-files")
           ).to_have_text("files +12 ~1")

    detail = panel.expand(wrote)
    files = detail.get_by_test_id("kernos-op-files")
    item = files.locator('li[data-path="out.csv"]')
    expect(item).to_have_attribute("data-change", "added")
    expect(item.locator(".kernos-file-path")).to_have_text("out.csv")
    expect(item.locator(".kernos-file-size")).to_have_text("8 B", timeout=STEP_TIMEOUT_MS)
    expect(item.locator("pre.kernos-file-diff")).to_be_hidden()
    item.locator(".kernos-file-diff-toggle").click()
    expect(item.locator("pre.kernos-file-diff")).to_contain_text("--- /dev/null")
    expect(item.locator("pre.kernos-file-diff")).to_contain_text("+1,2")
    expect(detail).to_be_visible()  # opening the diff did not collapse the row
    assert_fits(panel, "history files at 250 px")
    notebook.shot("250px-history-files")

    detail = panel.expand(many)
    files = detail.get_by_test_id("kernos-op-files")
    expect(files.locator(".kernos-op-files-title")).to_have_text("files +12 ~1")
    shown = files.locator("> ul > li.kernos-file")
    expect(shown).to_have_count(8)
    long = "plots/a-rather-long-directory-name-for-the-narrow-sidebar"
    expect(shown.first).to_have_attribute("data-path", f"{long}/figure-00.svg")
    # The file's name first, then its directory (cut short at this width; the tooltip
    # holds the whole path).
    expect(shown.first.locator(".kernos-file-name")).to_have_text("figure-00.svg")
    expect(shown.first.locator(".kernos-file-dir")).to_have_text(f" {long}")
    expect(shown.first.locator(".kernos-file-path")).to_have_attribute(
        "title", f"added: {long}/figure-00.svg")
    line = shown.first.bounding_box()
    assert line is not None and line["height"] < 30, line  # one line per file
    more = files.locator("details.kernos-file-more")
    expect(more.locator("> summary")).to_have_text("5 more files")
    more.locator("> summary").click()
    expect(more.locator('li[data-path="out.csv"]')).to_have_attribute("data-change", "changed")
    expect(more.locator('li[data-path="out.csv"] .kernos-file-size')).to_have_text(
        "8 B → 8 B", timeout=STEP_TIMEOUT_MS)
    assert_fits(panel, "history many files at 250 px")
    notebook.shot("250px-history-many-files")

    set_sidebar_width(notebook, 600)
    assert_fits(panel, "history many files at 600 px")
    notebook.shot("600px-history-many-files")

    # Comparing the two ops lists the files that differ.
    for op in (wrote, many):
        history.locator(f'tr[data-op="{op}"]').get_by_test_id("kernos-diff-select").check()
    diff = panel.testid("kernos-diff")
    expect(diff.locator('li[data-path="out.csv"]')).to_have_attribute("data-change", "changed")
    expect(diff.locator("li.kernos-diff-file")).to_have_count(13)
    notebook.shot("600px-history-files-diff")
