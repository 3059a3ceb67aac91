"""One op against an image: the code runs, then the op commits or rolls back.

An :class:`Op` wraps a :class:`~kernos.transaction.Transaction` and drives its
participants: each thing whose state must move with the op joins it.  The
image that starts the op (:meth:`kernos.image.Image.begin`) joins the
participants that move its own state: its snapshot history
(``kernos.image.changes``: what changed, the snapshot that stores it, and the
rollback), its audit chain (``kernos.audit.record``) and its random
generators (``kernos.determinism``).  Floors above the image that must move
with every op register a participant factory here
(:func:`register_participant`); this module imports none of them.

The caller runs the op's code against the namespace between
``image.begin()`` and ``op.commit()`` / ``op.abort()``.  The op carries what
its code did for the participants to record: the events it emitted, the
grants it used, its clock and environment reads, its effects, LLM calls and
recalls; :class:`CommitReport` and :class:`AbortReport` say what it changed
or undid.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernos.analysis import Reach
from kernos.audit.log import AuditLog
from kernos.errors import CommitFailed, DiskFull, KernosError, OpVetoed, UsageError
from kernos.personal import created_subjects
from kernos.store.workspace import Workspace
from kernos.transaction import Participant, Status, Transaction

__all__ = ["AbortReport", "CheckoutReport", "CommitReport", "Op", "OpImage",
           "register_participant"]


@dataclass(kw_only=True)
class CommitReport:
    """What a committed op changed, for the reply and the history."""

    op: int
    commit: str
    principal: str
    kind: str
    added: list[str]
    changed: list[str]
    deleted: list[str]
    committed_at: str
    unpersisted: list[dict[str, Any]] = field(default_factory=list)
    bytes_written: int = 0
    image_bytes: int = 0
    """The image's size after the op: the sum of its stored groups' sizes."""
    history_bytes: int = 0
    """The history's size after the op (see :meth:`Image.history_bytes`)."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    reach: str = ""
    audit: dict[str, Any] = field(default_factory=dict)
    """The op's audit record: its ``index`` and ``hash``."""
    failed: dict[str, str] | None = None
    """The error its code raised, for an op kept despite it (``on_error = keep``)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """The committed events, as external subscribers receive them."""
    unchanged: bool = False
    """The op changed nothing: it has an audit record and no snapshot of its own
    (``commit`` is the last snapshot, which is still the image)."""
    files: dict[str, list[str]] = field(default_factory=dict)
    """Tracked files the op ``added``, ``changed`` or ``deleted``, and ``notices``: paths
    left untracked or kept as they were, each told once (see ``kernos.files``)."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(kw_only=True)
class AbortReport:
    """What a rollback had to undo, so that the user can be told where it happened."""

    op: int
    removed: list[str]
    """Names the op added: gone again."""
    rebound: list[str]
    """Names the op bound to other objects: the committed objects are back."""
    reloaded: list[str]
    """Names the op changed in place: their committed values are back."""
    deleted: list[str] = field(default_factory=list)
    """Names the op deleted: back."""
    not_reset: list[str] = field(default_factory=list)
    """Names the op used whose values are or hold live resources (a file, a connection, a
    client with threads): they are not (wholly) in the image, so whatever the op did to
    them stays done; a copy would still talk to the live parts."""
    left_live: dict[str, str] = field(default_factory=dict)
    """Names left as the op left them rather than replaced by a copy, and why: the
    stored value could not be loaded (a copy would be a placeholder), or the value
    pickles differently each time, so whether the op changed it cannot be told.  A
    rollback never makes a usable value unusable, nor cuts a read value off what
    it shares."""
    random_reset: bool = False
    """The op had moved the global random generators; they are back where they were."""
    files: list[str] = field(default_factory=list)
    """Tracked files put back, each as ``path (removed|changed|deleted)``."""

    @property
    def nothing_undone(self) -> bool:
        return not (self.removed or self.rebound or self.deleted or self.reloaded
                    or self.not_reset or self.left_live or self.random_reset or self.files)

    def undone(self) -> dict[str, Any]:
        """The rollback as JSON, for a reply's metadata."""
        undone: dict[str, Any] = {
            "added": self.removed, "rebound": self.rebound, "deleted": self.deleted,
            "reloaded": self.reloaded, "not_reset": self.not_reset,
            "left_live": self.left_live, "random": self.random_reset}
        if self.files:
            undone["files"] = self.files
        return undone

    def summary(self) -> str:
        """One line: ``rolled back — not kept: tup (rebound); obj1, obj2 (added)``."""
        kept = [f"{_names(names)} ({why})" for names, why in (
            (self.rebound, "rebound"), (self.removed, "added"), (self.deleted, "deleted"),
            (self.reloaded, "changed in place")) if names]
        if self.random_reset:
            kept.append("the random generators' state (drawn from or seeded)")
        if self.files:
            kept.append(f"files: {_names(self.files)}")
        line = "rolled back — " + ("not kept: " + "; ".join(kept) if kept
                                   else "nothing had changed")
        if self.not_reset:
            line += (f"; could not be reset: {_names(self.not_reset)} (they hold live "
                     "resources, so they stay as the cell left them)")
        for why in sorted(set(self.left_live.values())):
            names = sorted(name for name, reason in self.left_live.items() if reason == why)
            line += f"; left as the cell left them: {_names(names)} ({why})"
        return line


AGENT_NAMESPACE = "kernos:ns:"
"""The prefix of an agent's namespace (``kernos.agents.runtime.namespace_key``)."""
SYSTEM_NAMES = {"kernos:agents": "the agents and their grants",
                "kernos:events": "the event subscriptions",
                "kernos:effects": "the pending effects",
                "kernos:supervisor": "the agents' loops and circuits",
                "kernos:random": "the random generators' state",
                "kernos:embeddings": "the memory settings"}
"""How a rollback line names the image's own values, which users never bind themselves."""


def shown_name(name: str) -> str:
    """A name as a user reads it: an agent's namespace is that agent's variables."""
    if name.startswith(AGENT_NAMESPACE):
        return f"{name[len(AGENT_NAMESPACE):]}'s variables"
    return SYSTEM_NAMES.get(name, name)


def _names(names: list[str], limit: int = 8) -> str:
    names = [shown_name(name) for name in names]
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass(kw_only=True)
class CheckoutReport:
    ref: str
    commit: str
    op: int | None
    names: int
    bytes: int


Progress = Callable[[int, int], None]


class OpImage(Protocol):
    """What an op needs of the image that started it (:class:`kernos.image.Image`)."""

    @property
    def workspace(self) -> Workspace: ...

    @property
    def audit(self) -> AuditLog: ...

    def checkout(self, op: Op, ref: str, progress: Progress | None = None) -> CheckoutReport:
        """Make the namespace equal to snapshot ``ref``, as part of ``op``."""
        ...

    def _release(self) -> None:
        """The op is over: the image runs the next one."""
        ...


ParticipantFactory = Callable[["Op"], Participant | None]
"""Makes the participant that joins an op (None: this op needs none)."""

_factories: list[ParticipantFactory] = []


def register_participant(factory: ParticipantFactory) -> None:
    """Join every op from now on a participant made by ``factory(op)``.

    This is how a floor above the image takes part in every op's transaction
    (its module registers at import; ``kernos/__init__.py`` imports it).  The
    participant follows :class:`kernos.transaction.Participant`; its
    ``sort_key`` orders it among the others (the image's, ``~kernos.image``,
    votes last: its publish is the commit point).
    """
    if factory not in _factories:
        _factories.append(factory)


class Op:
    """An op in flight.  Finish it with exactly one of :meth:`commit` or :meth:`abort`."""

    def __init__(self, image: OpImage, *, op: int, principal: str, source: str | None,
                 kind: str, reach: Reach) -> None:
        self.image = image
        self.id = op
        self.principal = principal
        self.source = source
        self.kind = kind
        self.reach = reach
        self.started = time.perf_counter()
        self.note = ""
        self.facts: dict[str, Any] = {}
        """Extra facts for the snapshot manifest (for example, which tool versions ran)."""
        self.vetoes: list[str] = []
        """Reasons this op must not commit (a capability denial, a breached limit)."""
        self.veto_status = "vetoed"
        """The audit status of a vetoed op (``denied``, ``failed``, ...)."""
        self.events: list[tuple[Any, Any]] = []
        """Events emitted so far (``kernos.events.bus.Event``), with the payload as the
        audit log stores it."""
        self.event_depth = 0
        """How deep event delivery is right now (see kernos.events.bus)."""
        self.grants_used: dict[str, str] = {}
        """Grant id -> capability, for every grant the op's principals used."""
        self.denied: list[dict[str, Any]] = []
        """Capabilities that were refused (bounded by the runtime)."""
        self.file_access: list[dict[str, Any]] = []
        """Files principals read, wrote, listed or were refused (kernos.agents.files), for
        its audit record."""
        self.environ: list[list[str | None]] = []
        """Environment variables its own code read: [name, SHA-256 of the value or None]."""
        self.clock: list[int] = []
        """The op's own code's clock readings, in ns (see kernos.determinism), for its audit."""
        self.effects: list[dict[str, Any]] = []
        """External effects this op queued, or recorded (see kernos.effects), for its audit."""
        self.key: str | None = None
        """An idempotency key from the op's sender, kept in its audit record."""
        self.llm_calls: list[dict[str, Any]] = []
        """The op's LLM calls (kernos.llm), failed ones too, for its audit record."""
        self.recalls: list[tuple[dict[str, Any], str, frozenset[str]]] = []
        """The op's recalls (kernos.memory): (request, the answer as JSON, the data subjects
        whose text it holds), for its audit record, so that a replay serves the same."""
        self.outcome: tuple[str, dict[str, str] | None] = ("rolled back", None)
        """(status, error) of an op that did not commit, for its audit record."""
        self.failure: dict[str, str] | None = None
        """The error of an op whose code raised but which commits what it reached
        (see :meth:`keep_failed`), for its snapshot and audit record."""
        self.checked_out: CheckoutReport | None = None
        """What :meth:`checkout` made the image equal to, for the op's notice."""
        self.report_draft: CommitReport | None = None
        self.report: CommitReport | None = None
        self.abort_report: AbortReport | None = None
        self.commit_sha: bytes | None = None
        """The commit being written, from the commit phase on (set by the image)."""
        self.on_commit: list[Callable[[CommitReport], None]] = []
        """Called with the report once the op committed and the image runs the next one
        (the audit chain publishes the op's events)."""
        self.participants: list[Participant] = []
        self.transaction = Transaction(op=op, principal=principal)
        for factory in _factories:
            participant = factory(self)
            if participant is not None:
                self.join(participant)

    def join(self, participant: Participant) -> None:
        """Make ``participant`` move with this op (see :mod:`kernos.transaction`)."""
        self.transaction.join(participant)
        self.participants.append(participant)

    @property
    def status(self) -> Status:
        return self.transaction.status

    def scan_everything(self, why: str = "a full scan was requested") -> None:
        """Check every value at commit, not only those in the op's reach."""
        self.reach = Reach.all(why)

    def touch(self, *names: str) -> None:
        """Add names the op changed in place to its reach (the runtime's own state, say)."""
        self.reach = self.reach.union(Reach(frozenset(names)))

    def veto(self, reason: str, *, status: str = "vetoed") -> None:
        """Make this op roll back at commit, whatever its code did with the error.

        ``status`` is what its audit record will say (a denial wins over others).
        """
        self.vetoes.append(reason)
        if self.veto_status != "denied":
            self.veto_status = status

    def keep_failed(self, kind: str, message: str) -> None:
        """Commit this op although its code raised ``kind: message`` (``on_error = keep``).

        Its snapshot and audit record say it failed.  Only the human's ops can be
        kept: an agent's op always rolls back.
        """
        if self.principal != "human":
            raise UsageError(f"an op of {self.principal!r} cannot be kept after an error: "
                             "agents' ops always roll back")
        self.failure = {"kind": kind[:120], "message": message[:500]}

    def act_as(self, principal: str, kind: str) -> None:
        """Attribute this op to another principal (a cell that runs as an agent)."""
        self.principal = principal
        self.transaction.principal = principal
        self.kind = kind

    def commit(self) -> CommitReport:
        """Write the snapshot; on failure the image is rolled back and CommitFailed raised.

        A vetoed op is rolled back instead and raises :class:`OpVetoed`.
        """
        if self.vetoes:
            vetoed = OpVetoed.from_op(self)
            self.abort(status=self.veto_status, error=vetoed)
            raise vetoed
        try:
            self.transaction.commit()
        except DiskFull as error:  # says where and what to do; this says the op rolled back
            raise CommitFailed(self.id, error) from error
        except KernosError:
            raise
        except BaseException as error:
            raise CommitFailed(self.id, error) from error
        finally:
            self.image._release()
        assert self.report is not None
        for published in self.on_commit:
            published(self.report)
        return self.report

    def abort(self, *, status: str | None = None,
              error: BaseException | tuple[str, str] | None = None) -> AbortReport:
        """Put the namespace back exactly as the last commit left it.

        ``status`` and ``error`` are what the audit record says about why
        (by default derived from ``error``: interrupted, denied, failed).
        """
        self.outcome = outcome(self, status, error)
        try:
            self.transaction.abort()
        finally:
            self.image._release()
        assert self.abort_report is not None
        return self.abort_report

    def commit_id(self) -> str | None:
        """The id of the commit being written (from the commit phase on); for an op that
        changed nothing, the last snapshot's (it writes none)."""
        return None if self.commit_sha is None else self.commit_sha.hex()

    @property
    def sealed(self) -> frozenset[str]:
        """Data subjects this op tagged: its code is stored sealed for them."""
        return created_subjects()

    def checkout(self, ref: str, progress: Progress | None = None) -> CheckoutReport:
        """Make the namespace equal to snapshot ``ref``, as part of this op.

        History is not rewritten: committing this op records a new snapshot
        whose groups are the old snapshot's own trees.
        """
        self.checked_out = self.image.checkout(self, ref, progress)
        return self.checked_out


def outcome(op: Op, status: str | None,
            error: BaseException | tuple[str, str] | None) -> tuple[str, dict[str, str] | None]:
    """The audit status and error of an op that did not commit."""
    if isinstance(error, BaseException):
        name, message = type(error).__name__, str(error)
    elif error is not None:
        name, message = error
    else:
        name = message = ""
    if status is None:
        if op.vetoes:
            status = op.veto_status
        elif name == "KeyboardInterrupt":
            status = "interrupted"
        elif name in ("CapabilityDenied", "OpVetoed") and op.denied:
            status = "denied"
        elif name:
            status = "failed"
        else:
            status = "rolled back"
    shown = {"kind": name[:120], "message": message[:500]} if name else None
    return status, shown

