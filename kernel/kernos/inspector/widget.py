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

This module is the widget's shell: the status line, the tab bar, the
requests, which tabs are stale, and closing.  The tabs themselves are in
``kernos.inspector.tabs`` (the History tab can also fork the chosen snapshot
into a new workspace, ``kernos.inspector.forking``; the Agents tab shows
loops, circuits and memory, with the human's controls,
``kernos.inspector.agents_tab``), on the base and the HTML helpers of
``kernos.inspector.panel``.

Only a page of objects is ever fetched (the harness filters, sorts and
pages), so the inspector stays quick on an image of many names.  Every
string that reaches HTML goes through :func:`html.escape`: names, reprs and
topics come from agent code.  A reply that is an error is shown in the
status line, never raised.

``kernos.inspect()`` and ``%kernos inspect`` display one for the running
kernel (see :func:`inspect`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ipywidgets as widgets

from kernos.errors import UsageError
from kernos.inspector.backend import Backend, Notice
from kernos.inspector.panel import Panel, escape
from kernos.inspector.tabs import (
    EVENTS_SHOWN,
    PAGE_SIZE,
    AgentsPanel,
    CapabilitiesPanel,
    EventsPanel,
    HistoryPanel,
    ObjectsPanel,
    PlotPanel,
)

__all__ = ["EVENTS_SHOWN", "PAGE_SIZE", "Inspector", "inspect", "kernel_backend"]

INSPECTOR_MIME = "application/vnd.kernos.inspector+json"
"""What the JupyterLab extension renders as an inspector (``extension/src/inline.ts``)."""
TAB_TITLES = ("Objects", "Events", "Capabilities", "History", "Plot", "Agents")


class Inspector(widgets.VBox):  # type: ignore[misc]
    """The image, seen through ``backend``: a status line over six tabs."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.status = widgets.HTML()
        self.objects = ObjectsPanel(self)
        self.events = EventsPanel(self)
        self.capabilities = CapabilitiesPanel(self)
        self.history = HistoryPanel(self)
        self.plot = PlotPanel(self)
        self.agents = AgentsPanel(self)
        self.panels: tuple[Panel, ...] = (self.objects, self.events, self.capabilities,
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
        self.status.value = f'<span style="color: {colour}">{escape(line)}</span>'
        self._error_shown = error

    # -- refreshing --------------------------------------------------------------------

    @property
    def visible(self) -> Panel:
        return self.panels[self.tabs.selected_index or 0]

    def refresh(self) -> None:
        """Read the visible tab again (the others when they are shown)."""
        self._stale = set(self.panels)
        self.refresh_panel(self.visible)

    def refresh_panel(self, panel: Panel) -> None:
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

