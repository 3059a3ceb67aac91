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
   hash (:mod:`kernos.effects`).  Likewise a harness op whose recorded source
   holds no bytes (a checkpoint change of ``KernosSaver``, a ``files_*``
   request: :data:`kernos.replay._taken.TAKEN_ACTIONS`, an allowlist) is not
   sent again: a new op of the same principal, kind and source applies what
   the original op changed, taken from the original's snapshot of it (the
   principal's checkpoint pages, or the files root's files), and one the
   original rolled back or that changed nothing changes nothing
   (:mod:`kernos.replay._taken`); its snapshot is compared as every op's.
   LLM calls are answered from the source's
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
   their hash-seed order; the digest does not).  The tracked files must be
   the same hash for hash: the snapshot's ``files/`` tree is the very same
   id, or each file that differs is named (:mod:`kernos.replay.files`, which
   also says where replayed file writes land).  Each step's state digest is
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

Where it lives: this module holds :func:`replay` and the loop that delivers
each op again; ``kernos.replay._source`` reads what the source recorded (an
op's code, refs and checkouts as they resolved then, effect outcomes) and
brings its history into the new workspace; ``kernos.replay._taken`` re-does
the ops it takes from the source's snapshots; ``kernos.replay._compare``
checks the snapshots; :mod:`kernos.replay.report` holds the records the
report is made of.
"""

from __future__ import annotations

import json
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kernos import llm
from kernos.agents import HUMAN, AgentRuntime, Agents
from kernos.analysis import Reach
from kernos.audit.human import Audit
from kernos.errors import KernosError, UsageError
from kernos.events.human import Events
from kernos.harness.service import HarnessService
from kernos.image import Image
from kernos.llm._store import LEDGER_FILE, read_calls
from kernos.memory.service import recorded_recalls
from kernos.replay._compare import Comparer, environment_changed
from kernos.replay._source import Source, copy_recordings, fetch_history, op_named
from kernos.replay._taken import Taker, taken_action
from kernos.replay.cells import CellCompiler
from kernos.replay.report import Divergence, ReplayReport, Step
from kernos.store.snapshots import read_snapshot
from kernos.store.trust import require_trusted
from kernos.store.workspace import Workspace, op_of

__all__ = ["Divergence", "ReplayReport", "Step", "replay"]

_HELPERS = ("agents", "events", "audit")
"""The kernel's own names in a notebook's namespace: present, never persisted."""
_NOT_RUN = frozenset({"conflict", "rejected", "refused"})
"""Statuses of ops that ran no code (``refused``: an open circuit refused it before)."""


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
        self.source = Source(original)
        self.workspace = Workspace.open(target, purpose="kernos replay")
        fetch_history(self.workspace, original)
        copy_recordings(self.workspace, original)
        self.module = types.ModuleType("__main__")
        self.namespace: dict[str, Any] = self.module.__dict__
        self.image = Image(self.workspace, self.namespace, module=self.module,
                           is_persistent=_persistent)
        # Its files root only: directories tracked outside are the user's (replay.files).
        self.image.files.outside_allowed = False
        self.image.restore()
        self.runtime = AgentRuntime(self.image)
        self.namespace.update({"agents": Agents(lambda: self.runtime),
                               "events": Events(lambda: self.runtime.events),
                               "audit": Audit(lambda: self.image)})
        self.service = HarnessService(self.image, self.runtime, max_request_bytes=1 << 30)
        self.commits: dict[str, str] = {}
        """Source commit id (as recorded, and as it is now if a prune renamed it) ->
        replayed commit id."""
        self._unchecked: list[int] = []
        """Ops since the last compared snapshot whose snapshots were pruned."""
        self.comparer = Comparer(self.workspace, self.image)
        self.taker = Taker(self.workspace, self.image, self.source)
        self.image.identity_override = self.source.tag()
        self.runtime.effects.replaying = True
        self.runtime.breakers.replaying = True  # the records say which ops circuits refused
        self.runtime.llm_keyring = self.source.audit.keyring  # recordings sealed by the source
        self.cells = CellCompiler()
        """The kernel's compiler state (``__future__`` flags) as the cells go."""
        self._restarts: set[int] = set()
        """Ops run by a new kernel process after one died (a new compiler)."""
        self.unfinished = self.source.unfinished()

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
        for entry in self.source.audit.entries:
            if entry.type == "died":
                died = True
            elif (entry.type == "op" and entry.op is not None and not entry.voided
                  and entry.index != self.unfinished):
                if entry.op <= first:  # not replayed; its cell may have set a __future__
                    if died:
                        self.cells.restarted()
                    self._compiled(self.source.audit.read(entry.index))
                elif last is None or entry.op <= last:
                    if died:
                        self._restarts.add(entry.op)
                    yield self.source.audit.read(entry.index)
                else:
                    continue
                died = False

    def _compiled(self, record: dict[str, Any]) -> int | None:
        """The ``__future__`` flags the kernel compiled this cell under (None: not a cell
        the kernel ran)."""
        code = self.source.code(record)
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
            start = self.source.forked_at()
        if start is not None:
            commit = self.source.resolve(start)
            first = op_of(self.source.workspace.read_commit(commit)) or 0
            self._base(commit, first)
            first = max(first, op_named(start))  # @N: the ops after N (N wrote no snapshot)
        last = None
        if end is not None:
            last = op_of(self.source.workspace.read_commit(self.source.resolve(end)))
            if op_named(end):  # @N: up to op N, which may have no snapshot of its own
                last = max(last or 0, op_named(end))
        report = ReplayReport(source=str(self.source.workspace.path),
                              into=str(self.workspace.path), steps=[])
        if self.unfinished is not None:
            report.unfinished = self.source.audit.entries[self.unfinished].op
        records = list(self._records(first, last))
        replayed = {int(record["op"]) for record in records}
        # The ledger outside the image follows the source's: the calls of ops this
        # replay does not re-run are charged before the ops after them run.
        # (In op order; a call outside any op, first.)
        calls = read_calls(Path(self.source.workspace.path) / LEDGER_FILE)
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
                report.pending_code = self.source.code(record)
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
        changed = environment_changed(record, self.image.audit)
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
        now, by = self.source.prunes.resolve(recorded, int(record.get("index", -1)))
        if now is None:  # the source's snapshot was pruned: nothing to compare with
            step.pruned_by = by
            step.digest = self.comparer.snapshot_digest(
                bytes.fromhex(commit), read_snapshot(self.workspace, bytes.fromhex(commit)
                                                     ).group_trees)
            self._unchecked.append(op)
            return step, None
        self.commits[now] = commit
        divergence = self.comparer.compare(step, bytes.fromhex(now), bytes.fromhex(commit))
        unchecked, self._unchecked = self._unchecked, []
        if divergence is not None and unchecked:
            divergence.reason += (f"; the snapshots of ops {', '.join(map(str, unchecked))} "
                                  "before it were pruned, so the difference may have begun "
                                  "there")
        return step, divergence

    def _deliver(self, record: dict[str, Any]) -> tuple[str, str | None]:
        """Run the op again; (how it ended, the new commit id)."""
        op = int(record["op"])
        status = str(record.get("status"))
        kind = str(record.get("kind"))
        principal = str(record.get("principal") or HUMAN)
        if op in self._restarts:
            self.cells.restarted()  # a new kernel process: a new compiler
        if kind == "effect":
            reports = self.runtime.effects.drain(recorded=self.source.recorded_effects(record))
            if not reports:
                raise UsageError(f"op {op} recorded effects, but nothing was queued in the "
                                 "replay")
            return "committed", reports[-1].commit
        if kind == "supervisor":
            return self._announced(record)
        code = self.source.code(record)
        if code is None:
            raise UsageError(f"op {op} has no code to replay (sealed for a data subject, or "
                             "not recorded)")
        if status in _NOT_RUN:
            replayed = self.image.begin(source=code, principal=principal, kind=kind,
                                        reach=Reach(frozenset()))
            replayed.abort(status=status, error=_error(record))
            return status, None
        action = taken_action(kind, code)
        if action is not None:  # its bytes are only in its snapshot: taken from there
            return self.taker.redo(record, code, action)
        self.runtime.llm_client().replay_cached = [  # the completions' (an embedding's
            bool(call.get("cached"))                 # entry says what it was)
            for call in record.get("llm") or [] if call.get("kind") != "embedding"]
        self.runtime.memory.replaying = recorded_recalls(self.source.audit, record)
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
        replayed = self.image.begin(source=self.source.code(record), principal=HUMAN,
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
                    "policy", "reset", "session_add", "session_pop", "session_clear"):
                request = {"v": 1, **data}
                if data["action"] == "checkout":
                    request["ref"] = self._mapped(
                        self.source.checked_out(record, str(data.get("ref"))))
                return request
            return {"v": 1, "action": "op", "principal": principal, "code": code}
        if kind == "cell":
            return {"v": 1, "action": "op", "principal": HUMAN, "code": _transform(code)}
        raise UsageError(f"op {record.get('op')} is of kind {kind!r}, which replay does not "
                         "run yet")

    def _mapped(self, ref: str) -> str:
        prefix = ref.strip().lower()
        if 4 <= len(prefix) <= 40 and all(c in "0123456789abcdef" for c in prefix):
            # An id as it was recorded: a prune may have renamed or deleted it since.
            found = {new for old, new in self.commits.items() if old.startswith(prefix)}
            if len(found) == 1:
                return found.pop()
        commit = self.source.workspace.resolve(ref).hex()
        if commit not in self.commits:
            raise UsageError(f"a checkout of {ref} (commit {commit[:12]}) that the replay did "
                             "not rebuild")
        return self.commits[commit]


def _persistent(name: str) -> bool:
    return name not in _HELPERS and not (name.startswith("__") and name.endswith("__"))


def _error(record: dict[str, Any]) -> tuple[str, str]:
    error = record.get("error") or {}
    return str(error.get("kind", "")), str(error.get("message", ""))


def _transform(code: str) -> str:
    """A notebook cell as plain Python (IPython's input transforms), if IPython is here."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return code
    transformed: str = TransformerManager().transform_cell(code)  # type: ignore[no-untyped-call]
    return transformed
