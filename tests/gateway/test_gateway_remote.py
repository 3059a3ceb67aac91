"""Two machines, one remote: a gateway kernel resumes from the workspace's git remote.

Two real Enterprise Gateways ("machine A" and "machine B", started with deploy/gateway's
scripts) with two ``KERNOS_WORKSPACE_ROOT``s and one remote template,
``deploy/gateway/install --remote origin=<remotes>/{workspace}.git`` (the writer lease on).

* A kernel on A commits, is culled by A's idle culling (its shutdown pushes and lets the
  lease go), and a kernel on B for the same name materializes the workspace from the
  remote with its state exact: values (a numpy array too), history head, and ``kernos
  audit verify`` with the real CLI on B's copy.
* While A's kernel holds the workspace, a kernel on B for the same name is refused: every
  request, harness op or notebook cell, names the lease's holder (A's kernel, by pid) and
  what to do; nothing is lost on A, nothing reaches the remote from B; once A lets go, the
  same kernel on B, asked again, takes the lease and catches up with A's last op.
* A kernel SIGKILLed on A keeps its lease (nobody released it): B is refused until the
  documented recovery, ``kernos remote release origin --force`` on B's copy; then B resumes
  with every op that had reached the remote before the kill (the pusher's lag bounds what a
  kill can lose: at most the ops of the last interval).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from client_support import committed
from gateway_support import CHECKOUT, USERNAME, Gateway, execute, kernos_cli, running_gateway
from kernos.client import KernosManager, RequestError, run_kernel
from kernos.client.gateway_transport import GatewayAPI
from kernos.store.workspace import Workspace

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

DEADLINE = 180.0


@dataclass
class Machines:
    a: Gateway
    b: Gateway
    remotes: Path
    """The shared remote root: workspace NAME's remote is ``remotes / f"{NAME}.git"``."""


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machines]:
    base = tmp_path_factory.mktemp("two-machines")
    remotes = base / "remotes"
    # One deployment: both machines sign with the operator's key, so B trusts what A pushed.
    install = ["--remote", f"origin={remotes}/{{workspace}}.git",
               "--signing-key", str(base / "signing.pem")]
    with pytest.MonkeyPatch.context() as patch, contextlib.ExitStack() as stack:
        patch.setenv("KERNEL_USERNAME", USERNAME)
        patch.delenv("KERNOS_GATEWAY_TOKEN", raising=False)
        a = stack.enter_context(running_gateway(base / "a", install=install))
        b = stack.enter_context(running_gateway(base / "b", install=install))
        yield Machines(a=a, b=b, remotes=remotes)


def git(url: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(url), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def remote_ref(machines: Machines, name: str, ref: str) -> str | None:
    return git(machines.remotes / f"{name}.git", "for-each-ref", "--format=%(objectname)",
               ref) or None


def head_on_disk(gateway: Gateway, name: str) -> str | None:
    with Workspace.open(gateway.root / name, writable=False, create=False) as workspace:
        head = workspace.head()
    return head.hex() if head else None


async def wait_for(what: str, check: Callable[[], bool], seconds: float = 60) -> None:
    """Poll ``check()`` until it is true (a deadline for a hang, not a speed assertion)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)


ARRAY = "numpy.arange(12, dtype=numpy.int64).reshape(3, 4)"


def test_a_kernel_culled_on_a_comes_back_on_b_from_the_remote(machines: Machines) -> None:
    name = f"moving-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        manager = KernosManager(name, gateway=machines.a.url, token=machines.a.token)
        await manager.start()
        client = await manager.client()
        where = committed(await client.op("import kernos\nkernos.__file__"))
        assert where.value is not None  # the kernel runs this tree's code
        assert str(Path(__file__).resolve().parents[2] / "kernel") in str(where.value.json)
        committed(await client.op(f"import numpy\narr = {ARRAY}\nnotes = {{'k': [1, 2]}}"))
        last = committed(await client.op("arr *= 3\nnotes['k'].append(3)"))
        assert manager.gateway is not None and manager.gateway.kernel_id is not None
        kernel_id = manager.gateway.kernel_id
        await client.close()  # idle, and nobody connected: A culls it
        api = GatewayAPI(machines.a.url, token=machines.a.token)
        deadline = time.monotonic() + 60
        while await api.kernel(kernel_id) is not None:
            assert time.monotonic() < deadline, "gateway A did not cull the idle kernel"
            await asyncio.sleep(0.5)
        await wait_for("the culled kernel did not release its lease",
                       lambda: remote_ref(machines, name, "refs/kernos/lease") is None)
        # Its shutdown pushed everything: the remote's history is A's, to the last op.
        assert remote_ref(machines, name, "refs/heads/main") == last.commit
        assert head_on_disk(machines.a, name) == last.commit
        assert not (machines.b.root / name).exists()  # B has never seen this workspace

        async with run_kernel(name, gateway=machines.b.url, token=machines.b.token) as (
                _, resumed):
            assert (await resumed.log(limit=1))[0]["op"] == last.op
            check = committed(await resumed.op(
                f"assert arr.dtype == numpy.int64 and (arr == 3 * {ARRAY}).all()\n"
                "notes['k']"))
            assert check.value is not None and check.value.json == [1, 2, 3]
            after = committed(await resumed.op("notes['k'].append('on B')"))
        assert head_on_disk(machines.b, name) == after.commit
        assert remote_ref(machines, name, "refs/heads/main") == after.commit

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE))
    verified = kernos_cli("audit", "verify", "-w", str(machines.b.root / name))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_second_machine_is_refused_while_the_first_holds_the_workspace(
        machines: Machines) -> None:
    name = f"held-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        second = KernosManager(name, gateway=machines.b.url, token=machines.b.token)
        async with run_kernel(name, gateway=machines.a.url, token=machines.a.token) as (
                manager_a, first):
            committed(await first.op("ledger = {'in': 1}"))
            assert manager_a.gateway is not None and manager_a.gateway.kernel_id is not None
            pid = machines.a.kernel_pid(manager_a.gateway.kernel_id)
            await wait_for("A's first op never reached the remote",
                           lambda: remote_ref(machines, name, "refs/heads/main") is not None)
            # B's kernel starts (the gateway knows nothing of leases), and then answers
            # every request, op or notebook cell, with the refusal.
            await second.start(timeout=60)
            client = await second.client()
            for code in ("ledger = {'in': 'from B'}", "1 + 1"):
                with pytest.raises(RequestError) as refused:
                    await client.op(code)
                message = str(refused.value)
                assert "The remote origin is leased to workspace" in message
                assert f"(pid {pid}," in message  # A's kernel, the holder
                # ... with the whole command, B's copy named: a gateway host's operator
                # cannot guess the workspace root.
                assert (f"kernos remote release origin --force -w {machines.b.root / name}`"
                        in message)
            assert second.gateway is not None and second.gateway.kernel_id is not None
            api = GatewayAPI(machines.b.url, token=machines.b.token)
            channels = await api.channels(second.gateway.kernel_id)
            try:
                reply = await execute(channels, "ledger = {'in': 'cell from B'}")
            finally:
                channels.close()
            assert reply["content"]["status"] == "error"
            content = reply["content"]
            shown = " ".join([content.get("evalue", ""), *content.get("traceback", [])])
            assert "is leased to workspace" in shown and f"(pid {pid}," in shown, shown
            # Nothing is lost on A, nothing of B's reached the remote, and A goes on.
            assert (await first.object("ledger")).preview.json == {"in": 1}
            last = committed(await first.op("ledger['in'] += 1"))
        try:  # A let go (final push, lease released): B's kernel, asked again, catches up
            assert remote_ref(machines, name, "refs/heads/main") == last.commit
            assert remote_ref(machines, name, "refs/kernos/lease") is None
            assert (await client.object("ledger")).preview.json == {"in": 2}
            assert (await client.log(limit=1))[0]["op"] == last.op
            after = committed(await client.op("ledger['in'] += 10"))
        finally:
            await second.shutdown()
        assert remote_ref(machines, name, "refs/heads/main") == after.commit

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE))


def test_after_a_sigkill_on_a_b_takes_over_with_release_force(machines: Machines) -> None:
    name = f"killed-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        manager = KernosManager(name, gateway=machines.a.url, token=machines.a.token)
        await manager.start()
        try:
            client = await manager.client()
            committed(await client.op("import numpy\nseries = [1]"))
            pushed = committed(await client.op(f"series.append(2)\narr = {ARRAY}"))
            # Acknowledged, then on the remote within the push interval (200 ms) plus the
            # push itself: wait for it, as a client that needs the op safe elsewhere would.
            await wait_for("an acknowledged op never reached the remote",
                           lambda: remote_ref(machines, name, "refs/heads/main")
                           == pushed.commit)
            late = committed(await client.op("series.append(3)"))  # may or may not travel
            assert manager.gateway is not None and manager.gateway.kernel_id is not None
            os.kill(machines.a.kernel_pid(manager.gateway.kernel_id), signal.SIGKILL)
        finally:
            await manager.shutdown()
        holder = remote_ref(machines, name, "refs/kernos/lease")
        assert holder is not None  # a killed kernel releases nothing

        refused = KernosManager(name, gateway=machines.b.url, token=machines.b.token)
        await refused.start(timeout=60)
        try:
            with pytest.raises(RequestError, match="is leased to workspace"):
                await (await refused.client()).op("series")
        finally:
            await refused.shutdown()

        # The documented recovery: the holder is known dead, so B's operator takes it over.
        released = kernos_cli("remote", "release", "origin", "--force", "--json",
                              "-w", str(machines.b.root / name))
        assert released.returncode == 0, released.stderr
        assert json.loads(released.stdout)["released"]["workspace"] is not None
        assert remote_ref(machines, name, "refs/kernos/lease") is None

        async with run_kernel(name, gateway=machines.b.url, token=machines.b.token) as (
                _, resumed):
            head = (await resumed.log(limit=1))[0]["op"]
            series = (await resumed.object("series")).preview.json
            # Everything pushed before the kill is there; the late op only if it travelled.
            assert (head, series) in ((pushed.op, [1, 2]), (late.op, [1, 2, 3]))
            committed(await resumed.op(f"assert (arr == {ARRAY}).all()"))
            after = committed(await resumed.op("series.append('B')"))
        assert remote_ref(machines, name, "refs/heads/main") == after.commit

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE))
    verified = kernos_cli("audit", "verify", "-w", str(machines.b.root / name))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_install_writes_the_remote_template_and_refuses_what_it_cannot_use(
        tmp_path: Path) -> None:
    install = [str(CHECKOUT / "deploy" / "gateway" / "install"), "--python", sys.executable,
               "--workspace-root", str(tmp_path / "w")]
    template = "origin=/srv/kernos/remotes/{workspace}.git"
    for extra, lease in (([], "1"), (["--no-lease"], None)):
        done = subprocess.run([*install, "--dest", str(tmp_path / f"k{lease}"), "--remote",
                               template, *extra], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        spec = json.loads((Path(done.stdout.strip()) / "kernels" / "kernos" / "kernel.json")
                          .read_text())
        assert spec["env"]["KERNOS_REMOTE"] == template
        assert spec["env"].get("KERNOS_REMOTE_LEASE") == lease
    key = tmp_path / "keys" / "signing.pem"
    key.parent.mkdir()
    done = subprocess.run([*install, "--dest", str(tmp_path / "signed"), "--signing-key",
                           str(key)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "signed" / "kernels" / "kernos" / "kernel.json").read_text())
    assert spec["env"]["KERNOS_SIGNING_KEY"] == str(key)
    assert key.stat().st_mode & 0o777 == 0o600 and b"PRIVATE KEY" in key.read_bytes()
    made = key.read_bytes()
    subprocess.run([*install, "--dest", str(tmp_path / "again"), "--signing-key", str(key)],
                   check=True, capture_output=True)
    assert key.read_bytes() == made  # an existing key is the deployment's: kept
    done = subprocess.run([*install, "--remote", "/srv/no-name.git"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2 and "--remote takes NAME=URL" in done.stderr
    done = subprocess.run([*install, "--no-lease"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "--no-lease goes with --remote" in done.stderr
