"""Replay: rebuild an image in a fresh workspace by re-running its recorded ops.

:func:`replay` reads a source workspace (read-only: no lock, so a kernel may
be running on it) and re-runs, in a new workspace, the ops its audit log
recorded between two snapshots:

1. *Base.*  The new workspace fetches the source's history (``git fetch``),
   and its first op checks out the ``--from`` snapshot (none: the empty
   image).
2. *Ops, in audit order, each with its original op id.*  A harness op is
   delivered again as the same request (code, tool call, or grant, revoke,
   add_agent, checkout); a notebook cell runs as human code (IPython's input
   transforms applied, compiled under the ``__future__`` flags the kernel's
   compiler had then, :mod:`kernos.replay.cells`; a magic is reported as
   unsupported); an op that ended
   in a conflict or was rejected ran no code, and is recorded so again.
   Effects are never executed: the follow-up op of kind ``effect`` takes
   each outcome from the source's journal, and only for the same request
   hash (:mod:`kernos.effects`).  LLM calls are answered from the source's
   recordings, in ``replay`` mode (:mod:`kernos.llm`): a request the
   original did not make fails loudly, and no model is asked.  Recalls of the
   agents' memory are answered from the op's record in the same way
   (:mod:`kernos.memory.service`).  Budgets are
   spent again in the new workspace's own ledger, by the same ops, failed
   ones included; an op's embedding calls are not made again (recalls come
   from the record, and a recorded text is answered free), so the source's
   ledger calls of kind ``embedding`` of each op are absorbed just before it
   runs, and the new ledger charges what the original did.
3. *Check.*  Every op must end as it did (committed or not), and after each
   committed op the image must equal the source's snapshot of that op.  Two
   snapshots are equal when every group's stored tree is the same bytes, or
   failing that, when :func:`kernos.replay.digest.state_digest` of the
   values is the same (pickles of functions carry their file names, and sets
   their hash-seed order; the digest does not).  Each step's state digest is
   reported, and the first divergence names the op and the names that
   differ, with the first difference in each.

*A fork* (``kernos fork``, :mod:`kernos.fork`): its log starts at the
snapshot it was forked from, so by default the replay starts there, as if
``--from`` named it.

``until`` stops just before that op, leaving the new workspace as it was
then, for a person to open in a notebook and run the op by hand.

*A pruned history* (``kernos prune``, :mod:`kernos.audit.pruning`).  Every
recorded op is still re-run (its code is in the audit log, not in the
snapshots), so the replayed image is the whole history's.  A snapshot a
prune renamed is compared at its new id.  A step whose snapshot a prune
deleted cannot be compared: it is reported as not checked (``pruned``, with
the prune record), and the next kept snapshot checks the state all the
unchecked steps led to; a divergence found there says that it may have
begun in them.  A checkout op whose own snapshot was pruned cannot be
replayed (which snapshot it took is not known any more): replay ``--from``
a snapshot after it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernos import llm
from kernos.agents import HUMAN, AgentRuntime, Agents
from kernos.analysis import Reach
from kernos.audit.canonical import canonical
from kernos.audit.human import Audit
from kernos.audit.pruning import Prunes
from kernos.audit.verify_history import unpublished
from kernos.errors import KernosError, UsageError
from kernos.events.human import Events
from kernos.harness.service import HarnessService
from kernos.image import Image
from kernos.llm._store import DIRECTORY as LLM_DIRECTORY
from kernos.llm._store import LEDGER_FILE, read_calls
from kernos.memory.service import recorded_recalls
from kernos.replay.cells import CellCompiler
from kernos.replay.digest import describe_difference, state_digest
from kernos.store.snapshots import read_group, read_snapshot
from kernos.store.trust import require_trusted
from kernos.store.workspace import Workspace, op_of

__all__ = ["Divergence", "ReplayReport", "Step", "replay"]

_HELPERS = ("agents", "events", "audit")
"""The kernel's own names in a notebook's namespace: present, never persisted."""
_NOT_RUN = frozenset({"conflict", "rejected", "refused"})
"""Statuses of ops that ran no code (``refused``: an open circuit refused it before)."""


@dataclass(kw_only=True)
class Step:
    """One replayed op."""

    op: int
    kind: str
    principal: str
    status: str
    """How the op ended in the source."""
    replayed: str
    """How it ended in the replay."""
    digest: str | None = None
    """The state digest after it (committed ops), in the replay."""
    original: str | None = None
    """The state digest of the source's snapshot of it."""
    pruned_by: int | None = None
    """The prune record that deleted the source's snapshot of it: not compared."""

    @property
    def matches(self) -> bool:
        return self.replayed == self.status and (
            self.pruned_by is not None or self.digest == self.original)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "matches": self.matches}


@dataclass(kw_only=True)
class Divergence:
    """The first op whose replay did not end like the original."""

    op: int
    reason: str
    names: dict[str, str] = field(default_factory=dict)
    """Name -> what differs (``added``, ``missing``, or the first difference)."""

    def __str__(self) -> str:
        lines = [f"op {self.op}: {self.reason}"]
        lines += [f"  {name}: {what}" for name, what in sorted(self.names.items())]
        return "\n".join(lines)


@dataclass(kw_only=True)
class ReplayReport:
    source: str
    into: str
    steps: list[Step]
    divergence: Divergence | None = None
    stopped_before: int | None = None
    """With ``until``: the op not run (its code is ``pending_code``)."""
    pending_code: str | None = None
    unfinished: int | None = None
    """An op the source's kernel died committing (its record is written, its commit was
    never published): not run, since the next open of the source voids it."""

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def summary(self) -> str:
        """The steps as a table, then the verdict (what ``kernos replay`` prints)."""
        from kernos.history import format_table

        rows = [("op", "kind", "principal", "original", "replayed", "state", "same")]
        rows += [(str(s.op), s.kind, s.principal, s.status, s.replayed,
                  (s.digest or "")[:12],
                  "NO" if not s.matches else "pruned" if s.pruned_by is not None else "yes")
                 for s in self.steps]
        lines = [format_table(rows), ""]
        committed = sum(1 for s in self.steps
                        if s.status == "committed" and s.pruned_by is None)
        pruned = sum(1 for s in self.steps if s.pruned_by is not None)
        if self.divergence is not None:
            lines.append(f"DIVERGED at {self.divergence}")
        else:
            lines.append(f"ok: {len(self.steps)} ops replayed, {committed} snapshots equal to "
                         "the original; no effect was executed"
                         + (f"; {pruned} not checked: their snapshots were pruned"
                            if pruned else ""))
        if self.unfinished is not None:
            lines.append(f"op {self.unfinished} not replayed: the kernel died before its "
                         "commit was published, and the next open of the workspace voids it")
        if self.stopped_before is not None:
            lines.append(f"stopped before op {self.stopped_before}; its code:")
            lines += ["    " + line for line in (self.pending_code or "").splitlines()]
            lines.append(f"open that state with KERNOS_WORKSPACE={self.into}")
        lines.append(f"replayed into {self.into}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "into": self.into, "ok": self.ok,
                "steps": [step.to_json() for step in self.steps],
                "divergence": None if self.divergence is None else {
                    "op": self.divergence.op, "reason": self.divergence.reason,
                    "names": self.divergence.names},
                "stopped_before": self.stopped_before, "pending_code": self.pending_code,
                "unfinished": self.unfinished}


def replay(source: str | Path, *, start: str | None = None, end: str | None = None,
           until: int | None = None, into: str | Path | None = None,
           keep_going: bool = False) -> ReplayReport:
    """Re-run the recorded ops of ``source`` in a fresh workspace (see the module docstring).

    ``start``/``end`` are snapshot refs of the source (``@N``, ``HEAD~N``, a
    commit id); by default the whole history.  ``into`` is the new
    workspace's directory (it must not exist yet; default: a temporary one).
    """
    require_trusted(Path(source).expanduser().absolute())  # a replay runs its recorded code
    original = Workspace.open(source, writable=False)
    try:
        target = Path(into) if into is not None else Path(
            tempfile.mkdtemp(prefix="kernos-replay-")) / "workspace"
        if target.exists() and any(target.iterdir()):
            raise UsageError(f"{target} is not empty: replay builds a fresh workspace; give a "
                             "new directory")
        previous = llm.set_mode(None)
        llm.set_mode(llm.Mode.REPLAY)  # a model is never asked again: recordings only
        try:
            with _Replayer(original, target) as replayer:
                return replayer.run(start=start, end=end, until=until, keep_going=keep_going)
        finally:
            llm.set_mode(previous)
    finally:
        original.close()


class _Replayer:
    def __init__(self, original: Workspace, target: Path) -> None:
        from kernos.audit import open_audit

        self.original = original
        self.source_audit = open_audit(original)
        self.workspace = Workspace.open(target, purpose="kernos replay")
        _fetch(self.workspace, original)
        _copy_recordings(self.workspace, original)
        self.module = types.ModuleType("__main__")
        self.namespace: dict[str, Any] = self.module.__dict__
        self.image = Image(self.workspace, self.namespace, module=self.module,
                           is_persistent=_persistent)
        self.image.restore()
        self.runtime = AgentRuntime(self.image)
        self.namespace.update({"agents": Agents(lambda: self.runtime),
                               "events": Events(lambda: self.runtime.events),
                               "audit": Audit(lambda: self.image)})
        self.service = HarnessService(self.image, self.runtime, max_request_bytes=1 << 30)
        self.commits: dict[str, str] = {}
        """Source commit id (as recorded, and as it is now if a prune renamed it) ->
        replayed commit id."""
        self.prunes = Prunes.from_log(self.source_audit)
        self._unchecked: list[int] = []
        """Ops since the last compared snapshot whose snapshots were pruned."""
        self._digests: dict[bytes, str] = {}
        self.image.identity_override = _tag(self.source_audit)
        self.runtime.effects.replaying = True
        self.runtime.breakers.replaying = True  # the records say which ops circuits refused
        self.runtime.llm_keyring = self.source_audit.keyring  # recordings sealed by the source
        self._journal: dict[str, list[dict[str, Any]]] | None = None
        self.cells = CellCompiler()
        """The kernel's compiler state (``__future__`` flags) as the cells go."""
        self._restarts: set[int] = set()
        """Ops run by a new kernel process after one died (a new compiler)."""
        self.unfinished = self._unfinished()

    def _unfinished(self) -> int | None:
        """The audit index of the op the source's kernel died committing, if it did.

        Only the newest committed record can name a commit that was never
        published (see ``AuditLog.recover``, which voids it at the next writable
        open, and ``verify``, which reports it as unfinished)."""
        index = self.source_audit.last_commit_index()
        if index is None:
            return None
        commit = self.source_audit.entries[index].commit
        if commit is None or self.prunes.resolve(commit, index)[1] is not None:
            return None  # a prune after it renamed or deleted its snapshot
        head = self.original.head()
        if head is not None and commit == head.hex():
            return None
        return index if unpublished(self.original, commit) else None

    def __enter__(self) -> _Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        # A replay hands over a quiet workspace: a background repack its commits started
        # would still be writing into it (a caller that deletes it at once races git).
        try:
            self.workspace.objects.wait_for_maintenance()
        finally:
            self.workspace.close()

    # -- what to run ------------------------------------------------------------------

    def _records(self, first: int, last: int | None) -> Iterator[dict[str, Any]]:
        died = False
        for entry in self.source_audit.entries:
            if entry.type == "died":
                died = True
            elif (entry.type == "op" and entry.op is not None and not entry.voided
                  and entry.index != self.unfinished):
                if entry.op <= first:  # not replayed; its cell may have set a __future__
                    if died:
                        self.cells.restarted()
                    self._compiled(self.source_audit.read(entry.index))
                elif last is None or entry.op <= last:
                    if died:
                        self._restarts.add(entry.op)
                    yield self.source_audit.read(entry.index)
                else:
                    continue
                died = False

    def _compiled(self, record: dict[str, Any]) -> int | None:
        """The ``__future__`` flags the kernel compiled this cell under (None: not a cell
        the kernel ran)."""
        code = self._code(record)
        if (record.get("kind") not in ("cell", "checkout") or code is None
                or record.get("status") in _NOT_RUN):
            return None
        if record.get("kind") == "checkout":
            try:
                data = json.loads(code)
            except ValueError:
                data = None  # `%kernos checkout REF` in a notebook: a cell
            if isinstance(data, dict) and "action" in data:
                return None  # a harness checkout request (as _request tells them apart)
        return self.cells.ran(_transform(code))

    def run(self, *, start: str | None, end: str | None, until: int | None,
            keep_going: bool) -> ReplayReport:
        first = 0
        if start is None:
            start = self._forked_at()
        if start is not None:
            commit = self._resolve(start)
            first = op_of(self.original.read_commit(commit)) or 0
            self._base(commit, first)
            first = max(first, _op_named(start))  # @N: the ops after N (N wrote no snapshot)
        last = None
        if end is not None:
            last = op_of(self.original.read_commit(self._resolve(end)))
            if _op_named(end):  # @N: up to op N, which may have no snapshot of its own
                last = max(last or 0, _op_named(end))
        report = ReplayReport(source=str(self.original.path), into=str(self.workspace.path),
                              steps=[])
        if self.unfinished is not None:
            report.unfinished = self.source_audit.entries[self.unfinished].op
        records = list(self._records(first, last))
        replayed = {int(record["op"]) for record in records}
        # The ledger outside the image follows the source's: the calls of ops this
        # replay does not re-run are charged before the ops after them run.
        # (In op order; a call outside any op, first.)
        calls = read_calls(Path(self.original.path) / LEDGER_FILE)
        unrun = sorted((call for call in calls if call["op"] not in replayed),
                       key=lambda call: call["op"] or 0)
        # The embedding calls of the ops it re-runs are not made again (their recalls
        # are answered from the records, and a text embedded before is answered free
        # from its recording): each op's are charged just before it runs.
        embedded: dict[int, list[dict[str, Any]]] = {}
        for call in calls:
            if call["op"] in replayed and call["kind"] == "embedding":
                embedded.setdefault(call["op"], []).append(call)
        ledger = self.runtime.llm_client().store.ledger
        for record in records:
            op = int(record["op"])
            if until is not None and op >= until:
                report.stopped_before = op
                report.pending_code = self._code(record)
                break
            due = next((at for at, call in enumerate(unrun) if (call["op"] or 0) >= op),
                       len(unrun))
            if due:
                ledger.absorb(unrun[:due])
                del unrun[:due]
            ledger.absorb(embedded.pop(op, []))
            step, divergence = self._step(record)
            report.steps.append(step)
            if divergence is not None and report.divergence is None:
                report.divergence = divergence
                if not keep_going:
                    break
        return report

    def _base(self, commit: bytes, op: int) -> None:
        self.image.last_op = op - 1
        base = self.image.begin(source=f"replay base {commit.hex()}", kind="checkout",
                                reach=Reach.all("a checkout replaces everything"))
        try:
            base.checkout(commit.hex())
        except BaseException:
            base.abort()
            raise
        report = base.commit()
        self.commits[commit.hex()] = report.commit

    # -- one op ----------------------------------------------------------------------

    def _code(self, record: dict[str, Any]) -> str | None:
        code = record.get("code")
        if code is None:
            return None
        if code.get("sealed"):
            return None
        if "text" in code:
            return str(code["text"])
        return self.source_audit.code(int(record["op"]))

    def _forked_at(self) -> str | None:
        """A fork's history starts at the snapshot it was forked from (``kernos.fork``):
        its ops run on that image, not on an empty one."""
        if not self.source_audit.entries:
            return None
        genesis = self.source_audit.read(0)
        adopted = genesis.get("adopts")
        return adopted if isinstance(genesis.get("forked_from"), dict) and isinstance(
            adopted, str) else None

    def _resolve(self, ref: str) -> bytes:
        """A ref of the source; ``@N`` of an op that wrote no snapshot (it changed nothing,
        or rolled back, as its audit record says) is the image it left: the snapshot before."""
        op = _op_named(ref)
        if op:
            entries = [entry for entry in self.source_audit.entries
                       if entry.type == "op" and entry.op == op and not entry.voided]
            wrote = any(entry.status == "committed" and not entry.unchanged for entry in entries)
            if entries and not wrote:
                return self.original.snapshot_of_op(op, exact=False, ref=ref)
        return self.original.resolve(ref)

    def _step(self, record: dict[str, Any]) -> tuple[Step, Divergence | None]:
        op = int(record["op"])
        status = str(record.get("status"))
        kind = str(record.get("kind"))
        principal = str(record.get("principal") or HUMAN)
        step = Step(op=op, kind=kind, principal=principal, status=status, replayed="")
        self.image.last_op = op - 1
        try:
            step.replayed, commit = self._deliver(record)
        except KernosError as error:
            step.replayed = "not replayable"
            return step, Divergence(op=op, reason=str(error))
        changed = self._environment_changed(record)
        if changed:
            return step, Divergence(
                op=op, reason="it read environment variables whose values differ from the "
                              "original's: set them as they were, then replay again",
                names={f"${name}": what for name, what in changed.items()})
        if step.replayed != status:
            return step, Divergence(
                op=op, reason=f"it ended {step.replayed!r} in the replay, {status!r} "
                              "originally")
        if status != "committed":
            return step, None
        if record.get("unchanged") is True:  # no snapshot originally: none in the replay
            if self.image.head_op == op:  # the replayed op wrote a snapshot
                return step, Divergence(op=op, reason="it changed the image in the replay, "
                                                      "and nothing originally")
            return step, None
        assert commit is not None
        recorded = str(record.get("commit"))
        self.commits[recorded] = commit
        now, by = self.prunes.resolve(recorded, int(record.get("index", -1)))
        if now is None:  # the source's snapshot was pruned: nothing to compare with
            step.pruned_by = by
            step.digest = self._state_digest(
                bytes.fromhex(commit), read_snapshot(self.workspace, bytes.fromhex(commit)
                                                     ).group_trees)
            self._unchecked.append(op)
            return step, None
        self.commits[now] = commit
        divergence = self._compare(step, bytes.fromhex(now), bytes.fromhex(commit))
        unchecked, self._unchecked = self._unchecked, []
        if divergence is not None and unchecked:
            divergence.reason += (f"; the snapshots of ops {', '.join(map(str, unchecked))} "
                                  "before it were pruned, so the difference may have begun "
                                  "there")
        return step, divergence

    def _environment_changed(self, record: dict[str, Any]) -> dict[str, str]:
        """Variables the original op read that the replayed one saw otherwise (by SHA-256)."""
        original = {str(name): value for name, value in record.get("environ") or []}
        if not original:
            return {}
        audit = self.image.audit
        ours: dict[str, Any] = {}
        for entry in reversed(audit.entries):
            if entry.type == "op" and entry.op == record.get("op"):
                ours = {str(name): value for name, value in audit.read(entry.index).get(
                    "environ") or []}
                break
        return {name: ("unset now" if ours.get(name, value) is None else
                       "unset originally" if value is None else "another value")
                for name, value in original.items()
                if name in ours and ours[name] != value}

    def _deliver(self, record: dict[str, Any]) -> tuple[str, str | None]:
        """Run the op again; (how it ended, the new commit id)."""
        op = int(record["op"])
        status = str(record.get("status"))
        kind = str(record.get("kind"))
        principal = str(record.get("principal") or HUMAN)
        if op in self._restarts:
            self.cells.restarted()  # a new kernel process: a new compiler
        if kind == "effect":
            reports = self.runtime.effects.drain(recorded=self._recorded_effects(record))
            if not reports:
                raise UsageError(f"op {op} recorded effects, but nothing was queued in the "
                                 "replay")
            return "committed", reports[-1].commit
        if kind == "supervisor":
            return self._announced(record)
        code = self._code(record)
        if code is None:
            raise UsageError(f"op {op} has no code to replay (sealed for a data subject, or "
                             "not recorded)")
        if status in _NOT_RUN:
            replayed = self.image.begin(source=code, principal=principal, kind=kind,
                                        reach=Reach(frozenset()))
            replayed.abort(status=status, error=_error(record))
            return status, None
        self.runtime.llm_client().replay_cached = [  # the completions' (an embedding's
            bool(call.get("cached"))                 # entry says what it was)
            for call in record.get("llm") or [] if call.get("kind") != "embedding"]
        self.runtime.memory.replaying = recorded_recalls(self.source_audit, record)
        self.image.clock_replay = list(record.get("clock") or [])
        if kind == "loop":  # an iteration of an agent's loop (kernos.agents.loop)
            from kernos.agents.loop import run_once

            turn = run_once(self.runtime, principal)
            self.image.clock_replay = None
            return turn.outcome, None if turn.report is None else turn.report.commit
        request = self._request(kind, principal, code, record)
        if record.get("key") is not None and request["action"] == "op":
            request["key"] = record["key"]
        if status == "committed" and record.get("error") and request["action"] == "op":
            request["on_error"] = "keep"  # kept although it raised (on_error = keep)
        if self._compiled(record) is not None:  # a notebook cell: run as IPython ran it
            self.service.cell_runner = self.cells.run
        try:
            handled = self.service.handle(request)
        finally:
            self.service.cell_runner = None
        self.image.clock_replay = None  # a request refused before its op began used none
        reply = handled.reply
        if reply.get("status") != "ok":
            error = reply.get("error") or {}
            raise UsageError(f"op {op} was refused in the replay: {error.get('message')}")
        result = reply["result"]
        return str(result.get("status", "committed")), result.get("commit")

    def _announced(self, record: dict[str, Any]) -> tuple[str, str | None]:
        """The supervisor's op that announced tripped circuits: its events again (a trip
        is decided outside the image, by the original's journal)."""
        replayed = self.image.begin(source=self._code(record), principal=HUMAN,
                                    kind="supervisor", reach=Reach(frozenset()))
        try:
            for event in record.get("events") or []:
                self.runtime.events.emit(event["topic"], event.get("payload"),
                                         principal=HUMAN)
        except BaseException:
            replayed.abort()
            raise
        report = replayed.commit()
        return "committed", report.commit

    def _request(self, kind: str, principal: str, code: str,
                 record: dict[str, Any]) -> dict[str, Any]:
        try:
            data = json.loads(code) if kind in ("harness", "checkout") else None
        except ValueError:
            data = None
        if kind == "checkout" and not (isinstance(data, dict) and "action" in data):
            kind = "cell"  # `%kernos checkout REF` in a notebook
        if kind in ("harness", "checkout"):
            if isinstance(data, dict) and set(data) == {"tool", "arguments"}:
                return {"v": 1, "action": "op", "principal": principal, **data}
            if isinstance(data, dict) and data.get("action") in (
                    "grant", "revoke", "add_agent", "checkout", "loop", "remember",
                    "policy", "reset"):
                request = {"v": 1, **data}
                if data["action"] == "checkout":
                    request["ref"] = self._mapped(self._checked_out(record, str(data.get("ref"))))
                return request
            return {"v": 1, "action": "op", "principal": principal, "code": code}
        if kind == "cell":
            return {"v": 1, "action": "op", "principal": HUMAN, "code": _transform(code)}
        raise UsageError(f"op {record.get('op')} is of kind {kind!r}, which replay does not "
                         "run yet")

    def _checked_out(self, record: dict[str, Any], ref: str) -> str:
        """The commit a checkout took, as it resolved then (``HEAD~1`` moves on)."""
        commit = record.get("commit")
        if not isinstance(commit, str):
            return ref
        now, by = self.prunes.resolve(commit, int(record.get("index", -1)))
        if now is None:
            raise UsageError(f"op {record.get('op')} checked out {ref}, but its snapshot was "
                             f"pruned (audit record {by}), so which snapshot it took is not "
                             "known any more: replay --from a snapshot after it")
        note = str(read_snapshot(self.original, bytes.fromhex(now)).manifest.get("note", ""))
        return note.removeprefix("checkout ").strip() if note.startswith("checkout ") else ref

    def _mapped(self, ref: str) -> str:
        prefix = ref.strip().lower()
        if 4 <= len(prefix) <= 40 and all(c in "0123456789abcdef" for c in prefix):
            # An id as it was recorded: a prune may have renamed or deleted it since.
            found = {new for old, new in self.commits.items() if old.startswith(prefix)}
            if len(found) == 1:
                return found.pop()
        commit = self.original.resolve(ref).hex()
        if commit not in self.commits:
            raise UsageError(f"a checkout of {ref} (commit {commit[:12]}) that the replay did "
                             "not rebuild")
        return self.commits[commit]

    def _recorded_effects(self, record: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The outcomes a follow-up op recorded, with their request hashes and results."""
        if self._journal is None:
            self._journal = {}
            for entry in self.source_audit.entries:
                if entry.type == "effect" and entry.key is not None:
                    self._journal.setdefault(entry.key, []).append(
                        self.source_audit.read(entry.index))
        found = {}
        for outcome in record.get("effects") or []:
            key = str(outcome.get("key"))
            journal = self._journal.get(key, [])
            done = [item for item in journal if item.get("state") == "done"]
            found[key] = {**outcome, "request": journal[0].get("request") if journal else None,
                          "result": done[-1].get("result") if done else None}
        return found

    # -- comparing -----------------------------------------------------------------------

    def _compare(self, step: Step, original: bytes, replayed: bytes) -> Divergence | None:
        ours = read_snapshot(self.workspace, replayed).group_trees
        theirs = read_snapshot(self.workspace, original).group_trees
        step.digest = self._state_digest(replayed, ours)
        step.original = self._state_digest(original, theirs)
        if step.digest == step.original:
            return None
        names = self._differences(original, replayed)
        return Divergence(op=step.op, reason="the image differs from the original snapshot",
                          names=names)

    def _state_digest(self, commit: bytes, trees: dict[str, bytes]) -> str:
        parts = []
        for key in sorted(trees):
            tree = trees[key]
            if tree not in self._digests:
                values = self._load(commit, {key: tree})
                self._digests[tree] = state_digest(values)[0]
            parts.append([key, self._digests[tree]])
        return hashlib.sha256(canonical(parts)).hexdigest()

    def _load(self, commit: bytes, trees: dict[str, bytes]) -> dict[str, object]:
        groups = {key: read_group(self.workspace, key, tree) for key, tree in trees.items()}
        values, failed = self.image.load_groups(groups)
        if failed:
            raise UsageError(f"snapshot {commit.hex()[:12]} could not be loaded for comparison "
                             f"({', '.join(sorted(failed))})")
        return values

    def _differences(self, original: bytes, replayed: bytes) -> dict[str, str]:
        ours = self._load(replayed, read_snapshot(self.workspace, replayed).group_trees)
        theirs = self._load(original, read_snapshot(self.workspace, original).group_trees)
        found: dict[str, str] = {}
        for name in sorted(set(ours) | set(theirs)):
            if name not in theirs:
                found[name] = "only in the replay"
            elif name not in ours:
                found[name] = "missing from the replay"
            else:
                difference = describe_difference(theirs[name], ours[name], root=name)
                if difference is not None:
                    found[name] = difference
        return found


def _persistent(name: str) -> bool:
    return name not in _HELPERS and not (name.startswith("__") and name.endswith("__"))


def _tag(audit: Any) -> str:
    entries = audit.entries
    return str(entries[0].hash[:12]) if entries else "local"


def _error(record: dict[str, Any]) -> tuple[str, str]:
    error = record.get("error") or {}
    return str(error.get("kind", "")), str(error.get("message", ""))


def _fetch(workspace: Workspace, original: Workspace) -> None:
    """Bring the source's history objects into the new workspace (not its branch)."""
    if original.head() is None:
        return
    # Commits the source's kernel has not folded into git yet (kernos.store.tail).
    workspace.objects.add_packed(original.tail.objects.items())
    if original.git_ref() is None:
        return  # every commit is still in the tail
    completed = subprocess.run(
        # One pack (the store reads packs itself): unpacking every object loose made a
        # replay's start grow with the whole history, 8 s at 1,100 ops.
        ["git", "--git-dir", str(workspace.git_dir), "fetch", "--quiet", "--no-tags",
         str(original.git_dir), "+refs/heads/main:refs/kernos/source"],
        capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise UsageError(f"could not read the history of {original.path}: "
                         f"{completed.stderr.strip()[:500]}")


def _copy_recordings(workspace: Workspace, original: Workspace) -> None:
    """The source's recorded LLM requests and answers (not its ledger: the replayed ops
    spend again, and the calls of the others are absorbed as the replay goes)."""
    for part in ("objects", "recordings"):
        source = Path(original.path) / LLM_DIRECTORY / part
        if source.is_dir():
            shutil.copytree(source, Path(workspace.path) / LLM_DIRECTORY / part,
                            dirs_exist_ok=True)


def _transform(code: str) -> str:
    """A notebook cell as plain Python (IPython's input transforms), if IPython is here."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return code
    transformed: str = TransformerManager().transform_cell(code)  # type: ignore[no-untyped-call]
    return transformed


def _op_named(ref: str) -> int:
    """N for a ref ``@N``, else 0."""
    match = re.fullmatch(r"\s*@(\d+)\s*", ref)
    return int(match.group(1)) if match else 0
