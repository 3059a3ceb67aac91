"""What every family of harness requests stands on (the core; no Jupyter).

:class:`ServiceBase` holds the image and the agent runtime a
:class:`~kernos.harness.service.HarnessService` serves, the limits and hooks its
transport sets, and the steps the request families share: who is asking
(:meth:`~ServiceBase._principal`, ``human`` or a registered agent) and which
names it may read, a name's version, the ``ok`` reply, and beginning the op a
request runs in (:meth:`~ServiceBase._begin`, which marks that the request's
own op will record it), and running a request's change as one op of a
principal (:meth:`~ServiceBase._principal_op`: its circuit first, a rollback on
any failure, every failure answered as a refusal of a known kind).

The families build on it, one module each: ``read_requests`` (reads, no op),
``op_requests`` (code and tool calls as ops, checkout and fork),
``agent_requests`` (agents, grants, circuits, loops, memory) and ``file_requests``
(the files root).
``kernos.harness.service`` joins them and owns the dispatch.  A request
handler is a method named ``_`` + the action, taking the parsed
:class:`~kernos.harness.protocol.Request` and returning a :class:`Handled`;
it raises :class:`~kernos.errors.KernosError` to refuse.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernos.analysis import Reach
from kernos.errors import CircuitOpen, CommitFailed, OpVetoed
from kernos.harness.protocol import ProtocolError, Request, ok_reply

if TYPE_CHECKING:
    from kernos.agents import AgentRuntime
    from kernos.image import Image
    from kernos.op import CommitReport, Op

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "HUMAN", "Handled", "ServiceBase", "plain"]

HUMAN = "human"
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


@dataclass(kw_only=True)
class Handled:
    """What a request produced: the reply, and the committed events to push to subscribers."""

    reply: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    followups: list[CommitReport] = field(default_factory=list)
    """Ops that recorded the outcomes of external effects, after the request's own op."""


class ServiceBase:
    """The image and runtime served, the transport's hooks, and the steps requests share."""

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

    # -- beginning an op ----------------------------------------------------------------

    def _begin(self, *, principal: str, source: str, kind: str, note: str = "",
               reach: Reach | None = None) -> Op:
        op = self.image.begin(source=source, principal=principal, kind=kind, reach=reach)
        self._began = True
        if note:
            op.note = note
        return op

    def _principal_op(self, request: Request, *, principal: str, source: str, note: str,
                      body: Callable[[Op], dict[str, Any]], same: Callable[[], str],
                      key: str | None = None,
                      refusal: Callable[[BaseException], ProtocolError | None] | None = None,
                      reported: Callable[[CommitReport], dict[str, Any]] | None = None,
                      ) -> Handled:
        """Run ``body`` as one op of ``principal``, recorded with ``source`` and ``note``.

        An agent's op is an op like any other: its circuit breaker admits it first
        (``same`` tells which ops are the same, for the repeat policy), and an open
        circuit is a ``denied`` refusal.  ``body`` returns the reply's fields; the op
        id and commit are added.  Whatever ``body`` raises rolls the op back: a
        :class:`ProtocolError` is recorded as a rejected request, an exception that
        ``refusal`` maps to one is answered as that, and anything else is raised
        again as it was.  A veto at commit is ``denied`` (a capability) or
        ``invalid``, and a commit that fails on disk is ``workspace``.  ``reported``
        adds fields taken from the commit's report (the files it changed, say).
        """
        op = self._begin(principal=principal, source=source, kind="harness", note=note,
                         reach=Reach(frozenset()))
        op.key = key
        try:
            if principal != HUMAN:
                self.runtime.breakers.admit(principal, op, same)
            result = body(op)
        except CircuitOpen as error:
            op.abort()
            raise ProtocolError("denied", str(error), {"type": "CircuitOpen",
                                                       "policy": error.policy}) from None
        except ProtocolError as problem:
            op.abort(status="rejected", error=(f"RequestRejected:{problem.kind}", str(problem)))
            raise
        except BaseException as error:
            op.abort(error=error)  # a denial vetoed it already: its record says "denied"
            refused = refusal(error) if refusal is not None else None
            if refused is None:
                raise
            raise refused from None
        try:
            report = op.commit()
        except OpVetoed as vetoed:
            kind = "denied" if op.outcome[0] == "denied" else "invalid"
            raise ProtocolError(kind, str(vetoed)[:2000], {"type": "OpVetoed"}) from None
        except CommitFailed as failed:
            raise ProtocolError("workspace", f"{request.action}: {failed}"[:2000],
                                {"type": "CommitFailed"}) from None
        if reported is not None:
            result = {**result, **reported(report)}
        return self._ok(request, {**result, "op": report.op, "commit": report.commit},
                        report.events)

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


def plain(value: Any) -> Any:
    """Registry descriptions as JSON (Decimal amounts become strings)."""
    return json.loads(json.dumps(value, default=str))
