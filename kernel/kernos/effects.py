"""External effects: queued in the op, executed after it commits, exactly once.

A tool registered with ``effect="external"`` (a payment, an email, an HTTP
call) cannot be rolled back, so it never runs inside an op that might still
roll back.  Kernos uses the **outbox** semantics:

1. *Queue.*  Calling the tool inside an op runs nothing.  It adds an
   :class:`Effect` to the image's outbox (``kernos:effects``) with status
   ``queued`` and returns a ticket (``{"effect": KEY, "status": "queued"}``).
   The outbox commits or rolls back with the op: an op that rolls back
   queued nothing, so nothing of it ever reaches the world.
2. *Execute.*  After the op commits, :meth:`EffectRunner.drain` runs each
   queued effect, outside any op.  Before calling the implementation it
   appends an ``effect`` record with state ``started`` to the audit log
   (synced); after the implementation returns, a record with state
   ``done`` and the result.  The audit log is the journal: append-only,
   hash-chained, and never rolled back.
3. *Record.*  A follow-up op, by the principal that called the tool (kind
   ``effect``), sets each effect's status, result and attempts in the outbox;
   its audit record lists them.  An op that queued the effects of several
   principals (a subscriber's, say) is followed by one such op per principal.

**Idempotency key.**  ``<workspace>-<op>-<position>``: the workspace part
(from the audit log's genesis record) keeps two workspaces that share a
payment provider apart; the op id and the call's position in the op make it
unique within one.  The implementation receives it as the keyword argument
``idempotency_key`` and should pass it on to the outside service, which is
what makes retries safe.

**Bound to the request.**  Every journal record carries the hash of the
request (tool, version, the code of that version, and the arguments).  A
recorded result is used only for the same hash; a different request under
the same key is refused, never answered with another request's result.

**Crashes.**  What the journal says about a queued effect when a drain
starts (after a restart, say) decides what happens:

=================  ======================================================
nothing            never started: execute it
``done``           executed and journaled, not yet in the image: record it
``failed``         gave up after its attempts: record the failure
``error``          an attempt raised: retry with the next attempt
``started``        **in doubt**: it may or may not have happened.  If the
                   tool has a ``resolve`` function, it is asked, with the
                   key, whether the effect happened (``(True, result)``) or
                   not (``(False, None)``); else the effect is marked
                   ``in-doubt`` in the image and waits for a person to
                   resolve it (:meth:`EffectRunner.resolve`).  Never
                   executed again blindly.
=================  ======================================================

**Timeouts.**  An attempt runs in a worker thread (the tool's ``timeout``,
60 s unless registered otherwise).  One still running when its time is up
may yet touch the world, so its effect is journaled ``in-doubt`` and the
drain goes on: the kernel is free, nothing is retried, and a person resolves
it by its key.  ``timeout=None`` runs the implementation unbounded in the
caller's thread (for code bound to its thread).

**Retries.**  An implementation that raises is retried with exponential
backoff (``backoff * 2**(attempt-1)`` seconds) up to the tool's ``attempts``;
the last failure is recorded, so it is visible in the image (status
``failed`` and the error) and in the audit log.

Contracts: :func:`queue` is called by the agent runtime inside an op;
:meth:`EffectRunner.drain` by whatever finished an op (the kernel after a
cell, the harness service after a request, the kernel after its start-up
restore), never inside an op.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import reprlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kernos import _faults
from kernos.audit.canonical import canonical, check_json
from kernos.errors import DiskFull, EventError, KernosError, UsageError

if TYPE_CHECKING:
    from kernos.image import Image
    from kernos.op import CommitReport, Op

__all__ = ["OUTBOX", "STATUSES", "Effect", "EffectRunner", "EffectsHost", "Outbox", "Tool",
           "ToolShelf", "queue", "request_hash"]

OUTBOX = "kernos:effects"
STATUSES = ("queued", "done", "failed", "in-doubt")
DEFAULT_ATTEMPTS = 3
DEFAULT_BACKOFF = 0.05
DEFAULT_TIMEOUT = 60.0
"""Seconds an attempt may run before its effect is left in doubt (per tool: ``timeout``)."""
"""Seconds before the second attempt; doubled for each later one."""
MAX_BACKOFF = 5.0
MAX_RESULT_BYTES = 64 * 1024
"""A larger result is recorded as a bounded repr, with a note."""

log = logging.getLogger(__name__)


# -- what effects need of the agent runtime (which sits above them) ----------------------------


class Tool(Protocol):
    """One version of an external tool, as effects read it (a
    :class:`kernos.agents.registry.ToolVersion` is one).  Optional attributes a version
    may carry are read with ``getattr`` and their defaults here: ``attempts``
    (:data:`DEFAULT_ATTEMPTS`), ``backoff`` (:data:`DEFAULT_BACKOFF`), ``timeout``
    (:data:`DEFAULT_TIMEOUT`) and ``resolve`` (None)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def function(self) -> Callable[..., Any]: ...
    @property
    def source(self) -> str | None: ...


class ToolShelf(Protocol):
    """The tool versions by name, oldest first (``kernos.agents.registry.Registry.tools``)."""

    @property
    def tools(self) -> Mapping[str, Sequence[Tool]]: ...


class EffectsHost(Protocol):
    """What queueing and the :class:`EffectRunner` need of their host (the agent runtime,
    ``kernos.agents.runtime.AgentRuntime``): the image, and the registry's tool versions."""

    @property
    def image(self) -> Image: ...
    @property
    def registry(self) -> ToolShelf: ...


@dataclass(kw_only=True)
class Effect:
    """One external effect, as the image holds it."""

    key: str
    """The idempotency key: ``<workspace>-<op>-<position>``."""
    op: int
    """The op that queued it."""
    position: int
    """Its position among that op's effects (0, 1, ...)."""
    principal: str
    """Who called the tool."""
    tool: str
    version: int
    request: str
    """SHA-256 of the canonical request (tool, version, its code, arguments)."""
    arguments: dict[str, Any]
    status: str = "queued"
    """``queued``, ``done``, ``failed`` or ``in-doubt``."""
    result: Any = None
    error: str | None = None
    attempts: int = 0
    recorded_op: int | None = None
    """The follow-up op that recorded its outcome."""
    resolution: dict[str, Any] | None = None
    """A person's answer for an in-doubt effect, until a drain journals it."""

    def describe(self) -> dict[str, Any]:
        return {"key": self.key, "op": self.op, "position": self.position,
                "principal": self.principal, "tool": self.tool, "version": self.version,
                "request": self.request, "arguments": self.arguments, "status": self.status,
                "result": self.result, "error": self.error, "attempts": self.attempts,
                "recorded_op": self.recorded_op}


@dataclass
class Outbox:
    """Every effect of the image, by key (persisted as ``kernos:effects``)."""

    effects: dict[str, Effect] = field(default_factory=dict)

    def waiting(self) -> list[Effect]:
        """Queued effects, oldest first."""
        return sorted((e for e in self.effects.values() if e.status == "queued"),
                      key=lambda e: (e.op, e.position))


# -- queueing, inside an op ----------------------------------------------------------------


def request_hash(version: Tool, arguments: dict[str, Any]) -> str:
    """What a recorded outcome is bound to: the tool version, its code and the arguments."""
    return hashlib.sha256(canonical({
        "tool": version.name, "version": version.version, "code": code_identity(version),
        "arguments": arguments})).hexdigest()


def code_identity(version: Tool) -> str:
    """A digest of the code a tool version runs (its source, or its compiled code)."""
    if version.source is not None:
        return hashlib.sha256(version.source.encode("utf-8", "surrogatepass")).hexdigest()
    function = version.function
    code = getattr(function, "__code__", None)
    name = f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', '')}"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass"))
    if code is not None:
        digest.update(code.co_code)
        digest.update(repr(code.co_consts).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def workspace_tag(runtime: EffectsHost) -> str:
    """The workspace part of idempotency keys (see :attr:`Image.identity`)."""
    return runtime.image.identity


def queue(runtime: EffectsHost, op: Op, principal: str, version: Tool,
          arguments: dict[str, Any]) -> dict[str, Any]:
    """Queue a call of an external tool in ``op``; the ticket the caller gets back."""
    try:
        check_json(arguments, what=f"the arguments of {version.name}")
    except EventError as error:
        raise UsageError(f"{str(error).rstrip('.')}; an external effect's arguments are "
                         "recorded as JSON") from None
    image = runtime.image
    outbox = image.system.get(OUTBOX)
    if not isinstance(outbox, Outbox):
        outbox = Outbox()
        image.bind(OUTBOX, outbox)
    op.touch(OUTBOX)
    position = len(op.effects)
    effect = Effect(key=f"{workspace_tag(runtime)}-{op.id}-{position}", op=op.id,
                    position=position, principal=principal, tool=version.name,
                    version=version.version, request=request_hash(version, arguments),
                    arguments=arguments)
    outbox.effects[effect.key] = effect
    op.effects.append({"key": effect.key, "tool": effect.tool, "version": effect.version,
                       "request": effect.request, "status": "queued"})
    return {"effect": effect.key, "status": "queued", "tool": version.name}


# -- executing and recording, after the op ---------------------------------------------------


@dataclass(kw_only=True)
class _Outcome:
    key: str
    status: str
    result: Any = None
    error: str | None = None
    attempts: int = 0

    def audit(self) -> dict[str, Any]:
        found: dict[str, Any] = {"key": self.key, "status": self.status,
                                 "attempts": self.attempts}
        if self.error is not None:
            found["error"] = self.error
        return found


_JOURNAL_FULL = {
    "started": "The effect {key} was not executed: it stays queued, and is executed after "
               "the next op that commits once there is space.",
    "done": "The effect {key} was executed, but its result is not journaled: the journal "
            "says it started, so after the next op that commits it is in doubt, and its "
            "tool's resolve function (or a person) says whether it happened. It is never "
            "executed again blindly.",
    "": "The effect {key} stays queued; its state is settled again after the next op "
        "that commits.",
}
"""What a full disk at each journal record means for the effect (see the table above)."""


class EffectRunner:
    """Executes queued effects and records their outcomes (see the module docstring)."""

    def __init__(self, runtime: EffectsHost, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.runtime = runtime
        self.sleep = sleep
        self.replaying = False
        """In a replay, effects are never executed: only recorded outcomes are taken."""

    @property
    def outbox(self) -> Outbox:
        found = self.runtime.image.system.get(OUTBOX)
        return found if isinstance(found, Outbox) else Outbox()

    def effects(self) -> list[dict[str, Any]]:
        return [effect.describe() for effect in sorted(
            self.outbox.effects.values(), key=lambda e: (e.op, e.position))]

    def drain(self, recorded: dict[str, dict[str, Any]] | None = None) -> list[CommitReport]:
        """Execute every queued effect and record the outcomes; the follow-up ops' reports.

        Never raises for an effect's failure: that is recorded.  Nor for a
        journal that finds the disk full: that is logged, and the effects not
        settled stay queued for the next drain (see ``_JOURNAL_FULL``).  Called
        outside any op; does nothing (cheaply) when nothing is queued.

        ``recorded`` (replay): the outcomes to record instead, by key, each
        with the ``request`` hash it was recorded for; nothing is executed,
        and an effect without one stays queued.
        """
        image = self.runtime.image
        if image.current is not None:
            raise UsageError("effects are executed after an op, not inside one")
        if self.replaying and recorded is None:
            return []
        waiting = self.outbox.waiting()
        if recorded is not None:
            return self._replayed(waiting, recorded)
        if not waiting:
            return []
        # The ops that queued them may still wait for their sync (a group commit): an
        # effect reaches the world only once its op is durable.
        image.workspace.make_durable()
        # One follow-up op per queuing op and principal: an op can queue the effects of
        # several (a subscriber's run as it, inside the emitter's op), and each one's
        # outcomes are recorded by an op of its own principal, never of another.
        by_op: dict[tuple[int, str], list[Effect]] = {}
        for effect in waiting:
            by_op.setdefault((effect.op, effect.principal), []).append(effect)
        reports = []
        for effects in by_op.values():
            try:
                outcomes = [self._settle(effect) for effect in effects]
            except DiskFull as error:  # the journal found no room: stop, the next drain resumes
                log.warning("kernos: %s", error)
                break
            report = self._record(effects[0].principal, effects[0].op, outcomes)
            if report is not None:
                reports.append(report)
        return reports

    def _replayed(self, waiting: list[Effect],
                  recorded: dict[str, dict[str, Any]]) -> list[CommitReport]:
        chosen = [effect for effect in waiting if effect.key in recorded]
        if not chosen:
            raise UsageError("the original recorded effects here, but the replay queued none "
                             f"of them ({', '.join(sorted(recorded)[:5])})")
        outcomes = []
        for effect in chosen:
            found = recorded[effect.key]
            if found.get("request") != effect.request:
                raise UsageError(f"effect {effect.key} ({effect.tool}) was requested with other "
                                 "arguments or another tool version than in the original")
            outcomes.append(_Outcome(key=effect.key, status=str(found["status"]),
                                     result=found.get("result"), error=found.get("error"),
                                     attempts=int(found.get("attempts", 0))))
        report = self._record(chosen[0].principal, chosen[0].op, outcomes)
        return [] if report is None else [report]

    def resolve(self, op: Op, key: object, *, executed: object,
                result: object = None) -> dict[str, Any]:
        """A person's answer for an in-doubt effect, inside ``op``; the next drain journals it."""
        outbox = self.outbox
        effect = outbox.effects.get(key) if type(key) is str else None
        if effect is None:
            raise UsageError(f"there is no effect {str(key)[:80]!r}; `agents.effects()` lists "
                             "them")
        if effect.status != "in-doubt":
            raise UsageError(f"effect {effect.key} is {effect.status}, not in doubt: only an "
                             "in-doubt effect is resolved by hand")
        if type(executed) is not bool:
            raise UsageError("resolve() needs executed=True (it happened; give its result) or "
                             "executed=False (it did not; it will be executed)")
        if executed:
            try:
                check_json(result, what="the result")
            except EventError as error:
                raise UsageError(str(error)) from None
        effect.resolution = {"executed": executed, "result": _plain(result), "by": op.principal,
                             "op": op.id}
        effect.status = "queued"
        op.touch(OUTBOX)
        return effect.describe()

    # -- one effect ----------------------------------------------------------------------

    def _journal(self, effect: Effect, state: str, attempt: int, **fields: Any) -> None:
        try:
            self.runtime.image.audit.append({
                "type": "effect", "key": effect.key, "op": effect.op, "tool": effect.tool,
                "version": effect.version, "request": effect.request, "state": state,
                "attempt": attempt, **fields})
        except DiskFull as error:  # the drain stops here; the next one picks up from the journal
            raise error.retold(_JOURNAL_FULL.get(state, _JOURNAL_FULL[""]).format(
                key=effect.key)) from error

    def _settle(self, effect: Effect) -> _Outcome:
        audit = self.runtime.image.audit
        last = audit.effect_state(effect.key)
        if last is not None and last.get("request") != effect.request:
            return _Outcome(key=effect.key, status="failed", attempts=int(last.get("attempt", 0)),
                            error="a different request was recorded under this key; refusing "
                                  "to reuse its outcome")
        last = last or {}
        state = last.get("state")
        attempt = int(last.get("attempt", 0))
        if state == "done":
            return _Outcome(key=effect.key, status="done", result=last.get("result"),
                            attempts=attempt)
        if state in ("failed", "in-doubt") and effect.resolution is None:
            return _Outcome(key=effect.key, status=state, error=last.get("error"),
                            attempts=attempt)
        if state in ("started", "in-doubt"):
            answer = self._resolve(effect)
            if answer is None:
                self._journal(effect, "in-doubt", attempt,
                              error="it may have happened: resolve it by its key")
                return _Outcome(key=effect.key, status="in-doubt", attempts=attempt,
                                error="started but never confirmed (the kernel stopped); the "
                                      "tool has no resolve function: check by its key, then "
                                      "agents.resolve_effect(key, executed=...)")
            executed, result, how = answer
            if executed:
                self._journal(effect, "done", attempt, result=result, resolved=how)
                return _Outcome(key=effect.key, status="done", result=result,
                                attempts=attempt)
            self._journal(effect, "absent", attempt, resolved=how)
        return self._execute(effect, attempt)

    def _resolve(self, effect: Effect) -> tuple[bool, Any, str] | None:
        """Whether an in-doubt effect happened: a person's answer, or the tool's resolver."""
        if effect.resolution is not None:
            answer = effect.resolution
            return (bool(answer["executed"]), answer.get("result"),
                    f"{answer.get('by')} in op {answer.get('op')}")
        version = self._version(effect)
        resolver = getattr(version, "resolve", None) if version is not None else None
        if resolver is None:
            return None
        try:
            found = resolver(effect.key)
            executed, result = found
        except Exception as error:
            log.warning("kernos: resolving effect %s failed: %s", effect.key, error)
            return None
        return bool(executed), _plain(result), "the tool's resolve function"

    def _version(self, effect: Effect) -> Tool | None:
        versions = self.runtime.registry.tools.get(effect.tool, [])
        if 0 < effect.version <= len(versions):
            return versions[effect.version - 1]
        return None

    def _execute(self, effect: Effect, attempt: int) -> _Outcome:
        version = self._version(effect)
        if version is None:
            self._journal(effect, "failed", attempt, error="the tool version is gone")
            return _Outcome(key=effect.key, status="failed", attempts=attempt,
                            error=f"tool {effect.tool} v{effect.version} is not in the image")
        limit = max(1, int(getattr(version, "attempts", DEFAULT_ATTEMPTS)))
        backoff = float(getattr(version, "backoff", DEFAULT_BACKOFF))
        timeout = getattr(version, "timeout", DEFAULT_TIMEOUT)
        while True:
            attempt += 1
            _faults.point("effect.before")
            self._journal(effect, "started", attempt)
            _faults.point("effect.started")
            try:
                finished, result = _bounded_call(version.function, effect, timeout)
            except Exception as error:
                message = f"{type(error).__name__}: {_bounded(error)}"
                final = attempt >= limit
                self._journal(effect, "failed" if final else "error", attempt, error=message)
                if final:
                    return _Outcome(key=effect.key, status="failed", error=message,
                                    attempts=attempt)
                self.sleep(min(MAX_BACKOFF, backoff * 2 ** (attempt - 1)))
                continue
            if not finished:
                message = (f"it ran past its {timeout:g} s timeout and may still be running "
                           "(the kernel went on without it)")
                self._journal(effect, "in-doubt", attempt, error=message)
                return _Outcome(key=effect.key, status="in-doubt", attempts=attempt,
                                error=f"{message}: check by its key, then "
                                      "agents.resolve_effect(key, executed=...)")
            _faults.point("effect.executed")
            plain = _plain(result)
            self._journal(effect, "done", attempt, result=plain)
            _faults.point("effect.journaled")
            return _Outcome(key=effect.key, status="done", result=plain, attempts=attempt)

    # -- the follow-up op ------------------------------------------------------------------

    def _record(self, principal: str, queued_by: int,
                outcomes: list[_Outcome]) -> CommitReport | None:
        from kernos.analysis import Reach

        image = self.runtime.image
        source = canonical({"effects": [outcome.key for outcome in outcomes]}).decode()
        op = image.begin(source=source, principal=principal, kind="effect",
                         reach=Reach(frozenset({OUTBOX})))
        op.note = (f"effects of op {queued_by}: "
                   + ", ".join(f"{o.key.rsplit('-', 1)[-1]} {o.status}" for o in outcomes))
        try:
            outbox = image.system.get(OUTBOX)
            assert isinstance(outbox, Outbox)
            for outcome in outcomes:
                effect = outbox.effects[outcome.key]
                effect.status = outcome.status
                effect.result = outcome.result
                effect.error = outcome.error
                effect.attempts = outcome.attempts
                effect.recorded_op = op.id
                effect.resolution = None
            op.effects = [outcome.audit() for outcome in outcomes]
        except BaseException:
            op.abort()
            raise
        _faults.point("effect.record")
        try:
            return op.commit()
        except KernosError as error:  # journaled already: the next drain records it
            log.warning("kernos: recording effects failed (%s); they stay queued", error)
            return None


def _bounded_call(function: Callable[..., Any], effect: Effect,
                  timeout: float | None) -> tuple[bool, Any]:
    """Run an effect's implementation: ``(True, result)``, or ``(False, None)`` if it is
    still running after ``timeout`` seconds (it goes on in its daemon thread; nothing
    it does later is recorded).  What it raised is raised here."""
    if timeout is None:  # bound to the kernel's thread, by its registration
        return True, function(**effect.arguments, idempotency_key=effect.key)
    outcome: dict[str, Any] = {}

    def attempt() -> None:
        try:
            outcome["result"] = function(**effect.arguments, idempotency_key=effect.key)
        except BaseException as error:  # handed to the caller's thread, whatever it is
            outcome["error"] = error

    worker = threading.Thread(target=contextvars.copy_context().run, args=(attempt,),
                              name=f"kernos-effect-{effect.key}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return False, None
    if "error" in outcome:
        raise outcome["error"]
    return True, outcome.get("result")


def _plain(value: object) -> object:
    """A result as the journal can hold it: JSON, or a bounded repr with a note."""
    try:
        check_json(value, what="the result")
        data = canonical(value)
        if len(data) <= MAX_RESULT_BYTES:
            # As the journal holds it (keys sorted), so a replay records the same value.
            return json.loads(data)
    except (EventError, TypeError, ValueError):
        pass
    return {"repr": _bounded(value), "note": "not JSON (or too large): kept as a repr"}


def _bounded(value: object) -> str:
    shown = reprlib.Repr()
    shown.maxstring, shown.maxother, shown.maxlevel = 300, 300, 3
    return (str(value) if isinstance(value, BaseException) else shown.repr(value))[:1000]
