"""Errors the harness client raises.

The tree (under ``kernos.errors.KernosError``)::

    ClientError                   root: anything the client library raises on purpose
    ├── RequestError              the kernel refused a request (a ``status: error`` reply);
    │                             ``kind`` is the protocol's error kind, ``data`` its facts
    ├── KernelDied                the kernel process died or stopped answering
    ├── NoKernelRunning           ``connect()`` found no live kernel for the workspace
    ├── ProtocolMismatch          the kernel does not speak this client's protocol version
    ├── RequestTimeout            no reply within the caller's timeout (also a TimeoutError)
    ├── BadReply                  a reply this client cannot read (a bug on one side)
    ├── ClientClosed              the client was closed while a request was waiting
    ├── GatewayError              a Jupyter Enterprise Gateway was unreachable or refused
    └── ConflictRetriesExhausted  ``retry_on_conflict`` still saw a conflict after every attempt

A refused request is not the same as an op that did not commit: an op that
rolled back, conflicted or was denied is an ordinary ``OpResult`` whose
``status`` says so.  ``RequestError`` is for requests the kernel could not
carry out at all (malformed, unknown principal, another protocol version, ...).
"""

from __future__ import annotations

from typing import Any

from kernos.errors import KernosError
from kernos.harness.results import OpResult

__all__ = [
    "BadReply",
    "ClientClosed",
    "ClientError",
    "ConflictRetriesExhausted",
    "GatewayError",
    "KernelDied",
    "NoKernelRunning",
    "ProtocolMismatch",
    "RequestError",
    "RequestTimeout",
]

_UNKNOWN_OUTCOME = (
    "Whether a request that was in flight took effect is not known here: an op is committed "
    "only if its reply said so, and every op whose reply said so survives. Start the kernel "
    "again (manager.restart(), or a new kernel on the workspace), check with versions() or "
    "log(), and resend ops with the same idempotency key (key=...) so that none runs twice."
)


class ClientError(KernosError):
    """Root of every error the harness client raises on purpose."""


class RequestError(ClientError):
    """The kernel refused a request: a ``status: error`` reply.

    ``kind`` is one of ``kernos.harness.protocol.ERROR_KINDS``; switch on it,
    never on the message.
    """

    def __init__(self, kind: str, message: str, data: dict[str, Any] | None = None, *,
                 action: str | None = None) -> None:
        super().__init__(f"{action or 'request'} refused ({kind}): {message}")
        self.kind = kind
        """The protocol's error kind: ``malformed``, ``protocol``, ``denied``, ..."""
        self.message = message
        """The kernel's message: what was wrong and what to do."""
        self.data = dict(data or {})
        """The facts the kernel attached (``supported`` versions, names, ...)."""
        self.action = action
        """The action that was refused, when the kernel named it."""

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> RequestError:
        """The error carried by a ``status: error`` reply's content."""
        error = reply.get("error")
        if not isinstance(error, dict):
            error = {}
        data = error.get("data")
        action = reply.get("action")
        return cls(str(error.get("kind") or "internal"),
                   str(error.get("message") or "the kernel gave no reason"),
                   data if isinstance(data, dict) else None,
                   action=action if isinstance(action, str) else None)


class KernelDied(ClientError):
    """The kernel process died, or stopped answering, while this client used it.

    A client belongs to one kernel process: once this is raised, every later
    request on the same client raises it again.  Get a new client from the
    restarted manager (``await manager.client()``) or ``connect()`` again.
    """

    def __init__(self, message: str, *, pid: int | None = None, action: str | None = None,
                 silent_for: float | None = None) -> None:
        super().__init__(message)
        self.pid = pid
        """The kernel's process id, when known."""
        self.action = action
        """The request that was waiting (None if none was)."""
        self.silent_for = silent_for
        """Seconds the heartbeat was silent, when that is how the death was noticed."""

    @classmethod
    def exited(cls, pid: int | None, action: str | None = None) -> KernelDied:
        """The kernel process is gone (killed, crashed, shut down or restarted)."""
        who = f"the kernel (pid {pid})" if pid is not None else "the kernel"
        during = f" while the {action!r} request was waiting for its reply" if action else ""
        return cls(f"{who} is gone: it died, or its manager shut it down or restarted "
                   f"it{during}. {_UNKNOWN_OUTCOME}", pid=pid, action=action)

    @classmethod
    def silent(cls, pid: int | None, seconds: float,
               action: str | None = None) -> KernelDied:
        """The process may exist, but its heartbeat has not answered for ``seconds``."""
        who = f"the kernel (pid {pid})" if pid is not None else "the kernel"
        during = f" while the {action!r} request was waiting" if action else ""
        return cls(f"{who} stopped answering its heartbeat for {seconds:.0f} s{during}: it "
                   "is hung, stopped or unreachable. Kill it (manager.kill()) or restart it. "
                   f"{_UNKNOWN_OUTCOME}", pid=pid, action=action, silent_for=seconds)

    def during(self, action: str | None) -> KernelDied:
        """The same death, told to the request ``action`` that was waiting."""
        if self.silent_for is not None:
            return KernelDied.silent(self.pid, self.silent_for, action)
        return KernelDied.exited(self.pid, action)


class NoKernelRunning(ClientError):
    """``connect()`` found no live kernel for the workspace."""

    def __init__(self, message: str, *, workspace: str) -> None:
        super().__init__(message)
        self.workspace = workspace
        """The workspace that was asked for."""

    @classmethod
    def missing(cls, workspace: str, marker: str) -> NoKernelRunning:
        return cls(f"no kernel is running on the workspace {workspace}: {marker} does not "
                   "exist. Start one with kernos.client.run_kernel(workspace), "
                   "KernosClient.start(workspace), or open a notebook on it.",
                   workspace=workspace)

    @classmethod
    def stale(cls, workspace: str, marker: str, pid: int | None) -> NoKernelRunning:
        return cls(f"{marker} names the kernel process {pid}, which is not running (it was "
                   "killed or crashed, so it could not remove the file). Start a new kernel "
                   "on the workspace; it takes over and restores the last committed op.",
                   workspace=workspace)

    @classmethod
    def unreadable(cls, workspace: str, marker: str, problem: str) -> NoKernelRunning:
        return cls(f"{marker} cannot be used to reach a kernel: {problem}. If no kernel is "
                   "running, start one; if one is, it rewrites the file on its next start.",
                   workspace=workspace)


class ProtocolMismatch(ClientError):
    """The kernel does not speak the version of the harness protocol this client speaks."""

    def __init__(self, message: str, *, kernel_protocol: object) -> None:
        super().__init__(message)
        self.kernel_protocol = kernel_protocol
        """What the kernel's ``kernel_info_reply`` said (None: not a Kernos kernel)."""


class RequestTimeout(ClientError, TimeoutError):
    """No reply came within the caller's timeout; the kernel is still alive.

    The request was sent and may still run (an op queues behind other ops).
    """

    def __init__(self, action: str, timeout: float) -> None:
        super().__init__(
            f"no reply to the {action!r} request within {timeout:g} s, although the kernel is "
            "alive (it may be busy with a long op; ops run one at a time). The request may "
            "still run: check with versions() or log() before resending, and give ops an "
            "idempotency key (key=...) so a resend cannot run twice.")
        self.action = action
        self.timeout = timeout


class BadReply(ClientError):
    """A reply that does not match the protocol: a bug in the kernel or in this client."""


class ClientClosed(ClientError):
    """The client was closed (by ``close()`` or its manager's shutdown)."""


class GatewayError(ClientError):
    """A Jupyter Enterprise Gateway could not be reached, or refused a request."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        """The gateway's URL."""
        self.status = status
        """The HTTP status of the refusal (401, 403, 404, ...); None when unreachable."""

    @classmethod
    def unreachable(cls, url: str, problem: str) -> GatewayError:
        return cls(f"no Jupyter Enterprise Gateway answers at {url} ({problem}). Start one "
                   "(deploy/gateway/start), or check the URL given to --gateway / gateway=.",
                   url=url)


class ConflictRetriesExhausted(ClientError):
    """Every attempt of ``retry_on_conflict`` was rejected with a conflict."""

    def __init__(self, result: OpResult, attempts: int) -> None:
        current = ", ".join(f"{name}={version}" for name, version in result.versions.items())
        super().__init__(
            f"the op conflicted {attempts} times in a row (current versions: "
            f"{current or 'none reported'}): other writers change these names faster than this "
            "caller reads and acts. Give it more attempts, or have writers of the same names "
            "take turns.")
        self.result = result
        """The last attempt's result (status ``conflict``, with the current ``versions``)."""
        self.attempts = attempts
