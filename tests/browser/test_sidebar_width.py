"""The sidebar at the widths users have: JupyterLab's default and narrowest (250 px) to 800.

At each width no tab scrolls sideways (the panel, the tab strip and every
view's content fit their width), the tab strip is one row with every label
whole, and the plot's labels keep a readable size.  Objects reads like a
variable inspector (type, shape, a short value; who changed it in which op on
wider sidebars and in the expanded row) and leaves the image's own ``kernos:``
names out until asked; a click expands a row without scrolling the table.
History lists ops by number with the head marked, a changes count, rolled-back
and read-only ops as such, an agent's cell by its code; a click shows an op's
code and its actions; a diff and a checkout are named by ops.  The header names
the head snapshot's op and commit, as ``%kernos status`` does, also after a
restart, which shows a value that could not persist as a placeholder.  With no
notebook open the panel says so.  Screenshots of every tab at each width are
saved under the test's artifacts.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from browser.pages import STEP_TIMEOUT_MS, KernosPanel, NotebookPage

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]

TABS = ("objects", "events", "capabilities", "history", "plot", "agents")
WIDTHS = (250, 400, 600, 800)

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

TAB_STRIP = """strip => {
    // One row, and no label cut short.
    const tabs = [...strip.querySelectorAll('button')];
    const tops = new Set(tabs.map(tab => Math.round(tab.getBoundingClientRect().top)));
    const cut = tabs.filter(tab => tab.scrollWidth > tab.clientWidth + 1)
        .map(tab => tab.textContent);
    return {rows: tops.size, cut};
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


def assert_header_is_the_head(notebook: NotebookPage) -> int:
    """The header's "op N · COMMIT" is the head snapshot `%kernos status` names."""
    header = notebook.panel.status()
    status = notebook.output(notebook.run_cell("%kernos status"))
    found = re.search(r"^head\s+([0-9a-f]+)\s+op (\d+)$", status, re.MULTILINE)
    assert found, status
    notebook.page.wait_for_timeout(300)  # the status cell's own notice lands
    assert notebook.panel.status() == header, (notebook.panel.status(), header)
    assert header == f"op {found.group(2)} · {found.group(1)[:7]}", (header, status)
    return int(found.group(2))


def assert_fits(panel: KernosPanel, what: str) -> None:
    spilled = panel.root.evaluate(OVERFLOW)
    assert spilled == [], f"{what}: {spilled}"


def check_objects(panel: KernosPanel, width: int, head: int) -> None:
    panel.tab("objects")
    # The image's own names are left out until asked; a short value is shown.
    panel.wait_for_names("accounts", "grid", absent=("kernos:random",))
    expect(panel.row("accounts")).to_contain_text("Account(owner='ada', balance=70)")
    expect(panel.row("a_rather_long_variable_name_for_the_narrow_sidebar")).to_be_visible()
    grid = panel.row("grid")
    shape_column = panel.objects.locator("th.kernos-col-shape")
    changed_column = panel.objects.locator("th.kernos-col-changed")
    if width < 400:  # no Shape column: the type carries the shape
        expect(shape_column).to_be_hidden()
        expect(grid.locator("td.kernos-col-type")).to_have_text("ndarray 3\N{MULTIPLICATION SIGN}4")
    else:
        expect(shape_column).to_be_visible()
        expect(grid.locator("td.kernos-col-shape")).to_have_text("3\N{MULTIPLICATION SIGN}4")
        expect(panel.row("accounts").locator("td.kernos-col-shape")).to_have_text("2")
    if width < 560:
        expect(changed_column).to_be_hidden()
    else:
        expect(panel.row("accounts").locator("td.kernos-col-changed")).to_have_text(
            f"op {head} · human")
    panel.testid("kernos-show-internal").check()
    panel.wait_for_names("kernos:random")
    panel.testid("kernos-show-internal").uncheck()
    panel.wait_for_names(absent=("kernos:random",))
    # A click expands the row in place (who changed it, in which op), and does not scroll
    # the table sideways: the name stays in view.
    panel.select("accounts")
    detail = panel.objects.locator("tr.kernos-object-detail")
    expect(detail).to_contain_text(f"changed in op {head} by human")
    expect(detail.locator("pre")).to_contain_text("Account(owner='ada', balance=70)")
    assert panel.objects.evaluate("t => t.parentElement.scrollLeft") == 0
    name = panel.row("accounts").locator("td.kernos-col-name").bounding_box()
    box = panel.root.bounding_box()
    assert name and box and name["x"] >= box["x"], (name, box)
    assert_fits(panel, f"objects expanded at {width} px")


def test_every_tab_fits_at_250_400_600_and_800_px(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("widths")
    panel = notebook.panel
    panel.open()
    notebook.run_cell(
        "import random, numpy\n"
        "class Account:\n    def __init__(self, owner, balance):\n"
        "        self.owner, self.balance = owner, balance\n"
        "accounts = [Account('ada', 100), Account('grace', 250)]\n"
        "a_rather_long_variable_name_for_the_narrow_sidebar = list(range(1000))\n"
        "grid = numpy.zeros((3, 4))\n"
        "handle = open('/dev/null')\n"
        "draw = random.random()")
    first = panel.status_op()
    notebook.run_cell("%kernos agent add analyst\n%kernos grant analyst read:accounts")
    agent = notebook.run_cell("%%agent analyst\nseen = len(read('accounts'))\nprint(seen)")
    assert notebook.output(agent).strip() == "2"
    notebook.run_cell("accounts[0].balance -= 30\nevents.emit('payments.sent', {'amount': 30})")
    notebook.run_cell("accounts[1].balance = 0\nraise ValueError('not this time')")
    notebook.run_cell("len(accounts)")  # read-only: an op, and no snapshot
    panel.wait_for_names("accounts", "draw")
    # The header names the head snapshot's op and commit, as `%kernos status` does (read-only
    # ops made it name the newest op beside the last snapshot's commit).
    head = assert_header_is_the_head(notebook)
    assert head == first + 3

    for width in WIDTHS:
        set_sidebar_width(notebook, width)
        strip = panel.root.locator(".kernos-tabs")
        for name in TABS:
            panel.tab(name)
            notebook.page.wait_for_timeout(300)  # the view's refresh lands
            assert strip.evaluate(TAB_STRIP) == {"rows": 1, "cut": []}, width
            assert_fits(panel, f"{name} at {width} px")
            if name == "plot":
                label = panel.testid("kernos-plot").locator("text.kernos-plot-axis").first
                size = label.bounding_box()
                assert size and size["height"] >= 10, (width, size)
            notebook.shot(f"{width}px-{name}")
        check_objects(panel, width, head)
        notebook.shot(f"{width}px-objects-expanded")

    set_sidebar_width(notebook, 250)
    panel.tab("history")
    history = panel.history
    row = history.locator(f'tr[data-op="{head}"]')
    expect(row.get_by_test_id("kernos-head")).to_be_visible(timeout=STEP_TIMEOUT_MS)
    expect(row.get_by_test_id("kernos-changes")).to_have_text("~1")
    expect(history.get_by_test_id("kernos-head")).to_have_count(1)
    expect(history.locator(f'tr[data-op="{first}"]').get_by_test_id("kernos-changes")
           ).to_have_text("+8")  # kernos:random is the image's own: not counted
    read_only = history.locator(f'tr[data-op="{head + 2}"]')
    expect(read_only).to_have_attribute("data-outcome", "read-only")
    expect(read_only.get_by_test_id("kernos-outcome")).to_have_text("read-only")
    failed = history.locator(f'tr[data-op="{head + 1}"]')
    expect(failed).to_have_attribute("data-outcome", "failed")
    expect(failed).to_have_class(re.compile(r"\bkernos-rolled-back\b"))
    expect(failed.get_by_test_id("kernos-outcome")).to_have_text("rolled back (failed)")
    expect(failed.locator(".kernos-message")).to_have_text("accounts[1].balance = 0 (+1 lines)")
    by_agent = history.locator(f'tr[data-op="{head - 1}"]')
    expect(by_agent.locator(".kernos-principal")).to_have_text("analyst")
    expect(by_agent.locator(".kernos-message")).to_have_text(
        "seen = len(read('accounts')) (+1 lines)")

    detail = panel.expand(head)
    expect(detail.get_by_test_id("kernos-op-code")).to_have_text(
        "accounts[0].balance -= 30\nevents.emit('payments.sent', {'amount': 30})",
        timeout=STEP_TIMEOUT_MS)
    expect(detail.get_by_test_id("kernos-op-names")).to_have_text("changed accounts")
    expect(detail.get_by_test_id("kernos-checkout")).to_be_visible()
    expect(detail.get_by_test_id("kernos-fork")).to_be_visible()
    assert_fits(panel, "history expanded at 250 px")
    notebook.shot("250px-history-expanded")
    # A rolled-back op's code comes from its audit record; it offers no actions.
    detail = panel.expand(head + 1)
    expect(detail.get_by_test_id("kernos-op-code")).to_have_text(
        "accounts[1].balance = 0\nraise ValueError('not this time')", timeout=STEP_TIMEOUT_MS)
    expect(detail.get_by_test_id("kernos-op-outcome")).to_contain_text(
        "rolled back (failed): nothing of it was kept")
    expect(detail.get_by_test_id("kernos-checkout")).to_have_count(0)
    set_sidebar_width(notebook, 600)
    assert_fits(panel, "history expanded at 600 px")
    notebook.shot("600px-history-expanded")

    # A diff is named by ops.
    for op in (first, head):
        history.locator(f'tr[data-op="{op}"]').get_by_test_id("kernos-diff-select").check()
    expect(panel.testid("kernos-diff").locator(".kernos-diff-title")).to_have_text(
        f"op {first} → op {head}")
    expect(panel.testid("kernos-diff").locator('li[data-name="accounts"]')).to_have_attribute(
        "data-change", "changed")
    notebook.shot("600px-history-diff")

    # A checkout reads as the op it went back to, which is marked checked out.
    panel.check_out(first)
    checkout = head + 4  # after the two read-only ops (the second: `%kernos status`)
    row = history.locator(f'tr[data-op="{checkout}"]')
    expect(row.locator(".kernos-message")).to_have_text(f"checkout → op {first}",
                                                        timeout=STEP_TIMEOUT_MS)
    expect(row.get_by_test_id("kernos-head")).to_be_visible()
    expect(history.locator(f'tr[data-op="{first}"]').get_by_test_id("kernos-checked-out")
           ).to_be_visible()
    set_sidebar_width(notebook, 250)
    assert_fits(panel, "history after a checkout at 250 px")
    notebook.shot("250px-history-checked-out")

    # After a restart the open file is a placeholder, shown as one; the header is still
    # the head snapshot.
    notebook.restart_kernel()
    panel.tab("objects")
    handle = panel.row("handle")
    expect(handle.locator("td.kernos-col-type")).to_have_text("placeholder",
                                                              timeout=STEP_TIMEOUT_MS)
    expect(handle.locator("td.kernos-col-value")).to_contain_text(
        "placeholder for _io.TextIOWrapper: could not be persisted")
    assert "name='/dev/null'" not in str(handle.inner_text())
    assert assert_header_is_the_head(notebook) == checkout
    assert_fits(panel, "objects after a restart at 250 px")
    notebook.shot("250px-objects-placeholder")

    # With no notebook open, the panel says that, not that the kernel is not Kernos.
    notebook.page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current "
                          ".lm-TabBar-tabCloseIcon").click()
    # The notebook has unsaved changes: JupyterLab asks first.
    discard = notebook.page.locator(".jp-Dialog .jp-Dialog-button",
                                    has_text=re.compile(r"Discard|Don.t Save"))
    discard.click()
    expect(panel.testid("kernos-not-kernos")).to_have_text(
        re.compile(r"^No notebook or console is open\."), timeout=STEP_TIMEOUT_MS)
    assert_fits(panel, "no notebook at 250 px")
    notebook.shot("250px-no-notebook")
