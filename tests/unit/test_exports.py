"""The public surface is what we mean it to be, and the core does not import Jupyter."""

from __future__ import annotations

import subprocess
import sys

import kernos

EXPECTED = {
    "AbortReport", "AuditError", "CheckoutReport", "CommitFailed", "CommitReport",
    "ErasedValue", "EventCascadeTooDeep", "EventError", "Image", "KernosError", "Op",
    "Personal", "RemoteDiverged", "RemoteError", "RemoteLeaseHeld", "RemoteRefused",
    "SubscriberFailed", "UnknownSubject", "personal", "RequestRejected",
    "RestoreError", "RestoreReport", "TransactionStateError",
    "UnknownRef", "Unpersisted", "UnpersistedValueError", "UsageError", "Workspace",
    "WorkspaceCorrupt", "WorkspaceError", "WorkspaceFormatError", "WorkspaceLocked",
    "WorkspaceUntrusted",
    "__version__", "default_workspace", "inspect",
}


def test_exports_are_the_intended_ones() -> None:
    assert set(kernos.__all__) == EXPECTED
    for name in kernos.__all__:
        assert hasattr(kernos, name), name


def test_core_does_not_import_jupyter() -> None:
    core = ["kernos", "kernos.image", "kernos.op", "kernos.history", "kernos.transaction",
            "kernos.analysis", "kernos.store.snapshots", "kernos.serialize.pickler", "kernos.cli",
            "kernos.agents", "kernos.agents.runtime", "kernos.events", "kernos.events.bus",
            "kernos.events.human", "kernos.audit", "kernos.audit.verify", "kernos.audit.human",
            "kernos.personal", "kernos.llm", "kernos.prune", "kernos.store.retention",
            "kernos.audit.pruning", "kernos.remote.transfer", "kernos.remote.lease",
            "kernos.remote.autopush", "kernos.remote.config", "kernos.remote.start",
            "kernos.cli._remote", "kernos.fork"]
    code = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in core)
        + "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
          "{'ipykernel', 'jupyter_client', 'IPython', 'ipywidgets', 'zmq', 'tornado'})\n"
        + "print(','.join(bad))\n"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert found == "", f"the core imported {found}"
