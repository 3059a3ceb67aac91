"""The Kernos sidebar in a real JupyterLab whose kernels run under Enterprise Gateway.

JupyterLab is started with ``--gateway-url`` pointing at a real gateway on loopback
(started with deploy/gateway's scripts, ``gateway_support``), so the notebook's
kernel is a gateway kernel on the workspace ``KERNEL_WORKSPACE`` names under the
gateway's root.  After a cell commits, the sidebar shows its objects and its history
row; a failed cell leaves both as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from browser.pages import STEP_TIMEOUT_MS, NotebookPage
from gateway_support import USERNAME, Gateway, running_gateway
from kernos import history
from kernos.store.workspace import Workspace

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.extension]

WORKSPACE = "lab-through-gateway"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("gateway")) as started:
        yield started


@pytest.fixture(scope="module")
def lab_options(gateway: Gateway) -> dict[str, Any]:
    return {"args": [f"--gateway-url={gateway.url}",
                     f"--GatewayClient.auth_token={gateway.token}",
                     # Without it chromium's first kernel websocket leaves the gateway an
                     # orphan that takes the notebook's replies (kernos.client.gateway_lab).
                     "--ServerApp.kernel_websocket_connection_class="
                     "kernos.client.gateway_lab.GatewayConnection"],
            "env": {"KERNEL_USERNAME": USERNAME, "KERNEL_WORKSPACE": WORKSPACE}}


def test_the_sidebar_works_against_a_gateway_kernel(
        gateway: Gateway, open_notebook: Callable[..., NotebookPage]) -> None:
    notebook = open_notebook("through-gateway")
    kernels = gateway.api("/api/kernels")
    assert len(kernels) == 1, kernels  # the notebook's kernel runs under the gateway
    # The launcher's logo comes through the gateway (it showed a plain "K" without it).
    spec = notebook.server.api("/api/kernelspecs")["kernelspecs"]["kernos"]
    assert "logo-svg" in spec["resources"], spec
    path = spec["resources"]["logo-svg"].lstrip("/")
    logo = notebook.page.request.get(f"{notebook.server.url}/{path}")
    assert logo.ok and b"<svg" in logo.body(), logo.status
    panel = notebook.panel
    panel.open()
    panel.tab("objects")
    notebook.shot("opened-with-panel")

    notebook.run_cell("seen_through = 'the gateway'; numbers = [1, 2, 3]")
    panel.wait_for_versions({"numbers": "1", "seen_through": "1"})
    op = panel.status_op()
    notebook.shot("cell-committed")

    notebook.run_cell("numbers.append(4)\n1 / 0")
    panel.wait_for_versions({"numbers": "1", "seen_through": "1"})

    panel.tab("history")
    expect(panel.history.locator(f"tr[data-op='{op}']")).to_be_visible(
        timeout=STEP_TIMEOUT_MS)
    notebook.shot("history")
    # The kernel committed into the gateway's root, under the name Lab's environment gave.
    with Workspace.open(gateway.root / WORKSPACE, writable=False, create=False) as workspace:
        assert history.log(workspace, limit=1)[0].op == op
