"""Carrying out harness requests against one image (the core; no Jupyter).

:class:`HarnessService` takes a request's content (see
``kernos.harness.protocol``), validates it, and carries it out against an
:class:`~kernos.image.Image` and its :class:`~kernos.agents.AgentRuntime`.
The kernel (``kernos.kernel.control``) is a thin adapter that hands it the
content of each ``kernos_request`` and sends back what it returns; a harness
in the same process can call it directly (that is how the in-process
throughput is measured).

One op at a time: the caller serializes requests (the kernel holds its op
lock around each one; in-process, ``Image.begin`` waits for the running op).
A request that changes the image runs as one op:

1. ``image.begin`` assigns the op number;
2. the idempotency key, if any, is looked up: a committed op that carries it
   answers the request (``duplicate``), and nothing runs;
3. the preconditions are checked *inside* the op, before its body: a stale
   version or a false predicate aborts it as ``conflict``;
4. the body runs (human Python, restricted agent code, or a tool call);
5. the op commits, or rolls back on any ``BaseException`` (a denial vetoes it
   even if the code caught it).

A refused request (malformed, unknown principal, a precondition on a
missing name, oversized) also gets an audit record: an op that aborts
before its body with status ``rejected``.  Reads (objects, history, events)
run no op and record nothing.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos import history
from kernos._version import __version__
from kernos.analysis import Reach
from kernos.audit.oplog import every_op
from kernos.errors import (
    AgentCodeRejected,
    CapabilityDenied,
    CircuitOpen,
    CommitFailed,
    InvalidGrant,
    KernosError,
    OpVetoed,
    RestoreError,
    UnknownAgent,
    UnknownRef,
    UnknownTool,
    UsageError,
)
from kernos.fork import FORK_NAME, fork
from kernos.harness.inspection import newest_ops, op_without_snapshot, shape_of
from kernos.harness.protocol import (
    ACTIONS,
    MUTATING,
    VERSION,
    ProtocolError,
    Request,
    error_reply,
    ok_reply,
    parse_request,
)
from kernos.harness.results import ErrorInfo, OpResult, Value
from kernos.harness.values import DEFAULT_PREVIEW_BYTES, value_of
from kernos.serialize.unpersisted import Unpersisted

if TYPE_CHECKING:
    from kernos.agents import AgentRuntime
    from kernos.image import Image
    from kernos.op import CommitReport, Op

__all__ = ["Handled", "HarnessService"]

log = logging.getLogger(__name__)

HUMAN = "human"
MAX_OUTPUT_CHARS = 64 * 1024
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
HARNESS_FILENAME = "<kernos-harness>"


@dataclass(kw_only=True)
class Handled:
    """What a request produced: the reply, and the committed events to push to subscribers."""

    reply: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    followups: list[CommitReport] = field(default_factory=list)
    """Ops that recorded the outcomes of external effects, after the request's own op."""


class _BoundedText(io.StringIO):
    """Captures what an op prints, keeping at most ``MAX_OUTPUT_CHARS``."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def write(self, text: str) -> int:
        room = MAX_OUTPUT_CHARS - self.tell()
        if room <= 0:
            self.dropped += len(text)
            return len(text)
        if len(text) > room:
            self.dropped += len(text) - room
            text = text[:room]
        return super().write(text)

    def text(self) -> str:
        value = self.getvalue()
        if self.dropped:
            value += f"\n[... {self.dropped:,} more characters not shown]"
        return value


class _Conflict(Exception):
    def __init__(self, message: str, versions: dict[str, int | None]) -> None:
        super().__init__(message)
        self.versions = versions


class HarnessService:
    """Harness requests against one image.  Not thread-safe: one request at a time."""

    def __init__(self, image: Image, runtime: AgentRuntime, *,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.image = image
        self.runtime = runtime
        self.max_request_bytes = max_request_bytes
        self.cell_runner: Callable[[str, dict[str, Any]], tuple[bool, object]] | None = None
        """Runs human code in place of :meth:`_run_human`'s own compile and exec, and
        returns (whether it ended in an expression, its value): replay sets it to run a
        notebook's cell as the kernel's IPython did (``kernos.replay.cells``)."""
        self.progress: Callable[[str, int, int], None] | None = None
        """Told ``(what, done, total)`` bytes while a long step runs (``checkout``); the
        transport sets it for a request's duration (``kernos_progress`` in the protocol)."""
        self.interruptible: Callable[[int, str | None], ContextManager[None]] = (
            lambda op, key: contextlib.nullcontext())
        """Wraps an op's body, given its id and key: the kernel lets SIGINT interrupt the
        body there, and nowhere else (``kernos.kernel.interrupts``)."""
        self._began = False
        """Whether the request being handled has begun an op (which records itself)."""

    # -- the entry point ------------------------------------------------------------

    def handle(self, content: object, *, size: int | None = None) -> Handled:
        """Carry out one request; ``size`` is its encoded size, if the transport knows it."""
        action = content.get("action") if isinstance(content, dict) else None
        shown_action = action if type(action) is str and action in ACTIONS else None
        try:
            if size is not None and size > self.max_request_bytes:
                raise ProtocolError(
                    "oversized", f"the request is {size:,} bytes, over the limit of "
                    f"{self.max_request_bytes:,} (KERNOS_MAX_SOURCE_BYTES); nothing ran. Put "
                    "large data in a file and load it from a short op.",
                    {"size": size, "limit": self.max_request_bytes})
            request = parse_request(content)
        except ProtocolError as error:
            self._record_rejection(content, shown_action, error)
            return Handled(reply=error_reply(shown_action, error))
        self._began = False
        try:
            handled: Handled = getattr(self, "_" + request.action)(request)
        except KernosError as error:
            problem = error if isinstance(error, ProtocolError) else _as_protocol_error(error)
            # Refused before its op began (an unknown principal, say): record it here.
            # Once an op began, its own audit record tells what happened.
            if request.action in MUTATING and not self._began:
                self._record_rejection(content, request.action, problem)
            return Handled(reply=error_reply(request.action, problem))
        if request.action in MUTATING:
            self._settle_effects(handled)
            self._announce_trips(handled)
        return handled

    def _announce_trips(self, handled: Handled) -> None:
        report = self.announce_trips()
        if report is not None:
            handled.events += report.events
            handled.followups.append(report)

    def announce_trips(self) -> CommitReport | None:
        """Commit, in a small op of the supervisor's own, the ``kernos.circuit.open``
        events of the trips no committed op has emitted yet; None if there are none.

        Called right after each op (a request's here, a cell's by the kernel): the
        op that trips a circuit always rolls back, and its events with it, so the
        trip is announced by the next op that commits, and this one follows at once
        (see ``kernos.agents.supervisor``).
        """
        breakers = self.runtime.breakers
        if self.image.current is not None or not breakers.pending():
            return None
        op = self.image.begin(source=json.dumps({"action": "announce_trips"}),
                              principal=HUMAN, kind="supervisor", reach=Reach(frozenset()))
        op.note = "supervisor: circuit open"
        try:
            breakers.announce()
        except BaseException:
            op.abort()
            raise
        return op.commit()

    def _settle_effects(self, handled: Handled) -> None:
        """Execute the effects the request's op queued (after it committed); say how they ended."""
        handled.followups = self.runtime.effects.drain()
        if not handled.followups:
            return
        recorded = {report.op for report in handled.followups}
        settled = [effect for effect in self.runtime.effects.effects()
                   if effect["recorded_op"] in recorded]
        result = handled.reply.get("result")
        if isinstance(result, dict):
            result["effects"] = _plain(settled)

    def _ok(self, request: Request, result: dict[str, Any],
            events: list[dict[str, Any]] | None = None) -> Handled:
        return Handled(reply=ok_reply(request.action, result), events=events or [])

    # -- principals and names ---------------------------------------------------------

    def _principal(self, name: str | None) -> str:
        if name is None or name == HUMAN:
            return HUMAN
        if name not in self.runtime.registry.principals:
            known = sorted(self.runtime.registry.principals)
            raise ProtocolError(
                "unknown_principal", f"there is no principal {name[:80]!r}; the principals are "
                f"human{', ' if known else ''}{', '.join(known[:20])}. Add an agent first "
                "(action add_agent).", {"principal": name[:80], "known": ["human", *known]})
        return name

    def _may_read(self, principal: str, name: str) -> bool:
        if principal == HUMAN:
            return True
        if name == f"kernos:ns:{principal}":
            return True
        return (not name.startswith("kernos:")
                and self.runtime.registry.find(principal, "read", name) is not None)

    def _version(self, name: str) -> int | None:
        meta = self.image.meta.get(name)
        return None if meta is None else meta.version

    # -- reads --------------------------------------------------------------------------

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
        return self._ok(request, {"grants": _plain(self.runtime.grants(agent))})

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
            tools.append(_plain(tool))
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
                "message": entry.headline,
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
            "unpersisted": shown["unpersisted"]})

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
                        for name, (old, new) in result.changed.items()]})

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

    # -- memory (kernos.memory) ------------------------------------------------------------

    def _memory_principal(self, request: Request, capability: str) -> str:
        principal = self._principal(request.get("principal"))
        if principal != HUMAN and self.runtime.registry.find(
                principal, "memory", capability) is None:
            raise CapabilityDenied(principal, f"memory:{capability}")
        return principal

    def _recall(self, request: Request) -> Handled:
        from kernos.memory.sources import may_read_for

        principal = self._memory_principal(request, "read")
        found = self.runtime.memory.recall(
            principal, request.get("query"), k=request.get("k", 5), kinds=request.get("kinds"),
            may_read=may_read_for(self.runtime.registry, principal))
        return self._ok(request, {"memories": found})

    def _remember(self, request: Request) -> Handled:
        principal = self._memory_principal(request, "write")
        source = json.dumps({"action": "remember", **request.fields}, sort_keys=True)
        op = self._begin(principal=principal, source=source, kind="harness",
                         note=f"remember ({principal})", reach=Reach(frozenset()))
        try:
            if principal != HUMAN:  # an agent's op like any other: its circuit, its grant
                from kernos.agents.supervisor import fingerprint

                self.runtime.breakers.admit(principal, op, lambda: fingerprint(
                    "remember", repr(request.get("fact"))[:10_000]))
                grant = self.runtime.registry.find(principal, "memory", "write")
                if grant is not None:
                    op.grants_used[grant.id] = grant.capability
            fact = self.runtime.memory.remember(principal, request.get("fact"),
                                                request.get("tags") or [])
        except CircuitOpen as error:
            op.abort()
            raise ProtocolError("denied", str(error), {"type": "CircuitOpen",
                                                       "policy": error.policy}) from None
        except BaseException:
            op.abort()
            raise
        report = op.commit()
        return self._ok(request, {"fact": fact, "op": report.op, "commit": report.commit},
                        report.events)

    def _memory(self, request: Request) -> Handled:
        command = request.get("command")
        if command not in ("stats", "rebuild"):
            raise ProtocolError("malformed", f"the memory command is 'stats' or 'rebuild', "
                                f"not {str(command)[:40]!r}")
        memory = self.runtime.memory
        if command == "rebuild":
            memory.rebuild()
        return self._ok(request, memory.stats())

    # -- ops ------------------------------------------------------------------------------

    def _begin(self, *, principal: str, source: str, kind: str, note: str = "",
               reach: Reach | None = None) -> Op:
        op = self.image.begin(source=source, principal=principal, kind=kind, reach=reach)
        self._began = True
        if note:
            op.note = note
        return op

    def _op(self, request: Request) -> Handled:
        principal = self._principal(request.get("principal"))
        code: str | None = request.get("code")
        tool: str | None = request.get("tool")
        arguments: dict[str, Any] = request.get("arguments") or {}
        expect: dict[str, Any] = request.get("expect") or {"versions": {}, "predicate": None}
        key: str | None = request.get("key")
        if key is not None:
            earlier = self.image.audit.committed_with_key(key)
            if earlier is not None:  # a redelivery: answer it, run nothing, record nothing
                return self._ok(request, _duplicate(earlier, principal).to_json())
        if tool is not None:
            source = json.dumps({"tool": tool, "arguments": arguments}, sort_keys=True,
                                default=str)
            op = self._begin(principal=principal, source=source, kind="harness",
                             note=f"call {tool}", reach=Reach(frozenset()))
        else:
            assert code is not None
            op = self._begin(principal=principal, source=code, kind="harness")
        op.key = key
        started = time.perf_counter()
        output = _BoundedText()
        value: Value | None = None
        try:
            self._check_expectations(op, principal, expect)
            with self.interruptible(op.id, key), \
                    contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                if tool is not None:
                    result = self.runtime.call_as(principal, tool, arguments)
                    value = value_of(result)
                elif principal == HUMAN:
                    value = self._run_human(code or "")
                else:
                    run = self.runtime.run(principal, code, keep_value=True)
                    output.write(run.output)
                    value = value_of(run.value) if run.has_value else None
        except _Conflict as conflict:
            op.abort(status="conflict", error=("Conflict", str(conflict)))
            return self._ok(request, self._not_committed(
                op, principal, output, error=ErrorInfo(
                    kind="conflict", message=str(conflict),
                    data={"versions": conflict.versions}),
                versions=conflict.versions).to_json())
        except ProtocolError as problem:  # a precondition that cannot be evaluated
            op.abort(status="rejected", error=(f"RequestRejected:{problem.kind}", str(problem)))
            raise
        except BaseException as error:  # any failure rolls the op back, unless kept
            if (request.get("on_error") == "keep" and principal == HUMAN and tool is None
                    and isinstance(error, Exception) and not op.vetoes):
                op.keep_failed(type(error).__name__, str(error))
                return self._ok(request, *self._commit(op, principal, output, None, expect,
                                                       started))
            op.abort(error=error)
            status = op.outcome[0]
            return self._ok(request, self._not_committed(
                op, principal, output, error=_error_info(error, status)).to_json())
        return self._ok(request, *self._commit(op, principal, output, value, expect, started))

    def _check_expectations(self, op: Op, principal: str, expect: dict[str, Any]) -> None:
        versions: dict[str, int] = expect.get("versions") or {}
        missing = [name for name, version in versions.items()
                   if version > 0 and name not in self.image.meta]
        if missing:
            raise ProtocolError(
                "precondition", f"the precondition names {missing[:5]}, which do not exist; "
                "nothing ran. Expect version 0 for a name that must not exist yet, or read "
                "the current versions (action versions) first.", {"missing": missing[:20]})
        hidden = [name for name in versions if not self._may_read(principal, name)]
        if hidden:
            raise ProtocolError("denied", f"{principal!r} may not read {hidden[:5]}, so it "
                                "cannot state preconditions on them", {"names": hidden[:20]})
        current = {name: self._version(name) for name in versions}
        stale = {name: version for name, version in versions.items()
                 if (current[name] or 0) != version}
        if stale:
            raise _Conflict(
                "stale read: " + ", ".join(f"{name} is at version {current[name] or 0}, not "
                                           f"{version}" for name, version in
                                           list(stale.items())[:5])
                + "; nothing ran. Read again, decide again, and resend with the new versions.",
                current)
        predicate = expect.get("predicate")
        if predicate is not None and not self._predicate(principal, predicate):
            raise _Conflict(f"the predicate {predicate[:80]!r} is false; nothing ran",
                            current)

    def _predicate(self, principal: str, predicate: str) -> bool:
        try:
            if principal == HUMAN:
                code = compile(predicate, "<kernos-precondition>", "eval")
                return bool(eval(code, self._globals()))  # the human is trusted
            run = self.runtime.run(principal, predicate, keep_value=True)
            return bool(run.has_value and run.value)
        except SyntaxError as error:
            raise ProtocolError("precondition", f"the predicate is not an expression: "
                                f"{error.msg}; nothing ran") from None
        except AgentCodeRejected as error:
            raise ProtocolError("precondition", f"the predicate was refused: {error}; "
                                "nothing ran") from None

    def _globals(self) -> dict[str, Any]:
        namespace = self.image.namespace
        if not isinstance(namespace, dict):
            raise UsageError("human code runs only in an image whose namespace is a dict")
        return namespace

    def _run_human(self, code: str) -> Value | None:
        """Run ordinary Python in the namespace; the value of a final expression, if any."""
        namespace = self._globals()
        if self.cell_runner is not None:
            has_value, result = self.cell_runner(code, namespace)
            return value_of(result) if has_value else None
        # dont_inherit: compile() would otherwise add this module's own __future__ flags
        # (annotations) to the user's functions.
        tree = ast.parse(code, HARNESS_FILENAME, "exec")
        final = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body.pop()
            assert isinstance(last, ast.Expr)
            final = compile(ast.Expression(body=last.value), HARNESS_FILENAME, "eval",
                            dont_inherit=True)
        exec(compile(tree, HARNESS_FILENAME, "exec", dont_inherit=True), namespace)
        if final is None:
            return None
        return value_of(eval(final, namespace))

    def _commit(self, op: Op, principal: str, output: _BoundedText, value: Value | None,
                expect: dict[str, Any], started: float) -> tuple[dict[str, Any],
                                                                  list[dict[str, Any]]]:
        try:
            report = op.commit()
        except (OpVetoed, CommitFailed) as error:
            status = op.outcome[0]
            return self._not_committed(op, principal, output,
                                       error=_error_info(error, status)).to_json(), []
        names = [*expect.get("versions", {}), *report.added, *report.changed]
        result = OpResult(
            status="committed", principal=principal, op=report.op, commit=report.commit,
            value=value, output=output.text(), added=report.added, changed=report.changed,
            failed=report.failed,
            deleted=report.deleted, events=report.events,
            versions={name: self._version(name) for name in names},
            timings_ms={**report.timings_ms,
                        "request": (time.perf_counter() - started) * 1000},
            audit=report.audit)
        return result.to_json(), report.events

    def _not_committed(self, op: Op, principal: str, output: _BoundedText, *,
                       error: ErrorInfo, versions: dict[str, int | None] | None = None
                       ) -> OpResult:
        index, digest = self.image.audit.head()
        aborted = op.abort_report
        return OpResult(status=op.outcome[0], principal=principal, op=op.id,
                        output=output.text(), error=error, versions=versions or {},
                        audit={"index": index, "hash": digest},
                        undone=None if aborted is None else aborted.undone())

    def _human_op(self, request: Request, note: str, body: Callable[[Op], Any]) -> Handled:
        source = json.dumps({"action": request.action, **request.fields}, sort_keys=True)
        op = self._begin(principal=HUMAN, source=source, kind="harness", note=note,
                         reach=Reach(frozenset()))
        try:
            result = body(op)
        except BaseException:
            op.abort()
            raise
        report = op.commit()
        return self._ok(request, {**result, "op": report.op, "commit": report.commit},
                        report.events)

    def _grant(self, request: Request) -> Handled:
        agent, capability = request.get("agent"), request.get("capability")
        self._principal(agent)
        return self._human_op(request, f"grant {agent} {capability}", lambda op: {
            "grant": _plain(self.runtime.grant(agent, capability, request.get("limit")))})

    def _revoke(self, request: Request) -> Handled:
        agent, capability = request.get("agent"), request.get("capability")
        self._principal(agent)
        return self._human_op(request, f"revoke {agent} {capability}", lambda op: {
            "revoked": self.runtime.revoke(agent, capability)})

    # -- the supervisor (kernos.agents.supervisor) ----------------------------------------

    def _human_only(self, request: Request, what: str) -> None:
        principal = self._principal(request.get("principal"))
        if principal != HUMAN:
            raise ProtocolError("denied", f"only the human may {what}; {principal!r} may not "
                                "(an agent can neither close its circuit nor loosen its "
                                "policy)", {"principal": principal})

    def _policy(self, request: Request) -> Handled:
        agent: str = request.get("agent")
        breakers = self.runtime.breakers
        figures = request.get("set")
        if figures is None:
            self._principal(agent)
            return self._ok(request, self._policy_of(agent))
        self._human_only(request, "set a circuit-breaker policy")
        self._principal(agent)
        return self._human_op(request, f"policy {agent}", lambda op: {
            **self._policy_of(agent, breakers.set_policy(agent, **figures))})

    def _policy_of(self, agent: str, effective: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
        breakers = self.runtime.breakers
        own = breakers.supervision.policies.get(agent)
        return {"agent": agent,
                "policy": effective or breakers.effective(agent).describe(),
                "own": {} if own is None else own.describe()}

    def _circuit(self, request: Request) -> Handled:
        agent: str | None = request.get("agent")
        names = [self._principal(agent)] if agent is not None else \
            sorted(self.runtime.registry.principals)
        breakers = self.runtime.breakers
        pending = {(trip.agent, trip.op) for trip in breakers.pending()}
        circuits: dict[str, Any] = {}
        for name in names:
            trip = breakers.circuit(name)
            circuits[name] = None if trip is None else {
                "policy": trip.policy, "limit": trip.limit, "figures": trip.figures,
                "message": trip.message, "op": trip.op, "at": trip.at,
                "announced": (trip.agent, trip.op) not in pending}
        safe = {name: breakers.safe_point(name) for name in names}
        return self._ok(request, {"circuits": circuits, "safe": safe})

    def _reset(self, request: Request) -> Handled:
        agent: str = request.get("agent")
        self._human_only(request, "close a circuit")
        self._principal(agent)
        return self._human_op(request, f"reset {agent}", lambda op: _plain(
            self.runtime.breakers.reset(agent, restore=request.get("restore"))))

    def _add_agent(self, request: Request) -> Handled:
        agent = request.get("agent")
        return self._human_op(request, f"add agent {agent}", lambda op: {
            "agent": self.runtime.add_agent(agent, limits=request.get("limits"))})

    def _loop(self, request: Request) -> Handled:
        """An agent's loop: start, pause, resume, stop (each a human op), or status."""
        from kernos.agents import loop

        do: str = request.get("do")
        agent: str | None = request.get("agent")
        if agent is not None:
            self._principal(agent)
        if do == "status":
            outputs = loop.outputs_of(self.runtime)
            since = request.get("since_op")
            found = [entry for entry in loop.loops(self.image)
                     if agent is None or entry["agent"] == agent]
            for entry in found:
                entry["output"] = outputs.last(entry["agent"])
                if since is not None:
                    entry["outputs"] = outputs.since(entry["agent"], since)
            return self._ok(request, {"loops": _plain(found)})
        assert agent is not None
        if do == "start":
            return self._human_op(request, f"loop start {agent}", lambda op: {
                "loop": _plain(loop.start(
                    self.runtime, agent, request.get("step"),
                    every_ms=request.get("every_ms", 0),
                    max_iterations=request.get("max_iterations"), plan=request.get("plan"),
                    pending=request.get("pending") or ()))})
        status = {"pause": "paused", "resume": "running", "stop": "stopped"}[do]
        return self._human_op(request, f"loop {do} {agent}", lambda op: {
            "loop": _plain(loop.set_status(self.runtime, agent, status,
                                           request.get("reason")))})

    def _checkout(self, request: Request) -> Handled:
        ref: str = request.get("ref")
        op = self._begin(principal=HUMAN, source=json.dumps({"action": "checkout", "ref": ref}),
                         kind="harness", reach=Reach(frozenset()))
        started = time.perf_counter()
        try:
            report = self.progress
            checkout = op.checkout(ref, None if report is None else
                                   lambda done, total: report("checkout", done, total))
        except BaseException:
            op.abort()
            raise
        result, events = self._commit(op, HUMAN, _BoundedText(), None,
                                      {"versions": {}}, started)
        result["checkout"] = dict(checkout.__dict__)
        return self._ok(request, result, events)

    def _fork(self, request: Request) -> Handled:
        """A new workspace beside this one, from one of its snapshots (``kernos.fork``).

        ``dest`` is a bare name (:data:`kernos.fork.FORK_NAME`, an allowlist, never a
        path); :func:`kernos.fork.fork_destination` puts it beside this workspace, as it
        does for ``kernos fork``."""
        name: str = request.get("dest")
        if not FORK_NAME.fullmatch(name):
            raise ProtocolError("invalid", f"fork: the new workspace's name {name[:60]!r} is "
                                "not 1-100 letters, digits, '.', '_' or '-' (not starting "
                                "with '.'); it is a name, made beside this workspace, not a "
                                "path")
        source = Path(self.image.workspace.path)
        made = fork(source, name, request.get("ref") or "HEAD")
        return self._ok(request, {**made.to_json(),
                                  "open": {"env": {"KERNOS_WORKSPACE": made.dest}}})

    # -- rejections -------------------------------------------------------------------------

    def _refused(self, request: Request) -> Handled:
        """An adapter (the MCP server, say) refused a request before it reached the kernel:
        give it the audit record every kernel-side refusal gets."""
        principal = self._principal(request.get("principal"))
        via, what = request.get("via")[:40], request.get("what")[:200]
        problem = ProtocolError("invalid", f"{via} refused {what}: {request.get('problem')}"
                                [:2000])
        before = self.image.audit.head()[0]
        self._record_rejection({"principal": principal}, "refused", problem,
                               detail={"via": via, "what": what})
        index, digest = self.image.audit.head()
        return self._ok(request, {"recorded": index != before,
                                  "audit": {"index": index, "hash": digest}})

    def _record_rejection(self, content: object, action: str | None,
                          error: ProtocolError, *, detail: dict[str, str] | None = None) -> None:
        """Give a refused request its audit record: an op aborted before any body ran."""
        claimed = content.get("principal") if isinstance(content, dict) else None
        principal = claimed if (type(claimed) is str and (
            claimed == HUMAN or claimed in self.runtime.registry.principals)) else "unknown"
        if self.image.current is not None:  # refused while an op runs: it must not wait
            return
        summary = {"action": action, "kind": error.kind, **(detail or {})}
        if principal == "unknown" and type(claimed) is str:
            summary["claimed_principal"] = claimed[:80]
        try:
            op = self.image.begin(source=json.dumps(summary, sort_keys=True),
                                  principal=principal, kind="harness", reach=Reach(frozenset()))
            op.note = f"rejected {action or 'request'}"
            op.abort(status="conflict" if error.kind == "conflict" else "rejected",
                     error=(f"RequestRejected:{error.kind}", str(error)))
        except (KernosError, OSError) as failure:  # a full disk, say: the reply still goes
            log.warning("kernos: the rejection of a %s request could not be recorded: %s",
                        action or "malformed", failure)


def _elapsed_ms(started: object, finished: object) -> float | None:
    if not isinstance(started, str) or not isinstance(finished, str):
        return None
    try:
        delta = datetime.fromisoformat(finished) - datetime.fromisoformat(started)
    except ValueError:
        return None
    return round(delta.total_seconds() * 1000, 3)


def _duplicate(record: dict[str, Any], principal: str) -> OpResult:
    changes = record.get("changes") or {}
    return OpResult(
        status="committed", principal=str(record.get("principal", principal)),
        op=record.get("op"), commit=record.get("commit"), duplicate=True,
        added=list(changes.get("added", [])), changed=list(changes.get("changed", [])),
        deleted=list(changes.get("deleted", [])),
        audit={"index": record.get("index"), "hash": record.get("hash")})


def _error_info(error: BaseException, status: str) -> ErrorInfo:
    data: dict[str, Any] = {"type": type(error).__name__}
    if isinstance(error, CapabilityDenied):
        data["capability"] = error.capability
    if isinstance(error, OpVetoed):
        data["reasons"] = [reason[:300] for reason in error.reasons[:10]]
    try:
        text = str(error)[:2000]
    except Exception:  # an exception whose message cannot be built
        text = "(its message could not be read)"
    message = text if isinstance(error, KernosError) else f"{type(error).__name__}: {text}"
    return ErrorInfo(kind=status, message=message, data=data)


def _as_protocol_error(error: KernosError) -> ProtocolError:
    if isinstance(error, UnknownAgent):
        kind = "unknown_principal"
    elif isinstance(error, UnknownTool):
        kind = "unknown_tool"
    elif isinstance(error, UnknownRef):
        kind = "unknown_ref"
    elif isinstance(error, CapabilityDenied):
        kind = "denied"
    elif isinstance(error, (InvalidGrant, UsageError, RestoreError)):
        kind = "invalid"
    else:
        kind = "internal"
    return ProtocolError(kind, str(error)[:2000], {"type": type(error).__name__})


def _plain(value: Any) -> Any:
    """Registry descriptions as JSON (Decimal amounts become strings)."""
    return json.loads(json.dumps(value, default=str))
