"""Test doubles that ship with Kernos, for testing code built on its transactions.

:class:`RecordingParticipant` takes part in a transaction, records every call
and checks that each phase comes in the order the participant contract
(``kernos.transaction``) promises; it can also be told to fail in a phase.
"""

from __future__ import annotations

from kernos.transaction import Transaction

__all__ = ["PhaseError", "RecordingParticipant"]

_NEXT = {
    None: {"tpc_begin", "abort"},
    "tpc_begin": {"commit", "tpc_abort"},
    "commit": {"tpc_vote", "tpc_abort"},
    "tpc_vote": {"tpc_finish", "tpc_abort"},
    "tpc_finish": {"tpc_abort"},
    "tpc_abort": {"abort"},
    "abort": set(),
}


class PhaseError(AssertionError):
    """A participant was called out of the contract's order."""


class RecordingParticipant:
    def __init__(self, name: str = "recorder", *, fail_in: str | None = None,
                 error: BaseException | None = None) -> None:
        self.name = name
        self.fail_in = fail_in
        self.error = error or RuntimeError(f"{name} fails in {fail_in}")
        self.calls: list[str] = []

    def sort_key(self) -> str:
        return self.name

    def _enter(self, phase: str) -> None:
        last = self.calls[-1] if self.calls else None
        if phase not in _NEXT[last]:
            raise PhaseError(f"{self.name}: {phase} after {last or 'nothing'}")
        self.calls.append(phase)
        if phase == self.fail_in:
            raise self.error

    def tpc_begin(self, txn: Transaction) -> None:
        self._enter("tpc_begin")

    def commit(self, txn: Transaction) -> None:
        self._enter("commit")

    def tpc_vote(self, txn: Transaction) -> None:
        self._enter("tpc_vote")

    def tpc_finish(self, txn: Transaction) -> None:
        self._enter("tpc_finish")

    def tpc_abort(self, txn: Transaction) -> None:
        self._enter("tpc_abort")

    def abort(self, txn: Transaction) -> None:
        self._enter("abort")
