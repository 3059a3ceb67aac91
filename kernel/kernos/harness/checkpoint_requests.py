"""The harness requests on graph checkpoints: a framework's checkpointer, kept in the image.

:class:`CheckpointRequests` carries out ``checkpoint_put``, ``checkpoint_writes``,
``checkpoint_get``, ``checkpoint_list``, ``checkpoint_delete``, ``checkpoint_copy``,
``checkpoint_prune`` and ``checkpoint_delete_runs``: the storage behind a
LangGraph checkpointer (``kernos.integrations.langgraph.KernosSaver``), with
the shapes of LangGraph's own savers (a checkpoint, the blobs of the channels
it changed, and the pending writes of its tasks), as plain data.

Where it lives.  A thread of a principal is a few image names, its *pages*
(:func:`page_name`: ``kernos:langgraph:PRINCIPAL:THREAD:N``, the thread id
percent-encoded, ``N`` from 0).  A page is a ``dict`` whose entries are
immutable tuples of plain data under tuple keys::

    ("c", NS, CHECKPOINT_ID)               -> (TYPE, BYTES, PARENT_ID | None, METADATA, VERSIONS)
    ("b", NS, CHANNEL, VERSION)            -> (TYPE, BYTES)         a channel's value
    ("w", NS, CHECKPOINT_ID, TASK_ID, IDX) -> (CHANNEL, TYPE, BYTES, TASK_PATH)

and the thread is the union of its pages (a later page's entry wins).
``TYPE, BYTES`` is what the framework's serializer made (``dumps_typed``): the
kernel stores the bytes and never decodes them.  ``METADATA`` (the checkpoint's
metadata) and ``VERSIONS`` (its channel versions) are JSON data, so that the
kernel can filter a listing and pick the blobs a checkpoint reads.  A change
commits whole or not at all (a rollback or a ``kill -9`` never leaves half a
checkpoint), and shows in ``kernos log`` as a change of a page, by its
principal.

Cost.  A put or a write adds its entries to a copy of the thread's last page
and binds it in its place; once a page holds :data:`PAGE_ENTRIES` entries or
:data:`PAGE_BYTES` bytes, the next change starts a new one.  Only that page is
pickled and stored again (``kernos:*`` names are stored whole, never in
segments), so a put costs what its checkpoint and one page cost, not what the
thread's history does; the committed pages are never edited in place, so a
rollback only rebinds.  Reads, and the rare changes of a whole thread (delete,
copy, prune, delete_runs), read every page.

Who may.  A principal reaches only its own threads: the name holds the
principal, and no request names another's.  Its threads are its own state, like
its namespace and its ``agents/NAME/`` files, so no grant is needed (as for
those); an agent's change passes its circuit first (``runtime.breakers.admit``),
so its policies (``iterations``, ``wall_seconds``, ...) bound a graph's steps.
Agent code cannot reach a ``kernos:`` name, so a graph's checkpoints are out of
reach of the code the graph runs as that agent.

Ops.  Each change (put, writes, delete, copy, prune, delete_runs) is one op of
the principal: ``kind`` ``harness``, its source the action and the ids and sizes
of what it stored (never the bytes; they are in the snapshot), its note
``langgraph ...``.  A change that finds nothing to do (a write already stored, a
thread that does not exist) commits as an op that changed nothing.  Reads
(``checkpoint_get``, ``checkpoint_list``) run no op, as ``objects`` does.
Replay: ``kernos replay`` does not send these ops again (their recorded source
holds no bytes, as for the ``files_*`` requests): it takes each op's changes
to the principal's pages from the original's snapshot of that op, as an op
of the same principal, kind and source, and compares its snapshot as every
op's (:mod:`kernos.replay._taken`).

Requests (``?`` optional; ``principal?`` on each, default ``human``; bytes are
base64 text)::

    checkpoint_put     thread, ns?, checkpoint: {id, parent?, type, data, metadata,
                       versions}, blobs?: [[channel, version, type, data]]
                       -> {thread, ns, checkpoint_id, op, commit}
    checkpoint_writes  thread, ns?, checkpoint_id, task_id, task_path?,
                       writes: [[idx, channel, type, data]] -> {stored, op, commit}
    checkpoint_get     thread, ns?, checkpoint_id? -> {checkpoint: CHECKPOINT | null}
    checkpoint_list    thread?, ns?, checkpoint_id?, filter?, before?, limit?
                       -> {checkpoints: [CHECKPOINT]}  newest first (by id)
    checkpoint_delete  thread -> {deleted: bool, op, commit}
    checkpoint_copy    source, target -> {copied: int, op, commit}
    checkpoint_prune   threads, strategy ("keep_latest" | "delete") -> {removed, op, commit}
    checkpoint_delete_runs  runs -> {removed, op, commit}

    CHECKPOINT = {thread, ns, id, parent, type, data, metadata,
                  blobs: [[channel, type, data]], writes: [[task_id, channel, type, data]]}

A write whose ``idx`` is >= 0 is stored once per ``(task_id, idx)`` (a resent
one changes nothing); a negative one (an error, an interrupt) replaces the last.
``writes`` come in ``(task_path, task_id, idx)`` order, the order LangGraph
applies them.  A copy adds the source's entries to the target, keeping an entry
the target already holds under the same key.  Every field is checked before the
op begins (``malformed``, recorded as a rejected request).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, unquote

from kernos.agents.supervisor import fingerprint
from kernos.harness.protocol import ProtocolError, Request
from kernos.harness.serving import Handled, ServiceBase

__all__ = ["MAX_ID_CHARS", "PAGE_BYTES", "PAGE_ENTRIES", "PREFIX", "PRUNE_STRATEGIES",
           "CheckpointRequests", "page_name", "thread_name"]

PREFIX = "kernos:langgraph:"
"""The image names of the threads start with this, then ``PRINCIPAL:THREAD``."""
MAX_ID_CHARS = 256
"""The longest thread id, checkpoint id, task id, channel name or type."""
MAX_NS_CHARS = 1024
"""The longest checkpoint namespace (a subgraph's path)."""
PRUNE_STRATEGIES = ("keep_latest", "delete")
PAGE_ENTRIES = 256
"""A thread's entries per page: a change stores its last page again, at most this many."""
PAGE_BYTES = 1 << 20
"""A page that holds this many bytes of values is full, however few its entries."""

Thread = dict[tuple[Any, ...], tuple[Any, ...]]
_Body = Callable[[], dict[str, Any]]


def thread_name(principal: str, thread: str) -> str:
    """What the image names of ``principal``'s ``thread``'s pages start with (then ``:N``)."""
    return f"{PREFIX}{principal}:{quote(thread, safe='')}"


def page_name(principal: str, thread: str, number: int) -> str:
    """The image name of page ``number`` (from 0) of ``principal``'s ``thread``."""
    return f"{thread_name(principal, thread)}:{number}"


class CheckpointRequests(ServiceBase):
    """The checkpoint requests: changes are ops of their principal, reads run none."""

    # -- changes ------------------------------------------------------------------------

    def _checkpoint_put(self, request: Request) -> Handled:
        action = request.action
        principal = self._principal(request.get("principal"))
        thread, ns = self._thread_field(request, "thread"), _ns(request)
        given = request.get("checkpoint")
        known = {"id", "parent", "type", "data", "metadata", "versions"}
        unknown = sorted(str(key)[:40] for key in given if key not in known)
        if unknown:
            raise ProtocolError("malformed", f"{action}: unknown fields in 'checkpoint': "
                                f"{unknown}; they are {sorted(known)}")
        checkpoint_id = _text(action, "checkpoint.id", given.get("id"))
        parent = given.get("parent")
        if parent is not None:
            parent = _text(action, "checkpoint.parent", parent)
        kind = _text(action, "checkpoint.type", given.get("type"))
        data = _bytes(action, "checkpoint.data", given.get("data"))
        metadata, versions = given.get("metadata"), given.get("versions")
        if type(metadata) is not dict:
            raise ProtocolError("malformed", f"{action}: 'checkpoint.metadata' is an object")
        _check_versions(action, "checkpoint.versions", versions)
        added: Thread = {}
        for number, item in enumerate(request.get("blobs") or []):
            where = f"blobs[{number}]"
            if type(item) is not list or len(item) != 4:
                raise ProtocolError("malformed", f"{action}: {where} is [channel, version, "
                                    "type, data]")
            channel = _text(action, f"{where}[0]", item[0])
            _check_versions(action, f"{where}[1]", {channel: item[1]})
            added[("b", ns, channel, item[1])] = (_text(action, f"{where}[2]", item[2]),
                                                  _bytes(action, f"{where}[3]", item[3]))
        added[("c", ns, checkpoint_id)] = (kind, data, parent, metadata, dict(versions))

        def body() -> dict[str, Any]:
            self._append(principal, thread, added)
            return {"thread": thread, "ns": ns, "checkpoint_id": checkpoint_id}

        return self._change(request, principal, body,
                            note=f"langgraph put {thread[:60]} step {metadata.get('step')}",
                            recorded={"thread": thread, "ns": ns, "checkpoint_id": checkpoint_id,
                                      "parent": parent, "bytes": _size(added),
                                      "channels": [key[2] for key in added if key[0] == "b"]})

    def _checkpoint_writes(self, request: Request) -> Handled:
        action = request.action
        principal = self._principal(request.get("principal"))
        thread, ns = self._thread_field(request, "thread"), _ns(request)
        checkpoint_id = _text(action, "checkpoint_id", request.get("checkpoint_id"))
        task_id = _text(action, "task_id", request.get("task_id"))
        task_path = request.get("task_path") or ""
        if len(task_path) > MAX_NS_CHARS:
            raise ProtocolError("malformed", f"{action}: 'task_path' is at most "
                                f"{MAX_NS_CHARS} characters")
        writes: Thread = {}
        for number, item in enumerate(request.get("writes")):
            where = f"writes[{number}]"
            if type(item) is not list or len(item) != 4 or type(item[0]) is not int:
                raise ProtocolError("malformed", f"{action}: {where} is [idx (an int), "
                                    "channel, type, data]")
            writes[("w", ns, checkpoint_id, task_id, item[0])] = (
                _text(action, f"{where}[1]", item[1]), _text(action, f"{where}[2]", item[2]),
                _bytes(action, f"{where}[3]", item[3]), task_path)

        def body() -> dict[str, Any]:
            pages = [self.image.lookup(name) for _, name in self._pages(principal, thread)]
            # The same task's write sent again is stored once; an error or interrupt
            # (a negative idx) replaces the last.
            added = {key: value for key, value in writes.items() if key[4] < 0 or not any(
                key in page for page in pages if isinstance(page, dict))}
            if added:
                self._append(principal, thread, added)
            return {"stored": len(added)}

        return self._change(request, principal, body,
                            note=f"langgraph writes {thread[:60]} task {task_id[:40]}",
                            recorded={"thread": thread, "ns": ns,
                                      "checkpoint_id": checkpoint_id, "task_id": task_id,
                                      "channels": [value[0] for value in writes.values()][:100],
                                      "bytes": _size(writes)})

    def _checkpoint_delete(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        thread = self._thread_field(request, "thread")

        def body() -> dict[str, Any]:
            pages = self._pages(principal, thread)
            self._rewrite(principal, thread, {})
            return {"deleted": bool(pages)}

        return self._change(request, principal, body, note=f"langgraph delete {thread[:60]}",
                            recorded={"thread": thread})

    def _checkpoint_copy(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        source = self._thread_field(request, "source")
        target = self._thread_field(request, "target")
        if source == target:
            raise ProtocolError("invalid", f"{request.action}: the source and the target are "
                                f"the same thread ({source[:80]!r}); name another target")

        def body() -> dict[str, Any]:
            found = self._entries(principal, source)
            if not found:
                return {"copied": 0}
            merged = self._entries(principal, target)
            copied = {key: value for key, value in found.items() if key not in merged}
            self._rewrite(principal, target, {**merged, **copied})
            return {"copied": len(copied)}

        return self._change(request, principal, body,
                            note=f"langgraph copy {source[:40]} -> {target[:40]}",
                            recorded={"source": source, "target": target})

    def _checkpoint_prune(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        threads = sorted({_text(request.action, f"threads[{number}]", thread)
                          for number, thread in enumerate(request.get("threads"))})
        strategy = request.get("strategy") or "keep_latest"
        if strategy not in PRUNE_STRATEGIES:
            raise ProtocolError("malformed", f"{request.action}: 'strategy' is one of "
                                f"{', '.join(PRUNE_STRATEGIES)}, not {strategy[:40]!r}")

        def body() -> dict[str, Any]:
            removed = 0
            for thread in threads:
                entries = self._entries(principal, thread)
                latest: dict[str, str] = {}
                if strategy == "keep_latest":
                    for key in entries:
                        if key[0] == "c" and key[2] > latest.get(key[1], ""):
                            latest[key[1]] = key[2]
                removed += self._keep_only(principal, thread, entries, [
                    ("c", ns, checkpoint_id) for ns, checkpoint_id in latest.items()])
            return {"removed": removed}

        return self._change(request, principal, body,
                            note=f"langgraph prune {len(threads)} threads ({strategy})",
                            recorded={"threads": threads[:100], "strategy": strategy})

    def _checkpoint_delete_runs(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        runs = {_text(request.action, f"runs[{number}]", run)
                for number, run in enumerate(request.get("runs"))}

        def body() -> dict[str, Any]:
            removed = 0
            for thread in self._threads(principal) if runs else []:
                entries = self._entries(principal, thread)
                kept = [key for key, value in entries.items()
                        if key[0] == "c" and value[3].get("run_id") not in runs]
                if len(kept) < sum(1 for key in entries if key[0] == "c"):
                    removed += self._keep_only(principal, thread, entries, kept)
            return {"removed": removed}

        return self._change(request, principal, body,
                            note=f"langgraph delete runs ({len(runs)})",
                            recorded={"runs": sorted(runs)[:100]})

    # -- reads: no op ---------------------------------------------------------------------

    def _checkpoint_get(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        thread, ns = self._thread_field(request, "thread"), _ns(request)
        wanted = request.get("checkpoint_id")
        entries = self._entries(principal, thread)
        if wanted is None:
            wanted = max((key[2] for key in entries if key[0] == "c" and key[1] == ns),
                         default=None)
        if wanted is None or ("c", ns, wanted) not in entries:
            return self._ok(request, {"checkpoint": None})
        writes = [(key, value) for key, value in entries.items()
                  if key[0] == "w" and key[1] == ns and key[2] == wanted]
        return self._ok(request, {"checkpoint": _shown(thread, ns, wanted, entries, writes)})

    def _checkpoint_list(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        thread, ns = request.get("thread"), request.get("ns")
        wanted, before = request.get("checkpoint_id"), request.get("before")
        match = request.get("filter") or {}
        limit = request.get("limit")
        threads = (self._threads(principal) if thread is None
                   else [_text(request.action, "thread", thread)])
        found: list[tuple[str, str, str]] = []
        entries: dict[str, Thread] = {}
        for name in threads:
            entries[name] = self._entries(principal, name)
            for key, value in entries[name].items():
                if key[0] != "c" or (ns is not None and key[1] != ns):
                    continue
                if (wanted is not None and key[2] != wanted) or (
                        before is not None and key[2] >= before):
                    continue
                if any(value[3].get(field) != expected for field, expected in match.items()):
                    continue
                found.append((key[2], name, key[1]))
        found.sort(reverse=True)
        if limit is not None:
            found = found[:limit]
        writes: dict[tuple[str, str, str], list[Any]] = {(name, ns, checkpoint_id): []
                                                         for checkpoint_id, name, ns in found}
        for name in {name for _, name, _ in found}:
            for key, value in entries[name].items():
                if key[0] == "w" and (name, key[1], key[2]) in writes:
                    writes[(name, key[1], key[2])].append((key, value))
        return self._ok(request, {"checkpoints": [
            _shown(name, ns, checkpoint_id, entries[name], writes[(name, ns, checkpoint_id)])
            for checkpoint_id, name, ns in found]})

    # -- the pages of a thread -------------------------------------------------------------

    def _pages(self, principal: str, thread: str) -> list[tuple[int, str]]:
        """The names of ``thread``'s pages, in order."""
        prefix = thread_name(principal, thread) + ":"
        pages = []
        for name in list(self.image.system):
            number = name[len(prefix):]
            if name.startswith(prefix) and number.isdigit():
                pages.append((int(number), name))
        return sorted(pages)

    def _threads(self, principal: str) -> list[str]:
        """The threads ``principal`` has checkpoints in, sorted."""
        prefix = thread_name(principal, "")
        return sorted({unquote(name[len(prefix):].rpartition(":")[0])
                       for name in list(self.image.system) if name.startswith(prefix)})

    def _entries(self, principal: str, thread: str) -> Thread:
        """Every entry of ``thread`` (a later page's entry wins over an earlier's)."""
        merged: Thread = {}
        for _, name in self._pages(principal, thread):
            page = self.image.lookup(name)
            if type(page) is not dict:
                raise ProtocolError("workspace", f"the image name {name[:120]!r} does not "
                                    "hold a page of checkpoints (a dict); something else "
                                    "wrote it")
            assert isinstance(page, dict)
            merged.update(page)
        return merged

    def _append(self, principal: str, thread: str, added: Thread) -> None:
        """Add ``added`` to the thread's last page, or to a new one when that is full.

        The page is a new dict (the committed one is never edited in place), so only
        that name is stored again, and a rollback only rebinds it."""
        pages = self._pages(principal, thread)
        number, last = pages[-1] if pages else (0, None)
        page = self.image.lookup(last) if last is not None else None
        if not isinstance(page, dict) or len(page) >= PAGE_ENTRIES or (
                _size(page) >= PAGE_BYTES):
            number, page = (number + 1 if last is not None else 0), {}
        self.image.bind(page_name(principal, thread, number), {**page, **added})

    def _rewrite(self, principal: str, thread: str, entries: Thread) -> None:
        """Make ``entries`` the whole of ``thread`` (none: it is gone)."""
        for _, name in self._pages(principal, thread):
            self.image.unbind(name)
        items = list(entries.items())
        for number, start in enumerate(range(0, len(items), PAGE_ENTRIES)):
            self.image.bind(page_name(principal, thread, number),
                            dict(items[start:start + PAGE_ENTRIES]))

    def _keep_only(self, principal: str, thread: str, entries: Thread,
                   checkpoints: Iterable[tuple[Any, ...]]) -> int:
        """Leave in ``thread`` only ``checkpoints``, their writes and the blobs they read;
        how many checkpoints it dropped."""
        kept: Thread = {}
        for key in checkpoints:
            value = entries[key]
            kept[key] = value
            for channel, version in value[4].items():
                blob = ("b", key[1], channel, version)
                if blob in entries:
                    kept[blob] = entries[blob]
        chosen = {key[1:] for key in kept if key[0] == "c"}
        for key, value in entries.items():
            if key[0] == "w" and key[1:3] in chosen:
                kept[key] = value
        if len(kept) < len(entries):
            self._rewrite(principal, thread, kept)
        return sum(1 for key in entries if key[0] == "c") - len(chosen)

    def _thread_field(self, request: Request, field: str) -> str:
        return _text(request.action, field, request.get(field))

    def _change(self, request: Request, principal: str, body: _Body, *, note: str,
                recorded: dict[str, Any]) -> Handled:
        """Run ``body`` as one op of ``principal``.  It only binds and unbinds pages (never
        edits a committed one in place), which the image sees by identity: the op's reach
        names nothing."""
        source = json.dumps({"action": request.action, **recorded}, sort_keys=True,
                            default=str)
        return self._principal_op(request, principal=principal, source=source, note=note,
                                  body=lambda op: body(),
                                  same=lambda: fingerprint(request.action, source))


def _size(entries: Thread) -> int:
    """The bytes the serializer made, in ``entries``."""
    return sum(len(part) for value in entries.values() for part in value
               if isinstance(part, bytes))


def _shown(thread: str, ns: str, checkpoint_id: str, stored: Thread,
           writes: list[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> dict[str, Any]:
    """One checkpoint as the reply carries it: its blobs, and its writes in LangGraph's order."""
    kind, data, parent, metadata, versions = stored[("c", ns, checkpoint_id)]
    blobs = []
    for channel, version in versions.items():
        blob = stored.get(("b", ns, channel, version))
        if blob is not None and blob[0] != "empty":
            blobs.append([channel, blob[0], _b64(blob[1])])
    # (task_path, task_id, idx): langgraph.checkpoint.base.writes_sort_key
    writes.sort(key=lambda item: (item[1][3], item[0][3], item[0][4]))
    return {"thread": thread, "ns": ns, "id": checkpoint_id, "parent": parent, "type": kind,
            "data": _b64(data), "metadata": metadata, "blobs": blobs,
            "writes": [[key[3], value[0], value[1], _b64(value[2])] for key, value in writes]}


def _ns(request: Request) -> str:
    ns = request.get("ns") or ""
    if len(ns) > MAX_NS_CHARS:
        raise ProtocolError("malformed", f"{request.action}: 'ns' is at most {MAX_NS_CHARS} "
                            "characters")
    return str(ns)


def _text(action: str, field: str, value: object) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_ID_CHARS:
        raise ProtocolError("malformed", f"{action}: {field!r} must be a string of 1 to "
                            f"{MAX_ID_CHARS} characters")
    assert isinstance(value, str)
    return value


def _check_versions(action: str, field: str, versions: object) -> None:
    if type(versions) is not dict or any(
            type(version) not in (str, int, float) for version in versions.values()):
        raise ProtocolError("malformed", f"{action}: {field!r} maps channels to versions "
                            "(strings or numbers)")


def _bytes(action: str, field: str, value: object) -> bytes:
    if type(value) is not str:
        raise ProtocolError("malformed", f"{action}: {field!r} is base64 text")
    assert isinstance(value, str)
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError) as error:
        raise ProtocolError("malformed", f"{action}: {field!r} is not base64 ({error}); "
                            "encode the bytes with base64 (RFC 4648, with '=' padding)"
                            ) from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
