"""The inspector's "Fork" action on a history row (``kernos fork``, from the History tab).

The user picks a snapshot (the History tab's *Snapshot* row), types a name
and clicks *Fork*: the kernel makes a new workspace of that name beside its
own, from that snapshot (the harness ``fork`` action; ``kernos.fork``), and
the tab shows where it is and how to open it (a kernel started with
``KERNOS_WORKSPACE`` set to it, or ``kernos ... -w NAME`` from a shell).  A
bare name goes where ``kernos fork SRC NAME`` puts it, beside the source: one
rule, :func:`kernos.fork.fork_destination`.  The name is checked by the kernel
against an allowlist (a path is refused here); a refusal is shown in the
status line, like every error.
This image is not changed: a fork only reads the workspace.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

__all__ = ["ForkControls"]


class ForkControls:
    """A name, a *Fork* button and the result, for the snapshot ``selected()`` names."""

    def __init__(self, request: Callable[..., dict[str, Any] | None],
                 selected: Callable[[], str | None], label: Callable[[object], str],
                 say: Callable[..., None]) -> None:
        self._request, self._selected, self._label, self._say = request, selected, label, say
        self.name = widgets.Text(description="Fork as",
                                 placeholder="a name: made beside this workspace")
        self.button = widgets.Button(description="Fork", icon="code-branch",
                                     tooltip="a new workspace from the chosen snapshot")
        self.result = widgets.HTML()
        self.button.on_click(self._on_fork)
        self.box = widgets.VBox([widgets.HBox([self.name, self.button]), self.result])

    def _on_fork(self, button: object) -> None:
        target = self._selected()
        name = self.name.value.strip()
        if target is None:
            return
        if not name:
            self._say("Fork: type a name for the new workspace first (letters, digits, "
                      "'.', '_' or '-').", error=True)
            return
        made = self._request("fork", ref=target, dest=name)
        if made is None:
            return  # refused: the status line says why
        dest = str(made.get("dest"))
        self.result.value = (
            f"Forked {html.escape(self._label(target))} into <code>{html.escape(dest)}</code>. "
            "Open it with a kernel started with "
            f"<code>KERNOS_WORKSPACE={html.escape(dest)}</code>, or read it from a shell "
            f"with <code>kernos log -w {html.escape(dest)}</code>.")
        self._say(f"Forked {self._label(target)} into {dest}")
