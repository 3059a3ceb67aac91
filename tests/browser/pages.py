"""What a person does in JupyterLab, as steps a browser test can take and check.

:class:`LabServer` is a running server (started by ``conftest.lab_server``),
:class:`NotebookPage` one notebook open in chromium, and :class:`KernosPanel`
the Kernos sidebar, read through the extension's ``data-testid`` contract:

- panel ``#kernos-inspector``, opened by its tab in the left sidebar;
- tabs ``kernos-tab-{objects,events,capabilities,history,plot}``;
- objects table ``kernos-objects`` with rows ``tr[data-name=NAME]``, filter
  ``kernos-filter``, pages ``kernos-prev`` / ``kernos-next`` / ``kernos-page``,
  preview ``kernos-preview``;
- history table ``kernos-history`` with rows ``tr[data-op=OP]``; a click expands one
  into ``tr[data-detail-op=OP]`` with the op's code and its ``kernos-checkout`` button
  (a dialog whose accept button says "Check out") and ``kernos-fork``;
- ``kernos-status`` ("op N · COMMIT"), ``kernos-progress``,
  ``kernos-not-kernos``, ``kernos-plot``.

Waits go through playwright's ``expect`` and ``wait_for_*`` with timeouts.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import Locator, Page, expect

from support import token_api

KERNEL_TIMEOUT_MS = 90_000
"""A kernel start (or restart) with its image restore, on a busy 2-core machine."""
STEP_TIMEOUT_MS = 30_000
"""Anything else a person waits for: a panel refresh, a dialog, a cell's output."""

KERNELSPECS = {
    "kernos": {"name": "kernos", "display_name": "Kernos (Python 3)", "language": "python"},
    "python3": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
}


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (kernels run in sessions of their own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces; the ppid follows it.
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


@dataclass
class LabServer:
    """A running JupyterLab server."""

    url: str
    """``http://127.0.0.1:PORT``, no trailing slash."""
    token: str
    root: Path
    """The server's root directory: notebooks written here are served."""
    workspace: Path
    """``KERNOS_WORKSPACE`` for every kernos kernel the server starts."""
    log: Path
    pid: int
    kernel_pids: set[int] = field(default_factory=set)
    """Every kernel process seen, so that teardown can kill any that outlive the server."""

    def api(self, path: str, method: str = "GET", body: object = None) -> Any:
        return token_api(self.url, self.token, path, method, body)

    def lab_url(self, notebook: str) -> str:
        # ?reset drops any saved layout; the token logs the browser in (a cookie).
        return f"{self.url}/lab/tree/{notebook}?reset&token={self.token}"

    def remember_kernels(self) -> None:
        self.kernel_pids.update(children(self.pid))

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no server log)"


def write_notebook(path: Path, kernel: str) -> None:
    """An empty notebook (one empty code cell) whose kernelspec is ``kernel``."""
    notebook = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": "first",
                   "metadata": {}, "outputs": [], "source": []}],
        "metadata": {"kernelspec": KERNELSPECS[kernel], "language_info": {"name": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook, indent=1))


class NotebookPage:
    """One notebook open in JupyterLab (its own browser tab), and its screenshots."""

    def __init__(self, page: Page, server: LabServer, artifacts: Path, notebook: str,
                 kernel: str) -> None:
        self.page = page
        self.server = server
        self.artifacts = artifacts
        self.notebook = notebook
        self.display_name = KERNELSPECS[kernel]["display_name"]
        self.console: list[str] = []
        self.steps = 0
        page.on("console", lambda message: self.console.append(
            f"{message.type}: {message.text}"))
        page.on("pageerror", lambda error: self.console.append(f"pageerror: {error}"))
        self.panel = KernosPanel(self)

    # -- artifacts ---------------------------------------------------------------------------

    def shot(self, step: str) -> Path:
        """Save a screenshot of the window as ``NN-step.png`` in the test's artifacts."""
        self.steps += 1
        path = self.artifacts / f"{self.steps:02d}-{re.sub(r'[^A-Za-z0-9_-]+', '-', step)}.png"
        self.page.screenshot(path=str(path))
        return path

    def write_console_log(self) -> None:
        (self.artifacts / f"console-{self.notebook}.log").write_text("\n".join(self.console))

    # -- the notebook ------------------------------------------------------------------------

    def open(self) -> None:
        self.page.goto(self.server.lab_url(self.notebook))
        expect(self.page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible(
            timeout=KERNEL_TIMEOUT_MS)
        self.wait_for_idle_kernel()
        self.server.remember_kernels()

    def wait_for_idle_kernel(self, timeout: int = KERNEL_TIMEOUT_MS,
                             display_name: str | None = None) -> None:
        """Wait until the toolbar names the shown notebook's kernel and its status reads Idle.

        The execution indicator alone reads idle before any kernel is connected, so the
        kernel's display name (toolbar) and the status bar's "NAME | Idle" are both required.
        """
        self.page.wait_for_function(
            """name => {
                const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
                if (!panel) return false;
                const label = panel.querySelector('.jp-Toolbar-kernelName');
                const status = panel.querySelector('.jp-Notebook-ExecutionIndicator');
                const bar = document.querySelector('#jp-main-statusbar');
                return label && label.textContent.trim() === name
                    && status && status.getAttribute('data-status') === 'idle'
                    && bar && bar.innerText.includes(name + ' | Idle');
            }""", arg=display_name or self.display_name, timeout=timeout)

    @property
    def cells(self) -> Locator:
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")

    def run_cell(self, code: str, timeout: int = KERNEL_TIMEOUT_MS) -> Locator:
        """Put ``code`` in the last cell, run it with Shift+Enter, wait for its count.

        The text is inserted, not typed key by key, so the editor's auto-indent cannot
        reshape it.  Returns the cell.
        """
        cell = self._submit(code)
        expect(cell.locator(".jp-InputPrompt")).to_have_text(
            re.compile(r"\[\d+\]:"), timeout=timeout)
        return cell

    def _submit(self, code: str) -> Locator:
        """Put ``code`` in the last cell (inserted, not typed) and press Shift+Enter."""
        cell = self.cells.nth(self.cells.count() - 1)
        editor = cell.locator(".cm-content")
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(code)
        expect(editor).to_contain_text(code.splitlines()[0])
        self.page.keyboard.press("Shift+Enter")
        return cell

    def open_from_file_browser(self, notebook: str, kernel: str) -> None:
        """Double-click ``notebook`` in the file browser; wait for its kernel to idle."""
        browser = self.page.locator("#filebrowser")
        if not browser.is_visible():
            self.page.locator('.jp-SideBar.jp-mod-left [data-id="filebrowser"]').click()
        self.page.locator(".jp-DirListing-item", has_text=notebook).dblclick()
        expect(self.page.locator(".jp-mod-current .lm-TabBar-tabLabel, "
                                 ".lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel").filter(
            has_text=notebook).first).to_be_visible()
        self.wait_for_idle_kernel(display_name=KERNELSPECS[kernel]["display_name"])
        self.server.remember_kernels()

    def switch_to(self, notebook: str) -> None:
        """Click the notebook's tab in the main area."""
        self.page.locator("#jp-main-dock-panel .lm-TabBar-tab", has_text=notebook).click()
        expect(self.page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current",
                                 has_text=notebook)).to_be_visible()

    def output(self, cell: Locator) -> str:
        return str(cell.locator(".jp-OutputArea").inner_text())

    def restart_kernel(self) -> None:
        """Kernel menu → Restart Kernel…, accept the dialog, wait for the new kernel to idle."""
        before = set(children(self.server.pid))
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$")).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel…$")).click()
        dialog = self.page.locator(".jp-Dialog")
        expect(dialog).to_be_visible()
        self.shot("restart-dialog")
        dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
        expect(dialog).to_have_count(0)
        # A restart is a new kernel process; until it exists the old status may read idle.
        deadline = time.monotonic() + KERNEL_TIMEOUT_MS / 1000
        while not set(children(self.server.pid)) - before:
            if time.monotonic() > deadline:
                raise AssertionError("Restart Kernel started no new kernel process")
            time.sleep(0.05)
        self.server.remember_kernels()
        self.wait_for_idle_kernel()

    # -- what each cell did (extension/src/cells.ts) ----------------------------------------

    def badge(self, cell: Locator) -> Locator:
        """The cell's outcome footer: ``data-op``, ``data-status``, ``data-stale``, its text."""
        return cell.get_by_test_id("kernos-cell-badge")

    def start_cell(self, code: str) -> Locator:
        """Like :meth:`run_cell`, but return once the cell runs (its prompt reads [*])."""
        cell = self._submit(code)
        expect(cell.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\*\]:"))
        return cell

    def rerun(self, cell: Locator, timeout: int = KERNEL_TIMEOUT_MS) -> None:
        """Run ``cell`` again in place (Ctrl+Enter); wait for its new execution count."""
        prompt = cell.locator(".jp-InputPrompt")
        before = str(prompt.inner_text()).strip()
        cell.locator(".cm-content").click()
        self.page.keyboard.press("Control+Enter")
        expect(prompt).not_to_have_text(before, timeout=timeout)
        expect(prompt).to_have_text(re.compile(r"\[\d+\]:"), timeout=timeout)

    def kernel_pids(self) -> list[int]:
        """The server's kernos kernel processes."""
        found = []
        for pid in children(self.server.pid):
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"kernos.kernel" in command:
                    found.append(pid)
        return found

    def lab(self, script: str, arg: Any = None) -> Any:
        """Evaluate ``script`` (a function of ``app`` and ``arg``) on the JupyterLab app; the
        server must expose it (``--LabApp.expose_app_in_browser=True``)."""
        return self.page.evaluate(f"([arg]) => ({script})(window.jupyterapp, arg)", [arg])


class KernosPanel:
    """The Kernos sidebar of a :class:`NotebookPage`."""

    def __init__(self, notebook: NotebookPage) -> None:
        self.notebook = notebook
        self.page = notebook.page
        self.root = self.page.locator("#kernos-inspector")

    def testid(self, name: str) -> Locator:
        return self.root.get_by_test_id(name)

    def open(self) -> None:
        """Click the panel's tab in the left sidebar (unless the panel is already shown)."""
        if not self.root.is_visible():
            tab = self.page.locator('.jp-SideBar.jp-mod-left [data-id="kernos-inspector"]')
            if not tab.count():
                tab = self.page.locator('.jp-SideBar.jp-mod-left li[title*="Kernos"]')
            tab.first.click()
        expect(self.root).to_be_visible()

    def click(self, target: Locator, landed: Locator, what: str) -> None:
        """Click ``target`` until ``landed`` is visible (at most three times).

        The panel's transient note (after a rolled-back op) appears and disappears above
        the tabs and shifts them; a click that started before the shift lands on the
        element that moved under the pointer, as a person's would.  So each click is
        checked, and repeated if it hit something else.
        """
        for _ in range(2):
            target.click()
            try:
                expect(landed).to_be_visible(timeout=2_000)
                return
            except AssertionError:
                self.page.keyboard.press("Escape")  # a dialog the missed click opened
                self.notebook.shot(f"missed-click-{what}")
        target.click()
        expect(landed).to_be_visible()

    def tab(self, name: str) -> None:
        button = self.testid(f"kernos-tab-{name}")
        self.click(button, self.root.locator(
            f'[data-testid="kernos-tab-{name}"][aria-selected="true"]'), f"tab-{name}")

    def select(self, name: str) -> None:
        """Click an objects row (which shows its preview)."""
        self.click(self.row(name), self.objects.locator(
            f'tr.kernos-selected[data-name="{name}"]'), f"row-{name}")

    # -- objects -----------------------------------------------------------------------------

    @property
    def objects(self) -> Locator:
        return self.testid("kernos-objects")

    def row(self, name: str) -> Locator:
        return self.objects.locator(f'tr[data-name="{name}"]')

    def wait_for_names(self, *names: str, absent: tuple[str, ...] = ()) -> None:
        for name in names:
            expect(self.row(name)).to_have_count(1, timeout=STEP_TIMEOUT_MS)
        for name in absent:
            expect(self.row(name)).to_have_count(0, timeout=STEP_TIMEOUT_MS)

    def table(self) -> dict[str, dict[str, str]]:
        """Every shown row of the objects table: name -> {column header: cell text}."""
        return dict(self.objects.evaluate(
            """table => {
                // A sorted header's text carries an arrow; its data-sort key does not.
                const headers = [...table.querySelectorAll('thead th')].map(
                    th => th.getAttribute('data-sort') || th.textContent.trim().toLowerCase());
                return [...table.querySelectorAll('tr[data-name]')].map(row => {
                    const cells = {};
                    [...row.querySelectorAll('td')].forEach((td, i) => {
                        cells[headers[i] || String(i)] = td.textContent.trim();
                    });
                    for (const attribute of row.getAttributeNames()) {
                        if (attribute.startsWith('data-')) {
                            cells[attribute] = row.getAttribute(attribute);
                        }
                    }
                    return [row.getAttribute('data-name'), cells];
                });
            }"""))

    def versions(self) -> dict[str, str]:
        """name -> version, from a ``data-version`` attribute or the "version" column."""
        versions = {}
        for name, cells in self.table().items():
            version = next((cells[key] for key in ("data-version", "version", "ver", "v")
                            if cells.get(key)), None)
            assert version is not None, f"no version shown for {name}: {cells}"
            versions[name] = version
        return versions

    def wait_for_versions(self, expected: dict[str, str]) -> None:
        """Wait until the objects table shows exactly ``expected`` (name -> version)."""
        deadline = time.monotonic() + STEP_TIMEOUT_MS / 1000
        while (shown := self.versions()) != expected:
            if time.monotonic() > deadline:
                raise AssertionError(f"the objects table shows {shown}, not {expected}")
            self.page.wait_for_timeout(100)

    def mark_rows(self) -> None:
        """Tag every shown objects row (a JS property, not an attribute) to spot a redraw."""
        self.objects.evaluate(
            "table => table.querySelectorAll('tr[data-name]').forEach("
            "row => { row.kernosTestMark = true; })")

    def redrawn_rows(self) -> list[str]:
        """The names whose row is not the element :meth:`mark_rows` tagged (redrawn since)."""
        return list(self.objects.evaluate(
            "table => [...table.querySelectorAll('tr[data-name]')]"
            ".filter(row => !row.kernosTestMark).map(row => row.getAttribute('data-name'))"))

    def wait_for_redrawn(self, *names: str) -> None:
        """Wait until the rows of ``names`` are all new elements (since :meth:`mark_rows`)."""
        self.objects.wait_for(state="attached")
        self.page.wait_for_function(
            """names => {
                const table = document.querySelector(
                    '#kernos-inspector [data-testid="kernos-objects"]');
                return table && names.every(name => {
                    const row = table.querySelector(`tr[data-name="${name}"]`);
                    return row && !row.kernosTestMark;
                });
            }""", arg=list(names), timeout=STEP_TIMEOUT_MS)

    # -- status and history ------------------------------------------------------------------

    def status(self) -> str:
        return str(self.testid("kernos-status").inner_text()).strip()

    def status_op(self) -> int:
        """N of the status line's "op N · COMMIT"."""
        found = re.search(r"op\s+(\d+)", self.status())
        assert found, f"the status line names no op: {self.status()!r}"
        return int(found.group(1))

    def wait_for_status_op(self, op: int) -> None:
        expect(self.testid("kernos-status")).to_contain_text(
            re.compile(rf"op\s+{op}\b"), timeout=STEP_TIMEOUT_MS)

    def record_progress(self) -> None:
        """Record every state the progress bar shows from now on (it can flash by quickly)."""
        self.testid("kernos-progress").evaluate(
            """bar => {
                const seen = [];
                const note = () => seen.push({hidden: bar.hidden,
                    what: bar.getAttribute('data-what'),
                    percent: Number(bar.getAttribute('aria-valuenow'))});
                if (bar.kernosTestObserver) bar.kernosTestObserver.disconnect();
                bar.kernosTestObserver = new MutationObserver(note);
                bar.kernosTestObserver.observe(bar, {attributes: true});
                bar.kernosTestSeen = seen;
                note();
            }""")

    def progress_seen(self) -> list[dict[str, Any]]:
        """What the bar showed since :meth:`record_progress`: hidden, what, percent."""
        return list(self.testid("kernos-progress").evaluate("bar => bar.kernosTestSeen || []"))

    @property
    def history(self) -> Locator:
        return self.testid("kernos-history")

    def expand(self, op: int) -> Locator:
        """History tab: click the op's row; return its expanded detail row (code, actions)."""
        self.tab("history")
        row = self.history.locator(f'tr[data-op="{op}"]')
        expect(row).to_have_count(1, timeout=STEP_TIMEOUT_MS)
        detail = self.history.locator(f'tr[data-detail-op="{op}"]')
        if not detail.count():
            self.click(row, detail, f"expand-{op}")
        return detail

    def check_out(self, op: int) -> None:
        """History tab: the op's row, its Check out button, then "Check out" in the dialog."""
        detail = self.expand(op)
        dialog = self.page.locator(".jp-Dialog")
        self.click(detail.get_by_test_id("kernos-checkout"),
                   dialog.filter(has_text=re.compile(rf"Check out op {op}\b")), f"checkout-{op}")
        self.notebook.shot(f"checkout-dialog-op-{op}")
        dialog.locator(".jp-Dialog-button", has_text="Check out").click()
        expect(dialog).to_have_count(0)
