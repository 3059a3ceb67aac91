"""Every error Kernos raises on purpose.

The tree::

    KernosError                   root: catch this to catch anything Kernos means to raise
    ├── UsageError                the caller used the API wrongly; fix the call
    │   ├── UnknownRef            a history reference that names no snapshot
    │   ├── PathRefused           a path that cannot name a file in a tracked directory
    │   ├── RequestRejected       a request Kernos refuses before running anything
    │   ├── TransactionStateError a transaction used after it finished or failed
    │   ├── UnknownAgent          no principal of that name
    │   ├── UnknownTool           no tool of that name (or no version visible to the op)
    │   ├── InvalidGrant          a malformed capability, amount or schema
    │   ├── AgentCodeRejected     agent code that the restricted dialect refuses to compile
    │   ├── EventError            a malformed topic, pattern or event payload
    │   ├── UnknownSubject        erasure of a data subject Kernos never saw
    │   └── LLMRequestInvalid     an LLM request Kernos refuses to send (unknown param, ...)
    ├── WorkspaceError            the workspace directory cannot be used as asked
    │   ├── WorkspaceLocked       another process owns the workspace
    │   ├── WorkspaceCorrupt      the history on disk is damaged or unreadable
    │   ├── WorkspaceFormatError  written by a newer Kernos, or not a workspace at all
    │   ├── WorkspaceUntrusted    a clone whose writers are not trusted yet: nothing is restored
    │   ├── UnknownWorkspace      a workspace name that names none, or several
    │   └── DiskFull              a write found no space (ENOSPC, EDQUOT); also an OSError
    ├── CommitFailed              an op could not be committed; the image was rolled back
    ├── OpVetoed                  an op was rolled back at commit (a denial, a breached limit)
    ├── CapabilityDenied          a principal used a capability it does not hold
    ├── CircuitOpen               an agent's circuit breaker is open: its ops are refused
    ├── BoundaryError             a value that may not cross between an agent and the host
    ├── EventCascadeTooDeep       events triggered events past the depth limit
    ├── SubscriberFailed          an in-image subscriber raised; the op rolls back
    ├── AuditError                the audit log cannot be read or appended to as asked
    ├── RemoteError               a git remote cannot be reached or used as asked
    │   ├── RemoteDiverged        a push or pull that would fork the history (another writer)
    │   ├── RemoteRefused         a pull or clone refused what the remote holds; nothing changed
    │   └── RemoteLeaseHeld       another workspace holds the remote's writer lease
    ├── ErasedValue               a personal value whose subject was erased
    ├── RestoreError              a snapshot could not be loaded into the namespace
    └── LLMError                  an LLM call failed or was refused; inside an op, the op rolls back
        ├── LLMProviderError      the provider refused or failed the call (litellm's error, mapped)
        ├── LLMResponseInvalid    a malformed answer (no choices, tool-call arguments not JSON)
        ├── LLMToolCallInvalid    a tool call's arguments fail the schema of the tool it names
        ├── LLMReplayMiss         replay mode, and no recorded response for the request
        └── LLMBudgetExceeded     a token or cost budget (per principal or per op) would be exceeded

Every message says what was wrong and what to do about it.  Errors carry the
facts as attributes (``op``, ``name``, ``path``, ...) so that callers never parse
messages.

The classes live in one module per family (``base``: the root and usage
errors; ``workspace``: the workspace on disk and its remotes; ``ops``: an op's
commit, restore, events, audit and personal data; ``agents``; ``llm``), and
every one is imported from here: ``from kernos.errors import CommitFailed``.
Each reads as ``kernos.errors.<Name>`` (tracebacks, reprs, pickles) wherever
its family's module is.
"""

from __future__ import annotations

from kernos.errors.agents import (
    AgentCodeRejected,
    BoundaryError,
    CapabilityDenied,
    CircuitOpen,
    InvalidGrant,
    UnknownAgent,
    UnknownTool,
)
from kernos.errors.base import (
    KernosError,
    PathRefused,
    RequestRejected,
    TransactionStateError,
    UnknownRef,
    UsageError,
)
from kernos.errors.llm import (
    LLMBudgetExceeded,
    LLMError,
    LLMProviderError,
    LLMRecordingErased,
    LLMReplayMiss,
    LLMRequestInvalid,
    LLMResponseInvalid,
    LLMToolCallInvalid,
)
from kernos.errors.ops import (
    AuditError,
    CommitFailed,
    ErasedValue,
    EventCascadeTooDeep,
    EventError,
    OpVetoed,
    RestoreError,
    SubscriberFailed,
    UnknownSubject,
)
from kernos.errors.workspace import (
    DiskFull,
    RemoteDiverged,
    RemoteError,
    RemoteLeaseHeld,
    RemoteRefused,
    UnknownWorkspace,
    WorkspaceCorrupt,
    WorkspaceError,
    WorkspaceFormatError,
    WorkspaceLocked,
    WorkspaceUntrusted,
)
from kernos.errors.workspace import is_disk_full as is_disk_full

__all__ = [
    "AgentCodeRejected",
    "AuditError",
    "BoundaryError",
    "CapabilityDenied",
    "CircuitOpen",
    "CommitFailed",
    "DiskFull",
    "ErasedValue",
    "EventCascadeTooDeep",
    "EventError",
    "InvalidGrant",
    "KernosError",
    "LLMBudgetExceeded",
    "LLMError",
    "LLMProviderError",
    "LLMRecordingErased",
    "LLMReplayMiss",
    "LLMRequestInvalid",
    "LLMResponseInvalid",
    "LLMToolCallInvalid",
    "OpVetoed",
    "PathRefused",
    "RemoteDiverged",
    "RemoteError",
    "RemoteLeaseHeld",
    "RemoteRefused",
    "RequestRejected",
    "RestoreError",
    "SubscriberFailed",
    "TransactionStateError",
    "UnknownAgent",
    "UnknownRef",
    "UnknownSubject",
    "UnknownTool",
    "UnknownWorkspace",
    "UsageError",
    "WorkspaceCorrupt",
    "WorkspaceError",
    "WorkspaceFormatError",
    "WorkspaceLocked",
    "WorkspaceUntrusted",
]

# One name per error, the one users catch it by: each class reads as kernos.errors.<Name>.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
