"""The transaction state machine and the participant contract."""

from __future__ import annotations

import pytest

from kernos.errors import TransactionStateError
from kernos.testing import RecordingParticipant
from kernos.transaction import Status, Transaction


def make(*participants: RecordingParticipant) -> Transaction:
    txn = Transaction(op=7, principal="human")
    for participant in participants:
        txn.join(participant)
    return txn


def test_commit_runs_the_phases_in_order_and_in_sort_key_order() -> None:
    order: list[str] = []
    a, b = RecordingParticipant("b"), RecordingParticipant("a")
    for participant in (a, b):
        original = participant._enter

        def spy(phase: str, participant: RecordingParticipant = participant,
                original=original) -> None:  # type: ignore[no-untyped-def]
            order.append(f"{participant.name}.{phase}")
            original(phase)

        participant._enter = spy  # type: ignore[method-assign]
    txn = make(a, b)
    txn.commit()
    assert txn.status is Status.COMMITTED
    assert order == ["a.tpc_begin", "b.tpc_begin", "a.commit", "b.commit", "a.tpc_vote",
                     "b.tpc_vote", "a.tpc_finish", "b.tpc_finish"]


@pytest.mark.parametrize("phase", ["tpc_begin", "commit", "tpc_vote", "tpc_finish"])
def test_a_failing_phase_aborts_everyone_and_the_original_error_surfaces(phase: str) -> None:
    failing = RecordingParticipant("a", fail_in=phase, error=KeyError("original"))
    other = RecordingParticipant("b")
    txn = make(failing, other)
    with pytest.raises(KeyError, match="original"):
        txn.commit()
    assert txn.status is Status.COMMIT_FAILED
    assert failing.calls[-2:] == ["tpc_abort", "abort"]
    if phase == "tpc_begin":  # "b" sorts after "a": it never began, so only the op is undone
        assert other.calls == ["abort"]
    else:
        assert other.calls[-2:] == ["tpc_abort", "abort"]
    assert txn.cleanup_errors == []


def test_cleanup_failure_does_not_hide_the_original_error() -> None:
    failing = RecordingParticipant("a", fail_in="tpc_vote", error=ValueError("the cause"))
    broken_cleanup = RecordingParticipant("b", fail_in="tpc_abort", error=OSError("cleanup"))
    txn = make(failing, broken_cleanup)
    with pytest.raises(ValueError, match="the cause"):
        txn.commit()
    assert [type(e) for e in txn.cleanup_errors] == [OSError]
    assert broken_cleanup.calls[-1] == "abort"  # still asked to undo the op


def test_base_exceptions_abort_too() -> None:
    failing = RecordingParticipant("a", fail_in="commit", error=KeyboardInterrupt())
    txn = make(failing)
    with pytest.raises(KeyboardInterrupt):
        txn.commit()
    assert failing.calls[-1] == "abort"


def test_abort_asks_every_participant() -> None:
    a, b = RecordingParticipant("a"), RecordingParticipant("b")
    txn = make(a, b)
    txn.abort()
    assert txn.status is Status.ABORTED
    assert a.calls == ["abort"] and b.calls == ["abort"]


def test_a_finished_transaction_refuses_further_use() -> None:
    txn = make(RecordingParticipant("a", fail_in="commit"))
    with pytest.raises(RuntimeError):
        txn.commit()
    for action in (txn.commit, txn.abort, lambda: txn.join(RecordingParticipant())):
        with pytest.raises(TransactionStateError, match="commit failed"):
            action()
    done = make(RecordingParticipant())
    done.commit()
    with pytest.raises(TransactionStateError, match="committed"):
        done.abort()


def test_recording_participant_catches_out_of_order_calls() -> None:
    from kernos.testing import PhaseError

    participant = RecordingParticipant()
    with pytest.raises(PhaseError, match="tpc_vote after nothing"):
        participant.tpc_vote(make())
