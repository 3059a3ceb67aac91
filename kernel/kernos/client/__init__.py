"""The harness client: drive a Kernos kernel over the real Jupyter protocol.

It follows jupyter_client's split.  A *manager* owns the kernel process; a
*client* owns the requests.  Async first, with one thin sync facade::

    from kernos.client import run_kernel

    async with run_kernel("/path/to/workspace") as (manager, client):
        await client.add_agent("alice")
        await client.grant("alice", "read:budget")
        await client.grant("alice", "write:budget")
        result = await client.op("budget = {'left': 500}")        # as the human
        assert result.committed
        seen = await client.versions(["budget"])                  # read
        result = await client.op(                                  # act, if still true
            "left = read('budget')['left']\\n"
            "write('budget', {'left': left - 400})",
            principal="alice", expect_versions=seen, key="alice-spend-1")
        if result.conflict:
            ...                     # read again, decide again (see retry_on_conflict)

and, blocking::

    from kernos.client import KernosClient

    with KernosClient.start("/path/to/workspace") as client:   # starts and owns a kernel
        client.op("x = 1")
    with KernosClient.connect("/path/to/workspace") as client:  # a kernel already running
        print(client.objects())

An op that fails is an ``OpResult`` whose ``status`` says so; exceptions are
for requests the kernel refused (``RequestError``, with the protocol's
``kind``) and for a kernel that died (``KernelDied``).  A client belongs to
one kernel process: after a kill or a restart, get a new one
(``await manager.client()``).

Requests are the harness protocol's (``kernos.harness.protocol``): custom
``kernos_request`` shell messages, version 1.  Committed events arrive on the
``kernos.events`` comm (``client.subscribe``).  A harness never sends Python
source just to read state.

Through a Jupyter Enterprise Gateway, ``KernosManager(name, gateway=URL)`` (and
``run_kernel``, ``KernosClient.start``) start the kernel there, on the workspace
``name`` under the gateway's root; see ``gateway`` and deploy/README.md.

Modules: ``manager`` (KernosManager, run_kernel), ``client``
(AsyncKernosClient, EventSubscription; its channels, readers and watchdog are
``_connection``'s), ``sync`` (KernosClient, its
BlockingManager and EventStream), ``retry`` (retry_on_conflict), ``gateway``
(the gateway path), ``errors``
(the ClientError tree).
"""

from __future__ import annotations

from kernos.client.client import AsyncKernosClient, EventSubscription
from kernos.client.errors import (
    BadReply,
    ClientClosed,
    ClientError,
    ConflictRetriesExhausted,
    GatewayError,
    KernelDied,
    NoKernelRunning,
    ProtocolMismatch,
    RequestError,
    RequestTimeout,
)
from kernos.client.manager import KernosManager, run_kernel
from kernos.client.retry import retry_on_conflict
from kernos.client.sync import BlockingManager, EventStream, KernosClient
from kernos.harness.results import ErrorInfo, ObjectInfo, OpResult, Value

__all__ = [
    "AsyncKernosClient",
    "BadReply",
    "BlockingManager",
    "ClientClosed",
    "ClientError",
    "ConflictRetriesExhausted",
    "ErrorInfo",
    "EventStream",
    "EventSubscription",
    "GatewayError",
    "KernelDied",
    "KernosClient",
    "KernosManager",
    "NoKernelRunning",
    "ObjectInfo",
    "OpResult",
    "ProtocolMismatch",
    "RequestError",
    "RequestTimeout",
    "Value",
    "retry_on_conflict",
    "run_kernel",
]
