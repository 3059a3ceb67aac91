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

The request families live one module each, and :class:`HarnessService` joins
them: ``kernos.harness.read_requests`` (reads), ``kernos.harness.op_requests``
(``op``, ``checkout``, ``fork``), ``kernos.harness.agent_requests`` (agents,
grants, circuits, loops, memory), ``kernos.harness.file_requests`` (the files
root, under the principal's grants), ``kernos.harness.session_requests`` (a
principal's conversation sessions) and ``kernos.harness.checkpoint_requests`` (a
principal's graph checkpoints), on the shared steps of
``kernos.harness.serving``.  This module holds the service's side of each
request's life: the dispatch, the audit record of a refusal, and what follows
a committed op (its external effects, and the announcement of tripped
circuits).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from kernos.analysis import Reach
from kernos.errors import (
    CapabilityDenied,
    InvalidGrant,
    KernosError,
    RestoreError,
    UnknownAgent,
    UnknownRef,
    UnknownTool,
    UsageError,
)
from kernos.harness.agent_requests import AgentRequests
from kernos.harness.checkpoint_requests import CheckpointRequests
from kernos.harness.file_requests import FileRequests
from kernos.harness.op_requests import OpRequests
from kernos.harness.protocol import (
    ACTIONS,
    MUTATING,
    ProtocolError,
    Request,
    error_reply,
    parse_request,
)
from kernos.harness.read_requests import ReadRequests
from kernos.harness.serving import HUMAN, Handled, plain
from kernos.harness.session_requests import SessionRequests

if TYPE_CHECKING:
    from kernos.op import CommitReport

__all__ = ["Handled", "HarnessService"]

log = logging.getLogger(__name__)


class HarnessService(ReadRequests, OpRequests, AgentRequests, FileRequests, SessionRequests,
                     CheckpointRequests):
    """Harness requests against one image.  Not thread-safe: one request at a time.

    Built as ``HarnessService(image, runtime, max_request_bytes=...)``; the hooks a
    transport may set (``cell_runner``, ``progress``, ``interruptible``) are
    :class:`~kernos.harness.serving.ServiceBase`'s.
    """

    # -- a request's life: dispatch, then what follows its op --------------------------

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
        except Exception as error:  # a bug, here or below: every request is still answered
            if self.image.current is not None:  # an op the handler left open rolls back
                self.image.current.abort(error=error)
            problem = ProtocolError(
                "internal", f"{request.action}: an internal error in Kernos "
                f"({type(error).__name__}: {str(error)[:500]}); its op, if it began one, "
                "rolled back. Please report it.", {"type": type(error).__name__})
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
            result["effects"] = plain(settled)

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
