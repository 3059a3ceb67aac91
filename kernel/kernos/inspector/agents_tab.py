"""The inspector's Agents tab: loops, circuits and memory (issue 20).

Three sections, each read through the backend (harness actions, as ``human``):

* **Loops**: every agent's loop (``loop`` ``status``: status, iteration,
  pending work, last op, why it stopped, what its last committed iteration
  printed, bounded) and whether it is *tripped* (its agent's circuit is
  open).  *Pause*, *Resume* and *Stop* act on the chosen loop (``loop``
  ``pause`` / ``resume`` / ``stop``, an op by ``human``).
* **Circuits**: per agent, the effective policy (``policy``) and, when the
  circuit is open, the policy that tripped, its figures and message
  (``circuit``).  *Reset* closes the chosen circuit (``reset``, an op by
  ``human``), optionally
  putting the agent's namespace back to its safe checkpoint: the checkbox is
  offered only when the agent has one (``circuit``'s ``safe``), and names its op.
* **Memory**: the index's entries per layer (``memory`` ``stats``), and a
  search: ``recall`` as the human or as a chosen agent (only what that
  principal may read; an agent needs ``memory:read``).

Every string from the image came from agent code: it reaches HTML only
through :func:`html.escape`.  The tab refreshes after every committed op
(the inspector's ``committed`` notice), so a button's op shows at once.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets

__all__ = ["AgentsTab"]

Request = Callable[..., "dict[str, Any] | None"]
RECALL_K = 10
EVERYONE_AS = "human"


def _escape(value: object) -> str:
    return html.escape(str(value), quote=True)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False, default=str)
        return text if len(text) <= 120 else text[:117] + "..."
    return str(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], empty: str) -> str:
    """An HTML table; every header and cell is escaped here."""
    if not rows:
        return f'<p style="color: #666; margin: 4px 0">{_escape(empty)}</p>'
    head = "".join(f'<th style="text-align: left; padding: 2px 8px">{_escape(cell)}</th>'
                   for cell in headers)
    body = "".join("<tr>" + "".join(f'<td style="padding: 2px 8px">{_escape(_cell(cell))}</td>'
                                    for cell in row) + "</tr>" for row in rows)
    return f'<table style="border-collapse: collapse"><tr>{head}</tr>{body}</table>'


def _output(output: object) -> str | None:
    """What an iteration printed (the reply's ``output``), with a note when it was cut."""
    text = output.get("text") if isinstance(output, dict) else None
    if not isinstance(text, str):
        return None
    text = text.rstrip("\n")
    cut = output.get("cut") if isinstance(output, dict) else None
    return text + (f" [cut: {cut} more characters]" if type(cut) is int and cut else "")


def _heading(text: str) -> widgets.HTML:
    return widgets.HTML(f"<b>{_escape(text)}</b>")


class AgentsTab:
    """The Agents tab's widgets over ``request`` (the inspector's: errors go to ``say``)."""

    def __init__(self, request: Request, say: Callable[..., None]) -> None:
        self._request, self._say = request, say
        self.loops: list[dict[str, Any]] = []
        self.circuits: list[dict[str, Any]] = []
        self.loops_table = widgets.HTML()
        self.loop_chosen = widgets.Dropdown(options=[], description="Loop")
        self.pause = widgets.Button(description="Pause", icon="pause")
        self.resume = widgets.Button(description="Resume", icon="play")
        self.stop = widgets.Button(description="Stop", icon="stop")
        self.pause.on_click(lambda _button: self._set_loop("pause"))
        self.resume.on_click(lambda _button: self._set_loop("resume"))
        self.stop.on_click(lambda _button: self._set_loop("stop"))
        self.circuits_table = widgets.HTML()
        self.circuit_chosen = widgets.Dropdown(options=[], description="Agent")
        self.restore = widgets.Checkbox(value=False, indent=False,
                                        description="restore its safe checkpoint")
        self.reset = widgets.Button(description="Reset", icon="undo",
                                    tooltip="close the circuit (an op by human)")
        self.reset.on_click(self._on_reset)
        self.circuit_chosen.observe(lambda _change: self._offer_restore(), names="value")
        self.counts = widgets.HTML()
        self.query = widgets.Text(placeholder="words to recall...", description="Recall",
                                  continuous_update=False)
        self.principal = widgets.Dropdown(options=[EVERYONE_AS], value=EVERYONE_AS,
                                          description="as")
        self.search = widgets.Button(description="Search", icon="search")
        self.search.on_click(self._on_search)
        self.query.observe(self._on_search, names="value")  # on Enter, or leaving the box
        self.results = widgets.HTML()
        self.box = widgets.VBox([
            _heading("Loops"), self.loops_table,
            widgets.HBox([self.loop_chosen, self.pause, self.resume, self.stop]),
            _heading("Circuits"), self.circuits_table,
            widgets.HBox([self.circuit_chosen, self.restore, self.reset]),
            _heading("Memory"), self.counts,
            widgets.HBox([self.query, self.principal, self.search]), self.results])

    # -- reading -------------------------------------------------------------------------

    def refresh(self) -> None:
        loops, circuits, memory = (self._request("loop", do="status"),
                                   self._request("circuit"),
                                   self._request("memory", command="stats"))
        if circuits is not None:
            self.circuits = []
            safe = circuits.get("safe") or {}
            for agent, trip in sorted((circuits.get("circuits") or {}).items()):
                policy = self._request("policy", agent=agent)
                self.circuits.append({"agent": agent, "circuit": trip, "safe": safe.get(agent),
                                      "policy": (policy or {}).get("policy") or {}})
            self._draw_circuits()
        if loops is not None:
            self.loops = list(loops.get("loops") or [])
            self._draw_loops()
        if memory is not None:
            counts = memory.get("entries") or {}
            self.counts.value = _escape("Entries: " + ", ".join(
                f"{kind} {counts.get(kind, 0)}" for kind in ("working", "episodic", "semantic")))
        if self.query.value.strip() and self.results.value:
            self._on_search(None)

    def _draw_loops(self) -> None:
        trips = {entry.get("agent"): entry.get("circuit") for entry in self.circuits}
        rows = []
        for loop in self.loops:
            trip = trips.get(loop.get("agent"))
            state = str(loop.get("status"))
            if trip:
                state += f" (tripped: {trip.get('policy')})"
            rows.append((loop.get("agent"), state, loop.get("iteration"), loop.get("pending"),
                         loop.get("last_op"), loop.get("reason") or
                         (trip.get("message") if trip else None),
                         _output(loop.get("output"))))
        self.loops_table.value = _table(
            ("agent", "status", "iteration", "pending", "last op", "reason", "last output"),
            rows,
            "No loops: start one with agents.loop(NAME, step).")
        _choose(self.loop_chosen, [str(loop.get("agent")) for loop in self.loops
                                   if loop.get("status") in ("running", "paused")])
        busy = not self.loop_chosen.options
        for button in (self.pause, self.resume, self.stop):
            button.disabled = busy

    def _draw_circuits(self) -> None:
        rows = []
        for entry in self.circuits:
            trip = entry.get("circuit")
            policy = entry.get("policy") or {}
            state = f"open: {trip.get('policy')}" if trip else "closed"
            rows.append((entry.get("agent"), ", ".join(f"{key}={value}" for key, value in
                                                       sorted(policy.items())) or "none",
                         state, trip.get("figures") if trip else None,
                         trip.get("message") if trip else None))
        self.circuits_table.value = _table(
            ("agent", "policy", "circuit", "figures", "message"), rows, "No agents yet.")
        _choose(self.circuit_chosen, [str(entry.get("agent")) for entry in self.circuits
                                      if entry.get("circuit")])
        self.reset.disabled = not self.circuit_chosen.options
        self._offer_restore()
        agents = [EVERYONE_AS, *(str(entry.get("agent")) for entry in self.circuits)]
        _choose(self.principal, agents)

    def _offer_restore(self) -> None:
        """The restore checkbox, only for an agent with a checkpoint tagged safe."""
        chosen = self.circuit_chosen.value
        point = next((entry.get("safe") for entry in self.circuits
                      if entry.get("agent") == chosen), None)
        self.restore.disabled = point is None
        if point is None:
            self.restore.value = False
            self.restore.description = "restore (no safe checkpoint)"
        else:
            self.restore.description = f"restore its safe checkpoint (op {point})"

    # -- acting --------------------------------------------------------------------------

    def _set_loop(self, do: str) -> None:
        agent = self.loop_chosen.value
        if not agent:
            return
        done = self._request("loop", do=do, agent=agent)
        if done is not None:
            self._say(f"{agent}'s loop is {(done.get('loop') or {}).get('status')} "
                      f"(op {done.get('op')})")

    def _on_reset(self, button: object) -> None:
        agent = self.circuit_chosen.value
        if not agent:
            return
        done = self._request("reset", agent=agent,
                             restore=self.restore.value and not self.restore.disabled)
        if done is not None:
            restored = done.get("restored_from")
            self._say(f"{agent}'s circuit is closed (op {done.get('op')})"
                      + (f"; its namespace is back to op {restored}" if restored else ""))

    def _on_search(self, source: object) -> None:
        query = self.query.value.strip()
        if not query:
            self.results.value = ""
            return
        principal = self.principal.value
        found = self._request("recall", query=query, principal=principal, k=RECALL_K)
        if found is None:  # refused (an agent without memory:read): the status line says why
            self.results.value = ""
            return
        rows = [(memory.get("kind"), memory.get("title"), memory.get("op"),
                 memory.get("principal"), memory.get("text")) for memory in
                found.get("memories") or []]
        self.results.value = _table(("kind", "title", "op", "whose", "text"), rows,
                                    f"Nothing that {principal} may read matches.")


def _choose(dropdown: widgets.Dropdown, options: list[str]) -> None:
    """New options, keeping the chosen one when it is still there."""
    chosen = dropdown.value
    dropdown.options = options
    if chosen in options:
        dropdown.value = chosen
    elif options:
        dropdown.value = options[0]
