"""Kernos: a persistent, transactional Python image with a git-backed history.

The core API (no Jupyter involved)::

    from kernos import Image, Workspace

    with Workspace.open("/path/to/workspace") as workspace:
        namespace: dict = {}
        image = Image(workspace, namespace)
        image.restore()
        op = image.begin(source="x = 1")
        exec("x = 1", namespace)
        op.commit()          # or op.abort() to put the namespace back

The Jupyter kernel (``kernos.kernel``) runs every cell this way, and in it
``kernos.inspect()`` displays an inspector of the image (objects, events,
capabilities, history, a plot).
"""

# Registered with Workspace.open (a writable open finishes what a crash interrupted):
import kernos.audit._store_hooks  # the audit records the commit tail carries

# The composition root: importing these registers the floors above with the floors below.
import kernos.llm._erasure  # erasing a subject deletes its LLM recordings
import kernos.remote._store_hooks  # an interrupted pull
import kernos.store.retention  # noqa: F401  (an interrupted prune)
from kernos._version import __version__
from kernos.errors import (
    AuditError,
    CommitFailed,
    ErasedValue,
    EventCascadeTooDeep,
    EventError,
    KernosError,
    RemoteDiverged,
    RemoteError,
    RemoteLeaseHeld,
    RemoteRefused,
    RequestRejected,
    RestoreError,
    SubscriberFailed,
    TransactionStateError,
    UnknownRef,
    UnknownSubject,
    UsageError,
    WorkspaceCorrupt,
    WorkspaceError,
    WorkspaceFormatError,
    WorkspaceLocked,
    WorkspaceUntrusted,
)
from kernos.image import Image, RestoreReport
from kernos.op import AbortReport, CheckoutReport, CommitReport, Op
from kernos.personal import Personal, personal
from kernos.serialize.unpersisted import Unpersisted, UnpersistedValueError
from kernos.store.workspace import Workspace, default_workspace

__all__ = [
    "AbortReport",
    "AuditError",
    "CheckoutReport",
    "CommitFailed",
    "CommitReport",
    "ErasedValue",
    "EventCascadeTooDeep",
    "EventError",
    "Image",
    "KernosError",
    "Op",
    "Personal",
    "RemoteDiverged",
    "RemoteError",
    "RemoteLeaseHeld",
    "RemoteRefused",
    "RequestRejected",
    "RestoreError",
    "RestoreReport",
    "SubscriberFailed",
    "TransactionStateError",
    "UnknownRef",
    "UnknownSubject",
    "Unpersisted",
    "UnpersistedValueError",
    "UsageError",
    "Workspace",
    "WorkspaceCorrupt",
    "WorkspaceError",
    "WorkspaceFormatError",
    "WorkspaceLocked",
    "WorkspaceUntrusted",
    "__version__",
    "default_workspace",
    "inspect",
    "personal",
]


def inspect() -> None:
    """Display an inspector of the running Kernos kernel's image (an ipywidgets widget).

    Returns None, so nothing lands in the namespace or in ``_``.  Outside a
    Kernos kernel it raises :class:`UsageError` saying what to do.  ipywidgets
    is imported only now, never by ``import kernos``.
    """
    from kernos.inspector.widget import inspect as display_inspector

    display_inspector()
