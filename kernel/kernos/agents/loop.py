"""An agent's loop that lives in the workspace: one op per iteration, resumed after a crash.

The contract (issue 20; no Jupyter here, the kernel's driver is an adapter):

**A loop** belongs to one agent and is a :class:`LoopState` in the image, as
``kernos:loop:<agent>``.  Only the human starts, pauses, resumes or stops a
loop; each of those is a change of that value in the human's op, so it
commits or rolls back with the op like any other change.

**An iteration is one op**, run as the agent: the loop's ``step`` (agent
source, compiled like any agent code under RestrictedPython and the agent's
limits and grants) runs in the agent's namespace, and the same op advances
``iteration``.  So an iteration either commits whole (its changes, its
effects, its recorded LLM calls, its events, and the advanced counter) or
not at all: after ``kill -9`` the loop resumes at the first iteration that
did not commit, and never runs a committed one again.  The op's audit record
names the loop and the iteration.  During its step the agent sees the loop
through builtins (plain data only, nothing of the runtime):

* ``loop_state()``: a copy of ``{"iteration", "plan", "pending", "notes"}``;
* ``loop_update(plan=..., pending=..., notes=...)``: replace those fields
  (plain data: what ``write`` accepts);
* ``loop_finish(reason)``: the loop ends after this iteration commits.

**An iteration that does not commit** (an error, a denial, a veto) leaves the
loop as it was: the same iteration runs again on the next turn.  The
supervisor (:mod:`kernos.agents.supervisor`) counts it, and its policies are
what stop a loop that fails, repeats itself or spends too fast: a loop whose
agent's circuit is open is *tripped* (not a state in the image: the circuit
lives outside it) and waits until the human resets the circuit.

**Who turns the loop.**  A driver outside the core (the kernel's, for a
kernel) runs one iteration at a time for each ``running`` loop, taking the
op lock for that op only: between two iterations the human's cells, harness
requests and other agents' ops run.  A kernel that starts on a workspace
resumes its ``running`` loops once the image is restored.  ``every_ms`` is
the pause between two iterations; ``max_iterations`` ends the loop
(``finished``) once that many have committed.

States: ``running``, ``paused``, ``stopped`` (by the human; final),
``finished`` (by ``loop_finish`` or ``max_iterations``; final).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LOOP_PREFIX", "STATES", "LoopState", "loop_name"]

LOOP_PREFIX = "kernos:loop:"
"""Image names of loops: ``kernos:loop:<agent>``."""
STATES = ("running", "paused", "stopped", "finished")


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
