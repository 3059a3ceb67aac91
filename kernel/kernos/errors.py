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
"""

from __future__ import annotations

import errno
import os
import shlex
from pathlib import Path
from typing import Any

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

    def __init__(self, path: str, owner: str, *, advice: str | None = None) -> None:
        self.owner = owner
        super().__init__(
            f"The workspace {path} is in use by {owner}. " + (advice or (
                "A workspace belongs to one kernel at a time. Stop that kernel, or point "
                "KERNOS_WORKSPACE at another directory.")),
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


class WorkspaceUntrusted(WorkspaceError):
    """A clone whose audit records are signed by writers this workspace does not trust yet.

    Restoring a snapshot runs pickle, which runs code: nothing is restored, replayed or
    forked from it until the human trusts each writer (``kernos remote trust``).
    """

    def __init__(self, path: str, *, url: str, signers: list[str], unsigned: int) -> None:
        self.url = url
        self.signers = signers
        self.unsigned = unsigned
        where = f" -w {shlex.quote(path)}"
        steps = [f"`kernos remote trust {key}{where}`" for key in signers]
        if unsigned:
            steps.append(f"`kernos remote trust --accept-unsigned{where}` (its {unsigned} "
                         "records from before signing existed)")
        who = ", ".join(signers) if signers else "no key"
        super().__init__(
            f"The workspace {path} was cloned from {url}, whose records are signed by {who}"
            + (f" ({unsigned} unsigned)" if unsigned else "") + ", which it does not trust "
            "yet. Restoring a snapshot runs code (pickle), so nothing in it is restored until "
            "you trust its writers: compare each key id with the one `kernos remote trust` "
            "prints in the writer's own workspace, then run " + " and ".join(steps) + ". "
            "`kernos log` and `kernos audit verify` work meanwhile.", path=path)


class UnknownWorkspace(WorkspaceError):
    """A workspace name (``kernos -w NAME``) that names no workspace, or several.

    ``name`` is what was given, ``root`` the directory names are looked up in, and
    ``candidates`` the workspaces it could mean (empty: none matched).
    """

    def __init__(self, message: str, *, name: str, root: str,
                 candidates: tuple[str, ...] = ()) -> None:
        self.name = name
        self.root = root
        self.candidates = candidates
        super().__init__(message, path=name)

    @classmethod
    def unknown(cls, name: str, *, root: str, known: list[str]) -> UnknownWorkspace:
        listed = (f"the workspaces there are {', '.join(known[:8])}"
                  + (f" and {len(known) - 8} more" if len(known) > 8 else "")) if known \
            else "there is no workspace there yet"
        return cls(f"no workspace is named {name!r} under {root} ({listed}). `kernos "
                   "workspaces` lists them with their paths. -w takes one of those names or a "
                   f"path: ./{name} for a directory here, {root}/{name} for a new workspace "
                   "there.", name=name, root=root)

    @classmethod
    def ambiguous(cls, name: str, *, root: str, candidates: list[str]) -> UnknownWorkspace:
        return cls(f"{name!r} could name {len(candidates)} workspaces under {root}: "
                   f"{', '.join(candidates[:8])}{' ...' if len(candidates) > 8 else ''}. "
                   "Give the whole name (`kernos workspaces` lists them) or a path.",
                   name=name, root=root, candidates=tuple(candidates))


class DiskFull(WorkspaceError, OSError):
    """A write into the workspace found its filesystem full (or the user's quota spent).

    It is an ``OSError`` too (``errno`` is ENOSPC or EDQUOT), so code that copes with
    a failed write copes with this one.  ``path`` is the file being written,
    ``what`` says what it is, ``mount`` the filesystem's mount point, ``free`` the
    bytes left there when the write failed, ``needed`` the size of the write when
    known, and ``then`` what became of the operation.
    """

    def __init__(self, *, path: str, what: str, mount: str, free: int | None,
                 needed: int | None, code: int, reason: str, then: str) -> None:
        self.what = what
        self.mount = mount
        self.free = free
        self.needed = needed
        self.then = then
        room = (f"{free:,} bytes free on {mount}" if free is not None
                else f"free space on {mount} unknown")
        if needed is not None:
            room += f", {needed:,} needed for this write"
        self.message = (
            f"the disk is full: writing {what} ({path}) failed with {reason}; {room}. "
            f"{then} Free space on {mount} (or move the workspace to a larger disk), "
            "then retry.")
        super().__init__(self.message, path=path)
        self.errno = code
        self.strerror = reason

    def __str__(self) -> str:
        return self.message  # not OSError's "[Errno 28] ...": the message says it all

    @classmethod
    def from_os_error(cls, error: OSError, *, path: str | os.PathLike[str], what: str,
                      needed: int | None = None,
                      then: str = "Nothing was written.") -> DiskFull:
        """The error for ``error`` (an ENOSPC or EDQUOT) while writing ``what`` at ``path``."""
        where = Path(path)
        probe = where
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free: int | None
        try:
            stat = os.statvfs(probe)
            free = stat.f_bavail * stat.f_frsize
        except OSError:
            free = None
        code = error.errno if error.errno is not None else errno.ENOSPC
        reason = f"{errno.errorcode.get(code, code)} ({os.strerror(code)})"
        return cls(path=str(where), what=what, mount=_mount_point(probe), free=free,
                   needed=needed, code=code, reason=reason, then=then)


    def retold(self, then: str) -> DiskFull:
        """The same failure, told with what it means for the operation at hand."""
        return DiskFull(path=self.path, what=self.what, mount=self.mount, free=self.free,
                        needed=self.needed, code=self.errno or errno.ENOSPC,
                        reason=self.strerror or "ENOSPC", then=then)


def _mount_point(path: Path) -> str:
    """The mount point of the filesystem that holds ``path`` (an existing path)."""
    try:
        current = path.resolve()
        device = current.stat().st_dev
        while current != current.parent and current.parent.stat().st_dev == device:
            current = current.parent
    except OSError:
        return str(path)
    return str(current)


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says that a filesystem (or a quota) has no room left."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


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
        self.detail = detail
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


class CircuitOpen(KernosError):
    """A supervisor policy tripped: every op of the agent is refused until a human resets it."""

    def __init__(self, agent: str, policy: str, message: str) -> None:
        self.agent = agent
        self.policy = policy
        self.message = message
        super().__init__(
            f"{agent!r}'s circuit is open ({message}), so its op was refused before it ran "
            f"and rolls back. Only a human closes it: `agents.reset({agent!r})` once the "
            "cause is dealt with.")
        self.sub_agent: str | None = None
        """The sub-agent whose op was refused, when the open circuit is an ancestor's."""

    @classmethod
    def for_sub_agent(cls, sub_agent: str, ancestors: list[str], agent: str, policy: str,
                      message: str, *, via: str) -> CircuitOpen:
        """``sub_agent``'s op (or ``via``: its tool) refused because ``agent``, reached
        through ``ancestors`` (nearest first, ending at ``agent``), has an open circuit."""
        error = cls(agent, policy, message)
        error.sub_agent = sub_agent
        chain = ", ".join(f"a sub-agent of {name!r}" for name in ancestors)
        what = (f"{sub_agent!r}'s op was refused before it ran and rolls back" if via == "op"
                else f"{sub_agent!r}'s {via} was refused before it ran and the op rolls back")
        error.args = (
            f"{sub_agent!r} is {chain}, whose circuit is open ({message}), so {what} (a "
            "sub-agent stops while an ancestor's circuit is open). Once the cause is dealt "
            f"with, only a human closes it: `agents.reset({agent!r})` in a cell or `kernos "
            f"agent reset {agent}` in a shell; then {sub_agent!r} runs again.",)
        return error


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


class RemoteError(KernosError):
    """A git remote cannot be reached or used as asked (``kernos.store.remote``)."""

    def __init__(self, message: str, *, remote: str = "") -> None:
        self.remote = remote
        super().__init__(message)


class RemoteDiverged(RemoteError):
    """A push (or pull) that would fork the history: another writer moved the remote."""

    def __init__(self, message: str, *, remote: str, writer: str) -> None:
        self.writer = writer
        """Who moved the remote last, as far as it says (host, workspace id, when)."""
        super().__init__(message, remote=remote)


class RemoteRefused(RemoteError):
    """A pull or clone refused what the remote holds (tampered, unsigned, untrusted, planted,
    oversized or malformed); the local workspace was not changed."""

    def __init__(self, message: str, *, remote: str, record: int | None = None,
                 commit: str | None = None, path: str | None = None) -> None:
        self.record = record
        """The audit record that was wrong, if one was."""
        self.commit = commit
        """The commit that was wrong, if one was."""
        self.path = path
        """The path in the remote's tree that was wrong, if one was."""
        super().__init__(message, remote=remote)


class RemoteLeaseHeld(RemoteError):
    """Another workspace holds the remote's writer lease, and it has not expired."""

    def __init__(self, remote: str, holder: str, *, expires: str,
                 workspace: str | None = None) -> None:
        self.holder = holder
        self.expires = expires
        where = f" -w {shlex.quote(workspace)}" if workspace else ""
        super().__init__(
            f"The remote {remote} is leased to {holder} until {expires}: one writer at a "
            "time extends a workspace. Wait for that kernel to stop (or the lease to expire), "
            f"or, if that writer is gone for good, take it over with "
            f"`kernos remote release {remote} --force{where}`.", remote=remote)


class ErasedValue(KernosError):
    """The value of a ``personal(...)`` wrapper whose data subject was erased."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        super().__init__(
            f"this value belonged to the data subject {subject!r}, which was erased; it "
            "cannot be read any more (by design)."
        )


# -- LLM calls (kernos.llm) ---------------------------------------------------------------


class LLMRequestInvalid(UsageError):
    """An LLM request that Kernos refuses to send: nothing was called or charged."""


class LLMError(KernosError):
    """An LLM call that failed or was refused.  Inside an op, the op rolls back.

    ``request`` is the request's hash (its recording in ``<workspace>/llm/``)
    and ``model`` the model asked for.
    """

    def __init__(self, message: str, *, request: str, model: str) -> None:
        self.request = request
        self.model = model
        super().__init__(message)


class LLMRecordingErased(LLMError):
    """A recorded LLM request or answer held a data subject's data, and it was erased."""

    def __init__(self, name: str, subjects: list[str], *, request: str = "",
                 model: str = "") -> None:
        self.name = name
        self.subjects = subjects
        super().__init__(
            f"the recorded LLM exchange {name[:16]} held data of the data subject(s) "
            f"{', '.join(map(repr, subjects))}, which was erased; it cannot be read or "
            "replayed any more (by design). Replay from a snapshot after that op, or call "
            "the model again.", request=request, model=model)


class LLMProviderError(LLMError):
    """The provider refused or failed the call (litellm raised ``kind``)."""

    def __init__(self, message: str, *, request: str, model: str, kind: str,
                 status_code: int | None, retryable: bool) -> None:
        self.kind = kind
        self.status_code = status_code
        self.retryable = retryable
        super().__init__(message, request=request, model=model)

    @classmethod
    def from_exception(cls, error: BaseException, *, request: str, model: str,
                       text: str) -> LLMProviderError:
        """``text`` is the provider's message, already stripped of credentials."""
        kind = type(error).__name__
        status = getattr(error, "status_code", None)
        status_code = status if type(status) is int else None
        retryable = kind in _RETRYABLE
        return cls(
            f"the LLM provider failed the call to {model!r} ({kind}"
            + (f", HTTP {status_code}" if status_code else "") + f": {text[:300]}). "
            + ("It may succeed if tried again later. " if retryable else
               "Fix the request, the model name or the provider's key in the environment. ")
            + f"Request {request[:16]}; the op rolls back.",
            request=request, model=model, kind=kind, status_code=status_code,
            retryable=retryable)


_RETRYABLE = frozenset({"RateLimitError", "Timeout", "APIConnectionError",
                        "ServiceUnavailableError", "InternalServerError", "BadGatewayError"})


class LLMResponseInvalid(LLMError):
    """The provider answered, but not with a usable completion."""

    def __init__(self, problem: str, *, request: str, model: str) -> None:
        self.problem = problem
        super().__init__(
            f"the answer of {model!r} to request {request[:16]} is malformed: {problem}. "
            "The op rolls back; the answer is kept in the workspace's llm store for "
            "inspection.", request=request, model=model)


class LLMToolCallInvalid(LLMError):
    """A tool call in the answer names no offered tool, or its arguments fail its schema."""

    def __init__(self, tool: str, problem: str, *, request: str, model: str) -> None:
        self.tool = tool
        self.problem = problem
        super().__init__(
            f"{model!r} called the tool {tool[:80]!r} with arguments that do not fit: "
            f"{problem}. Request {request[:16]}; the op rolls back. Describe the tool's schema "
            "to the model more clearly, or validate and retry in a new op.",
            request=request, model=model)


class LLMReplayMiss(LLMError):
    """Replay mode found no recorded response for a request."""

    def __init__(self, *, request: str, model: str, store: str) -> None:
        self.store = store
        super().__init__(
            f"replay mode: no recorded response for request {request} to model {model!r} "
            f"in {store}. Nothing was called. Record it first: run the op with "
            "KERNOS_LLM_MODE=record (or kernos.llm.set_mode('record')) and the provider's "
            "key in the environment; the op rolls back.", request=request, model=model)


class LLMBudgetExceeded(LLMError):
    """A call would exceed (``phase="before"``) or did exceed (``"after"``) a budget."""

    def __init__(self, *, budget: str, unit: str, limit: str, used: str, asked: str,
                 phase: str, request: str, model: str) -> None:
        self.budget = budget
        self.unit = unit
        self.limit = limit
        self.used = used
        self.asked = asked
        self.phase = phase
        if phase == "before":
            what = (f"a call to {model!r} may use up to {asked} {unit}, but {budget} has "
                    f"{used} of {limit} {unit} used. Nothing was called")
        else:
            what = (f"a call to {model!r} used {asked} {unit}, which took {budget} to {used} "
                    f"of {limit} {unit} (the provider used more than estimated; what it "
                    "used stays charged)")
        super().__init__(
            f"LLM budget exceeded: {what}. The op rolls back. Ask for fewer tokens "
            "(max_tokens, shorter messages), or have a human raise the budget.",
            request=request, model=model)
