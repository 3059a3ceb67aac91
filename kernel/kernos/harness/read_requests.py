"""The harness requests that read the image, its history and its audit log (no op).

:class:`ReadRequests` answers ``hello``, ``versions``, ``objects``, ``object``,
``grants``, ``agents``, ``tools``, ``log``, ``show``, ``diff``, ``events``,
``audit``, ``status`` and ``stats``.  A read runs no op and records nothing;
it shows an agent only the names its grants let it read (the human sees
everything).  The results' shapes are the protocol's (``kernos.harness.protocol``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kernos import history
from kernos._version import __version__
from kernos.audit.oplog import every_op
from kernos.errors import UnknownRef
from kernos.harness.inspection import newest_ops, op_without_snapshot, shape_of
from kernos.harness.protocol import ACTIONS, VERSION, ProtocolError, Request
from kernos.harness.serving import HUMAN, Handled, ServiceBase, plain
from kernos.harness.values import DEFAULT_PREVIEW_BYTES, value_of
from kernos.serialize.unpersisted import Unpersisted

__all__ = ["ReadRequests"]


class ReadRequests(ServiceBase):
    """The read-only requests: the image's names and values, its history, its audit."""

    def _hello(self, request: Request) -> Handled:
        image = self.image
        return self._ok(request, {
            "protocol": VERSION, "kernos": __version__,
            "workspace": str(image.workspace.path),
            "head": {"op": image.head_op, "commit": image.head.hex() if image.head else None},
            "principals": [HUMAN, *sorted(self.runtime.registry.principals)],
            "actions": sorted(ACTIONS),
            "limits": {"max_request_bytes": self.max_request_bytes},
        })

    def _versions(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        names: list[str] = request.get("names")
        hidden = [name for name in names if not self._may_read(principal, name)]
        if hidden:
            raise ProtocolError("denied", f"{principal!r} may not read {hidden[:5]}; a "
                                "principal sees versions of names it holds read:NAME for",
                                {"names": hidden[:20]})
        return self._ok(request, {"versions": {name: self._version(name) for name in names},
                                  "op": self.image.head_op})

    def _describe(self, name: str) -> dict[str, Any]:
        meta = self.image.meta[name]
        described = {"name": name, "type": meta.type, "size": meta.size,
                     "version": meta.version, "op": meta.op, "principal": meta.principal,
                     "changed_at": meta.changed_at, "summary": meta.summary}
        value = self.image.lookup(name)
        described["shape"] = shape_of(value)
        if type(value) is Unpersisted:  # a restore's placeholder, not what was stored
            described["type"] = "Unpersisted"
            described["summary"] = (f"placeholder for {value.type_name}: could not be "
                                    f"persisted ({value.reason})")
        return described

    def _objects(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        prefix = request.get("prefix") or ""
        meta = self.image.meta
        internal = request.get("internal", True)
        names = [name for name in meta
                 if name.startswith(prefix) and self._may_read(principal, name)
                 and (internal or not history.is_internal(name))]
        query = (request.get("query") or "").casefold()
        if query:
            names = [name for name in names if query in name.casefold()
                     or query in meta[name].type.casefold()
                     or query in meta[name].principal.casefold()]
        names.sort()
        sort: str = request.get("sort") or "name"
        key = sort.removeprefix("-")
        if key != "name":
            def value(name: str) -> Any:
                found = getattr(meta[name], key)
                return (found is None, found if found is not None else 0)
            names.sort(key=value)
        if sort.startswith("-"):
            names.reverse()  # ties stay by name, reversed with the rest
        offset = request.get("offset") or 0
        limit = request.get("limit")
        chosen = names[offset:] if limit is None else names[offset:offset + limit]
        return self._ok(request, {"objects": [self._describe(name) for name in chosen],
                                  "total": len(names)})

    def _object(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        name: str = request.get("name")
        if name not in self.image.meta or not self._may_read(principal, name):
            raise ProtocolError("unknown_name", f"there is no object {name[:80]!r} that "
                                f"{principal!r} may read; action objects lists them",
                                {"name": name[:80]})
        described = self._describe(name)
        preview_bytes = request.get("preview_bytes", DEFAULT_PREVIEW_BYTES)
        described["preview"] = value_of(self.image.lookup(name), preview_bytes).to_json()
        return self._ok(request, described)

    def _grants(self, request: Request) -> Handled:
        agent = request.get("agent")
        if agent is not None:
            self._principal(agent)
        return self._ok(request, {"grants": plain(self.runtime.grants(agent))})

    def _agents(self, request: Request) -> Handled:
        return self._ok(request, {"agents": self.runtime.agents()})

    def _tools(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        tools = []
        for tool in self.runtime.tools():
            name = str(tool["name"])
            if principal != HUMAN and tool.get("author") != principal and \
                    self.runtime.registry.find(principal, "call", name) is None:
                continue
            tools.append(plain(tool))
        return self._ok(request, {"tools": tools})

    def _log(self, request: Request) -> Handled:
        """The history, newest first; for an agent, only what its grants let it see.

        An agent sees a snapshot if it changed a name the agent may read, or if the
        agent's own op made it; the names listed are only those it may read (and its
        own namespace), and only its own ops show their code's first line.  (It reads
        the whole history to find them: an agent's log costs what the history holds.)
        """
        principal = self._principal(request.get("principal"))
        limit = request.get("limit")
        human = principal == HUMAN
        if request.get("all"):
            if not human:
                raise ProtocolError("denied", "log: 'all' is the human's view of every op; "
                                    "an agent's log lists the snapshots it may see")
            return self._ok(request, {"snapshots": [{
                "op": entry.op, "when": entry.committed_at,
                # An op that wrote no snapshot names none (a read-only one's record has
                # the head it left as it was).
                "commit": (entry.commit or None) if entry.outcome == "committed" else None,
                "principal": entry.principal, "kind": entry.kind, "changes": entry.changes,
                "files": entry.files, "message": entry.headline,
                "bytes": entry.bytes if entry.outcome == "committed" else None,
                "outcome": entry.outcome, "error": entry.error or None,
            } for entry in (every_op(self.image.workspace, self.image.audit) if limit is None
                            else newest_ops(self.image.workspace, self.image.audit, limit))]})
        own = f"kernos:ns:{principal}"
        shown: list[dict[str, Any]] = []
        for entry in history.log(self.image.workspace, limit=limit if human else None):
            changes = entry.changes if human else {
                kind: [name for name in names if name == own or self._may_read(principal, name)]
                for kind, names in entry.changes.items()}
            mine = human or entry.principal == principal
            if not mine and not any(changes.values()):
                continue
            shown.append({"op": entry.op, "commit": entry.commit, "when": entry.committed_at,
                          "principal": entry.principal, "kind": entry.kind,
                          "changes": changes, "message": entry.headline if mine else None,
                          # Tracked file paths: the human's view only (agents read files
                          # under file:read grants, which a log does not check).
                          "files": entry.files if human else {},
                          "bytes": entry.bytes if human else None})
            if limit is not None and len(shown) >= limit:
                break
        return self._ok(request, {"snapshots": shown})

    def _show(self, request: Request) -> Handled:
        ref: str = request.get("ref") or "HEAD"
        try:
            shown = history.show(self.image.workspace, ref)
        except UnknownRef:
            # `@N` of an op that wrote no snapshot: what its audit record says.
            unrecorded = op_without_snapshot(self.image.audit, ref)
            if unrecorded is None:
                raise
            return self._ok(request, unrecorded)
        manifest = shown["manifest"]
        return self._ok(request, {
            "commit": shown["commit"], "op": manifest.get("op"),
            "principal": manifest.get("principal"), "kind": manifest.get("kind"),
            "committed_at": manifest.get("committed_at"), "message": shown["message"],
            "code": shown["source"], "names": manifest.get("names", {}),
            "unpersisted": shown["unpersisted"],
            "files": [change.to_json() for change in shown["files"]]})

    def _diff(self, request: Request) -> Handled:
        result = history.diff(self.image.workspace, request.get("a"), request.get("b") or "HEAD")

        def entry(name: str, meta: dict[str, Any]) -> dict[str, Any]:
            return {"name": name, "type": meta.get("type"), "summary": meta.get("summary")}

        return self._ok(request, {
            "a": result.a, "b": result.b,
            "added": [entry(name, meta) for name, meta in result.added.items()],
            "deleted": [entry(name, meta) for name, meta in result.deleted.items()],
            "changed": [{"name": name, "type": new.get("type"), "before": old.get("summary"),
                         "after": new.get("summary")}
                        for name, (old, new) in result.changed.items()],
            "files": [change.to_json() for change in result.files]})

    def _events(self, request: Request) -> Handled:
        audit = self.image.audit
        found = audit.events_since(request.get("since"), op=request.get("op"),
                                   topic=request.get("topic"),
                                   principal=request.get("principal"),
                                   limit=request.get("limit"))
        cursor = found[-1]["seq"] if found else (request.get("since") or 0)
        return self._ok(request, {"events": found, "cursor": cursor})

    def _audit(self, request: Request) -> Handled:
        records = self.image.audit.records(principal=request.get("principal"),
                                           status=request.get("status"),
                                           topic=request.get("topic"),
                                           limit=request.get("limit"))
        return self._ok(request, {"records": records})

    def _status(self, request: Request) -> Handled:
        image = self.image
        index, digest = image.audit.head()
        tail = image.workspace.tail
        return self._ok(request, {
            "workspace": str(image.workspace.path),
            "head": {"op": image.head_op, "commit": image.head.hex() if image.head else None},
            "names": len(image.meta),
            "bytes": sum(state.stored.size for state in image.groups.values()),
            "ops": image.audit.last_op,
            "audit": {"index": index, "hash": digest},
            "commits": {"small": tail.appended, "syncs": tail.syncs,
                        "unfolded": len(tail.frames)}})

    def _stats(self, request: Request) -> Handled:
        limit = request.get("limit")
        records = self.image.audit.records(type="op", limit=500 if limit is None else limit)
        ops = []
        for record in records:
            sizes = record.get("sizes") or {}
            ops.append({"op": record.get("op"), "status": record.get("status"),
                        "principal": record.get("principal"), "kind": record.get("kind"),
                        "at": record.get("finished_at"),
                        "ms": _elapsed_ms(record.get("started_at"), record.get("finished_at")),
                        "image_bytes": sizes.get("image"),
                        "history_bytes": sizes.get("history")})
        return self._ok(request, {
            "ops": ops,
            "image_bytes": sum(state.stored.size for state in self.image.groups.values()),
            "history_bytes": self.image.history_bytes()})


def _elapsed_ms(started: object, finished: object) -> float | None:
    if not isinstance(started, str) or not isinstance(finished, str):
        return None
    try:
        delta = datetime.fromisoformat(finished) - datetime.fromisoformat(started)
    except ValueError:
        return None
    return round(delta.total_seconds() * 1000, 3)
