"""The harness requests on conversation sessions: a principal's list of items, in the image.

A *session* is an ordered list of conversation items (JSON objects: the
messages, tool calls and tool outputs an agent framework keeps between turns,
such as the OpenAI Agents SDK's ``Session``; see
``kernos.integrations.openai_agents``), kept in the image under a principal:
the session ``ID`` of principal ``P`` is the name ``kernos:session:P:ID`` (``ID``
percent-encoded, so any string names a session) and its pages
``kernos:session:P:ID:N``.  Sessions commit, roll back, restore, show in
``kernos log`` and the audit, and travel with the history like any other name.

:class:`SessionRequests` carries out:

``session_items``  session, principal?, limit?
    -> ``{"session", "principal", "items": [ITEM], "total": int}``: the last
    ``limit`` items (all without it), oldest first.  A read: no op, nothing
    recorded.  An unknown session has no items (``total`` 0).
``session_add``  session, items, principal?, key?   (one op of ``principal``)
    -> ``{"session", "principal", "added", "total", "op", "commit"}``.  ``items``
    is a list of JSON objects, appended in order, all or none.  An empty list
    runs no op (``op`` null).  ``key`` is an idempotency key, as for ``op``: a
    committed op that carries it answers ``{"session", "principal", "op",
    "commit", "duplicate": true}`` and nothing is added again.
``session_pop``  session, principal?   (one op, when there is an item)
    -> ``{"session", "principal", "item": ITEM | null, "total", "op", "commit"}``:
    the newest item, removed.  An empty session runs no op (``item`` and ``op`` null).
``session_clear``  session, principal?   (one op, when the session exists)
    -> ``{"session", "principal", "cleared": int, "op", "commit"}``.
``session_list``  principal?
    -> ``{"principal", "sessions": [{"session", "items"}]}``, sorted by id.  A read.

Whose.  A session belongs to its principal (``human`` when none is named), as an
agent's own namespace does: keeping its conversation needs no grant, and every
change is an op *of that principal* (an agent's passes its circuit breaker
first, like any op of its).  Agent code cannot read ``kernos:`` names, so a
session is reachable only through these requests (and the human's own tools).

Cost.  A session is stored in pages of at most :data:`PAGE_ITEMS` items (each a
name of its own; every page but the last is full), so an append re-stores the
last page and the small index, whatever the session's length: an op's cost does
not grow with the conversation (``kernos:*`` names are always stored whole, never
in segments).  Each change builds new lists rather than editing the committed
ones in place, so a rollback only rebinds.

Replay.  The op's recorded source is the request itself (``{"action":
"session_add", ...}``, items included), so a replay can send it again.  The
items are in the audit record as they are in the snapshot; erasure reaches both.

Refusals.  Every field is checked before an op begins (``malformed``: an empty or
over-long session id, an item that is not a JSON object); an agent whose circuit
is open is refused (``denied``), its op rolled back and recorded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

from kernos.agents.supervisor import fingerprint
from kernos.harness.protocol import MAX_KEY_CHARS, ProtocolError, Request
from kernos.harness.serving import Handled, ServiceBase

__all__ = ["MAX_SESSION_CHARS", "PAGE_ITEMS", "SESSION_PREFIX", "SessionRequests",
           "session_name"]

SESSION_PREFIX = "kernos:session:"
PAGE_ITEMS = 128
"""Items per page: an append re-stores at most this many (plus the ones it adds)."""
MAX_SESSION_CHARS = 200
"""The longest session id (before encoding)."""


def session_name(principal: str, session: str) -> str:
    """The name of ``principal``'s session ``session``'s index in the image."""
    return f"{SESSION_PREFIX}{principal}:{quote(session, safe='')}"


def _page_name(index_name: str, page: int) -> str:
    return f"{index_name}:{page}"


class SessionRequests(ServiceBase):
    """The session requests: reads answer from the image, changes are ops of the owner."""

    # -- reads --------------------------------------------------------------------------

    def _session_items(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        session = _session_of(request)
        limit: int | None = request.get("limit")
        index_name = session_name(principal, session)
        index = self._index(index_name)
        total = index["count"] if index else 0
        wanted = total if limit is None else min(limit, total)
        items: list[Any] = []
        page = index["pages"] - 1 if index else -1
        while len(items) < wanted and page >= 0:
            items[:0] = self._page(index_name, page)
            page -= 1
        return self._ok(request, {"session": session, "principal": principal,
                                  "items": items[len(items) - wanted:], "total": total})

    def _session_list(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        prefix = f"{SESSION_PREFIX}{principal}:"
        found = []
        for name in list(self.image.system):
            rest = name[len(prefix):]
            if name.startswith(prefix) and ":" not in rest:
                index = self._index(name)
                found.append({"session": unquote(rest), "items": index["count"] if index else 0})
        found.sort(key=lambda entry: str(entry["session"]))
        return self._ok(request, {"principal": principal, "sessions": found})

    # -- changes: one op of the session's principal each ---------------------------------

    def _session_add(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        session = _session_of(request)
        items = _items_of(request)
        key: str | None = request.get("key")
        if key is not None and not 0 < len(key) <= MAX_KEY_CHARS:
            raise ProtocolError("malformed", f"session_add: 'key' must be 1 to {MAX_KEY_CHARS} "
                                "characters")
        index_name = session_name(principal, session)
        if key is not None:
            earlier = self.image.audit.committed_with_key(key)
            if earlier is not None:  # a redelivery: answer it, add nothing again
                return self._ok(request, {"session": session, "principal": principal,
                                          "op": earlier.get("op"),
                                          "commit": earlier.get("commit"), "duplicate": True})
        if not items:
            index = self._index(index_name)
            return self._ok(request, {"session": session, "principal": principal, "added": 0,
                                      "total": index["count"] if index else 0, "op": None,
                                      "commit": None})

        def add() -> dict[str, Any]:
            index = self._index(index_name) or {"count": 0, "pages": 0,
                                                 "page_items": PAGE_ITEMS}
            size, pages, count = index["page_items"], index["pages"], index["count"]
            fresh = list(items)
            touched = [index_name]
            if pages and count - (pages - 1) * size < size:  # room in the last page
                last = _page_name(index_name, pages - 1)
                room = size - (count - (pages - 1) * size)
                self.image.bind(last, [*self._page(index_name, pages - 1), *fresh[:room]])
                touched.append(last)
                fresh = fresh[room:]
            while fresh:
                page = _page_name(index_name, pages)
                self.image.bind(page, fresh[:size])
                touched.append(page)
                fresh = fresh[size:]
                pages += 1
            total = count + len(items)
            self.image.bind(index_name, {"count": total, "pages": pages, "page_items": size})
            self._touch(*touched)
            return {"added": len(items), "total": total}

        digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()
        return self._session_op(request, principal, session,
                                f"session {session[:60]}: add {len(items)} "
                                f"item{'s' if len(items) > 1 else ''}", add,
                                fingerprint_of=digest, key=key)

    def _session_pop(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        session = _session_of(request)
        index_name = session_name(principal, session)
        if not self._index(index_name):
            return self._ok(request, {"session": session, "principal": principal,
                                      "item": None, "total": 0, "op": None, "commit": None})

        def pop() -> dict[str, Any]:
            index = self._index(index_name)
            assert index is not None
            last = _page_name(index_name, index["pages"] - 1)
            page = self._page(index_name, index["pages"] - 1)
            item, rest = page[-1], page[:-1]
            total, pages = index["count"] - 1, index["pages"]
            if rest:
                self.image.bind(last, rest)
            else:
                self.image.unbind(last)
                pages -= 1
            if total:
                self.image.bind(index_name, {**index, "count": total, "pages": pages})
            else:
                self.image.unbind(index_name)
            self._touch(index_name, last)
            return {"item": item, "total": total}

        return self._session_op(request, principal, session, f"session {session[:60]}: pop",
                                pop)

    def _session_clear(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        session = _session_of(request)
        index_name = session_name(principal, session)
        if not self._index(index_name):
            return self._ok(request, {"session": session, "principal": principal,
                                      "cleared": 0, "op": None, "commit": None})

        def clear() -> dict[str, Any]:
            index = self._index(index_name)
            assert index is not None
            pages = [_page_name(index_name, page) for page in range(index["pages"])]
            for name in [*pages, index_name]:
                if self.image.lookup(name) is not None:
                    self.image.unbind(name)
            self._touch(index_name, *pages)
            return {"cleared": index["count"]}

        return self._session_op(request, principal, session,
                                f"session {session[:60]}: clear", clear)

    def _session_op(self, request: Request, principal: str, session: str, note: str,
                    body: Callable[[], dict[str, Any]], *, fingerprint_of: str = "",
                    key: str | None = None) -> Handled:
        """Run ``body`` as one op of ``principal``; the request is its recorded source."""
        # The fields in a fixed order, the items' own keys as they came (sort_keys would
        # reorder them, and a replay would store dicts of another order).
        source = json.dumps({"action": request.action,
                             **{name: request.fields[name] for name in sorted(request.fields)}})
        return self._principal_op(
            request, principal=principal, source=source, note=f"{note} ({principal})",
            body=lambda op: {"session": session, "principal": principal, **body()},
            same=lambda: fingerprint(request.action, session, fingerprint_of), key=key)

    # -- the stored form ------------------------------------------------------------------

    def _touch(self, *names: str) -> None:
        op = self.image.current
        assert op is not None
        op.touch(*names)

    def _index(self, index_name: str) -> dict[str, int] | None:
        index = self.image.lookup(index_name)
        if index is None:
            return None
        if not isinstance(index, dict) or not all(
                type(index.get(field)) is int for field in ("count", "pages", "page_items")):
            raise ProtocolError("internal", f"the session index {index_name!r} is not one "
                                "Kernos wrote (it holds a " + type(index).__name__ + "); "
                                "nothing was changed. Please report it.")
        return index

    def _page(self, index_name: str, page: int) -> list[Any]:
        items = self.image.lookup(_page_name(index_name, page))
        if not isinstance(items, list):
            raise ProtocolError("internal", f"page {page} of the session {index_name!r} is "
                                "missing; nothing was changed. Please report it.")
        return items


def _session_of(request: Request) -> str:
    session: str = request.get("session")
    if not 0 < len(session) <= MAX_SESSION_CHARS:
        raise ProtocolError("malformed", f"{request.action}: 'session' must be 1 to "
                            f"{MAX_SESSION_CHARS} characters, not {len(session)}")
    return session


def _items_of(request: Request) -> list[dict[str, Any]]:
    items: list[Any] = request.get("items")
    for position, item in enumerate(items):
        if type(item) is not dict:
            raise ProtocolError("malformed", f"{request.action}: item {position} is a "
                                f"{type(item).__name__}; every item is a JSON object (a "
                                "message, a tool call, a tool output); nothing was added",
                                {"position": position})
    return items
