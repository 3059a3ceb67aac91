"""What the transaction hands its participants and callers, pinned exactly.

These close gaps mutation testing (scripts/mutation transaction) found: the
phase calls and the cleanup hook could receive ``None``, the status during the
phases, which cleanup error ``abort`` raises, and the refusal's wording.
"""

from __future__ import annotations

import pytest

from kernos.errors import TransactionStateError
from kernos.testing import RecordingParticipant
from kernos.transaction import Status, Transaction


class Watcher(RecordingParticipant):
    """Records, at every phase, which transaction it was given and its status."""

    def __init__(self, name: str = "watcher", **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.seen: list[tuple[str, Transaction, Status]] = []

    def _watch(self, phase: str, txn: Transaction) -> None:
        self.seen.append((phase, txn, txn.status))
        self._enter(phase)

    def tpc_begin(self, txn: Transaction) -> None:
        self._watch("tpc_begin", txn)

    def commit(self, txn: Transaction) -> None:
        self._watch("commit", txn)

    def tpc_vote(self, txn: Transaction) -> None:
        self._watch("tpc_vote", txn)

    def tpc_finish(self, txn: Transaction) -> None:
        self._watch("tpc_finish", txn)

    def tpc_abort(self, txn: Transaction) -> None:
        self._watch("tpc_abort", txn)

    def abort(self, txn: Transaction) -> None:
        self._watch("abort", txn)


def test_the_transaction_keeps_its_op_and_principal() -> None:
    txn = Transaction(op=12, principal="alice")
    assert (txn.op, txn.principal, txn.status) == (12, "alice", Status.ACTIVE)


def test_every_phase_gets_the_transaction_while_it_is_committing() -> None:
    watcher = Watcher()
    txn = Transaction(op=3, principal="human")
    txn.join(watcher)
    txn.commit()
    assert [phase for phase, _, _ in watcher.seen] == [
        "tpc_begin", "commit", "tpc_vote", "tpc_finish"]
    assert all(seen is txn for _, seen, _ in watcher.seen)
    assert all(status is Status.COMMITTING for _, _, status in watcher.seen)
    assert txn.status is Status.COMMITTED


def test_cleanup_steps_get_the_transaction_and_the_hook_gets_the_error() -> None:
    reported: list[BaseException] = []
    cleanup_error = OSError("disk gone")
    failing = Watcher("a", fail_in="tpc_vote", error=ValueError("vote"))
    broken = Watcher("b", fail_in="tpc_abort", error=cleanup_error)
    txn = Transaction(op=4, principal="human", on_cleanup_error=reported.append)
    txn.join(failing)
    txn.join(broken)
    with pytest.raises(ValueError, match="vote"):
        txn.commit()
    assert reported == [cleanup_error]
    cleanup = [(phase, seen) for phase, seen, _ in failing.seen + broken.seen
               if phase in ("tpc_abort", "abort")]
    assert len(cleanup) == 4 and all(seen is txn for _, seen in cleanup)


def test_abort_raises_the_first_cleanup_error_after_asking_everyone() -> None:
    first, second = OSError("first"), OSError("second")
    a = Watcher("a", fail_in="abort", error=first)
    b = Watcher("b", fail_in="abort", error=second)
    reported: list[BaseException] = []
    txn = Transaction(op=5, principal="human", on_cleanup_error=reported.append)
    txn.join(a)
    txn.join(b)
    with pytest.raises(OSError) as raised:
        txn.abort()
    assert raised.value is first
    assert txn.cleanup_errors == [first, second] and reported == [first, second]
    assert txn.status is Status.ABORTED
    assert [seen for _, seen, _ in a.seen + b.seen] == [txn, txn]


@pytest.mark.parametrize("action", ["join", "commit", "abort"])
def test_the_refusal_names_the_action_the_op_and_what_to_do(action: str) -> None:
    txn = Transaction(op=9, principal="human")
    txn.commit()
    calls = {"join": lambda: txn.join(RecordingParticipant()), "commit": txn.commit,
             "abort": txn.abort}
    with pytest.raises(TransactionStateError) as raised:
        calls[action]()
    assert str(raised.value) == (
        f"cannot {action} op 9: its transaction is committed. Start a new op instead.")


def test_the_commit_failure_is_known_to_the_participants_undoing_it() -> None:
    vote = ValueError("vote")
    failures: list[BaseException | None] = []

    class Reader(Watcher):
        def abort(self, txn: Transaction) -> None:
            failures.append(txn.failure)
            super().abort(txn)

    fine = Transaction(op=5, principal="human")
    fine.join(Reader("quiet"))
    fine.commit()
    assert fine.failure is None
    txn = Transaction(op=6, principal="human")
    txn.join(Watcher("a", fail_in="tpc_vote", error=vote))
    txn.join(Reader("b"))
    with pytest.raises(ValueError, match="vote"):
        txn.commit()
    assert txn.failure is vote and failures == [vote]
