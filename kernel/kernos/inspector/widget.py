"""The ipywidgets inspector: objects, events, capabilities, history, a plot and agents.

:class:`Inspector` is a widget over a :class:`~kernos.inspector.backend.Backend`.
It reads only through ``backend.request`` (harness reads, as ``human``) and
holds only the JSON of the replies, never an object of the image.  It
watches the backend with a bound method, so the backend holds it weakly:

* after a ``committed`` notice it refreshes the visible tab (the others are
  refreshed when they are shown);
* after ``rolled_back`` it changes nothing but the one-line status (a
  rolled-back op left the image as it was) and the Agents tab, since an op
  that did not commit counts towards its agent's circuit breaker, which
  lives outside the image;
* ``progress`` moves the checkout progress bar, nothing else.

The History tab can also fork the chosen snapshot into a new workspace
(``kernos.inspector.forking``).  The Agents tab shows loops, circuits and
memory, with the human's controls (``kernos.inspector.agents_tab``).

Only a page of objects is ever fetched (the harness filters, sorts and
pages), so the inspector stays quick on an image of many names.  Every
string that reaches HTML goes through :func:`html.escape`: names, reprs and
topics come from agent code.  A reply that is an error is shown in the
status line, never raised.

``kernos.inspect()`` and ``%kernos inspect`` display one for the running
kernel (see :func:`inspect`).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ipywidgets as widgets

from kernos.errors import UsageError
from kernos.history import human_size
from kernos.inspector.agents_tab import AgentsTab
from kernos.inspector.backend import Backend, Notice
from kernos.inspector.forking import ForkControls
from kernos.inspector.plot import line_chart

__all__ = ["Inspector", "inspect", "kernel_backend"]

INSPECTOR_MIME = "application/vnd.kernos.inspector+json"
"""What the JupyterLab extension renders as an inspector (``extension/src/inline.ts``)."""
PAGE_SIZE = 50
PREVIEW_BYTES = 2_000
EVENTS_SHOWN = 200
"""The events tab keeps the newest this many (matching its filters)."""
EVENTS_BATCH = 500
LOG_LIMIT = 200
STATS_LIMIT = 500
SORT_KEYS = (("name", "name"), ("type", "type"), ("size", "size"), ("version", "version"),
             ("last op", "op"), ("principal", "principal"), ("changed at", "changed_at"))
TAB_TITLES = ("Objects", "Events", "Capabilities", "History", "Plot", "Agents")
EVERYONE = ""


def _escape(value: object) -> str:
    return html.escape(str(value), quote=True)


def _note(text: str) -> str:
    return f'<p style="color: #666; margin: 4px 0">{_escape(text)}</p>'


def _table(headers: tuple[str, ...], rows: Sequence[Sequence[object]]) -> str:
    """An HTML table; every header and cell is escaped here."""
    head = "".join(f'<th style="text-align: left; padding: 2px 8px">{_escape(cell)}</th>'
                   for cell in headers)
    body = "".join("<tr>" + "".join(f'<td style="padding: 2px 8px">{_escape(cell)}</td>'
                                    for cell in row) + "</tr>" for row in rows)
    return f'<table style="border-collapse: collapse"><tr>{head}</tr>{body}</table>'


def _size(value: object) -> str:
    return human_size(value) if isinstance(value, (int, float)) else ""


def _short(value: object, width: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def _when(value: object) -> str:
    """An ISO timestamp to the second (the rest is noise in a table)."""
    return str(value or "")[:19].replace("T", " ")


def _hidden(widget: Any, hidden: bool) -> None:
    widget.layout.display = "none" if hidden else None


class _Panel:
    """One tab: its widgets, and how it refreshes from the backend."""

    def __init__(self, owner: Inspector) -> None:
        self.owner = owner
        self.box: Any = None

    def request(self, action: str, **fields: Any) -> dict[str, Any] | None:
        return self.owner.request(action, **fields)

    def refresh(self) -> None:
        raise NotImplementedError


class _Objects(_Panel):
    def __init__(self, owner: Inspector) -> None:
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
            self.table.value = _note(f"No objects match {query!r}." if query
                                     else "No objects yet.")
        else:
            self.table.value = _table(
                ("name", "type", "size", "version", "last op", "principal", "changed at"),
                [(row.get("name"), row.get("type"), _size(row.get("size")),
                  row.get("version"), row.get("op"), row.get("principal"),
                  _when(row.get("changed_at"))) for row in self.rows])
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
            self.preview.value = _note("Choose an object to preview it.")
            return
        result = self.request("object", name=name, preview_bytes=PREVIEW_BYTES)
        if result is None:
            self.preview.value = _note(f"{name!r} cannot be shown.")
            return
        preview = result.get("preview") or {}
        shown = str(preview.get("repr", ""))[: PREVIEW_BYTES * 2]
        self.preview.value = (
            f"<b>{_escape(result.get('name'))}</b>: {_escape(result.get('type'))}, "
            f"{_escape(_size(result.get('size')))}, version {_escape(result.get('version'))}, "
            f"op {_escape(result.get('op'))} by {_escape(result.get('principal'))}"
            f'<pre style="white-space: pre-wrap; max-height: 20em; overflow: auto">'
            f"{_escape(shown)}</pre>")


class _Events(_Panel):
    def __init__(self, owner: Inspector) -> None:
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
                self.log.value = _note("The events could not be read (see the status line).")
                return
            found = list(result.get("events") or [])
            self.events = (self.events + found)[-EVENTS_SHOWN:]
            self.cursor = int(result.get("cursor") or 0)
            if len(found) < EVENTS_BATCH:
                break
        self._render()

    def _render(self) -> None:
        if not self.events:
            self.log.value = _note("No events match these filters." if any(self.filters or ())
                                   else "No events yet.")
            return
        self.log.value = _table(
            ("seq", "op", "principal", "topic", "payload"),
            [(event.get("seq"), f"op {event.get('op')}", event.get("principal"),
              event.get("topic"), _short(event.get("payload"))) for event in self.events]
        ) + (_note(f"The newest {EVENTS_SHOWN} events are shown.")
             if len(self.events) >= EVENTS_SHOWN else "")


class _Capabilities(_Panel):
    def __init__(self, owner: Inspector) -> None:
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
            self.table.value = _note("No agents yet.")
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
                rows.append((principal, grant.get("capability"), _blank(grant.get("limit")),
                             _blank(grant.get("used")), _blank(grant.get("remaining")),
                             state, grant.get("id"), grant.get("op")))
        self.table.value = _table(("principal", "capability", "limit", "used", "left", "state",
                                   "grant", "granted at op"), rows)


def _blank(value: object) -> object:
    return "" if value is None else value


class _History(_Panel):
    def __init__(self, owner: Inspector) -> None:
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
        _hidden(self.confirmation, True)
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
            self.table.value = _note("No snapshots yet.")
        else:
            self.table.value = _table(
                ("op", "when", "principal", "kind", "message", "image size", "commit"),
                [(entry.get("op"), _when(entry.get("when")), entry.get("principal"),
                  entry.get("kind"), entry.get("message"), _size(entry.get("bytes")),
                  str(entry.get("commit") or "")[:12]) for entry in self.snapshots])
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
            self.diff.value = _note("The diff could not be read (see the status line).")
            return
        parts = [f"<b>{_escape(self._label(a))} &rarr; {_escape(self._label(b))}</b>"]
        for title, key in (("added", "added"), ("changed", "changed"), ("deleted", "deleted")):
            entries = result.get(key) or []
            if not entries:
                continue
            if key == "changed":
                parts.append(f"<div>{_escape(title)}</div>" + _table(
                    ("name", "type", "before", "after"),
                    [(entry.get("name"), entry.get("type"), entry.get("before"),
                      entry.get("after")) for entry in entries]))
            else:
                parts.append(f"<div>{_escape(title)}</div>" + _table(
                    ("name", "type", "summary"),
                    [(entry.get("name"), entry.get("type"), entry.get("summary"))
                     for entry in entries]))
        if len(parts) == 1:
            parts.append(_note("The two snapshots hold the same names and values."))
        self.diff.value = "".join(parts)

    def _on_checkout(self, button: object) -> None:
        target = self.target.value
        if target is None:
            return
        self.question.value = (f"Make the image equal to snapshot {_escape(self._label(target))}?"
                               " This runs as a new op; history is not rewritten.")
        _hidden(self.confirmation, False)

    def _on_cancel(self, button: object) -> None:
        _hidden(self.confirmation, True)
        self.question.value = ""

    def _on_confirm(self, button: object) -> None:
        target = self.target.value
        _hidden(self.confirmation, True)
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
                           f"{checkout.get('names')} names, {_size(checkout.get('bytes'))}.")
        else:
            error = result.get("error") or {}
            self.owner.say(f"The checkout was {result.get('status')}: "
                           f"{error.get('message')}", error=True)

    def on_progress(self, notice: Notice) -> None:
        done, total = notice.get("done"), notice.get("total")
        if not isinstance(done, int) or not isinstance(total, int):
            return
        self.progress.value = 1.0 if total <= 0 else min(1.0, max(0.0, done / total))
        self.progress_text.value = _escape(f"{notice.get('what')}: {human_size(done)} of "
                                           f"{human_size(total)}")


class _Plot(_Panel):
    def __init__(self, owner: Inspector) -> None:
        super().__init__(owner)
        self.chart = widgets.HTML()
        self.box = widgets.VBox([self.chart])

    def refresh(self) -> None:
        result = self.request("stats", limit=STATS_LIMIT)
        if result is None:
            return
        ops = list(result.get("ops") or [])
        if not ops:
            self.chart.value = _note("No ops yet.")
            return

        failed = sum(1 for op in ops if op.get("status") != "committed")

        def series(key: str) -> list[tuple[object, object]]:
            return [(op.get("op"), op.get(key)) for op in ops]

        def sized(value: float) -> str:
            return human_size(value)

        def ms(value: float) -> str:
            return f"{value:,.0f} ms" if value >= 10 else f"{value:.3g} ms"

        self.chart.value = "".join([
            _note(f"{len(ops)} op{'' if len(ops) == 1 else 's'} shown"
                  + (f" ({failed} did not commit)" if failed else "") + "; the image is "
                  f"{_size(result.get('image_bytes'))} and its history "
                  f"{_size(result.get('history_bytes'))} on disk."),
            "<div>", line_chart(series("image_bytes"), title="Image size", y_format=sized,
                                empty="No committed ops yet"), "</div><div>",
            line_chart(series("history_bytes"), title="History size on disk",
                       y_format=sized, empty="No committed ops yet"), "</div><div>",
            line_chart(series("ms"), title="Op latency (every op)", y_format=ms), "</div>"])


class _Agents(_Panel):
    """Loops, circuits and memory (``kernos.inspector.agents_tab``)."""

    def __init__(self, owner: Inspector) -> None:
        super().__init__(owner)
        self.tab = AgentsTab(self.request, owner.say)
        self.box = self.tab.box

    def refresh(self) -> None:
        self.tab.refresh()


class Inspector(widgets.VBox):  # type: ignore[misc]
    """The image, seen through ``backend``: a status line over six tabs."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.status = widgets.HTML()
        self.objects = _Objects(self)
        self.events = _Events(self)
        self.capabilities = _Capabilities(self)
        self.history = _History(self)
        self.plot = _Plot(self)
        self.agents = _Agents(self)
        self.panels: tuple[_Panel, ...] = (self.objects, self.events, self.capabilities,
                                           self.history, self.plot, self.agents)
        self.tabs = widgets.Tab(children=[panel.box for panel in self.panels],
                                titles=TAB_TITLES)
        self._stale = set(self.panels)
        self._error_shown = False
        super().__init__([self.status, self.tabs])
        self.tabs.observe(self._on_tab, names="selected_index")
        self._unwatch: Callable[[], None] | None = backend.watch(self._on_notice)
        self.refresh()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        """The widget, and :data:`INSPECTOR_MIME` for the JupyterLab extension.

        The extension draws its own panel for that type, bound to the notebook's
        session, so the inspector survives a kernel restart and a reopened notebook,
        where a widget's model is gone with the kernel that made it.  Frontends
        without the extension show the widget.
        """
        bundle: dict[str, Any] | None = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/plain"] = "Kernos inspector"
            bundle[INSPECTOR_MIME] = {"version": 1}
        return bundle

    # -- requests and the status line ---------------------------------------------------

    def request(self, action: str, **fields: Any) -> dict[str, Any] | None:
        """The result of one harness read, or None (the error is in the status line)."""
        try:
            reply = self._backend.request({"v": 1, "action": action, **fields})
        except Exception as error:  # a broken backend must not break the notebook
            self.say(f"{action}: {type(error).__name__}: {error}", error=True)
            return None
        if not isinstance(reply, dict) or reply.get("status") != "ok":
            problem = (reply.get("error") if isinstance(reply, dict) else None) or {}
            self.say(f"{action} failed ({problem.get('kind', 'error')}): "
                     f"{problem.get('message', reply)}", error=True)
            return None
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    def say(self, text: str, *, error: bool = False) -> None:
        """Show one line in the status line (bounded; escaped)."""
        line = " ".join(str(text).split())
        line = line if len(line) <= 300 else line[:297] + "..."
        colour = "#b00020" if error else "#444"
        self.status.value = f'<span style="color: {colour}">{_escape(line)}</span>'
        self._error_shown = error

    # -- refreshing --------------------------------------------------------------------

    @property
    def visible(self) -> _Panel:
        return self.panels[self.tabs.selected_index or 0]

    def refresh(self) -> None:
        """Read the visible tab again (the others when they are shown)."""
        self._stale = set(self.panels)
        self.refresh_panel(self.visible)

    def refresh_panel(self, panel: _Panel) -> None:
        if self._error_shown:
            self.status.value = ""
            self._error_shown = False
        self._stale.discard(panel)
        panel.refresh()

    def _on_tab(self, change: dict[str, Any]) -> None:
        if self.visible in self._stale:
            self.refresh_panel(self.visible)

    def _on_notice(self, notice: Notice) -> None:
        kind = notice.get("type")
        if kind == "progress":
            self.history.on_progress(notice)
        elif kind == "committed":
            changes = [f"{len(notice.get(key) or [])} {key}"
                       for key in ("added", "changed", "deleted") if notice.get(key)]
            self.say(f"op {notice.get('op')} committed by {notice.get('principal')}"
                     + (f": {', '.join(changes)}" if changes else ""))
            self.refresh()
        elif kind == "rolled_back":
            error = notice.get("error")
            self.say(f"op {notice.get('op')} by {notice.get('principal')} rolled back"
                     + (f": {error}" if error else "") + "; nothing changed.")
            # Circuits live outside the image: an op that did not commit counts, and may
            # open its agent's circuit.
            self._stale.add(self.agents)
            if self.visible is self.agents:
                self._stale.discard(self.agents)
                self.agents.refresh()

    # -- closing ----------------------------------------------------------------------

    def _descendants(self) -> Iterator[Any]:
        stack: list[Any] = list(self.children)
        while stack:
            widget = stack.pop()
            yield widget
            stack.extend(getattr(widget, "children", ()))

    def close(self) -> None:
        """Stop watching the backend and close every widget of the inspector."""
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        for widget in list(self._descendants()):
            for part in (getattr(widget, "layout", None), getattr(widget, "style", None)):
                if isinstance(part, widgets.Widget):
                    part.close()
            widget.close()
        for part in (self.layout, getattr(self, "style", None)):
            if isinstance(part, widgets.Widget):
                part.close()
        super().close()


# -- the running kernel -----------------------------------------------------------------


def kernel_backend() -> Backend:
    """The running Kernos kernel's backend, or a :class:`UsageError` saying what to do."""
    problem = ("kernos.inspect() shows the image of a running Kernos kernel, and {}. Run it in "
               "a notebook (or console) on the Kernos kernel; in a script, build "
               "kernos.inspector.widget.Inspector(kernos.inspector.ServiceBackend(service)).")
    try:
        from IPython import get_ipython
    except ImportError:
        raise UsageError(problem.format("IPython is not installed")) from None
    shell = get_ipython()
    if shell is None:
        raise UsageError(problem.format("this Python is not running IPython"))
    backend = getattr(getattr(shell, "kernel", None), "inspection", None)
    if backend is None:
        raise UsageError(problem.format("this is not one (its kernel has no Kernos inspector)"))
    return backend  # type: ignore[no-any-return]


def inspect() -> None:
    """Display an inspector of the running kernel's image; returns None (nothing lands in
    the namespace or ``_``)."""
    from IPython.display import display

    display(Inspector(kernel_backend()))  # type: ignore[no-untyped-call]
