"""Progress of long requests: ``kernos_progress`` messages, end to end.

The kernel throttles them (:class:`~kernos.kernel.control.ThrottledProgress`),
the client routes them by parent to the request's ``progress`` callback, and
the CLI draws them as a bar.  The cheap parts are checked without a kernel;
the rest checks out (and restores) a workspace holding a ~150 MB array, big
enough that loading it takes several progress intervals.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kernos.cli._progress import Progress
from kernos.client import AsyncKernosClient, KernosClient, run_kernel
from kernos.kernel.control import ThrottledProgress

DEADLINE = 240.0
BIG_CELL = ("import numpy as np\n"
            "big = np.random.default_rng(7).random(150_000_000 // 8)\n"
            "float(big[:3].sum())")
Calls = list[tuple[str, int, int]]
EVERY_STEP = {"KERNOS_PROGRESS_INTERVAL": "0"}
"""A bar needs several messages; a checkout from the page cache can end within one interval."""


# -- without a kernel --------------------------------------------------------------------

def test_the_sender_throttles_and_always_sends_the_final_message_once() -> None:
    sent: list[dict[str, Any]] = []
    now = [0.0]
    progress = ThrottledProgress(sent.append, interval=0.1, clock=lambda: now[0])
    for at, done in ((0.0, 10), (0.05, 20), (0.08, 30), (0.15, 40), (0.16, 50), (0.17, 100),
                     (0.18, 100)):  # 20 at 0.05 is held back; 100 repeats nothing
        now[0] = at
        progress("checkout", done, 100)
    assert [message["done"] for message in sent] == [10, 40, 100]
    assert sent[-1] == {"v": 1, "what": "checkout", "done": 100, "total": 100}
    progress("restore", 0, 0)  # nothing to measure: nothing sent
    progress("restore", 5, 50)  # a new step is sent at once, throttled or not
    now[0] = 1.0
    progress("restore", 5, 50)  # a stalled step: nothing new to say
    assert sent[-1]["what"] == "restore" and len(sent) == 4


def test_the_client_routes_progress_by_parent_until_the_idle() -> None:
    async def scenario() -> tuple[Calls, bool]:
        client = AsyncKernosClient(kernel_client=None)  # type: ignore[arg-type]
        calls: Calls = []
        idle = asyncio.Event()
        client._progress["mine"] = (lambda *call: calls.append(call), idle)

        def message(parent: str, kind: str, content: dict[str, Any]) -> dict[str, Any]:
            return {"msg_type": kind, "parent_header": {"msg_id": parent}, "content": content}

        for parent, done in (("mine", 1), ("other", 2), ("mine", 3)):
            client._route_progress(message(parent, "kernos_progress", {
                "v": 1, "what": "checkout", "done": done, "total": 3}))
        client._route_progress(message("mine", "kernos_progress", {"what": "checkout"}))
        client._route_progress(message("other", "status", {"execution_state": "idle"}))
        assert not idle.is_set()
        client._route_progress(message("mine", "status", {"execution_state": "idle"}))
        return calls, idle.is_set()

    calls, idle = asyncio.run(scenario())
    assert calls == [("checkout", 1, 3), ("checkout", 3, 3)] and idle


def test_the_cli_bar_shows_percent_and_megabytes_and_a_restore_phase() -> None:
    stream = io.StringIO()
    progress = Progress(True, tty=False, stream=stream)
    progress.phase("checking out @1")
    show = progress.follow("checking out @1")
    assert show is not None
    for what, done in (("restore", 50_000_000), ("restore", 100_000_000),
                       ("checkout", 75_000_000), ("checkout", 149_999_999),
                       ("checkout", 150_000_000)):
        show(what, done, 100_000_000 if what == "restore" else 150_000_000)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "kernos: restoring the image 50% (50 of 100 MB)" in lines
    assert "kernos: checking out @1 50% (75 of 150 MB)" in lines
    assert lines.count("kernos: checking out @1 100% (150 of 150 MB)") == 1, lines
    assert Progress(False, tty=False).follow("x") is None, "no callback, so no waiting"


# -- a real kernel -----------------------------------------------------------------------

def run(scenario: Any) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, DEADLINE))


async def _big_then_deleted(client: AsyncKernosClient) -> int:
    """Commit the big array, then delete it; the op that holds it."""
    made = await client.op(BIG_CELL)
    assert made.committed and made.op is not None, made
    assert (await client.op("del big")).committed
    return made.op


def _assert_a_rising_bar(calls: Calls, what: str) -> None:
    assert calls and {call[0] for call in calls} == {what}, calls
    dones = [done for _, done, _ in calls]
    totals = {total for _, _, total in calls}
    assert len(totals) == 1 and totals.pop() >= 150_000_000, calls
    assert len(dones) >= 3, f"too few progress messages to draw a bar: {calls}"
    assert dones == sorted(set(dones)), f"done must rise: {dones}"
    assert calls[-1][1] == calls[-1][2], f"the last message must be done == total: {calls}"


@pytest.mark.kernel
def test_a_checkout_reports_rising_progress_ending_at_the_total(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with run_kernel(tmp_path / "ws", env=EVERY_STEP) as (_, client):
            op = await _big_then_deleted(client)
            calls: Calls = []
            result = await client.checkout(f"@{op}", progress=lambda *call: calls.append(call))
            assert result.committed and result.added == ["big"], result
            _assert_a_rising_bar(calls, "checkout")
            quiet: Calls = []
            await client.request("status", progress=lambda *call: quiet.append(call))
            assert quiet == [], "a request with no long step reports nothing"

    run(scenario())


@pytest.mark.kernel
def test_the_blocking_client_passes_progress_through(tmp_path: Path) -> None:
    with KernosClient.start(tmp_path / "ws", env=EVERY_STEP) as client:
        op = run_on(client, _big_then_deleted)
        calls: Calls = []
        assert client.checkout(f"@{op}", progress=lambda *call: calls.append(call)).committed
        _assert_a_rising_bar(calls, "checkout")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("kernos")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kernos.cli"]
    env = {name: value for name, value in os.environ.items() if name != "KERNOS_WORKSPACE"}
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env,
                          timeout=DEADLINE)


def run_on(client: KernosClient, work: Callable[[AsyncKernosClient], Any]) -> Any:
    return client._loop.run(work(client.async_client))


@pytest.mark.kernel
def test_cli_checkout_through_a_running_kernel_draws_a_percent_bar(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace, env=EVERY_STEP) as client:
        op = run_on(client, _big_then_deleted)
        shown = cli("checkout", "-w", str(workspace), "--progress", f"@{op}")
        assert shown.returncode == 0, (shown.stdout, shown.stderr)
        bar = [line for line in shown.stderr.splitlines() if "%" in line]
        assert bar and bar[-1].endswith("100% (150 of 150 MB)"), shown.stderr
        assert len(bar) >= 2, f"one line per tenth, so more than the last: {shown.stderr}"
        assert "big" in [info.name for info in client.objects()], "the kernel has it back"


@pytest.mark.kernel
def test_a_request_sent_at_start_reports_the_restore(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"

    async def scenario() -> Calls:
        async with run_kernel(workspace) as (_, client):
            assert (await client.op(BIG_CELL.replace("150_000_000", "400_000_000"))).committed
        async with run_kernel(workspace) as (_, client):
            calls: Calls = []
            await client.request("status", progress=lambda *call: calls.append(call))
            return calls

    calls = run(scenario())
    if not calls:
        pytest.skip("the restore finished before the first request (a fast machine)")
    assert {call[0] for call in calls} == {"restore"}, calls
    dones = [done for _, done, _ in calls]
    assert dones == sorted(set(dones)), f"done must rise: {dones}"
    assert calls[-1][1] == calls[-1][2] >= 400_000_000, calls

