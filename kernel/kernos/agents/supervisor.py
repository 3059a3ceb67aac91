"""Circuit breakers for agents: policies the human sets, a circuit that only the human closes.

The contract (groundwork for issue 20; no Jupyter here):

**Policies** (:class:`Policy`) are per agent and held like grants: in the
image, as ``kernos:supervisor`` (a :class:`Supervision`), so setting one
commits and rolls back with its op.  Only the human sets them
(:meth:`Breakers.set_policy` refuses while agent code runs).  Every figure is
an int or None (no limit); what each one means, exactly:

* ``failures=N``: the circuit opens when N of the agent's ops *in a row*
  ended without committing (failed, denied, vetoed, rolled back).  The op
  after the Nth is refused.
* ``repeats=N``: at most N ops in a row with the same fingerprint (the
  SHA-256 of the code run, or of the tool name and its arguments) may run;
  the (N+1)th is refused.
* ``iterations=N``: at most N ops of the agent may run since its circuit was
  last reset (or since it was first supervised); the (N+1)th is refused.
* ``wall_seconds=N``: an op that starts N seconds or more after the agent's
  first supervised op since the last reset is refused.
* ``tokens_per_minute=N`` / ``micro_usd_per_minute=N``: an op is refused when
  the LLM ledger (``<workspace>/llm/calls.jsonl``, outside the image: it
  survives rollbacks) charged the agent N tokens (N millionths of a USD) or
  more in the 60 s before it starts.

A sub-agent inherits at most its parent's policies: its effective policy is,
figure by figure, the tightest of its own and every ancestor's, and setting a
figure looser than the parent's effective one is refused (:class:`InvalidGrant`).

**Counters and circuits live outside the image**, in an append-only journal
``<workspace>/supervisor/journal.jsonl`` (like the LLM ledger): an op that
rolls back must still count as a failure, and the refusal that opens a
circuit is itself in an op that rolls back.  Lines: ``admit`` (an op of the
agent starts: its fingerprint), ``end`` (it committed or not), ``trip`` (a
policy opened the circuit: the policy, the figures, the message) and
``reset`` (the human closed it).  The state is rebuilt from the journal when
a workspace opens, so a circuit stays open across restarts.  Only ``trip`` and
``reset`` lines are synced (a crash may lose the counts of the ops just
before it, never an open circuit).  An agent with no policy (its own or an
ancestor's) is not counted at all: supervision starts with its first policy.
The journal itself (its lines, the state they give, compaction) is
:class:`kernos.agents._journal.Journal`; this module decides what to write.

**An open circuit** refuses every op of its agent *before its body runs*
(:meth:`Breakers.admit` raises :class:`~kernos.errors.CircuitOpen`, and vetoes
the op, status ``refused``, whose audit record then names the policy and the
figures in its ``circuit`` field).  Every path by which an agent's code runs
goes through one of two checks:

* :meth:`Breakers.admit` (counts, and refuses): ``AgentRuntime.run`` (a
  ``%%agent NAME`` cell, ``agents.run``, the harness ``op`` with code, its
  ``expect`` predicate, and so the MCP server running as an agent) and
  ``AgentRuntime.call_as`` (the harness ``op`` with a tool, MCP registry
  tools);
* :meth:`Breakers.refuse_if_open` (refuses, counts nothing): a tool an agent
  wrote, whoever calls it (the human, another agent), since its author's code
  runs; the refusal's ``circuit.via`` names the tool.

An in-image subscriber of an agent whose circuit is open is *not run*, and
the emitting op goes on (refusing it would let a tripped agent veto every op
that emits what it subscribed to); the op's audit record lists it under
``circuit_skipped`` (agent, policy, topic).

**Circuits flow down.**  A sub-agent (a principal whose ``parent`` chain leads
to an agent) is stopped while any ancestor's circuit is open, on every path
above, as if its own were: :meth:`Breakers.circuit` gives its own trip, else
its nearest tripped ancestor's (the trip's ``agent`` says whose), so its ops
and the tools it wrote are refused (status ``refused``; the record's
``circuit`` names the ancestor and adds ``sub_agent``), its subscribers are
skipped and a driver parks its loop.  Nothing is counted against it
meanwhile.  Only the human's reset *of that ancestor* lets it run again
(resetting the sub-agent closes its own circuit only); a sub-agent's trip
never stops its parent.

**The trip is announced at once.**  A trip emits the event
``kernos.circuit.open`` (payload: agent, policy, limit, figures, message,
op): events roll back with their op, and the op that trips always rolls
back, so :meth:`Breakers.announce` emits it in another op.  The kernel runs
that op, kind ``supervisor`` (``HarnessService.announce_trips``), right
after every cell and harness request that left a trip unannounced, so
external subscribers see the event before the next op; an ``announced``
journal line is written when it commits.  A trip still unannounced when the
kernel died is announced after the first op of the next kernel.

**Scale.**  The burn-rate check reads the LLM ledger incrementally (only
the lines appended since the previous check; it keeps the calls of the last
60 s).  A journal longer than :data:`COMPACT_LINES` lines is compacted when a
workspace opens: rewritten atomically as the state it gives (one ``state``
line per agent, its open trip, and whether that was announced).

**Fork, clone, erase, replay.**  A fork of snapshot N copies the journal's
lines about ops up to N (:func:`copy_journal`): a circuit open then is open
in the fork.  A clone (``kernos clone``, git only) starts with every circuit
closed and no counts; the policies come with the image.  Erasure leaves the
journal: it holds agent names, op numbers, hashes of code and figures, never
a value.  Replay does not supervise (:attr:`Breakers.replaying`): an op
refused originally is replayed as refused from its audit record, without
running, and the supervisor's announcing ops emit their recorded events.

**Only the human closes a circuit** (:meth:`Breakers.reset`): it is refused
while any agent code runs (an agent-written tool included), whoever the
target.  Agent code has no handle on this object in any case; the check is
the allowlist behind that.

**Safe checkpoints.**  :meth:`Breakers.checkpoint` (``safe=True``) keeps a copy
of the agent's namespace in ``kernos:supervisor``, named by the op that took
it; :meth:`Breakers.reset` with ``restore=True`` (or a policy with
``restore_safe=True``) puts only that agent's namespace back to it, in the
human's op (so the restore itself commits or rolls back like any change).
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos._time import utc_now
from kernos.agents import context
from kernos.agents._after_outcome import AfterOutcome
from kernos.agents._journal import AgentState, BurnWindow, Journal, Trip, copy_journal
from kernos.agents.namespace import namespace_key, namespace_of
from kernos.agents.registry import HUMAN
from kernos.audit.canonical import canonical
from kernos.errors import CapabilityDenied, CircuitOpen, InvalidGrant, UsageError

if TYPE_CHECKING:
    from kernos.agents.context import Runtime
    from kernos.op import Op

__all__ = ["EVENT_TOPIC", "JOURNAL_FILE", "SUPERVISION", "Breakers", "Policy", "Supervision",
           "Trip", "copy_journal", "fingerprint"]

SUPERVISION = "kernos:supervisor"
"""The image name of the policies and safe checkpoints."""
JOURNAL_FILE = "supervisor/journal.jsonl"
"""The journal's path in a workspace."""
WINDOW_SECONDS = 60
COMPACT_LINES = 10_000
"""A journal longer than this is compacted when a workspace opens."""
EVENT_TOPIC = "kernos.circuit.open"


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One agent's circuit-breaker figures (None: no limit).  See the module docstring."""

    failures: int | None = None
    repeats: int | None = None
    iterations: int | None = None
    wall_seconds: int | None = None
    tokens_per_minute: int | None = None
    micro_usd_per_minute: int | None = None
    restore_safe: bool = False
    """On reset, put the namespace back to the last safe checkpoint."""

    @classmethod
    def figures(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "restore_safe"]

    @classmethod
    def checked(cls, values: dict[str, Any]) -> Policy:
        known = set(cls.figures()) | {"restore_safe"}
        for key, value in values.items():
            if key not in known:
                raise InvalidGrant(f"unknown policy {key!r}; the policies are "
                                   f"{sorted(known)}")
            if key == "restore_safe":
                if type(value) is not bool:
                    raise InvalidGrant(f"restore_safe must be True or False, not {value!r}")
            elif value is not None and (type(value) is not int or not 0 < value <= 10**12):
                raise InvalidGrant(f"the policy {key} must be a positive int (or None), "
                                   f"not {value!r}")
        return cls(**values)

    def tightest(self, other: Policy) -> Policy:
        """Figure by figure, the tighter of the two (None is no limit)."""
        merged: dict[str, Any] = {}
        for name in self.figures():
            mine, theirs = getattr(self, name), getattr(other, name)
            merged[name] = theirs if mine is None else mine if theirs is None else \
                min(mine, theirs)
        return replace(self, **merged, restore_safe=self.restore_safe or other.restore_safe)

    def looser_than(self, parent: Policy) -> list[str]:
        """The figures of this policy that a parent's effective ``parent`` would not allow."""
        loose = []
        for name in self.figures():
            mine, theirs = getattr(self, name), getattr(parent, name)
            if theirs is not None and (mine is None or mine > theirs):
                loose.append(f"{name}={mine} (the parent allows {theirs})")
        return loose

    def describe(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in [*self.figures(), "restore_safe"]
                if getattr(self, name) not in (None, False)}


@dataclass(kw_only=True)
class SafePoint:
    op: int
    names: dict[str, Any]


class Supervision:
    """Policies and safe checkpoints.  Lives in the image as ``kernos:supervisor``."""

    def __init__(self) -> None:
        self.policies: dict[str, Policy] = {}
        self.safe: dict[str, SafePoint] = {}


def fingerprint(kind: str, text: str, arguments: object = None) -> str:
    """What makes two ops "the same": the code (or tool) and its arguments, hashed."""
    try:
        body = canonical({"kind": kind, "text": text, "arguments": arguments})
    except (TypeError, ValueError):  # arguments that are not plain data
        body = (kind + "\0" + text + "\0" + repr(arguments)).encode()
    return hashlib.sha256(body).hexdigest()


class Breakers:
    """The circuit breakers of one runtime: policies in the image, counters in a journal."""

    def __init__(self, runtime: Runtime, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.clock = clock
        workspace = runtime.image.workspace
        self.path: Path = workspace.path / JOURNAL_FILE
        self.durable = bool(workspace.durable)
        self._lock = threading.Lock()
        self._journal = Journal(self.path, durable=self.durable)
        """Counters and circuits, outside the image (guarded by ``_lock``)."""
        self.replaying = False
        """Set by replay: the original's journal decided which ops ran (a refused op
        is replayed as refused, from its audit record); nothing is counted again."""
        self._burn = BurnWindow(WINDOW_SECONDS)
        self._admitted: set[tuple[str, int]] = set()
        self._journal.load(compact_over=COMPACT_LINES)

    # -- policies (in the image) -----------------------------------------------------

    @property
    def supervision(self) -> Supervision:
        found = self.runtime.image.system.get(SUPERVISION)
        return found if isinstance(found, Supervision) else Supervision()

    def _mutable(self, op: Op) -> Supervision:
        found = self.runtime.image.system.get(SUPERVISION)
        if not isinstance(found, Supervision):
            found = Supervision()
            self.runtime.image.bind(SUPERVISION, found)
        op.touch(SUPERVISION)
        return found

    def set_policy(self, agent: str, **figures: Any) -> dict[str, Any]:
        """Set (merge) ``agent``'s policy; the human only, inside an op.  Returns it, effective."""
        _human_only("set a circuit-breaker policy")
        op = self.runtime.current_op()
        registry = self.runtime.registry
        principal = registry.principal(agent)
        current = self.supervision.policies.get(agent, Policy())
        wanted = Policy.checked({**current.describe(), **figures})
        if principal.parent not in (None, HUMAN):
            asked = Policy.checked({key: value for key, value in figures.items()
                                    if key != "restore_safe"})
            loose = [text for text in asked.looser_than(self.effective(principal.parent))
                     if text.split("=")[0] in figures]
            if loose:
                raise InvalidGrant(f"a sub-agent's policy can only be tighter than its "
                                   f"parent's: {agent!r} would have {', '.join(loose)}; "
                                   f"loosen {principal.parent!r}'s first, or choose less")
        self._mutable(op).policies[agent] = wanted
        return self.effective(agent).describe()

    def effective(self, agent: str) -> Policy:
        """``agent``'s policy tightened by every ancestor's (a child never gets more)."""
        registry = self.runtime.registry
        policies = self.supervision.policies
        result = policies.get(agent, Policy())
        name: str | None = agent
        while name is not None and name in registry.principals:
            name = registry.principals[name].parent
            if name is not None and name in policies:
                result = result.tightest(policies[name])
        return result

    # -- safe checkpoints (in the image) -----------------------------------------------

    def checkpoint(self, agent: str, *, safe: bool = True) -> dict[str, Any]:
        """Tag ``agent``'s namespace as it is now (in this op) as its safe point."""
        _human_only("tag a checkpoint safe")
        if not safe:
            raise UsageError("only safe checkpoints are kept by the supervisor: "
                             "pass safe=True (every commit is a checkpoint already)")
        op = self.runtime.current_op()
        namespace = namespace_of(self.runtime.image, self.runtime.registry, agent)
        names = copy.deepcopy(namespace.user_items())
        self._mutable(op).safe[agent] = SafePoint(op=op.id, names=names)
        return {"agent": agent, "op": op.id, "names": sorted(names)}

    def safe_point(self, agent: str) -> int | None:
        """The op of ``agent``'s checkpoint tagged safe (what a restore goes back to), or None."""
        point = self.supervision.safe.get(agent)
        return None if point is None else point.op

    def restore_safe(self, agent: str) -> int:
        """Put ``agent``'s namespace back to its safe checkpoint, in this op; its op id."""
        _human_only("restore a namespace")
        op = self.runtime.current_op()
        point = self.supervision.safe.get(agent)
        if point is None:
            raise UsageError(f"{agent!r} has no checkpoint tagged safe: take one with "
                             f"agents.checkpoint({agent!r}, safe=True)")
        namespace = namespace_of(self.runtime.image, self.runtime.registry, agent)
        for key in list(namespace.user_items()):
            del namespace[key]
        namespace.update(copy.deepcopy(point.names))
        op.touch(namespace_key(agent))
        return point.op

    # -- the circuit ------------------------------------------------------------------

    def circuit(self, agent: str) -> Trip | None:
        """Why ``agent``'s ops are refused: its own open circuit, else its nearest tripped
        ancestor's (the trip's ``agent`` says whose); None if neither is open."""
        return self._open(self._lineage(agent))

    def _lineage(self, agent: str) -> list[str]:
        """``agent`` and its ancestors, nearest first (the human has no circuit)."""
        principals = self.runtime.registry.principals
        lineage = [agent]
        while lineage[-1] in principals:
            parent = principals[lineage[-1]].parent
            if parent is None or parent == HUMAN:
                break
            lineage.append(parent)
        return lineage

    def _open(self, lineage: list[str]) -> Trip | None:
        """The first open circuit among ``lineage``, or None."""
        with self._lock:
            for name in lineage:
                state = self._journal.states.get(name)
                if state is not None and state.trip is not None:
                    return state.trip
        return None

    def circuits(self) -> dict[str, Trip]:
        """Every open circuit, by agent."""
        with self._lock:
            return {agent: state.trip for agent, state in sorted(self._journal.states.items())
                    if state.trip is not None}

    def refuse_if_open(self, agent: str, op: Op, *, via: str) -> None:
        """Raise CircuitOpen (and veto ``op``) if ``agent``'s circuit, or an ancestor's, is
        open; count nothing.

        For the paths where ``agent``'s code runs inside someone else's op: a
        tool ``agent`` wrote, called by the human or another agent (``via``
        says which path, for the audit record).
        """
        if agent == HUMAN or self.replaying:
            return
        lineage = self._lineage(agent)
        trip = self._open(lineage)
        if trip is not None:
            raise _refuse(op, trip, via=via, lineage=lineage)

    def pending(self) -> list[Trip]:
        """The trips whose ``kernos.circuit.open`` event no committed op has emitted yet."""
        with self._lock:
            return [state.trip for state in self._journal.states.values()
                    if state.trip is not None and (state.trip.agent, state.trip.op)
                    not in self._journal.announced]

    def admit(self, agent: str, op: Op, fingerprint_of: Callable[[], str]) -> None:
        """Before an op of ``agent`` runs: raise CircuitOpen (and veto) or count it in.

        ``fingerprint_of()`` gives the op's :func:`fingerprint`; it is called only
        for a supervised agent's op not yet admitted (an unsupervised agent's op
        hashes nothing)."""
        if agent == HUMAN or self.replaying:
            return
        policy = self.effective(agent)
        lineage = self._lineage(agent)
        above = self._open(lineage[1:])
        now = self.clock()
        with self._lock:
            state = self._journal.states.get(agent)
            if (state is None or state.trip is None) and above is not None:
                # An ancestor's open circuit refuses it even if it is unsupervised; the
                # refusal is not this agent's failure, so nothing is counted.
                raise _refuse(op, above, via="op", lineage=lineage)
            if (state is None or state.trip is None) and not policy.describe():
                return  # unsupervised: nothing counted, nothing written
            state = self._journal.states.setdefault(agent, AgentState())
            trip = state.trip
            if trip is None and (agent, op.id) in self._admitted:
                return  # one op is one iteration, however many runs it holds
            print_ = fingerprint_of()
            if trip is None:
                trip = self._check_before(agent, policy, state, print_, now, op.id)
            if trip is not None:
                raise _refuse(op, trip, via="op", lineage=lineage)
            self._admitted.add((agent, op.id))
            self._journal.write({"type": "admit", "agent": agent, "op": op.id,
                                 "sha": print_, "at": now})
            self._journal.apply_admit(state, print_, now)
        op.transaction.join(AfterOutcome(  # after the image: its publish is the commit point
            "~~kernos.supervisor", committed=lambda: self.ended(agent, op.id, ok=True),
            aborted=lambda: self.ended(agent, op.id, ok=False)))

    def _check_before(self, agent: str, policy: Policy, state: AgentState, print_: str,
                      now: float, op: int) -> Trip | None:
        found: tuple[str, int, dict[str, Any], str] | None = None
        if policy.iterations is not None and state.iterations >= policy.iterations:
            found = ("iterations", policy.iterations, {"iterations": state.iterations},
                     f"{agent!r} already ran {state.iterations} ops since it was last reset; "
                     f"policy iterations<={policy.iterations}")
        elif policy.repeats is not None and print_ == state.last \
                and state.run >= policy.repeats:
            found = ("repeats", policy.repeats, {"sha": print_, "in_a_row": state.run + 1},
                     f"the same op (code sha {print_[:12]}…, same arguments) was asked for "
                     f"{state.run + 1} times in a row; policy repeats<={policy.repeats}")
        elif policy.wall_seconds is not None and state.first is not None \
                and now - state.first >= policy.wall_seconds:
            elapsed = now - state.first
            found = ("wall_seconds", policy.wall_seconds, {"seconds": round(elapsed, 3)},
                     f"{agent!r} has run for {elapsed:.1f} s since its first supervised op; "
                     f"policy wall_seconds<{policy.wall_seconds}")
        elif policy.tokens_per_minute is not None or policy.micro_usd_per_minute is not None:
            tokens, micro = self.burn(agent, now)
            if policy.tokens_per_minute is not None and tokens >= policy.tokens_per_minute:
                found = ("tokens_per_minute", policy.tokens_per_minute, {"tokens": tokens},
                         f"{agent!r} was charged {tokens} LLM tokens in the last "
                         f"{WINDOW_SECONDS} s; policy tokens_per_minute<"
                         f"{policy.tokens_per_minute}")
            elif policy.micro_usd_per_minute is not None and \
                    micro >= policy.micro_usd_per_minute:
                found = ("micro_usd_per_minute", policy.micro_usd_per_minute,
                         {"micro_usd": micro},
                         f"{agent!r} was charged {micro / 1e6:.6f} USD for LLM calls in the "
                         f"last {WINDOW_SECONDS} s; policy micro_usd_per_minute<"
                         f"{policy.micro_usd_per_minute}")
        if found is None:
            return None
        return self._trip(agent, state, *found, op=op)

    def _trip(self, agent: str, state: AgentState, policy: str, limit: int,
              figures: dict[str, Any], message: str, *, op: int) -> Trip:
        trip = Trip(agent=agent, policy=policy, limit=limit, figures=figures,
                    message=message, op=op, at=utc_now())
        self._journal.write({"type": "trip", "agent": agent, "policy": policy,
                             "limit": limit, "figures": figures, "message": message,
                             "op": op, "at": trip.at})
        state.trip = trip
        return trip

    def announce(self) -> list[Trip]:
        """Emit ``kernos.circuit.open`` for every trip not yet announced, in the current op.

        Events are transactional: one emitted in the refused op would roll back
        with it.  So a trip is announced by the next op that *commits* and calls
        this (the human's reset does, and ``HarnessService.announce_trips``
        runs an op for it after every cell and harness op); an ``announced``
        journal line is written when that op commits, so a rolled-back
        announcement is made again next time.
        """
        op = self.runtime.current_op()
        pending = self.pending()
        if not pending:
            return []
        token = context.suspend()  # the supervisor emits, not any agent
        try:
            for trip in pending:
                self.runtime.events.emit(EVENT_TOPIC, {
                    "agent": trip.agent, "policy": trip.policy, "limit": trip.limit,
                    "figures": trip.figures, "message": trip.message, "op": trip.op},
                    principal=HUMAN)
        finally:
            context.leave(token)
        op.transaction.join(AfterOutcome("~~kernos.supervisor.announced",
                                         committed=lambda: self._announced(pending)))
        return pending

    def _announced(self, trips: list[Trip]) -> None:
        """The op that announced ``trips`` committed: note it in the journal."""
        with self._lock:
            for trip in trips:
                self._journal.announced.add((trip.agent, trip.op))
                self._journal.write({"type": "announced", "agent": trip.agent, "op": trip.op})

    def ended(self, agent: str, op: int, *, ok: bool) -> None:
        """An admitted op of ``agent`` committed (``ok``) or did not."""
        policy = self.effective(agent)
        with self._lock:
            if op in self._journal.ended:
                return
            self._journal.ended.add(op)
            state = self._journal.states.setdefault(agent, AgentState())
            self._journal.write({"type": "end", "agent": agent, "op": op, "ok": ok})
            self._journal.apply_end(state, op, ok)
            if state.trip is None and policy.failures is not None \
                    and state.failures >= policy.failures:
                shown = ", ".join(str(n) for n in state.failed_ops[-5:])
                self._trip(agent, state, "failures", policy.failures,
                           {"in_a_row": state.failures, "ops": state.failed_ops[-5:]},
                           f"{state.failures} op(s) of {agent!r} in a row did not commit "
                           f"(ops {shown}); policy failures={policy.failures} opens the circuit "
                           f"at {policy.failures} in a row", op=op)

    def reset(self, agent: str, *, restore: bool | None = None) -> dict[str, Any]:
        """Close ``agent``'s circuit and zero its counters: the human only.

        With ``restore`` (default: the policy's ``restore_safe``) the agent's
        namespace goes back to its safe checkpoint in the current op.
        """
        _human_only("close a circuit")
        self.runtime.registry.principal(agent)
        if self.runtime.image.current is not None:
            self.announce()  # the event of the trip precedes its reset
        restored = None
        if restore if restore is not None else self.effective(agent).restore_safe:
            restored = self.restore_safe(agent)
        current = self.runtime.image.current
        with self._lock:
            state = self._journal.states.get(agent)
            was = None if state is None or state.trip is None else state.trip.policy
            self._journal.write({"type": "reset", "agent": agent,
                                 "op": None if current is None else current.id,
                                 "at": self.clock()})
            self._journal.states[agent] = AgentState()
        if current is not None:
            current.facts["circuit_reset"] = {"agent": agent, "was": was,
                                              "restored_from": restored}
        return {"agent": agent, "was_open": was, "restored_from": restored}

    # -- burn rate, from the LLM ledger ----------------------------------------------------

    def burn(self, agent: str, now: float) -> tuple[int, int]:
        """(tokens, micro-USD) the ledger charged ``agent`` in the window before ``now``."""
        from kernos.llm import LEDGER_FILE

        return self._burn.charged(self.runtime.image.workspace.path / LEDGER_FILE,
                                  f"principal:{agent}", now)

def _refuse(op: Op, trip: Trip, *, via: str, lineage: list[str]) -> CircuitOpen:
    """Veto ``op`` for ``trip`` (its audit record names the policy and the figures).

    ``lineage`` is the agent whose code was to run, then its ancestors: ``trip``
    is its own, or the one of the ancestor whose open circuit stops it.
    """
    agent = lineage[0]
    facts = {"agent": trip.agent, "policy": trip.policy, "limit": trip.limit,
             "figures": trip.figures, "tripped_op": trip.op, "via": via}
    if agent == trip.agent:
        op.veto(f"{trip.agent!r}'s circuit is open: {trip.message}", status="refused")
        op.facts["circuit"] = facts
        return CircuitOpen(trip.agent, trip.policy, trip.message)
    ancestors = lineage[1:lineage.index(trip.agent) + 1]
    chain = ", ".join(f"a sub-agent of {name!r}" for name in ancestors)
    op.veto(f"{agent!r} is {chain}, whose circuit is open: {trip.message}", status="refused")
    op.facts["circuit"] = {**facts, "sub_agent": agent}
    return CircuitOpen.for_sub_agent(agent, ancestors, trip.agent, trip.policy, trip.message,
                                     via=via)


def _human_only(action: str) -> None:
    """Refuse ``action`` while any agent code runs (the allowlist: the human's code only)."""
    running = context.running()
    if running is not None and running.authority():
        raise CapabilityDenied(running.principal, f"supervisor: {action}",
                               detail="only the human's own code may")
