"""The ``kernos`` CLI with ``--gateway``, and the errors of the gateway path.

The CLI runs as a subprocess (this tree's ``kernos.cli``) against the session's
real gateway: ``run`` commits into ``<root>/<name>``, ``objects`` and ``grants`` read
through a kernel started there.  Then what goes wrong, each with its clear message
and, for the CLI, its exit status: no gateway at the URL, a token that is not the
gateway's (or none), a workspace name that is a path, a kernelspec the gateway does
not offer, and a kernel that exits while starting.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway_support import CHECKOUT, Gateway, free_port, through
from kernos.client import KernosManager, RequestError, run_kernel
from kernos.client.errors import ClientError, GatewayError
from kernos.errors import UsageError

pytestmark = [pytest.mark.kernel]


def test_the_cli_runs_ops_and_reads_through_the_gateway(gateway: Gateway) -> None:
    done = through(gateway, "run", "-w", "cli", "--json", "ledger = {'in': 5}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "committed"
    done = through(gateway, "run", "-w", "cli", "--json", "ledger['in'] += 1\nledger['in']")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["value"]["json"] == 6
    listed = through(gateway, "objects", "-w", "cli", "--json")
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert found["source"] == "kernel"
    assert [(item["name"], item["version"]) for item in found["objects"]] == [("ledger", 2)]
    assert (gateway.root / "cli" / "history.git").is_dir()  # under the root, by its name
    rolled = through(gateway, "run", "-w", "cli", "ledger['in'] = 0\nraise KeyError('x')")
    assert rolled.returncode == 1
    grants = through(gateway, "grants", "-w", "cli", "--json")
    assert grants.returncode == 0 and json.loads(grants.stdout) == {"grants": []}
    # Every kernel the CLI started was shut down after its command.
    assert gateway.api("/api/kernels") == []


def test_cli_errors_are_one_clear_line_with_an_exit_status(gateway: Gateway) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    done = through(gateway, "run", "-w", "x", "a = 1", url=nobody)
    assert done.returncode == 4
    assert f"no Jupyter Enterprise Gateway answers at {nobody}" in done.stderr
    done = through(gateway, "run", "-w", "x", "a = 1", token="not-the-token")
    assert done.returncode == 4
    assert "the token is not the gateway's; check KERNOS_GATEWAY_TOKEN" in done.stderr
    done = through(gateway, "run", "-w", "../escape", "a = 1")
    assert done.returncode == 2
    assert "through a gateway the workspace is a name, not a path" in done.stderr
    assert "'../escape' cannot name a workspace" in done.stderr
    assert not (gateway.root.parent / "escape").exists()
    assert "Traceback" not in done.stderr


def test_client_errors_through_the_gateway(gateway: Gateway) -> None:
    async def scenario() -> None:
        nobody = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(GatewayError) as refused:
            await KernosManager("w", gateway=nobody, token="t").start()
        assert refused.value.status is None and "no Jupyter Enterprise Gateway" in str(
            refused.value)
        with pytest.raises(GatewayError) as refused:
            await KernosManager("w", gateway=gateway.url, token="wrong").start()
        assert refused.value.status == 401 and "the token is not the gateway's" in str(
            refused.value)
        with pytest.raises(GatewayError) as refused:
            await KernosManager("w", gateway=gateway.url, token="").start()
        assert refused.value.status == 401 and "no token was sent" in str(refused.value)
        for name in ("..", "a/b", "", "/etc"):
            with pytest.raises(UsageError, match="cannot name a workspace"):
                KernosManager(name, gateway=gateway.url, token=gateway.token)
        with pytest.raises(GatewayError, match="is not a gateway URL"):
            KernosManager("w", gateway="127.0.0.1:8888")
        with pytest.raises(ClientError, match="offers no kernelspec named 'python9'"):
            await KernosManager("w", gateway=gateway.url, token=gateway.token,
                                kernel_name="python9").start()
        # Without KERNEL_USERNAME the gateway refuses root; the message says what to set.
        if os.geteuid() == 0:
            manager = KernosManager("w", gateway=gateway.url, token=gateway.token)
            with pytest.MonkeyPatch.context() as patch:
                patch.delenv("KERNEL_USERNAME")
                with pytest.raises(GatewayError, match="Set KERNEL_USERNAME"):
                    await manager.start()
        assert gateway.api("/api/kernels") == []

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_kernel_whose_workspace_is_held_says_so_through_the_gateway(
        gateway: Gateway) -> None:
    """Two kernels on one name: the second one's requests name the owner (not a hang)."""
    async def scenario() -> None:
        async with run_kernel("held", gateway=gateway.url, token=gateway.token) as (_, first):
            assert (await first.op("a = 1")).committed
            second = KernosManager("held", gateway=gateway.url, token=gateway.token)
            try:
                await second.start(timeout=30)
                client = await second.client()
                with pytest.raises(RequestError) as refused:
                    await client.op("a = 2")
                assert refused.value.kind == "workspace"
                assert f"{gateway.root / 'held'} is in use by a kernos kernel" in str(
                    refused.value)
            finally:
                await second.shutdown()
            assert (await first.object("a")).preview.json == 1

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_the_kernel_itself_refuses_a_workspace_name_that_is_a_path(gateway: Gateway) -> None:
    """A client that skips Kernos's own check (a raw start request) still gets no path."""
    from kernos.client import AsyncKernosClient
    from kernos.client.gateway_transport import GatewayAPI

    async def scenario() -> None:
        api = GatewayAPI(gateway.url, token=gateway.token)
        kernel_id = await api.start("kernos", {"KERNEL_USERNAME": "mallory",
                                               "KERNEL_WORKSPACE": "../../escaped"})
        try:
            client = await AsyncKernosClient._attach(await api.channels(kernel_id),
                                                     timeout=60)
            with pytest.raises(RequestError) as refused:
                await client.op("stolen = 1")
            assert refused.value.kind == "workspace"
            assert "'../../escaped' cannot name a workspace" in str(refused.value)
            await client.close()
        finally:
            await api.delete(kernel_id)
        assert not (gateway.root.parent.parent / "escaped").exists()
        assert not (gateway.root.parent / "escaped").exists()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_the_deploy_scripts_refuse_what_they_cannot_use(tmp_path: Path) -> None:
    install = CHECKOUT / "deploy" / "gateway" / "install"
    done = subprocess.run([str(install), "--python", "/usr/bin/false", "--workspace-root",
                           str(tmp_path / "w")], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "cannot import kernos; give the Python of the venv where Kernos" in done.stderr
    done = subprocess.run([str(install), "--python", sys.executable], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2 and "--python and --workspace-root are required" in done.stderr
    done = subprocess.run([str(CHECKOUT / "deploy" / "gateway" / "start"), "--port", "1"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "--kernels DIR is required" in done.stderr
    done = subprocess.run([str(CHECKOUT / "deploy" / "gateway" / "start"), "--kernels",
                           str(tmp_path), "--venv", str(tmp_path / "none")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "no Enterprise Gateway in" in done.stderr
