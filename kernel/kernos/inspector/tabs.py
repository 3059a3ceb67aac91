"""The inspector's tabs: objects, events, capabilities, history, plot and agents.

Each tab is a :class:`~kernos.inspector.panel.Panel`: its widgets, and how it
reads itself from the backend through its owner (the inspector).  They hold
only the JSON of the replies, never an object of the image, and fetch only a
page at a time (the harness filters, sorts and pages):

* :class:`ObjectsPanel`: a filtered, sorted page of names, and a preview;
* :class:`EventsPanel`: the newest events matching a topic and a principal;
* :class:`CapabilitiesPanel`: each agent's grants and what is left of them;
* :class:`HistoryPanel`: the snapshots, a diff of two, a confirmed checkout
  with its progress, and a fork (``kernos.inspector.forking``);
* :class:`PlotPanel`: the image's size, its history's and the ops' latency;
* :class:`AgentsPanel`: loops, circuits and memory (``kernos.inspector.agents_tab``).
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as widgets

from kernos.history import file_counts, human_size
from kernos.inspector.agents_tab import AgentsTab
from kernos.inspector.backend import Notice
from kernos.inspector.forking import ForkControls
from kernos.inspector.panel import (
    Owner,
    Panel,
    blank,
    escape,
    hidden,
    note,
    short,
    size,
    table,
    when,
)
from kernos.inspector.plot import line_chart

__all__ = ["EVENTS_SHOWN", "PAGE_SIZE", "AgentsPanel", "CapabilitiesPanel", "EventsPanel",
           "HistoryPanel", "ObjectsPanel", "PlotPanel"]

PAGE_SIZE = 50
PREVIEW_BYTES = 2_000
EVENTS_SHOWN = 200
"""The events tab keeps the newest this many (matching its filters)."""
EVENTS_BATCH = 500
LOG_LIMIT = 200
STATS_LIMIT = 500
SORT_KEYS = (("name", "name"), ("type", "type"), ("size", "size"), ("version", "version"),
             ("last op", "op"), ("principal", "principal"), ("changed at", "changed_at"))
EVERYONE = ""


class ObjectsPanel(Panel):
    def __init__(self, owner: Owner) -> None:
        super().__init__(owner)
        self.page = 0
        self.total = 0
        self.rows: list[dict[str, Any]] = []
        self.query = widgets.Text(placeholder="name, type or principal contains...",
                                  description="Filter")
        self.sort = widgets.Dropdown(options=SORT_KEYS, value="name", description="Sort by")
        self.descending = widgets.Checkbox(value=False, description="descending", indent=False)
        self.previous = widgets.Button(description="previous", icon="chevron-left")
        self.next = widgets.Button(description="next", icon="chevron-right")
        self.pages = widgets.HTML()
        self.table = widgets.HTML()
        self.chosen = widgets.Select(options=[], rows=8, description="Preview")
        self.preview = widgets.HTML()
        self._choosing = False
        self.query.observe(self._on_filter, names="value")
        self.sort.observe(self._on_filter, names="value")
        self.descending.observe(self._on_filter, names="value")
        self.previous.on_click(self._on_previous)
        self.next.on_click(self._on_next)
        self.chosen.observe(self._on_choose, names="value")
        self.box = widgets.VBox([
            widgets.HBox([self.query, self.sort, self.descending]),
            widgets.HBox([self.previous, self.next, self.pages]), self.table,
            widgets.HBox([self.chosen, self.preview])])

    @property
    def pages_count(self) -> int:
        return max(1, math.ceil(self.total / PAGE_SIZE))

    def _on_filter(self, change: object) -> None:
        self.page = 0
        self.owner.refresh_panel(self)

    def _on_previous(self, button: object) -> None:
        if self.page > 0:
            self.page -= 1
            self.owner.refresh_panel(self)

    def _on_next(self, button: object) -> None:
        if self.page + 1 < self.pages_count:
            self.page += 1
            self.owner.refresh_panel(self)

    def refresh(self) -> None:
        sort = ("-" if self.descending.value else "") + str(self.sort.value)
        fields: dict[str, Any] = {"sort": sort, "limit": PAGE_SIZE,
                                  "offset": self.page * PAGE_SIZE}
        if self.query.value:
            fields["query"] = self.query.value
        result = self.request("objects", **fields)
        if result is None:
            return
        self.total = int(result.get("total") or 0)
        if self.page >= self.pages_count and self.page > 0:  # names went away: last page
            self.page = self.pages_count - 1
            self.refresh()
            return
        self.rows = list(result.get("objects") or [])
        self._render()

    def _render(self) -> None:
        self.pages.value = (f"page {self.page + 1} of {self.pages_count} &middot; "
                            f"{self.total:,} object{'' if self.total == 1 else 's'}")
        self.previous.disabled = self.page == 0
        self.next.disabled = self.page + 1 >= self.pages_count
        if not self.rows:
            query = self.query.value
            self.table.value = note(f"No objects match {query!r}." if query
                                    else "No objects yet.")
        else:
            self.table.value = table(
                ("name", "type", "size", "version", "last op", "principal", "changed at"),
                [(row.get("name"), row.get("type"), size(row.get("size")),
                  row.get("version"), row.get("op"), row.get("principal"),
                  when(row.get("changed_at"))) for row in self.rows])
        names = [str(row.get("name")) for row in self.rows]
        previous = self.chosen.value
        self._choosing = True
        try:
            self.chosen.options = names
            self.chosen.value = previous if previous in names else None
        finally:
            self._choosing = False
        self._show_preview()

    def _on_choose(self, change: object) -> None:
        if not self._choosing:
            self._show_preview()

    def _show_preview(self) -> None:
        name = self.chosen.value
        if name is None:
            self.preview.value = note("Choose an object to preview it.")
            return
        result = self.request("object", name=name, preview_bytes=PREVIEW_BYTES)
        if result is None:
            self.preview.value = note(f"{name!r} cannot be shown.")
            return
        preview = result.get("preview") or {}
        shown = str(preview.get("repr", ""))[: PREVIEW_BYTES * 2]
        self.preview.value = (
            f"<b>{escape(result.get('name'))}</b>: {escape(result.get('type'))}, "
            f"{escape(size(result.get('size')))}, version {escape(result.get('version'))}, "
            f"op {escape(result.get('op'))} by {escape(result.get('principal'))}"
            f'<pre style="white-space: pre-wrap; max-height: 20em; overflow: auto">'
            f"{escape(shown)}</pre>")


class EventsPanel(Panel):
    def __init__(self, owner: Owner) -> None:
        super().__init__(owner)
        self.events: list[dict[str, Any]] = []
        self.cursor: int | None = None
        self.filters: tuple[str, str] | None = None
        self.topic = widgets.Text(placeholder="orders.* or orders.**", description="Topic",
                                  continuous_update=False)
        self.principal = widgets.Dropdown(options=[("everyone", EVERYONE)], value=EVERYONE,
                                          description="Principal")
        self.log = widgets.HTML()
        self._updating = False
        self.topic.observe(self._on_filter, names="value")
        self.principal.observe(self._on_filter, names="value")
        self.box = widgets.VBox([widgets.HBox([self.topic, self.principal]), self.log])

    def _on_filter(self, change: object) -> None:
        if not self._updating:
            self.owner.refresh_panel(self)

    def refresh(self) -> None:
        agents = self.request("agents")
        if agents is not None:
            choices = [("everyone", EVERYONE), ("human", "human"),
                       *((str(name), str(name)) for name in agents.get("agents") or [])]
            if list(self.principal.options) != choices:
                current = self.principal.value
                self._updating = True
                try:
                    self.principal.options = choices
                    self.principal.value = current if current in dict(choices).values() \
                        else EVERYONE
                finally:
                    self._updating = False
        filters = (str(self.topic.value).strip(), str(self.principal.value or EVERYONE))
        if filters != self.filters:  # other filters: read again from the start
            self.filters, self.events, self.cursor = filters, [], None
        topic, principal = filters
        while True:  # pages from the cursor on; only the newest few are kept
            fields: dict[str, Any] = {"limit": EVENTS_BATCH}
            if self.cursor is not None:
                fields["since"] = self.cursor
            if topic:
                fields["topic"] = topic
            if principal:
                fields["principal"] = principal
            result = self.request("events", **fields)
            if result is None:
                self.filters = None  # a failed read: start again next time
                self.log.value = note("The events could not be read (see the status line).")
                return
            found = list(result.get("events") or [])
            self.events = (self.events + found)[-EVENTS_SHOWN:]
            self.cursor = int(result.get("cursor") or 0)
            if len(found) < EVENTS_BATCH:
                break
        self._render()

    def _render(self) -> None:
        if not self.events:
            self.log.value = note("No events match these filters." if any(self.filters or ())
                                  else "No events yet.")
            return
        self.log.value = table(
            ("seq", "op", "principal", "topic", "payload"),
            [(event.get("seq"), f"op {event.get('op')}", event.get("principal"),
              event.get("topic"), short(event.get("payload"))) for event in self.events]
        ) + (note(f"The newest {EVENTS_SHOWN} events are shown.")
             if len(self.events) >= EVENTS_SHOWN else "")


class CapabilitiesPanel(Panel):
    def __init__(self, owner: Owner) -> None:
        super().__init__(owner)
        self.table = widgets.HTML()
        self.box = widgets.VBox([self.table])

    def refresh(self) -> None:
        agents = self.request("agents")
        grants = self.request("grants")
        if agents is None or grants is None:
            return
        names = [str(name) for name in agents.get("agents") or []]
        if not names:
            self.table.value = note("No agents yet.")
            return
        by_principal: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for grant in grants.get("grants") or []:
            by_principal.setdefault(str(grant.get("principal")), []).append(grant)
        rows: list[tuple[object, ...]] = []
        for principal, held in by_principal.items():
            if not held:
                rows.append((principal, "(no grants)", "", "", "", "", "", ""))
            for grant in held:
                state = "active" if grant.get("active") else \
                    f"revoked at op {grant.get('revoked_op')}"
                rows.append((principal, grant.get("capability"), blank(grant.get("limit")),
                             blank(grant.get("used")), blank(grant.get("remaining")),
                             state, grant.get("id"), grant.get("op")))
        self.table.value = table(("principal", "capability", "limit", "used", "left", "state",
                                  "grant", "granted at op"), rows)




class HistoryPanel(Panel):
    def __init__(self, owner: Owner) -> None:
        super().__init__(owner)
        self.snapshots: list[dict[str, Any]] = []
        self.table = widgets.HTML()
        self.a = widgets.Dropdown(options=[], description="From")
        self.b = widgets.Dropdown(options=[], description="To")
        self.diff_button = widgets.Button(description="Diff")
        self.diff = widgets.HTML()
        self.target = widgets.Dropdown(options=[], description="Snapshot")
        self.checkout_button = widgets.Button(description="Check out...", icon="history")
        self.question = widgets.HTML()
        self.confirm = widgets.Button(description="Check out", button_style="danger")
        self.cancel = widgets.Button(description="Cancel")
        self.confirmation = widgets.HBox([self.question, self.confirm, self.cancel])
        self.progress = widgets.FloatProgress(value=0.0, min=0.0, max=1.0,
                                              description="Checkout")
        self.progress_text = widgets.HTML()
        hidden(self.confirmation, True)
        self.diff_button.on_click(self._on_diff)
        self.checkout_button.on_click(self._on_checkout)
        self.confirm.on_click(self._on_confirm)
        self.cancel.on_click(self._on_cancel)
        self.fork = ForkControls(self.request, lambda: self.target.value, self._label,
                                 owner.say)
        self.box = widgets.VBox([
            self.table, widgets.HBox([self.a, self.b, self.diff_button]), self.diff,
            widgets.HBox([self.target, self.checkout_button]), self.confirmation,
            widgets.HBox([self.progress, self.progress_text]), self.fork.box])

    def refresh(self) -> None:
        result = self.request("log", limit=LOG_LIMIT)
        if result is None:
            return
        self.snapshots = list(result.get("snapshots") or [])
        if not self.snapshots:
            self.table.value = note("No snapshots yet.")
        else:
            self.table.value = table(
                ("op", "when", "principal", "kind", "message", "image size", "commit",
                 "files"),
                [(entry.get("op"), when(entry.get("when")), entry.get("principal"),
                  entry.get("kind"), entry.get("message"), size(entry.get("bytes")),
                  str(entry.get("commit") or "")[:12],
                  file_counts(entry.get("files") or {}, label=""))
                 for entry in self.snapshots])
        choices = [(f"op {entry.get('op')}: {str(entry.get('message') or '')[:40]}",
                    str(entry.get("commit"))) for entry in self.snapshots]
        commits = [commit for _, commit in choices]
        defaults = {self.a: commits[1] if len(commits) > 1 else None,
                    self.b: commits[0] if commits else None,
                    self.target: commits[1] if len(commits) > 1 else None}
        for dropdown, default in defaults.items():
            current = dropdown.value
            if list(dropdown.options) != choices:
                dropdown.options = choices
            dropdown.value = current if current in commits else default
        self.diff_button.disabled = self.checkout_button.disabled = not commits
        self.fork.button.disabled = not commits

    def _label(self, commit: object) -> str:
        for entry in self.snapshots:
            if entry.get("commit") == commit:
                return f"op {entry.get('op')} ({str(commit)[:12]})"
        return str(commit)[:12]

    def _on_diff(self, button: object) -> None:
        a, b = self.a.value, self.b.value
        if a is None or b is None:
            return
        result = self.request("diff", a=a, b=b)
        if result is None:
            self.diff.value = note("The diff could not be read (see the status line).")
            return
        parts = [f"<b>{escape(self._label(a))} &rarr; {escape(self._label(b))}</b>"]
        for title, key in (("added", "added"), ("changed", "changed"), ("deleted", "deleted")):
            entries = result.get(key) or []
            if not entries:
                continue
            if key == "changed":
                parts.append(f"<div>{escape(title)}</div>" + table(
                    ("name", "type", "before", "after"),
                    [(entry.get("name"), entry.get("type"), entry.get("before"),
                      entry.get("after")) for entry in entries]))
            else:
                parts.append(f"<div>{escape(title)}</div>" + table(
                    ("name", "type", "summary"),
                    [(entry.get("name"), entry.get("type"), entry.get("summary"))
                     for entry in entries]))
        files = result.get("files") or []
        if files:
            parts.append("<div>tracked files</div>" + table(
                ("", "file", "size", "note"),
                [({"added": "+", "changed": "~", "deleted": "-"}.get(str(entry.get("change")),
                                                                     "?"),
                  entry.get("path"), _file_size(entry), entry.get("note") or "")
                 for entry in files]))
        if len(parts) == 1:
            parts.append(note("The two snapshots hold the same names and values, and the "
                              "same files."))
        self.diff.value = "".join(parts)

    def _on_checkout(self, button: object) -> None:
        target = self.target.value
        if target is None:
            return
        self.question.value = (f"Make the image equal to snapshot {escape(self._label(target))}?"
                               " This runs as a new op; history is not rewritten.")
        hidden(self.confirmation, False)

    def _on_cancel(self, button: object) -> None:
        hidden(self.confirmation, True)
        self.question.value = ""

    def _on_confirm(self, button: object) -> None:
        target = self.target.value
        hidden(self.confirmation, True)
        self.question.value = ""
        if target is None:
            return
        self.progress.value = 0.0
        self.progress_text.value = ""
        result = self.request("checkout", ref=target)
        if result is None:
            return
        if result.get("status") == "committed":
            checkout = result.get("checkout") or {}
            self.owner.say(f"Checked out {self._label(target)} as op {result.get('op')}: "
                           f"{checkout.get('names')} names, {size(checkout.get('bytes'))}.")
        else:
            error = result.get("error") or {}
            self.owner.say(f"The checkout was {result.get('status')}: "
                           f"{error.get('message')}", error=True)

    def on_progress(self, notice: Notice) -> None:
        done, total = notice.get("done"), notice.get("total")
        if not isinstance(done, int) or not isinstance(total, int):
            return
        self.progress.value = 1.0 if total <= 0 else min(1.0, max(0.0, done / total))
        self.progress_text.value = escape(f"{notice.get('what')}: {human_size(done)} of "
                                          f"{human_size(total)}")


class PlotPanel(Panel):
    def __init__(self, owner: Owner) -> None:
        super().__init__(owner)
        self.chart = widgets.HTML()
        self.box = widgets.VBox([self.chart])

    def refresh(self) -> None:
        result = self.request("stats", limit=STATS_LIMIT)
        if result is None:
            return
        ops = list(result.get("ops") or [])
        if not ops:
            self.chart.value = note("No ops yet.")
            return

        failed = sum(1 for op in ops if op.get("status") != "committed")

        def series(key: str) -> list[tuple[object, object]]:
            return [(op.get("op"), op.get(key)) for op in ops]

        def sized(value: float) -> str:
            return human_size(value)

        def ms(value: float) -> str:
            return f"{value:,.0f} ms" if value >= 10 else f"{value:.3g} ms"

        self.chart.value = "".join([
            note(f"{len(ops)} op{'' if len(ops) == 1 else 's'} shown"
                 + (f" ({failed} did not commit)" if failed else "") + "; the image is "
                 f"{size(result.get('image_bytes'))} and its history "
                 f"{size(result.get('history_bytes'))} on disk."),
            "<div>", line_chart(series("image_bytes"), title="Image size", y_format=sized,
                                empty="No committed ops yet"), "</div><div>",
            line_chart(series("history_bytes"), title="History size on disk",
                       y_format=sized, empty="No committed ops yet"), "</div><div>",
            line_chart(series("ms"), title="Op latency (every op)", y_format=ms), "</div>"])


class AgentsPanel(Panel):
    """Loops, circuits and memory (``kernos.inspector.agents_tab``)."""

    def __init__(self, owner: Owner) -> None:
        super().__init__(owner)
        self.tab = AgentsTab(self.request, owner.say)
        self.box = self.tab.box

    def refresh(self) -> None:
        self.tab.refresh()



def _file_size(entry: dict[str, Any]) -> str:
    """A tracked file's size in a diff: ``12 B``, ``was 12 B``, ``8 B -> 12 B``."""
    before, after = entry.get("before"), entry.get("after")
    if before is None:
        return size(after)
    if after is None:
        return f"was {size(before)}"
    return f"{size(before)} -> {size(after)}"
