"""What each cell did, and which outputs went stale, in a real JupyterLab and chromium.

Every executed cell on a Kernos kernel shows its op under its outputs ("op 12 ·
committed", "read-only: no change", "rolled back", "denied, rolled back"), from its
execute_reply, kept in the cell's metadata.  A cell's outputs are marked stale once a
name it reached is changed by anything but running this notebook's cells: an op from
outside (``kernos run`` through the running kernel), a checkout (``kernos checkout``),
a kernel killed while the cell ran.  Running the cell again clears the marker.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable

import pytest
from playwright.sync_api import Locator, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from audit_support import cli
from browser.pages import KERNEL_TIMEOUT_MS, STEP_TIMEOUT_MS, NotebookPage

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]

RESTART_STATUS_MS = 20_000
"""How long a restarted kernel's first status may take to reach JupyterLab."""


def op_of(notebook: NotebookPage, cell: Locator) -> int:
    badge = notebook.badge(cell)
    expect(badge).to_have_attribute("data-op", re.compile(r"^\d+$"), timeout=STEP_TIMEOUT_MS)
    return int(str(badge.get_attribute("data-op")))


def assert_fresh(notebook: NotebookPage, cell: Locator) -> None:
    expect(notebook.badge(cell)).to_have_attribute("data-stale", "false")
    expect(cell).not_to_have_class(re.compile(r"\bkernos-stale\b"))


def assert_stale(notebook: NotebookPage, cell: Locator, why: str) -> None:
    badge = notebook.badge(cell)
    expect(badge).to_have_attribute("data-stale", "true", timeout=STEP_TIMEOUT_MS)
    expect(badge).to_contain_text(why)
    expect(cell).to_have_class(re.compile(r"\bkernos-stale\b"))


def test_every_cell_shows_its_op_and_outside_changes_make_it_stale(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("badges")
    panel = notebook.panel
    panel.open()
    badge = notebook.badge

    first = notebook.run_cell("x = 1")
    op = op_of(notebook, first)
    panel.wait_for_status_op(op)  # the sidebar's head is the cell's op
    expect(badge(first)).to_have_text(f"op {op} · committed")
    reader = notebook.run_cell("print(x)")
    expect(badge(reader)).to_have_text(f"op {op + 1} · read-only: no change")
    other = notebook.run_cell("y = 10")
    expect(badge(other)).to_have_text(f"op {op + 2} · committed")
    failed = notebook.run_cell("x = 2\n1 / 0")
    expect(badge(failed)).to_have_text(f"op {op + 3} · rolled back")
    expect(badge(failed)).to_have_attribute("data-status", "rolled back")
    status = notebook.run_cell("%kernos status")
    assert re.search(rf"head\s+\w+\s+op {op + 2}\n", notebook.output(status))
    assert op_of(notebook, status) == op + 4
    agent_added = notebook.run_cell("%kernos agent add bob")
    denied = notebook.run_cell("%%agent bob\nread('x')")
    expect(badge(denied)).to_have_text(f"op {op + 6} · denied, rolled back")
    for cell in (first, reader, other, failed, status, denied):
        assert_fresh(notebook, cell)
    # A badge shows its op in the sidebar (it opens the sidebar, from any other).
    notebook.page.locator('.jp-SideBar.jp-mod-left [data-id="filebrowser"]').click()
    expect(panel.root).to_be_hidden()
    badge(other).locator("button").click()
    expect(panel.root).to_be_visible()
    # The op's details are one click away: the badge opens the sidebar's History.
    assert "show the op in the Kernos history" in str(
        badge(first).locator("button").get_attribute("title"))
    first.scroll_into_view_if_needed()
    notebook.shot("badges")

    # An op from outside the notebook, through the running kernel: the cells that
    # reached x are stale, and say why; the one that did not is not.
    workspace = str(notebook.server.workspace)
    outside = cli("run", "-w", workspace, "x = 5")
    assert outside.returncode == 0, outside.stderr
    why = f"x changed by op {op + 7} (human, outside this notebook)"
    assert_stale(notebook, first, why)
    assert_stale(notebook, reader, why)
    assert_fresh(notebook, other)
    assert_fresh(notebook, denied)  # a rolled-back cell shows no state of the image
    notebook.shot("stale-after-kernos-run")

    # Running it again refreshes it.
    notebook.rerun(reader)
    assert notebook.output(reader).strip() == "5"
    expect(badge(reader)).to_have_text(f"op {op + 8} · read-only: no change")
    assert_fresh(notebook, reader)

    # A checkout through the running kernel (the CLI): back to op `op`, where y did not
    # exist and x was 1.
    checkout = cli("checkout", "-w", workspace, f"@{op}")
    assert checkout.returncode == 0, checkout.stderr
    checked_out = f"changed by op {op + 9} (checkout of op {op})"
    assert_stale(notebook, reader, f"x {checked_out}")
    assert_stale(notebook, other, f"y {checked_out}")
    assert_stale(notebook, first, f"x changed by op {op + 7}")  # the first reason stays
    # The image's own values count for the cells that touched them: bob is gone again.
    assert_stale(notebook, agent_added, "the agents and their grants")
    assert_fresh(notebook, status)  # `%kernos status` reads no name
    first.scroll_into_view_if_needed()
    notebook.shot("stale-after-checkout")

    # The badges are in the notebook file: a reopened notebook shows them again.
    notebook.page.keyboard.press("Control+s")
    saved = notebook.server.root / "badges.ipynb"
    deadline = time.monotonic() + STEP_TIMEOUT_MS / 1000
    while True:
        cells = json.loads(saved.read_text())["cells"]
        kept = [cell["metadata"].get("kernos", {}) for cell in cells]
        if (len(kept) > 3 and "checkout" in kept[1].get("stale", "")) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert kept[0]["op"] == op and kept[0]["status"] == "committed" and "x" in kept[0]["names"]
    assert kept[1]["stale"] == f"x {checked_out}"
    assert kept[3]["status"] == "rolled back"


def test_a_cell_running_when_the_kernel_is_killed_is_marked(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("killed")
    badge = notebook.badge
    kept = notebook.run_cell("a = 1")
    op = op_of(notebook, kept)
    running = notebook.start_cell("a = 2\nprint('changed a')\nimport time; time.sleep(600)")
    expect(running.locator(".jp-OutputArea")).to_contain_text("changed a")
    [pid] = notebook.kernel_pids()
    os.kill(pid, signal.SIGKILL)
    # JupyterLab's server restarts the kernel; the new one restores the image.
    deadline = time.monotonic() + KERNEL_TIMEOUT_MS / 1000
    while notebook.kernel_pids() in ([], [pid]):
        assert time.monotonic() < deadline, "the killed kernel was not restarted"
        time.sleep(0.2)
    notebook.server.remember_kernels()
    # JupyterLab says so ("appears to have died. It will restart automatically").
    dialog = notebook.page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("restart automatically")
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    expect(dialog).to_have_count(0)
    try:
        notebook.wait_for_idle_kernel(timeout=RESTART_STATUS_MS)
    except PlaywrightTimeoutError:
        # JupyterLab's websocket sometimes reconnects before the new kernel's IOPub is
        # up and misses its status (the toolbar reads Unknown for good); a person
        # reconnects, from the Kernel menu.
        notebook.shot("status-missed-after-restart")
        notebook.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$")).click()
        notebook.page.locator(".lm-Menu-itemLabel",
                              has_text=re.compile(r"^Reconnect to Kernel$")).click()
        notebook.wait_for_idle_kernel()
    assert_stale(notebook, running, "never committed")
    assert "the kernel stopped while it ran" in str(
        badge(running).locator("button").get_attribute("title"))
    # The cell before it committed, and its op is in the restored image: not stale, but
    # from an earlier kernel session.
    expect(badge(kept)).to_have_attribute("data-earlier", "true", timeout=STEP_TIMEOUT_MS)
    expect(badge(kept)).to_have_text(f"op {op} · committed · earlier session")
    assert_fresh(notebook, kept)
    check = notebook.run_cell("print(a)")
    assert notebook.output(check).strip() == "1"
    notebook.shot("after-kill-9")


def test_a_reopened_notebook_shows_its_badges_and_what_changed_while_it_was_closed(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("reopened")
    made = notebook.run_cell("x = 1")
    op = op_of(notebook, made)
    notebook.run_cell("y = 2")
    notebook.page.keyboard.press("Control+s")
    path = notebook.server.root / "reopened.ipynb"
    deadline = time.monotonic() + STEP_TIMEOUT_MS / 1000
    while len(json.loads(path.read_text())["cells"]) < 3:
        assert time.monotonic() < deadline, "the notebook was not saved"
        time.sleep(0.1)
    notebook.page.close()
    server = notebook.server
    for kernel in server.api("/api/kernels"):
        server.api(f"/api/kernels/{kernel['id']}", method="DELETE")
    # While it is closed: an op by someone else (with no kernel running, `kernos run`
    # starts one for it), and a cell whose op the workspace does not have (the notebook
    # outlived a restore from an older copy, say).
    outside = cli("run", "-w", str(server.workspace), "x = 5")
    assert outside.returncode == 0, outside.stderr
    saved = json.loads(path.read_text())
    saved["cells"].insert(2, {
        "cell_type": "code", "execution_count": 9, "id": "lost", "source": "z = 3",
        "outputs": [], "metadata": {"kernos": {"op": op + 50, "status": "committed",
                                               "commit": "0" * 40, "names": ["z"],
                                               "kernel": "gone"}}})
    path.write_text(json.dumps(saved))

    again = NotebookPage(notebook.page.context.new_page(), server, notebook.artifacts,
                         "reopened.ipynb", "kernos")
    again.open()
    cells = again.cells
    expect(again.badge(cells.nth(0))).to_contain_text(f"op {op} · ")
    assert_stale(again, cells.nth(0),
                 f"x changed after op {op + 1}, by ops not in this notebook")
    assert_fresh(again, cells.nth(1))
    assert_stale(again, cells.nth(2), f"kernel restored to op {op + 2}; op {op + 50} was lost")
    # All three ran in a kernel that is gone.
    for index in range(3):
        expect(again.badge(cells.nth(index))).to_have_attribute("data-earlier", "true")
    again.shot("reopened")
