"""One tab of the inspector: the :class:`Panel` base, what it needs of its owner, and HTML.

A panel owns its widgets (``box``) and knows how to read itself again from
the backend (:meth:`Panel.refresh`).  It reaches the backend only through its
owner (:class:`Owner`, the :class:`~kernos.inspector.widget.Inspector`):
``request`` for a harness read, ``say`` for the status line, and
``refresh_panel`` to read a panel again after a filter or page changed.

The helpers draw the HTML the tabs show.  Every string that reaches HTML goes
through :func:`escape` (names, reprs and topics come from agent code);
:func:`table` escapes each header and cell itself.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any, Protocol

from kernos.history import human_size

__all__ = ["Owner", "Panel", "blank", "escape", "hidden", "note", "short", "size", "table",
           "when"]


class Owner(Protocol):
    """What a panel uses of the inspector that holds it."""

    def request(self, action: str, **fields: Any) -> dict[str, Any] | None:
        """The result of one harness read, or None (the error is in the status line)."""
        ...

    def say(self, text: str, *, error: bool = False) -> None:
        """Show one line in the status line."""
        ...

    def refresh_panel(self, panel: Panel) -> None:
        """Read ``panel`` again from the backend."""
        ...


def escape(value: object) -> str:
    """``value`` as text that is safe in HTML, quotes included."""
    return html.escape(str(value), quote=True)


def note(text: str) -> str:
    """A grey line of explanation (an empty tab, a failed read)."""
    return f'<p style="color: #666; margin: 4px 0">{escape(text)}</p>'


def table(headers: tuple[str, ...], rows: Sequence[Sequence[object]]) -> str:
    """An HTML table; every header and cell is escaped here."""
    head = "".join(f'<th style="text-align: left; padding: 2px 8px">{escape(cell)}</th>'
                   for cell in headers)
    body = "".join("<tr>" + "".join(f'<td style="padding: 2px 8px">{escape(cell)}</td>'
                                    for cell in row) + "</tr>" for row in rows)
    return f'<table style="border-collapse: collapse"><tr>{head}</tr>{body}</table>'


def size(value: object) -> str:
    """A byte count for people ("1.2 MB"), or "" if there is none."""
    return human_size(value) if isinstance(value, (int, float)) else ""


def short(value: object, width: int = 80) -> str:
    """``value`` as JSON on one line, cut to ``width`` characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def when(value: object) -> str:
    """An ISO timestamp to the second (the rest is noise in a table)."""
    return str(value or "")[:19].replace("T", " ")


def hidden(widget: Any, hide: bool) -> None:
    """Hide a widget, or show it again."""
    widget.layout.display = "none" if hide else None


class Panel:
    """One tab: its widgets, and how it refreshes from the backend."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.box: Any = None

    def request(self, action: str, **fields: Any) -> dict[str, Any] | None:
        return self.owner.request(action, **fields)

    def refresh(self) -> None:
        raise NotImplementedError


def blank(value: object) -> object:
    """A table cell for a value that may be missing."""
    return "" if value is None else value

