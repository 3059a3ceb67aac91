"""kernos.client exports what the MCP server, the CLI and harnesses build on."""

from __future__ import annotations

import kernos.client

EXPECTED = {
    "AsyncKernosClient", "BadReply", "BlockingManager", "ClientClosed", "ClientError",
    "ConflictRetriesExhausted", "ErrorInfo", "EventStream", "EventSubscription", "GatewayError",
    "KernelDied",
    "KernosClient", "KernosManager", "NoKernelRunning", "ObjectInfo", "OpResult",
    "ProtocolMismatch", "RequestError", "RequestTimeout", "Value", "retry_on_conflict",
    "run_kernel",
}


def test_exports_are_the_intended_ones() -> None:
    assert set(kernos.client.__all__) == EXPECTED
    for name in kernos.client.__all__:
        assert hasattr(kernos.client, name), name
