"""The harness side of the runtime: requests that drive an image, answered as data.

* ``kernos.harness.protocol``: the wire protocol (requests, replies, error kinds);
* ``kernos.harness.results``: typed results shared by the kernel and the client;
* ``kernos.harness.service``: :class:`HarnessService`, which carries requests
  out against an image (the kernel's ``kernos.kernel.control`` is its thin
  transport; an in-process harness can call it directly).

Nothing here imports Jupyter.
"""

from __future__ import annotations

from kernos.harness.protocol import VERSION, ProtocolError
from kernos.harness.results import ErrorInfo, ObjectInfo, OpResult, Value
from kernos.harness.service import Handled, HarnessService

__all__ = ["VERSION", "ErrorInfo", "Handled", "HarnessService", "ObjectInfo", "OpResult",
           "ProtocolError", "Value"]
