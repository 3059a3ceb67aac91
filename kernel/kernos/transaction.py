"""Transactions: every op commits completely or not at all.

The model is two-phase commit among *participants*, after
zopefoundation/transaction.  A participant is anything whose state must move
with the op: the image's snapshot history, its audit chain and its random
generators (the image joins them to each op it begins, ``kernos.image``), and
what a higher floor registers (``kernos.op.register_participant``).  This
module knows only the protocol, never a participant.

Participant contract (called in ``sort_key`` order):

``tpc_begin(txn)``
    The commit starts.  Prepare to write; change nothing visible.
``commit(txn)``
    Do all the work that can fail: serialize, write objects nobody can see
    yet.  Raise to refuse.
``tpc_vote(txn)``
    Last chance to refuse: make the prepared work durable.  A vote that
    fails raises.
``tpc_finish(txn)``
    Publish: after it returns, the op is committed.  It must not fail after
    anything became visible; an error before that point aborts the op.
``tpc_abort(txn)``
    Discard what ``tpc_begin``/``commit``/``tpc_vote`` prepared.  Called only
    for participants whose ``tpc_begin`` was called.
``abort(txn)``
    Undo the op's effects on live state (the namespace).  Called for an op
    that failed, and after ``tpc_abort`` when a commit failed.

Cleanup never hides the original error: a participant that fails during
abort is reported in the transaction's ``cleanup_errors`` and the caller sees
the error that started it.  A transaction whose commit failed refuses any
further use.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

from kernos.errors import TransactionStateError

__all__ = ["Participant", "Status", "Transaction"]


class Status(enum.Enum):
    ACTIVE = "active"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"
    COMMIT_FAILED = "commit failed"


class Participant(Protocol):
    def sort_key(self) -> str: ...

    def tpc_begin(self, txn: Transaction) -> None: ...

    def commit(self, txn: Transaction) -> None: ...

    def tpc_vote(self, txn: Transaction) -> None: ...

    def tpc_finish(self, txn: Transaction) -> None: ...

    def tpc_abort(self, txn: Transaction) -> None: ...

    def abort(self, txn: Transaction) -> None: ...


class Transaction:
    """The atomic unit behind one op."""

    def __init__(self, *, op: int, principal: str,
                 on_cleanup_error: Callable[[BaseException], None] | None = None) -> None:
        self.op = op
        self.principal = principal
        self.status = Status.ACTIVE
        self.cleanup_errors: list[BaseException] = []
        self.failure: BaseException | None = None
        """What made :meth:`commit` fail, set before the participants are undone."""
        self._participants: list[Participant] = []
        self._on_cleanup_error = on_cleanup_error

    def join(self, participant: Participant) -> None:
        self._require(Status.ACTIVE, "join")
        self._participants.append(participant)

    def _ordered(self) -> list[Participant]:
        return sorted(self._participants, key=lambda participant: participant.sort_key())

    def commit(self) -> None:
        """Run the two phases; on any failure undo everything and re-raise."""
        self._require(Status.ACTIVE, "commit")
        self.status = Status.COMMITTING
        participants = self._ordered()
        begun: list[Participant] = []
        try:
            for participant in participants:
                begun.append(participant)
                participant.tpc_begin(self)
            for participant in participants:
                participant.commit(self)
            for participant in participants:
                participant.tpc_vote(self)
            for participant in participants:
                participant.tpc_finish(self)
        except BaseException as error:
            self.status = Status.COMMIT_FAILED
            self.failure = error
            for participant in begun:
                self._quietly(participant.tpc_abort)
            for participant in participants:
                self._quietly(participant.abort)
            raise
        self.status = Status.COMMITTED

    def abort(self) -> None:
        """Undo the op.  Every participant is asked even if one of them fails."""
        self._require(Status.ACTIVE, "abort")
        for participant in self._ordered():
            self._quietly(participant.abort)
        self.status = Status.ABORTED
        if self.cleanup_errors:
            raise self.cleanup_errors[0]

    def _quietly(self, step: Callable[[Transaction], None]) -> None:
        try:
            step(self)
        except BaseException as error:
            self.cleanup_errors.append(error)
            if self._on_cleanup_error is not None:
                self._on_cleanup_error(error)

    def _require(self, status: Status, action: str) -> None:
        if self.status is not status:
            raise TransactionStateError(
                f"cannot {action} op {self.op}: its transaction is {self.status.value}. "
                "Start a new op instead."
            )
