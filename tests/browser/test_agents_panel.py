"""The sidebar's Agents tab in a real JupyterLab and chromium: loops, circuits, memory.

A person starts an agent's loop from a cell, sees it in the Agents tab with
what its last iteration printed, and pauses it with its button (the image says
paused, not only the page); the agent's failing ops open its circuit, and the
loop shows as tripped with the policy's message; the Reset button closes the
circuit, offering "restore" only once the agent has a checkpoint tagged safe; a search finds a
memory as the human; as an agent, recall is refused without ``memory:read``
and, with it, finds nothing the agent may not read.  Text the
image holds is shown as text: markup in a value never becomes an element.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from browser.pages import STEP_TIMEOUT_MS, KernosPanel, NotebookPage

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]

HOSTILE = '<img src=x onerror="window.kernosPwned = 1">'
STEP = f"n = 1\nprint({HOSTILE!r}, 'step done')"


def _loop_row(panel: KernosPanel, agent: str) -> object:
    return panel.testid("kernos-loops").locator(f'tr[data-agent="{agent}"]')


def test_pause_a_loop_reset_its_tripped_circuit_and_search_memory(
        open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("agents")
    panel = notebook.panel
    panel.open()
    notebook.run_cell(
        "agents.add('carol')\nagents.policy('carol', failures=1)\n"
        f"agents.loop('carol', {STEP!r}, every_ms=3_600_000, pending=['a', 'b'])\n"
        f"note = 'the zebra migrates at dawn {HOSTILE}'")
    panel.tab("agents")
    loops = panel.testid("kernos-loops")
    row = loops.locator('tr[data-agent="carol"]')
    expect(row).to_have_attribute("data-status", "running", timeout=STEP_TIMEOUT_MS)
    # The kernel's driver runs the first iteration at once (then waits an hour): the row
    # follows it live, from the iteration's committed notice.
    expect(row).to_contain_text("iteration 1 · 2 pending · last op", timeout=STEP_TIMEOUT_MS)
    # What the iteration printed, as text: the markup in it never becomes an element.
    expect(row.get_by_test_id("kernos-loop-output")).to_have_text(f"{HOSTILE} step done\n")
    assert panel.root.locator("img").count() == 0
    notebook.shot("loop-running")

    panel.click(row.get_by_test_id("kernos-loop-pause"),
                loops.locator('tr[data-agent="carol"][data-status="paused"]'), "pause")
    expect(panel.testid("kernos-status")).to_contain_text("carol's loop is paused")
    cell = notebook.run_cell("agents.loops()[0]['status']")
    expect(cell.locator(".jp-OutputArea-output")).to_contain_text("'paused'")
    notebook.shot("loop-paused")

    # The agent fails once (policy failures=1): its next op is refused, the circuit opens.
    notebook.run_cell("%%agent carol\n1 / 0")
    notebook.run_cell("%%agent carol\nx = 1")
    panel.tab("agents")
    tripped = loops.locator('tr[data-agent="carol"][data-tripped="true"]')
    expect(tripped).to_have_count(1, timeout=STEP_TIMEOUT_MS)
    expect(tripped).to_contain_text("paused, tripped (failures)")
    circuits = panel.testid("kernos-circuits")
    open_row = circuits.locator('tr[data-agent="carol"][data-open="true"]')
    expect(open_row).to_contain_text("1 op(s) of 'carol' in a row did not commit")
    # No checkpoint tagged safe: nothing to restore, so the box cannot be ticked.
    expect(open_row.get_by_test_id("kernos-circuit-restore")).to_be_disabled()
    expect(open_row).to_contain_text("restore (none)")
    notebook.shot("circuit-open")

    panel.click(open_row.get_by_test_id("kernos-circuit-reset"),
                circuits.locator('tr[data-agent="carol"][data-open="false"]'), "reset")
    expect(panel.testid("kernos-status")).to_contain_text("carol's circuit is closed")
    expect(loops.locator('tr[data-agent="carol"][data-tripped="false"]')).to_have_count(1)
    cell = notebook.run_cell("agents.circuit('carol')")
    expect(cell.locator(".jp-OutputArea-output")).to_have_count(0)  # None: closed
    notebook.shot("circuit-reset")

    # With a safe checkpoint, the next trip offers to restore it, naming its op.
    cell = notebook.run_cell("agents.checkpoint('carol', safe=True)['op']")
    expect(cell.locator(".jp-OutputArea-output")).to_have_count(1)
    point = cell.locator(".jp-OutputArea-output").inner_text().strip()
    notebook.run_cell("%%agent carol\n1 / 0")
    notebook.run_cell("%%agent carol\nx = 1")
    panel.tab("agents")
    expect(open_row).to_have_count(1, timeout=STEP_TIMEOUT_MS)
    restore = open_row.get_by_test_id("kernos-circuit-restore")
    expect(restore).to_be_enabled()
    expect(open_row).to_contain_text(f"restore op {point}")
    restore.check()
    notebook.shot("circuit-open-with-safe-point")
    panel.click(open_row.get_by_test_id("kernos-circuit-reset"),
                circuits.locator('tr[data-agent="carol"][data-open="false"]'), "reset")
    expect(panel.testid("kernos-status")).to_contain_text(
        f"its namespace is back to op {point}")

    panel.tab("agents")
    panel.testid("kernos-memory-query").fill("zebra")
    panel.testid("kernos-memory-as").select_option("human")
    panel.testid("kernos-memory-search").click()
    results = panel.testid("kernos-memory-results")
    found = results.locator('tr[data-kind="working"]', has_text="note")
    expect(found).to_have_count(1, timeout=STEP_TIMEOUT_MS)
    expect(found).to_contain_text('kernosPwned = 1">')   # shown as text (the summary is cut)...
    assert panel.root.locator("img").count() == 0   # ... never as markup
    assert panel.page.evaluate("window.kernosPwned") is None
    notebook.shot("memory-as-human")

    # As carol: refused without memory:read; with it, nothing she may read matches.
    panel.testid("kernos-memory-as").select_option("carol")
    panel.testid("kernos-memory-search").click()
    expect(panel.testid("kernos-memory-found")).to_contain_text(
        "Recall as carol refused", timeout=STEP_TIMEOUT_MS)
    expect(panel.testid("kernos-memory-found")).to_contain_text("memory:read")
    expect(results.locator("tbody tr")).to_have_count(0)
    notebook.shot("memory-as-carol-refused")
    notebook.run_cell("agents.grant('carol', 'memory:read')")
    panel.tab("agents")
    panel.testid("kernos-memory-search").click()
    expect(panel.testid("kernos-memory-found")).to_have_text(
        "Nothing that carol may read matches.", timeout=STEP_TIMEOUT_MS)
    expect(results.locator("tbody tr")).to_have_count(0)
    notebook.shot("memory-as-carol")
