"""Every error Kernos raises on purpose.

The tree::

    KernosError                   root: catch this to catch anything Kernos means to raise
    ├── UsageError                the caller used the API wrongly; fix the call
    │   ├── UnknownRef            a history reference that names no snapshot
    │   ├── RequestRejected       a request Kernos refuses before running anything
    │   ├── TransactionStateError a transaction used after it finished or failed
    │   ├── UnknownAgent          no principal of that name
    │   ├── UnknownTool           no tool of that name (or no version visible to the op)
    │   ├── InvalidGrant          a malformed capability, amount or schema
    │   ├── AgentCodeRejected     agent code that the restricted dialect refuses to compile
    │   ├── EventError            a malformed topic, pattern or event payload
    │   └── UnknownSubject        erasure of a data subject Kernos never saw
    ├── WorkspaceError            the workspace directory cannot be used as asked
    │   ├── WorkspaceLocked       another process owns the workspace
    │   ├── WorkspaceCorrupt      the history on disk is damaged or unreadable
    │   └── WorkspaceFormatError  written by a newer Kernos, or not a workspace at all
    ├── CommitFailed              an op could not be committed; the image was rolled back
    ├── OpVetoed                  an op was rolled back at commit (a denial, a breached limit)
    ├── CapabilityDenied          a principal used a capability it does not hold
    ├── BoundaryError             a value that may not cross between an agent and the host
    ├── EventCascadeTooDeep       events triggered events past the depth limit
    ├── SubscriberFailed          an in-image subscriber raised; the op rolls back
    ├── AuditError                the audit log cannot be read or appended to as asked
    ├── ErasedValue               a personal value whose subject was erased
    └── RestoreError              a snapshot could not be loaded into the namespace

Every message says what was wrong and what to do about it.  Errors carry the
facts as attributes (``op``, ``name``, ``path``, ...) so that callers never parse
messages.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentCodeRejected",
    "AuditError",
    "BoundaryError",
    "CapabilityDenied",
    "CommitFailed",
    "ErasedValue",
    "EventCascadeTooDeep",
    "EventError",
    "InvalidGrant",
    "KernosError",
    "OpVetoed",
    "RequestRejected",
    "RestoreError",
    "SubscriberFailed",
    "TransactionStateError",
    "UnknownAgent",
    "UnknownRef",
    "UnknownSubject",
    "UnknownTool",
    "UsageError",
    "WorkspaceCorrupt",
    "WorkspaceError",
    "WorkspaceFormatError",
    "WorkspaceLocked",
]


class KernosError(Exception):
    """Root of every error Kernos raises on purpose."""


class UsageError(KernosError):
    """The API was called in a way it does not support."""


class UnknownRef(UsageError):
    """A history reference (commit, ``@op``, ``HEAD~n``) names no snapshot."""

    def __init__(self, ref: str, workspace: str) -> None:
        self.ref = ref
        self.workspace = workspace
        super().__init__(
            f"{ref!r} names no snapshot in {workspace}. Use a commit id (or a prefix "
            "of one), HEAD, HEAD~N, or @N for op N; `kernos log` (or `%kernos log` in a "
            "notebook) lists them."
        )


class RequestRejected(UsageError):
    """A request was refused before anything ran; the image is untouched."""

    def __init__(self, message: str, *, reason: str) -> None:
        self.reason = reason
        super().__init__(message)

    @classmethod
    def oversized_source(cls, size: int, limit: int) -> RequestRejected:
        return cls(
            f"The code is {size:,} bytes, over the limit of {limit:,} bytes "
            "(KERNOS_MAX_SOURCE_BYTES). Nothing ran and the image is unchanged. Put large "
            "data in a file and load it from a short cell.",
            reason="oversized-source",
        )


class TransactionStateError(UsageError):
    """A transaction was used in a state that does not allow the call."""


class WorkspaceError(KernosError):
    """The workspace directory cannot be used as asked."""

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        super().__init__(message)


class WorkspaceLocked(WorkspaceError):
    """Another process (usually another kernel) owns the workspace."""

    def __init__(self, path: str, owner: str) -> None:
        self.owner = owner
        super().__init__(
            f"The workspace {path} is in use by {owner}. A workspace belongs to one kernel "
            "at a time. Stop that kernel, or point KERNOS_WORKSPACE at another directory.",
            path=path,
        )


class WorkspaceCorrupt(WorkspaceError):
    """The snapshot history on disk is damaged or cannot be read."""

    def __init__(self, path: str, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"The workspace {path} is damaged: {problem}. Nothing was changed. Inspect it "
            "with `kernos log` and `git -C <workspace>/history.git fsck`, or check out an "
            "earlier snapshot with `kernos checkout REF`.",
            path=path,
        )


class WorkspaceFormatError(WorkspaceError):
    """The directory is not a Kernos workspace this version can read."""


class CommitFailed(KernosError):
    """Committing an op failed, so the op was rolled back."""

    def __init__(self, op: int, cause: BaseException) -> None:
        self.op = op
        self.cause = cause
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


class UnknownAgent(UsageError):
    """A principal name that the image does not know."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(known) if known else "none yet"
        super().__init__(
            f"There is no agent {name!r} (agents: {listed}). Add it with "
            f"`%kernos agent add {name}` or `agents.add({name!r})`."
        )


class UnknownTool(UsageError):
    """A tool name with no version visible to the op."""

    def __init__(self, name: str, known: list[str], *, detail: str = "") -> None:
        self.name = name
        self.known = known
        listed = ", ".join(known) if known else "none yet"
        super().__init__(
            f"There is no tool {name!r}{detail} (tools: {listed}). Register it with "
            "`agents.register_tool(...)`, or let an agent define it with `define_tool(...)`."
        )


class InvalidGrant(UsageError):
    """A capability, amount, limit or tool schema that is not well formed."""


class AgentCodeRejected(UsageError):
    """Agent code that the restricted dialect does not accept; nothing ran."""

    def __init__(self, principal: str, problems: list[str]) -> None:
        self.principal = principal
        self.problems = problems
        super().__init__(
            f"The code for agent {principal!r} was refused before it ran: "
            + "; ".join(problems) + ". Agent code is a restricted Python dialect: no "
            "imports, no names or attributes starting with '_', bounded size and nesting."
        )


class CapabilityDenied(KernosError):
    """A principal tried to use a capability it was not granted (or that was revoked).

    Agent code may catch it, but the op is rolled back at commit regardless.
    """

    def __init__(self, principal: str, capability: str, *, detail: str = "") -> None:
        self.principal = principal
        self.capability = capability
        self.detail = detail
        grantable = capability.count(":") == 1 and " " not in capability
        super().__init__(
            f"{principal!r} does not hold the capability {capability!r}"
            + (f" ({detail})" if detail else "")
            + ". The op will roll back."
            + (f" A human can grant it with `%kernos grant {principal} {capability}`."
               if grantable else "")
        )


class BoundaryError(KernosError):
    """A value that may not pass between an agent and the host (only plain data may)."""


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
