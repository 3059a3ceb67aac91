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

**An open circuit** refuses every op of its agent *before its body runs*
(:meth:`Breakers.admit` raises :class:`~kernos.errors.CircuitOpen`, and vetoes
the op, whose audit record then names the policy and the figures).  A trip
also emits the event ``kernos.circuit.open`` (payload: agent, policy,
message) in the next committed op that calls :meth:`Breakers.announce` (the
human's reset does: events roll back with their op, and the refused op always
rolls back), and is a ``trip`` line of the journal.

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
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernos._time import utc_now
from kernos.agents import context
from kernos.agents.registry import HUMAN
from kernos.audit.canonical import canonical
from kernos.errors import CapabilityDenied, CircuitOpen, InvalidGrant, UsageError

if TYPE_CHECKING:
    from kernos.agents.runtime import AgentRuntime
    from kernos.op import Op

__all__ = ["JOURNAL_FILE", "SUPERVISION", "Breakers", "Policy", "Supervision", "Trip",
           "fingerprint"]

SUPERVISION = "kernos:supervisor"
"""The image name of the policies and safe checkpoints."""
JOURNAL_FILE = "supervisor/journal.jsonl"
"""The journal's path in a workspace."""
WINDOW_SECONDS = 60
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


@dataclass(frozen=True, kw_only=True)
class Trip:
    """Why a circuit is open."""

    agent: str
    policy: str
    """``failures``, ``repeats`` ... (the figure that tripped)."""
    limit: int
    figures: dict[str, Any]
    message: str
    op: int
    at: str


@dataclass(kw_only=True)
class _State:
    """One agent's counters since its last reset (from the journal)."""

    first: float | None = None
    iterations: int = 0
    failures: int = 0
    failed_ops: list[int] = field(default_factory=list)
    last: str | None = None
    run: int = 0
    trip: Trip | None = None


def fingerprint(kind: str, text: str, arguments: object = None) -> str:
    """What makes two ops "the same": the code (or tool) and its arguments, hashed."""
    body = canonical({"kind": kind, "text": text, "arguments": arguments}) \
        if _plain(arguments) else (kind + "\0" + text + "\0" + repr(arguments)).encode()
    return hashlib.sha256(body).hexdigest()


def _plain(value: object) -> bool:
    try:
        canonical(value)
    except (TypeError, ValueError):
        return False
    return True


class Breakers:
    """The circuit breakers of one runtime: policies in the image, counters in a journal."""

    def __init__(self, runtime: AgentRuntime, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.clock = clock
        workspace = runtime.image.workspace
        self.path: Path = workspace.path / JOURNAL_FILE
        self.durable = bool(workspace.durable)
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._ended: set[int] = set()
        self._admitted: set[tuple[str, int]] = set()
        self._announced: set[tuple[str, int]] = set()
        self._load()

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
        op = self.runtime._op()
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
        op = self.runtime._op()
        names = copy.deepcopy(self.runtime.namespace(agent).user_items())
        self._mutable(op).safe[agent] = SafePoint(op=op.id, names=names)
        return {"agent": agent, "op": op.id, "names": sorted(names)}

    def restore_safe(self, agent: str) -> int:
        """Put ``agent``'s namespace back to its safe checkpoint, in this op; its op id."""
        _human_only("restore a namespace")
        from kernos.agents.runtime import namespace_key

        op = self.runtime._op()
        point = self.supervision.safe.get(agent)
        if point is None:
            raise UsageError(f"{agent!r} has no checkpoint tagged safe: take one with "
                             f"agents.checkpoint({agent!r}, safe=True)")
        namespace = self.runtime.namespace(agent)
        for key in list(namespace.user_items()):
            del namespace[key]
        namespace.update(copy.deepcopy(point.names))
        op.touch(namespace_key(agent))
        return point.op

    # -- the circuit ------------------------------------------------------------------

    def circuit(self, agent: str) -> Trip | None:
        """Why ``agent``'s circuit is open, or None if it is closed."""
        with self._lock:
            state = self._states.get(agent)
            return None if state is None else state.trip

    def admit(self, agent: str, op: Op, print_: str) -> None:
        """Before an op of ``agent`` runs: raise CircuitOpen (and veto) or count it in."""
        if agent == HUMAN:
            return
        policy = self.effective(agent)
        now = self.clock()
        with self._lock:
            state = self._states.get(agent)
            if (state is None or state.trip is None) and not policy.describe():
                return  # unsupervised: nothing counted, nothing written
            state = self._states.setdefault(agent, _State())
            trip = state.trip
            if trip is None:
                trip = self._check_before(agent, policy, state, print_, now, op.id)
            if trip is not None:
                reason = f"{agent!r}'s circuit is open: {trip.message}"
                op.veto(reason, status="refused")
                op.facts["circuit"] = {"agent": agent, "policy": trip.policy,
                                       "limit": trip.limit, "figures": trip.figures,
                                       "tripped_op": trip.op}
                raise CircuitOpen(agent, trip.policy, trip.message)
            if (agent, op.id) in self._admitted:
                return  # one op is one iteration, however many runs it holds
            self._admitted.add((agent, op.id))
            self._write({"type": "admit", "agent": agent, "op": op.id, "sha": print_,
                         "at": now})
            self._apply_admit(state, print_, now)
        op.transaction.join(_Outcome(self, agent, op))

    def _check_before(self, agent: str, policy: Policy, state: _State, print_: str,
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

    def _trip(self, agent: str, state: _State, policy: str, limit: int,
              figures: dict[str, Any], message: str, *, op: int) -> Trip:
        trip = Trip(agent=agent, policy=policy, limit=limit, figures=figures,
                    message=message, op=op, at=utc_now())
        self._write({"type": "trip", "agent": agent, "policy": policy, "limit": limit,
                     "figures": figures, "message": message, "op": op, "at": trip.at})
        state.trip = trip
        return trip

    def announce(self) -> list[Trip]:
        """Emit ``kernos.circuit.open`` for every trip not yet announced, in the current op.

        Events are transactional: one emitted in the refused op would roll back
        with it.  So a trip is announced by the next op that *commits* and calls
        this (the human's reset does; issue 20 wires it after each cell and
        loop iteration); an ``announced`` journal line is written when that op
        commits, so a rolled-back announcement is made again next time.
        """
        op = self.runtime._op()
        with self._lock:
            pending = [state.trip for state in self._states.values()
                       if state.trip is not None and (state.trip.agent, state.trip.op)
                       not in self._announced]
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
        op.transaction.join(_Announced(self, pending))
        return pending

    def ended(self, agent: str, op: int, *, ok: bool) -> None:
        """An admitted op of ``agent`` committed (``ok``) or did not."""
        policy = self.effective(agent)
        with self._lock:
            if op in self._ended:
                return
            self._ended.add(op)
            state = self._states.setdefault(agent, _State())
            self._write({"type": "end", "agent": agent, "op": op, "ok": ok})
            self._apply_end(state, op, ok)
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
            state = self._states.get(agent)
            was = None if state is None or state.trip is None else state.trip.policy
            self._write({"type": "reset", "agent": agent,
                         "op": None if current is None else current.id, "at": self.clock()})
            self._states[agent] = _State()
        if current is not None:
            current.facts["circuit_reset"] = {"agent": agent, "was": was,
                                              "restored_from": restored}
        return {"agent": agent, "was_open": was, "restored_from": restored}

    # -- burn rate, from the LLM ledger ----------------------------------------------------

    def burn(self, agent: str, now: float) -> tuple[int, int]:
        """(tokens, micro-USD) the ledger charged ``agent`` in the window before ``now``."""
        from kernos.llm import LEDGER_FILE

        path = self.runtime.image.workspace.path / LEDGER_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return 0, 0
        key = f"principal:{agent}"
        calls: dict[int, dict[str, Any]] = {}
        for line in data[:data.rfind(b"\n") + 1].splitlines():
            entry = json.loads(line)
            call = calls.setdefault(entry["call"], {"keys": [], "at": entry.get("at")})
            if entry.get("keys"):
                call["keys"] = entry["keys"]
            call["tokens"], call["cost"] = entry["tokens"], entry["cost"]
        since = now - WINDOW_SECONDS
        tokens = micro = 0
        for call in calls.values():
            if key in call["keys"] and call["at"] and _epoch(call["at"]) >= since:
                tokens += int(call["tokens"])
                micro += int(float(call["cost"]) * 1_000_000)
        return tokens, micro

    # -- the journal (outside the image) --------------------------------------------------

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        for line in data[:data.rfind(b"\n") + 1].splitlines():
            entry = json.loads(line)
            state = self._states.setdefault(entry["agent"], _State())
            kind = entry["type"]
            if kind == "admit":
                self._apply_admit(state, entry["sha"], entry["at"])
            elif kind == "end":
                self._ended.add(entry["op"])
                self._apply_end(state, entry["op"], entry["ok"])
            elif kind == "trip":
                state.trip = Trip(agent=entry["agent"], policy=entry["policy"],
                                  limit=entry["limit"], figures=entry["figures"],
                                  message=entry["message"], op=entry["op"], at=entry["at"])
            elif kind == "reset":
                self._states[entry["agent"]] = _State()
            elif kind == "announced":
                self._announced.add((entry["agent"], entry["op"]))

    @staticmethod
    def _apply_admit(state: _State, print_: str, now: float) -> None:
        if state.first is None:
            state.first = now
        state.iterations += 1
        state.run = state.run + 1 if print_ == state.last else 1
        state.last = print_

    @staticmethod
    def _apply_end(state: _State, op: int, ok: bool) -> None:
        if ok:
            state.failures, state.failed_ops = 0, []
        else:
            state.failures += 1
            state.failed_ops = [*state.failed_ops[-9:], op]

    def _write(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode() + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            if self.durable and entry["type"] in ("trip", "reset"):
                os.fsync(fd)
        finally:
            os.close(fd)


class _Announced:
    """Notes, once the announcing op commits, that its trips were announced."""

    def __init__(self, breakers: Breakers, trips: list[Trip]) -> None:
        self.breakers, self.trips = breakers, trips

    def sort_key(self) -> str:
        return "~~kernos.supervisor.announced"

    def tpc_begin(self, txn: Any) -> None:
        pass

    def commit(self, txn: Any) -> None:
        pass

    def tpc_vote(self, txn: Any) -> None:
        pass

    def tpc_finish(self, txn: Any) -> None:
        breakers = self.breakers
        with breakers._lock:
            for trip in self.trips:
                breakers._announced.add((trip.agent, trip.op))
                breakers._write({"type": "announced", "agent": trip.agent, "op": trip.op})

    def tpc_abort(self, txn: Any) -> None:
        pass

    def abort(self, txn: Any) -> None:
        pass


class _Outcome:
    """Joins an admitted op's transaction to note whether it committed."""

    def __init__(self, breakers: Breakers, agent: str, op: Op) -> None:
        self.breakers, self.agent, self.op = breakers, agent, op

    def sort_key(self) -> str:
        return "~~kernos.supervisor"  # after the image: its publish is the commit point

    def tpc_begin(self, txn: Any) -> None:
        pass

    def commit(self, txn: Any) -> None:
        pass

    def tpc_vote(self, txn: Any) -> None:
        pass

    def tpc_finish(self, txn: Any) -> None:
        self.breakers.ended(self.agent, self.op.id, ok=True)

    def tpc_abort(self, txn: Any) -> None:
        pass

    def abort(self, txn: Any) -> None:
        self.breakers.ended(self.agent, self.op.id, ok=False)


def _human_only(action: str) -> None:
    """Refuse ``action`` while any agent code runs (the allowlist: the human's code only)."""
    running = context.running()
    if running is not None and running.authority():
        raise CapabilityDenied(running.principal, f"supervisor: {action}",
                               detail="only the human's own code may")


def _epoch(stamp: object) -> float:
    if isinstance(stamp, (int, float)):
        return float(stamp)
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
