"""A transaction participant that acts only once its op's outcome is known.

:class:`AfterOutcome` joins an op's transaction (``op.transaction.join``) and
takes part in the two-phase commit without voting or writing anything: after
the transaction finished (``tpc_finish``) it calls ``committed()``; when the
transaction aborts (``abort``, before or during the commit) it calls
``aborted()``.  Its ``sort_key`` orders it among the participants (a key
starting ``~~`` sorts after the image's, whose publish is the commit point).
The supervisor uses it to count an admitted op's outcome and to note that a
trip was announced by an op that committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["AfterOutcome"]


def _nothing() -> None:
    pass


class AfterOutcome:
    """Calls ``committed()`` after its transaction commits, ``aborted()`` if it aborts."""

    def __init__(self, key: str, *, committed: Callable[[], None] = _nothing,
                 aborted: Callable[[], None] = _nothing) -> None:
        self.key = key
        self.committed = committed
        self.aborted = aborted

    def sort_key(self) -> str:
        return self.key

    def tpc_begin(self, txn: Any) -> None:
        pass

    def commit(self, txn: Any) -> None:
        pass

    def tpc_vote(self, txn: Any) -> None:
        pass

    def tpc_finish(self, txn: Any) -> None:
        self.committed()

    def tpc_abort(self, txn: Any) -> None:
        pass

    def abort(self, txn: Any) -> None:
        self.aborted()
