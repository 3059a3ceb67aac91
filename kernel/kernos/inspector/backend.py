"""What an inspector (the widget, the JupyterLab panel) reads the image through.

One mechanism for every view: the inspector asks the harness protocol
(``kernos.harness.protocol``) as ``human``, and it is told when an op has
finished.  It never touches the namespace itself, so it holds no reference
to any object in the image and nothing of it can leak into the image.

A :class:`Backend` has two methods:

``request(content) -> REPLY``
    ``content`` is a harness request (``{"v": 1, "action": ..., ...}``) and
    the reply is the harness reply, exactly as ``kernos_reply`` carries it.
    Only the actions in :data:`ALLOWED` are served (narrowed by :data:`ONLY`);
    any other is refused with an error reply of kind ``denied``.
    ``checkout``, ``loop`` (but ``status``) and ``reset`` run as ops by
    ``human``, serialized with every other op (the kernel refuses them, and
    the ``loop`` and ``policy`` reads, from inside a cell: the harness settles
    effects after each); while a checkout loads the snapshot,
    the backend's watchers are told its progress.  ``fork`` makes a new
    workspace beside this one (``kernos.fork``); it reads this one only.

``watch(callback) -> unwatch``
    ``callback(notice)`` is called after every op that finishes (a cell, a
    harness request, a checkout from a widget or the panel), never while an
    op is running, with one NOTICE::

        {"type": "committed", "op": int, "commit": str, "principal": str,
         "added": [str], "changed": [str], "deleted": [str], "events": int,
         "request": str?, "checkout": {"ref": str, "op": int | None, "commit": str}?}
        {"type": "rolled_back", "op": int | None, "principal": str,
         "error": str | None, "request": str?}
        {"type": "progress", "what": "restore" | "checkout", "done": int,
         "total": int}

    ``request`` is there for a notebook cell's op only: the ``msg_id`` of its
    ``execute_request``, so that the notebook that sent it can tell its own
    ops from ops made elsewhere (another client, ``kernos run``, an agent's
    loop, an inspector).  ``checkout`` is there for an op that checked out a
    snapshot (from an inspector, the harness or ``%kernos checkout``): the
    ref it was given, and the op and commit of the snapshot it made the image
    equal to.  A notebook marks the outputs these invalidate as stale
    (``extension/src/cells.ts``).

    ``progress`` notices may arrive while a checkout runs (that is their
    point); a callback must only update its display then.  The backend
    keeps a weak reference to a bound method's object (so a closed widget
    is collected); ``unwatch()`` stops the calls.  A callback that raises is
    logged and dropped, never allowed to fail the op.

The kernel's backend is ``kernos.kernel.inspector.KernelBackend``;
:class:`ServiceBackend` serves a :class:`~kernos.harness.service.HarnessService`
directly (in-process tests, and scripts without a kernel).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from kernos.harness.protocol import VERSION, ProtocolError, error_reply

__all__ = ["ALLOWED", "CHANGES", "ONLY", "Backend", "Notice", "ServiceBackend", "Watchers",
           "checkout_notice", "notice_of"]

log = logging.getLogger(__name__)

Notice = dict[str, Any]

ALLOWED = frozenset({"hello", "versions", "objects", "object", "grants", "agents", "tools",
                     "log", "show", "diff", "events", "audit", "status", "stats", "checkout",
                     "fork", "loop", "policy", "circuit", "reset", "recall", "memory"})
"""Reads; checkout (after the user confirms); fork (a new workspace beside this one, which
this one's image never sees); the human's controls of agents, each an op by ``human``:
``loop`` to pause, resume or stop a loop (or read them, ``status``) and ``reset`` to close
a circuit (``policy`` and ``circuit`` read them); ``recall`` (a read, as the human or as an
agent, which then needs ``memory:read``) and ``memory`` (``stats``).  Never ``op``,
``remember``, ``loop`` ``start`` or a ``policy`` ``set``: an inspector runs no code, writes
nothing as an agent and loosens no policy.  :data:`ONLY` narrows those actions."""
ONLY: dict[str, tuple[str, frozenset[str | None], str]] = {
    "loop": ("do", frozenset({"status", "pause", "resume", "stop"}),
             "start a loop in a cell: agents.loop(NAME, STEP)"),
    "policy": ("set", frozenset({None}),
               "set a policy in a cell: agents.policy(NAME, failures=N, ...)"),
    "memory": ("command", frozenset({"stats"}),
               "rebuild the index with `kernos memory rebuild`")}
"""Per action: the field, the values of it an inspector may send (None: the field is
absent), and where to do the rest."""
HUMAN_OPS = frozenset({"grant", "revoke", "add_agent", "loop", "policy", "reset"})
"""Harness actions that run as an op by ``human`` and answer with ``op`` and ``commit`` only."""
CHANGES = frozenset({"checkout", "loop", "policy", "reset"})
"""The allowed actions that may be ops (they cannot run from inside a cell, itself an op)."""


class Backend(Protocol):
    def request(self, content: dict[str, Any]) -> dict[str, Any]: ...

    def watch(self, callback: Callable[[Notice], None]) -> Callable[[], None]: ...


def refuse(content: object) -> dict[str, Any] | None:
    """The error reply for a request an inspector may not make, or None if it may."""
    action = content.get("action") if isinstance(content, dict) else None
    if type(action) is str and action in ONLY and isinstance(content, dict):
        field, values, elsewhere = ONLY[action]
        value = content.get(field)
        if not (value is None or type(value) is str) or value not in values:  # hashable first
            allowed = (f"without {field!r}" if values == {None} else
                       f"only with {field} {' or '.join(sorted(map(str, values)))}")
            return error_reply(action, ProtocolError(
                "denied", f"an inspector sends {action} {allowed}; {elsewhere}"))
    if type(action) is str and action in ALLOWED:
        return None
    shown = action if type(action) is str else None
    return error_reply(shown[:40] if shown else None, ProtocolError(
        "denied", f"an inspector may only read, check out, fork, pause, resume or stop a "
        f"loop and reset a circuit; the actions it may send are "
        f"{', '.join(sorted(ALLOWED))}. Run changes as cells or through kernos.client."))


class Watchers:
    """Weakly held notice callbacks (bound methods are held by a weak method)."""

    def __init__(self) -> None:
        self._next = 0
        self._callbacks: dict[int, Callable[[], Callable[[Notice], None] | None]] = {}

    def watch(self, callback: Callable[[Notice], None]) -> Callable[[], None]:
        key = self._next
        self._next += 1
        ref: Callable[[], Callable[[Notice], None] | None]
        if hasattr(callback, "__self__") and hasattr(callback, "__func__"):
            ref = weakref.WeakMethod(callback)
        else:
            ref = _strong(callback)
        self._callbacks[key] = ref

        def unwatch() -> None:
            self._callbacks.pop(key, None)

        return unwatch

    def notify(self, notice: Notice) -> None:
        for key, ref in list(self._callbacks.items()):
            callback = ref()
            if callback is None:
                self._callbacks.pop(key, None)
                continue
            try:
                callback(notice)
            except Exception:  # an inspector's bug must never fail an op
                log.exception("Kernos: an inspector's callback failed; it is dropped")
                self._callbacks.pop(key, None)

    def __len__(self) -> int:
        return sum(1 for ref in self._callbacks.values() if ref() is not None)


def _strong(callback: Callable[[Notice], None]) -> Callable[[], Callable[[Notice], None]]:
    return lambda: callback


class ServiceBackend:
    """A backend over a HarnessService, for in-process use (no kernel, no comms).

    The caller tells it about ops it runs through :meth:`notify`; a checkout
    through :meth:`request` notifies by itself.
    """

    def __init__(self, service: Any) -> None:
        self.service = service
        self.watchers = Watchers()

    def request(self, content: dict[str, Any]) -> dict[str, Any]:
        refused = refuse(content)
        if refused is not None:
            return refused
        previous = self.service.progress
        self.service.progress = lambda what, done, total: self.watchers.notify(
            {"type": "progress", "what": what, "done": done, "total": total})
        try:
            handled = self.service.handle(content)
        finally:
            self.service.progress = previous
        notice = notice_of(handled.reply)
        if notice is not None:
            self.watchers.notify(notice)
        return handled.reply  # type: ignore[no-any-return]

    def watch(self, callback: Callable[[Notice], None]) -> Callable[[], None]:
        return self.watchers.watch(callback)

    def notify(self, notice: Notice) -> None:
        self.watchers.notify(notice)


def checkout_notice(checkout: dict[str, Any]) -> dict[str, Any]:
    """A notice's ``checkout``, from a checkout report (``kernos.op.CheckoutReport``)."""
    return {"ref": checkout.get("ref"), "op": checkout.get("op"),
            "commit": checkout.get("commit")}


def notice_of(reply: dict[str, Any]) -> Notice | None:
    """The notice for a harness reply whose action ran an op (None for reads and errors)."""
    if reply.get("status") != "ok" or reply.get("v") != VERSION:
        return None
    result = reply.get("result") or {}
    status = result.get("status")
    if status == "committed":
        notice = {"type": "committed", "op": result.get("op"), "commit": result.get("commit"),
                  "principal": result.get("principal"), "added": result.get("added", []),
                  "changed": result.get("changed", []), "deleted": result.get("deleted", []),
                  "events": len(result.get("events", []))}
        if isinstance(result.get("checkout"), dict):
            notice["checkout"] = checkout_notice(result["checkout"])
        return notice
    if status in ("rolled back", "failed", "denied", "interrupted", "vetoed"):
        error = result.get("error") or {}
        return {"type": "rolled_back", "op": result.get("op"),
                "principal": result.get("principal"), "error": error.get("message")}
    if status is None and reply.get("action") in HUMAN_OPS and type(result.get("op")) is int \
            and result.get("commit"):
        # A human op whose result is not an OP-RESULT (a grant, a loop paused, ...): the
        # views refresh all the same.
        return {"type": "committed", "op": result["op"], "commit": result["commit"],
                "principal": "human", "added": [], "changed": [], "deleted": [], "events": 0}
    return None
