"""An agent's loop that lives in the workspace: one op per iteration, resumed after a crash.

The contract (issue 20; no Jupyter here, the kernel's driver is an adapter):

**A loop** belongs to one agent and is a :class:`LoopState` in the image, as
``kernos:loop:<agent>``.  Only the human starts, pauses, resumes or stops a
loop (:func:`start`, :func:`set_status`; both refuse while agent code runs);
each of those is a change of that value in the human's op, so it commits or
rolls back with the op like any other change, and emits ``kernos.loop.status``
(payload: agent, status, iteration, reason) in it.

**An iteration is one op**, run as the agent (:func:`iterate` inside an op,
:func:`run_once` for a driver that begins and ends it): the loop's ``step``
(agent source, compiled like any agent code under RestrictedPython and the
agent's limits and grants) runs in the agent's namespace, and the same op
advances ``iteration``.  So an iteration either commits whole (its changes,
its effects, its recorded LLM calls, its events, and the advanced counter) or
not at all: after ``kill -9`` the loop resumes at the first iteration that
did not commit, and never runs a committed one again.  The op's kind is
``loop``, and its audit record (and snapshot manifest) carries
``"loop": {"agent", "iteration"}``, committed or not.  A committed iteration
emits ``kernos.loop.iteration`` (payload: agent, iteration, op, status).

**What a step prints** is kept for the human to read, in memory only
(:func:`outputs_of`: the last :data:`HELD_OUTPUTS` committed iterations of
each loop, each cut to :data:`MAX_OUTPUT_CHARS`), never in the image, the
audit or an event's payload.  The audit keeps no op's printed output either:
printed text may hold personal data, which reaches disk only sealed (a
``personal`` value), so that erasing its subject reaches it; printed text is
not sealed.  A kernel that restarts has none until its loops print again.
During its step, and only then, the agent sees the loop through builtins
(plain data only, nothing of the runtime):

* ``loop_state()``: a copy of ``{"iteration", "plan", "pending", "notes"}``;
  ``iteration`` is the number of iterations committed before this one;
* ``loop_update(plan=..., pending=..., notes=...)``: replace those fields
  (plain data: what ``write`` accepts; ``pending`` a list or tuple), applied
  when the step returns;
* ``loop_finish(reason)``: the loop ends (``finished``) once this iteration
  commits.

Called outside a loop's step (another op, another agent, a tool another
agent wrote), they refuse, and like every refused Kernos call they veto the
op.

**An iteration that does not commit** (an error, a denial, a veto) leaves the
loop as it was: the same iteration runs again on the next turn.  The
supervisor (:mod:`kernos.agents.supervisor`) counts it, and its policies are
what stop a loop that fails, repeats itself or spends too fast: a loop whose
agent's circuit is open (or an ancestor's: circuits flow down to sub-agents)
is *tripped* (not a state in the image: the circuit lives outside it) and
waits until the human resets that circuit (:func:`run_once` reports
``tripped``, and a driver parks the loop while ``Breakers.circuit`` names one).

**Who turns the loop.**  A driver outside the core (the kernel's,
:mod:`kernos.kernel.loops`) runs one iteration at a time for each
``running`` loop (:func:`running`), taking the op lock for that op only:
between two iterations the human's cells, harness requests and other agents'
ops run.  A kernel that starts on a workspace resumes its ``running`` loops
once the image is restored.  ``every_ms`` is the pause between two
iterations; ``max_iterations`` ends the loop (``finished``) once that many
have committed.

States: ``running``, ``paused``, ``stopped`` (by the human; final),
``finished`` (by ``loop_finish`` or ``max_iterations``; final).  A final loop
may be replaced by :func:`start`; a running or paused one may not.
"""

from __future__ import annotations

import collections
import contextvars
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernos.agents import context
from kernos.agents.api import refusals_veto
from kernos.agents.boundary import to_agent, to_host
from kernos.agents.guards import AGENT_BUILTINS
from kernos.agents.limits import AGENT_FILENAME_PREFIX
from kernos.agents.policy import compile_agent
from kernos.agents.registry import HUMAN
from kernos.agents.supervisor import fingerprint
from kernos.analysis import Reach
from kernos.errors import (
    BoundaryError,
    CapabilityDenied,
    CircuitOpen,
    KernosError,
    OpVetoed,
    UsageError,
)

if TYPE_CHECKING:
    from kernos.agents.runtime import AgentRuntime
    from kernos.image import Image
    from kernos.op import AbortReport, CommitReport, Op

__all__ = ["HELD_OUTPUTS", "ITERATION_TOPIC", "LOOP_PREFIX", "MAX_OUTPUT_CHARS", "STATES",
           "STATUS_TOPIC", "IterationResult", "LoopOutputs", "LoopState", "Turn", "iterate",
           "loop_name", "loops", "outputs_of", "run_once", "running", "set_status", "start",
           "state_of"]

LOOP_PREFIX = "kernos:loop:"
"""Image names of loops: ``kernos:loop:<agent>``."""
STATES = ("running", "paused", "stopped", "finished")
FINAL = ("stopped", "finished")
ITERATION_TOPIC = "kernos.loop.iteration"
STATUS_TOPIC = "kernos.loop.status"
MAX_EVERY_MS = 24 * 3600 * 1000
MAX_REASON_CHARS = 500
MAX_OUTPUT_CHARS = 2000
"""What is kept of one iteration's printed output (its end is cut, and ``cut`` says so)."""
HELD_OUTPUTS = 16
"""Committed iterations per loop whose output is kept (in memory)."""


def loop_name(agent: str) -> str:
    return LOOP_PREFIX + agent


@dataclass(kw_only=True)
class LoopState:
    """One agent's loop, as the image keeps it."""

    agent: str
    step: str
    """The agent source run by each iteration."""
    status: str = "running"
    iteration: int = 0
    """How many iterations have committed."""
    plan: Any = None
    pending: list[Any] = field(default_factory=list)
    notes: Any = None
    every_ms: int = 0
    max_iterations: int | None = None
    last_op: int | None = None
    """The op of the last committed iteration."""
    reason: str | None = None
    """Why the loop stopped or finished."""
    started_op: int | None = None

    def describe(self) -> dict[str, Any]:
        """Plain data for the CLI, the harness, the inspector and the sidebar."""
        return {"agent": self.agent, "status": self.status, "iteration": self.iteration,
                "plan": self.plan, "pending": len(self.pending), "every_ms": self.every_ms,
                "max_iterations": self.max_iterations, "last_op": self.last_op,
                "reason": self.reason, "started_op": self.started_op}


@dataclass(frozen=True, kw_only=True)
class IterationResult:
    """What one committed-to-be iteration did (the op still has to commit)."""

    agent: str
    iteration: int
    """The iteration that ran (0 for the first)."""
    op: int
    """The op it ran in."""
    status: str
    """The loop's status once the op commits: ``running`` or ``finished``."""
    reason: str | None
    """Why it finished, if it did."""
    output: str
    """What the step printed (bounded)."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(kw_only=True)
class Turn:
    """How :func:`run_once` ended: one op begun, then committed or rolled back."""

    agent: str
    outcome: str
    """``committed``; ``tripped`` (the agent's circuit, or an ancestor's, is open:
    refused, nothing ran); or the audit status of an iteration that did not commit
    (``rolled back``, ``denied``, ``vetoed``, ``failed`` ...)."""
    op: int
    result: IterationResult | None = None
    """The iteration, when it committed."""
    report: CommitReport | None = None
    aborted: AbortReport | None = None
    error: BaseException | None = None
    """Why it did not commit."""

    @property
    def committed(self) -> bool:
        return self.outcome == "committed"


class LoopOutputs:
    """What the last committed iterations of each loop printed; in memory only.

    Each entry is plain data: ``{"op", "iteration", "text", "cut"}`` (``cut``:
    how many characters of the output were left out, 0 when none).
    """

    def __init__(self) -> None:
        self._held: dict[str, collections.deque[dict[str, Any]]] = {}

    def record(self, result: IterationResult) -> None:
        text = result.output
        entry = {"op": result.op, "iteration": result.iteration,
                 "text": text[:MAX_OUTPUT_CHARS], "cut": max(len(text) - MAX_OUTPUT_CHARS, 0)}
        self._held.setdefault(result.agent, collections.deque(maxlen=HELD_OUTPUTS)).append(entry)

    def last(self, agent: str) -> dict[str, Any] | None:
        held = self._held.get(agent)
        return dict(held[-1]) if held else None

    def since(self, agent: str, op: int) -> list[dict[str, Any]]:
        """The held outputs of ``agent``'s iterations committed after op ``op``, oldest first."""
        return [dict(entry) for entry in self._held.get(agent, ()) if entry["op"] > op]


_OUTPUTS: weakref.WeakKeyDictionary[AgentRuntime, LoopOutputs] = weakref.WeakKeyDictionary()


def outputs_of(runtime: AgentRuntime) -> LoopOutputs:
    """The outputs :func:`run_once` kept for ``runtime``'s loops."""
    found = _OUTPUTS.get(runtime)
    if found is None:
        found = _OUTPUTS[runtime] = LoopOutputs()
    return found


# -- reading ---------------------------------------------------------------------------------


def state_of(image: Image, agent: str) -> LoopState | None:
    found = image.system.get(loop_name(agent))
    return found if isinstance(found, LoopState) else None


def loops(image: Image) -> list[dict[str, Any]]:
    """Every loop in the image, by agent name: :meth:`LoopState.describe` of each."""
    return [found.describe() for name, found in sorted(image.system.items())
            if name.startswith(LOOP_PREFIX) and isinstance(found, LoopState)]


def running(image: Image) -> list[LoopState]:
    """The loops a driver should turn, by agent name."""
    return [found for name, found in sorted(image.system.items())
            if name.startswith(LOOP_PREFIX) and isinstance(found, LoopState)
            and found.status == "running"]


# -- the human's operations ---------------------------------------------------------------


def start(runtime: AgentRuntime, agent: str, step: str, *, every_ms: int = 0,
          max_iterations: int | None = None, plan: object = None,
          pending: Iterable[object] = ()) -> dict[str, Any]:
    """Start ``agent``'s loop in the current (human) op; returns its description.

    ``step`` is agent source, checked now (it must compile in the agent's
    dialect and within its limits); ``plan`` and ``pending`` are plain data.
    A final (stopped or finished) loop of the agent is replaced; a running or
    paused one is refused.
    """
    _human_only("start a loop")
    op = runtime.current_op()
    agent = _agent(runtime, agent)
    if type(step) is not str or not step.strip():
        raise UsageError(f"the step of the loop of {agent!r} must be agent source (a non-empty "
                         f"str), not {_shown(step)}")
    limits = runtime.limits_for(agent)
    compile_agent(step, principal=agent, filename=f"{AGENT_FILENAME_PREFIX}{agent}>",
                  max_source=limits.source_bytes, max_depth=limits.ast_depth)
    if type(every_ms) is not int or not 0 <= every_ms <= MAX_EVERY_MS:
        raise UsageError(f"every_ms is the pause between two iterations, an int from 0 to "
                         f"{MAX_EVERY_MS} (a day), not {_shown(every_ms)}")
    if max_iterations is not None and (type(max_iterations) is not int or max_iterations < 1):
        raise UsageError(f"max_iterations is a positive int (or None: no end), not "
                         f"{_shown(max_iterations)}")
    plain_plan = _plain(plan, "plan")
    if isinstance(pending, (str, bytes, dict)) or not isinstance(pending, Iterable):
        raise UsageError(f"pending is a list of work items (plain data), not "
                         f"{type(pending).__name__}")
    plain_pending = _plain(list(pending), "pending")
    existing = state_of(runtime.image, agent)
    if existing is not None and existing.status not in FINAL:
        raise UsageError(
            f"{agent!r} already has a {existing.status} loop (at iteration "
            f"{existing.iteration}); stop it first with agents.stop({agent!r}), or "
            f"{'resume' if existing.status == 'paused' else 'pause'} it")
    state = LoopState(agent=agent, step=step, every_ms=every_ms,
                      max_iterations=max_iterations, plan=plain_plan, pending=plain_pending,
                      started_op=op.id)
    runtime.image.bind(loop_name(agent), state)
    op.touch(loop_name(agent))
    _emit_status(runtime, state)
    return state.describe()


_TARGETS = {"running": ("paused",), "paused": ("running",), "stopped": ("running", "paused")}
_VERBS = {"running": "resume", "paused": "pause", "stopped": "stop"}


def set_status(runtime: AgentRuntime, agent: str, status: str,
               reason: str | None = None) -> dict[str, Any]:
    """Pause (``paused``), resume (``running``) or stop (``stopped``) ``agent``'s loop.

    In the current (human) op; returns the loop's description.  Asking for
    the status the loop already has changes nothing.
    """
    _human_only("change a loop's status")
    op = runtime.current_op()
    agent = _agent(runtime, agent)
    if type(status) is not str or status not in _TARGETS:
        raise UsageError(f"a loop's status can be set to running (resume), paused (pause) or "
                         f"stopped (stop), not {_shown(status)}")
    if reason is not None and type(reason) is not str:
        raise UsageError(f"the reason is a str, not {type(reason).__name__}")
    state = state_of(runtime.image, agent)
    if state is None:
        raise UsageError(f"{agent!r} has no loop to {_VERBS[status]}; start one with "
                         f"agents.loop({agent!r}, STEP)")
    if state.status == status:
        return state.describe()
    if state.status not in _TARGETS[status]:
        raise UsageError(f"the loop of {agent!r} is {state.status} (final) and cannot "
                         f"{_VERBS[status]}; start a new one with agents.loop({agent!r}, STEP)")
    op.touch(loop_name(agent))
    state.status = status
    if status == "stopped":
        state.reason = (reason or "stopped by the human")[:MAX_REASON_CHARS]
    _emit_status(runtime, state)
    return state.describe()


# -- one iteration -----------------------------------------------------------------------


@dataclass(kw_only=True)
class _Step:
    """The loop's view for the step that runs now (what the builtins read and change)."""

    agent: str
    op: int
    seen: dict[str, Any]
    updates: dict[str, Any] = field(default_factory=dict)
    finish: str | None = None


_ACTIVE: contextvars.ContextVar[_Step | None] = contextvars.ContextVar(
    "kernos_loop_step", default=None)


def iterate(runtime: AgentRuntime, agent: str) -> IterationResult:
    """Run one iteration of ``agent``'s running loop inside the current op.

    The op becomes the agent's (kind ``loop``).  The step runs under the
    agent's grants and limits with the loop builtins available; when it
    returns, the loop's fields are updated and its counter advanced in this
    op.  Whatever the step raises propagates: the caller rolls the op back
    and the loop is unchanged.
    """
    op = runtime.current_op()
    agent = _agent(runtime, agent)
    state = state_of(runtime.image, agent)
    if state is None:
        raise UsageError(f"{agent!r} has no loop; start one with agents.loop({agent!r}, STEP)")
    if state.status != "running":
        raise UsageError(f"the loop of {agent!r} is {state.status}, so no iteration runs; "
                         f"agents.resume({agent!r}) resumes a paused one")
    op.act_as(agent, "loop")
    op.touch(loop_name(agent))
    op.facts["loop"] = {"agent": agent, "iteration": state.iteration}
    step = _Step(agent=agent, op=op.id, seen=to_agent({
        "iteration": state.iteration, "plan": state.plan, "pending": state.pending,
        "notes": state.notes}))
    token = _ACTIVE.set(step)
    try:
        # "The same op" for the supervisor's repeats: the step with what it is handed, so
        # an iteration that keeps failing repeats, and one that committed does not.
        ran = runtime.run(agent, state.step,
                          admit_as=lambda: fingerprint("loop", state.step, step.seen))
    finally:
        _ACTIVE.reset(token)
    for key, value in step.updates.items():
        setattr(state, key, value)
    number = state.iteration
    state.iteration += 1
    state.last_op = op.id
    if step.finish is not None:
        state.status, state.reason = "finished", step.finish
    elif state.max_iterations is not None and state.iteration >= state.max_iterations:
        state.status = "finished"
        state.reason = f"max_iterations={state.max_iterations} reached"
    token_ = context.suspend()  # the loop machinery emits, not the agent
    try:
        runtime.events.emit(ITERATION_TOPIC, {"agent": agent, "iteration": number,
                                              "op": op.id, "status": state.status},
                            principal=agent, by_runtime=True)
    finally:
        context.leave(token_)
    return IterationResult(agent=agent, iteration=number, op=op.id, status=state.status,
                           reason=state.reason if state.status == "finished" else None,
                           output=ran.output)


def run_once(runtime: AgentRuntime, agent: str, *, blocking: bool = True,
             before_commit: Callable[[Op], None] | None = None) -> Turn:
    """Begin an op, run one iteration of ``agent``'s loop in it, commit or roll back.

    For drivers: the caller serializes it with every other op (the kernel
    holds its op lock).  Never raises for what the step did; a refusal by
    an open circuit is ``tripped``.  ``before_commit`` runs between the
    iteration and the commit (the supervisor's announcements, a test's hook).
    A committed iteration's output is kept in :func:`outputs_of`.
    """
    state = state_of(runtime.image, agent)
    source = state.step if state is not None else ""
    op = runtime.image.begin(source=source, principal=agent, kind="loop",
                             reach=Reach(frozenset()), blocking=blocking)
    try:
        result = iterate(runtime, agent)
        if before_commit is not None:
            before_commit(op)
    except BaseException as error:  # the step's, a refusal, a breached limit: all roll back
        aborted = op.abort(error=error)
        outcome = "tripped" if isinstance(error, CircuitOpen) else op.outcome[0]
        return Turn(agent=agent, outcome=outcome, op=op.id, aborted=aborted, error=error)
    try:
        report = op.commit()
    except (OpVetoed, KernosError) as error:  # vetoed, or the commit failed: rolled back
        return Turn(agent=agent, outcome=op.outcome[0], op=op.id, aborted=op.abort_report,
                    error=error)
    outputs_of(runtime).record(result)
    return Turn(agent=agent, outcome="committed", op=op.id, result=result, report=report)


# -- the builtins agent code sees during its loop's step ------------------------------------


def _current_step(call: str) -> _Step:
    ctx = context.current()
    step = _ACTIVE.get()
    if step is None or step.agent != ctx.principal or step.op != ctx.op.id \
            or ctx.foreign() is not None:
        raise UsageError(f"{call}() works only in the step of your own loop, while it runs "
                         "(not in other ops, nor in a tool another agent wrote)")
    return step


def loop_state() -> dict[str, Any]:
    """A copy of your loop's iteration, plan, pending work and notes (plain data)."""
    step = _current_step("loop_state")
    seen = dict(step.seen)
    seen.update(step.updates)
    result: dict[str, Any] = to_agent(seen)
    return result


_UNSET: Any = object()


def loop_update(*, plan: object = _UNSET, pending: object = _UNSET,
                notes: object = _UNSET) -> None:
    """Replace your loop's plan, pending work or notes (plain data) when this step returns."""
    step = _current_step("loop_update")
    if plan is not _UNSET:
        step.updates["plan"] = to_host(plan)
    if pending is not _UNSET:
        if type(pending) not in (list, tuple):
            raise BoundaryError(f"loop_update(pending=...) takes a list, not "
                                f"{type(pending).__name__}")
        step.updates["pending"] = list(to_host(pending))
    if notes is not _UNSET:
        step.updates["notes"] = to_host(notes)


def loop_finish(reason: object = "finished by the agent") -> None:
    """End your loop once this iteration commits."""
    step = _current_step("loop_finish")
    if type(reason) is not str:
        raise BoundaryError(f"loop_finish(reason) takes a str, not {type(reason).__name__}")
    step.finish = reason[:MAX_REASON_CHARS]


CALLS = {function.__name__: refusals_veto(function)
         for function in (loop_state, loop_update, loop_finish)}
AGENT_BUILTINS.update(CALLS)


# -- helpers -----------------------------------------------------------------------------


def _human_only(action: str) -> None:
    """Refuse ``action`` while any agent code runs (an agent-written tool included)."""
    ctx = context.running()
    if ctx is not None and ctx.authority():
        raise CapabilityDenied(ctx.principal, f"loop: {action}",
                               detail="only the human's own code may")


def _agent(runtime: AgentRuntime, agent: object) -> str:
    if agent == HUMAN:
        raise UsageError("the human has no loop (cells are the human's); name an agent")
    return runtime.registry.principal(agent).name


def _plain(value: object, what: str) -> Any:
    try:
        return to_host(value)
    except BoundaryError as error:
        raise UsageError(f"the loop's {what} must be plain data (None, bool, int, float, str, "
                         f"bytes, Decimal, datetime values and lists, tuples, dicts and sets "
                         f"of them): {error}") from None


def _shown(value: object) -> str:
    if type(value) in (int, bool, float, str) or value is None:
        return repr(value)[:60]
    return f"a {type(value).__name__}"


def _emit_status(runtime: AgentRuntime, state: LoopState) -> None:
    runtime.events.emit(STATUS_TOPIC, {"agent": state.agent, "status": state.status,
                                       "iteration": state.iteration, "reason": state.reason},
                        principal=state.agent, by_runtime=True)
