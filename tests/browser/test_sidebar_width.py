"""The sidebar at the widths users have: JupyterLab's default (about 250 px), 400 and 600.

At each width, no tab scrolls sideways (the panel, the tab strip and every
view's content fit their width), and the tab strip is one row.  History lists
ops by number with the head marked, a changes count and rolled-back ops as
such, and a click shows an op's code; Objects shows a short value and leaves
the image's own ``kernos:`` names out until asked.  Screenshots of every tab at
each width are saved under the test's artifacts.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from browser.pages import STEP_TIMEOUT_MS, NotebookPage

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]

TABS = ("objects", "events", "capabilities", "history", "plot", "agents")

OVERFLOW = """panel => {
    // Everything inside the panel that is wider than its box and would scroll or spill.
    const found = [];
    const box = panel.getBoundingClientRect();
    if (panel.scrollWidth > panel.clientWidth + 1) {
        found.push(['panel', panel.scrollWidth, panel.clientWidth]);
    }
    for (const node of panel.querySelectorAll('*')) {
        if (node.offsetParent === null) continue;  // hidden
        const style = getComputedStyle(node);
        const scrolls = ['auto', 'scroll'].includes(style.overflowX);
        if (scrolls && node.scrollWidth > node.clientWidth + 1) {
            found.push([node.className || node.tagName, node.scrollWidth, node.clientWidth]);
        }
        const rect = node.getBoundingClientRect();
        if (rect.width > 0 && rect.right > box.right + 1 && style.position !== 'fixed') {
            found.push(['spills: ' + (node.className || node.tagName), rect.right, box.right]);
        }
    }
    return found.slice(0, 10);
}"""


def set_sidebar_width(notebook: NotebookPage, width: int) -> None:
    """Drag the splitter between the left area and the main area until the panel is ``width``."""
    panel = notebook.page.locator("#kernos-inspector")
    for _ in range(3):
        current = panel.bounding_box()
        assert current is not None
        if abs(current["width"] - width) <= 2:
            return
        handle = notebook.page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first
        grip = handle.bounding_box()
        assert grip is not None
        x, y = grip["x"] + grip["width"] / 2, grip["y"] + grip["height"] / 2
        notebook.page.mouse.move(x, y)
        notebook.page.mouse.down()
        notebook.page.mouse.move(x + (width - current["width"]), y, steps=5)
        notebook.page.mouse.up()
    final = panel.bounding_box()
    assert final is not None and abs(final["width"] - width) <= 2, (final, width)


def test_every_tab_fits_at_250_400_and_600_px(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("widths")
    panel = notebook.panel
    panel.open()
    notebook.run_cell(
        "import random\n"
        "class Account:\n    def __init__(self, owner, balance):\n"
        "        self.owner, self.balance = owner, balance\n"
        "accounts = [Account('ada', 100), Account('grace', 250)]\n"
        "a_rather_long_variable_name_for_the_narrow_sidebar = list(range(1000))\n"
        "draw = random.random()")
    notebook.run_cell("%kernos agent add analyst\n%kernos grant analyst read:accounts")
    notebook.run_cell("accounts[0].balance -= 30\nevents.emit('payments.sent', {'amount': 30})")
    notebook.run_cell("accounts[1].balance = 0\nraise ValueError('not this time')")
    notebook.run_cell("len(accounts)")  # read-only: an op, and no snapshot
    panel.wait_for_names("accounts", "draw")
    # The header names the head snapshot's op, as `%kernos status` does (a read-only op
    # made it name the next op beside the last snapshot's commit).
    head = panel.status_op()
    status = notebook.output(notebook.run_cell("%kernos status"))
    assert re.search(rf"^head\s+\w+\s+op {head}$", status, re.MULTILINE), (head, status)

    for width in (250, 400, 600):
        set_sidebar_width(notebook, width)
        tabs = panel.root.locator(".kernos-tabs")
        for name in TABS:
            panel.tab(name)
            notebook.page.wait_for_timeout(300)  # the view's refresh lands
            box = tabs.bounding_box()
            first = panel.testid("kernos-tab-objects").bounding_box()
            last = panel.testid("kernos-tab-agents").bounding_box()
            assert box and first and last and abs(first["y"] - last["y"]) < 1, \
                f"the tab strip wraps at {width} px"
            spilled = panel.root.evaluate(OVERFLOW)
            assert spilled == [], f"{name} overflows at {width} px: {spilled}"
            notebook.shot(f"{width}px-{name}")

        set_sidebar_width(notebook, width)
        panel.tab("objects")
        # The image's own names are left out until asked; a short value is shown.
        panel.wait_for_names("accounts", absent=("kernos:random",))
        expect(panel.row("accounts")).to_contain_text("Account(owner='ada', balance=70)")
        expect(panel.row("a_rather_long_variable_name_for_the_narrow_sidebar")).to_be_visible()
        panel.testid("kernos-show-internal").check()
        panel.wait_for_names("kernos:random")
        panel.testid("kernos-show-internal").uncheck()
        panel.wait_for_names(absent=("kernos:random",))
        # Clicking a row does not scroll the table sideways: the name stays in view.
        panel.select("accounts")
        assert panel.objects.evaluate("t => t.parentElement.scrollLeft") == 0

    panel.tab("history")
    history = panel.history
    row = history.locator(f'tr[data-op="{head}"]')
    expect(row.get_by_test_id("kernos-head")).to_be_visible(timeout=STEP_TIMEOUT_MS)
    expect(row.get_by_test_id("kernos-changes")).to_contain_text("~1")
    expect(history.get_by_test_id("kernos-head")).to_have_count(1)
    expect(history.locator(f'tr[data-op="{head + 2}"][data-outcome="read-only"]')).to_have_count(1)
    failed = history.locator('tr[data-outcome="failed"]')
    expect(failed).to_have_count(1)
    expect(failed).to_contain_text("accounts[1].balance = 0")
    detail = panel.expand(head)
    expect(detail.get_by_test_id("kernos-op-code")).to_contain_text(
        "events.emit('payments.sent'", timeout=STEP_TIMEOUT_MS)
    expect(detail.get_by_test_id("kernos-checkout")).to_be_visible()
    assert panel.root.evaluate(OVERFLOW) == []
    notebook.shot("600px-history-expanded")
    set_sidebar_width(notebook, 250)
    assert panel.root.evaluate(OVERFLOW) == []
    notebook.shot("250px-history-expanded")
