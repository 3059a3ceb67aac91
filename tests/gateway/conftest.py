"""One real Jupyter Enterprise Gateway for the whole tests/gateway session.

``gateway`` starts it with deploy/gateway's scripts (see ``gateway_support``),
on 127.0.0.1 with a temporary ``KERNOS_WORKSPACE_ROOT``, and stops it at the
end.  ``KERNEL_USERNAME`` is set for the session, since the gateway refuses to
start kernels for root.  Each test uses workspace names of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway_support import USERNAME, Gateway, running_gateway


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERNEL_USERNAME", USERNAME)
        patch.delenv("KERNOS_GATEWAY_TOKEN", raising=False)
        with running_gateway(tmp_path_factory.mktemp("gateway")) as started:
            yield started
