"""Errors of an op's life: its commit, its restore, its veto, the events and audit
records it writes, and the personal data it holds.

Part of the tree drawn in ``kernos.errors``, which is where they are imported from.
"""

from __future__ import annotations

from typing import Any

from kernos.errors.base import KernosError, UsageError
from kernos.errors.workspace import DiskFull

__all__ = ["AuditError", "CommitFailed", "ErasedValue", "EventCascadeTooDeep", "EventError",
           "OpVetoed", "RestoreError", "SubscriberFailed", "UnknownSubject"]


class CommitFailed(KernosError):
    """Committing an op failed, so the op was rolled back."""

    def __init__(self, op: int, cause: BaseException) -> None:
        self.op = op
        self.cause = cause
        if isinstance(cause, DiskFull):  # its message says where, and what to do
            super().__init__(f"Op {op} was rolled back because {cause}")
            return
        super().__init__(
            f"Op {op} ran, but saving its snapshot failed ({type(cause).__name__}: {cause}). "
            "The image was rolled back to its state before the op; run it again once the "
            "cause is fixed."
        )


class RestoreError(KernosError):
    """A snapshot, or part of one, could not be loaded."""

    def __init__(self, message: str, *, names: tuple[str, ...] = ()) -> None:
        self.names = names
        super().__init__(message)


class OpVetoed(KernosError):
    """An op was rolled back at commit because the runtime refused it."""

    def __init__(self, op: int, reasons: list[str]) -> None:
        self.op = op
        self.reasons = reasons
        super().__init__(
            f"Op {op} was rolled back: " + "; ".join(reason.rstrip(". ") for reason in reasons)
            + ". Nothing it did was kept, even if its code caught the error."
        )

    @classmethod
    def from_op(cls, op: Any) -> OpVetoed:
        return cls(op.id, list(op.vetoes))


class EventError(UsageError):
    """A topic, a topic pattern or an event payload that Kernos cannot accept."""


class UnknownSubject(UsageError):
    """An erasure request for a data subject that no value was ever tagged with."""

    def __init__(self, subject: str, known: list[str]) -> None:
        self.subject = subject
        self.known = known
        shown = ", ".join(repr(name) for name in known[:10]) or "none"
        super().__init__(
            f"no value was ever tagged with the data subject {subject!r}, so there is nothing "
            f"to erase. Subjects with values in this workspace: {shown}. Nothing was changed."
        )


class EventCascadeTooDeep(KernosError):
    """Events triggered events, past the depth limit: the op rolls back."""

    def __init__(self, op: int, topic: str, depth: int, limit: int) -> None:
        self.op = op
        self.topic = topic
        self.depth = depth
        self.limit = limit
        super().__init__(
            f"op {op}: the event {topic!r} would be emitted at depth {depth}, but events nest at "
            f"most {limit} deep (depths 0 to {limit - 1}: subscribers emitting events that reach "
            "subscribers that emit ...). "
            "The op rolls back with all its events. Break the cycle, or narrow the patterns."
        )


class SubscriberFailed(KernosError):
    """An in-image subscriber raised while an event was delivered: the op rolls back."""

    def __init__(self, subscription: str, principal: str, topic: str,
                 cause: BaseException) -> None:
        self.subscription = subscription
        self.principal = principal
        self.topic = topic
        self.cause_name = type(cause).__name__
        text = str(cause)[:300].rstrip(". ")
        super().__init__(
            f"subscriber {subscription} ({principal}) failed on {topic!r}: "
            f"{self.cause_name}: {text}. The op rolls back with all its events; fix the "
            f"subscriber or remove it with events.unsubscribe({subscription!r})."
        )


class AuditError(KernosError):
    """The audit log cannot be used as asked (damaged, or appended to out of order)."""

    def __init__(self, message: str, *, path: str = "", index: int | None = None) -> None:
        self.path = path
        self.index = index
        super().__init__(message)


class ErasedValue(KernosError):
    """The value of a ``personal(...)`` wrapper whose data subject was erased."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        super().__init__(
            f"this value belonged to the data subject {subject!r}, which was erased; it "
            "cannot be read any more (by design)."
        )


# -- LLM calls (kernos.llm) ---------------------------------------------------------------
