"""The harness requests that run an op: code and tool calls (``op``), and snapshots.

:class:`OpRequests` carries out ``op``, the protocol's central action, as one
op (see ``kernos.harness.service`` for the steps): an idempotency key that a
committed op already carries answers the request as a ``duplicate``; the
preconditions (versions, a predicate) are checked inside the op, before its
body, and a stale one aborts it as ``conflict``; the body is human Python (run
in the namespace, or by the transport's ``cell_runner``), restricted agent
code, or a tool call, with what it prints captured (at most
:data:`MAX_OUTPUT_CHARS`); the op commits, or rolls back on any
``BaseException`` unless the human asked to keep a failed op
(``on_error: keep``).  The reply is an :class:`~kernos.harness.results.OpResult`.

It also carries out ``checkout`` (an op that loads a snapshot, telling the
transport's ``progress`` how far it got) and ``fork`` (a new workspace beside
this one, from one of its snapshots; no op).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos.analysis import Reach
from kernos.errors import (
    AgentCodeRejected,
    CapabilityDenied,
    CommitFailed,
    KernosError,
    OpVetoed,
    UsageError,
)
from kernos.fork import FORK_NAME, fork
from kernos.harness.protocol import ProtocolError, Request
from kernos.harness.results import ErrorInfo, OpResult, Value
from kernos.harness.serving import HUMAN, Handled, ServiceBase
from kernos.harness.values import value_of

if TYPE_CHECKING:
    from kernos.op import Op

__all__ = ["HARNESS_FILENAME", "MAX_OUTPUT_CHARS", "OpRequests"]

MAX_OUTPUT_CHARS = 64 * 1024
HARNESS_FILENAME = "<kernos-harness>"


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


class OpRequests(ServiceBase):
    """The requests that run code, a tool call or a checkout as one op, and ``fork``."""

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
                    # Echoed as the run ends, failed or not: what it printed before
                    # an error is what tells the caller why.
                    run = self.runtime.run(principal, code, output.write, keep_value=True)
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

    # -- snapshots: checkout (an op) and fork (a new workspace) ---------------------------

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
