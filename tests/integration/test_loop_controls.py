"""Pause, resume and stop an agent's loop from a cell, from the harness and from the CLI,
on one real kernel; and a loop that a kernel restart finds running goes on by itself."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.agents_support import committed, names_of
from tests.integration.test_cli_harness import as_json, cli
from tests.integration.test_loop import STEP, loop_of, wait_for

from kernos.client import KernosClient

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

QUIET = 0.5
"""Seconds a paused loop is watched for not moving (it could only fail by moving)."""


def holds_still(kernel: Kernel, who: str) -> int:
    """The iteration of a paused loop, which it keeps while the kernel serves cells."""
    before = loop_of(kernel, who)
    assert before["status"] == "paused", before
    time.sleep(QUIET)
    after = loop_of(kernel, who)
    assert after["iteration"] == before["iteration"], (before, after)
    counter: int = after["iteration"]
    assert len(names_of(kernel, who).get("seen", [])) == counter
    return counter


def advances(kernel: Kernel, who: str, past: int) -> None:
    wait_for(kernel, who, lambda state: state["iteration"] > past)


def test_pause_resume_stop_from_a_cell_the_harness_and_the_cli(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace)
    committed(kernel, f"agents.add('walker')\nagents.loop('walker', {STEP!r}, every_ms=10)")
    advances(kernel, "walker", 0)

    # From a cell.
    committed(kernel, "agents.pause('walker')")
    at = holds_still(kernel, "walker")
    committed(kernel, "agents.resume('walker')")
    advances(kernel, "walker", at)

    # From the harness.
    with KernosClient.connect(workspace) as client:
        paused = client.request("loop", do="pause", agent="walker")
        assert paused["loop"]["status"] == "paused" and paused["op"] is not None
        at = holds_still(kernel, "walker")
        [listed] = client.request("loop", do="status")["loops"]
        assert (listed["agent"], listed["status"], listed["iteration"]) == (
            "walker", "paused", at)
        assert client.request("loop", do="resume", agent="walker")["loop"]["status"] == \
            "running"
        advances(kernel, "walker", at)

    # From the CLI, through the running kernel (its kernel.json).
    paused_doc = as_json(cli("agent", "pause", "walker", "-w", str(workspace), "--json"), 0)
    assert paused_doc["loop"]["status"] == "paused"
    at = holds_still(kernel, "walker")
    listed_doc = as_json(cli("agent", "loops", "-w", str(workspace), "--json"), 0)
    assert [(entry["agent"], entry["status"]) for entry in listed_doc["loops"]] == [
        ("walker", "paused")]
    as_json(cli("agent", "resume", "walker", "-w", str(workspace), "--json"), 0)
    advances(kernel, "walker", at)
    stopped_doc = as_json(cli("agent", "stop", "walker", "--reason", "enough",
                              "-w", str(workspace), "--json"), 0)
    assert (stopped_doc["loop"]["status"], stopped_doc["loop"]["reason"]) == (
        "stopped", "enough")
    final = loop_of(kernel, "walker")
    assert final["status"] == "stopped"
    assert names_of(kernel, "walker")["seen"] == list(range(final["iteration"]))

    # Refusals through the harness and the CLI: clear, and nothing changes.
    with KernosClient.connect(workspace) as client:
        from kernos.client.errors import RequestError

        with pytest.raises(RequestError) as refused:
            client.request("loop", do="resume", agent="walker")
        assert refused.value.kind == "invalid" and "final" in refused.value.message
    unknown = as_json(cli("agent", "pause", "nobody", "-w", str(workspace), "--json"), 2)
    assert unknown["error"]["kind"] == "unknown_principal"
    assert loop_of(kernel, "walker") == final


def test_a_started_loop_follows_to_its_end_from_the_cli(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    as_json(cli("run", "-w", str(workspace), "--json", "agents.add('cli')"), 0)
    run = cli("agent", "loop", "cli", "-w", str(workspace), "-c", STEP, "--max", "4",
              "--follow", "--json")
    assert run.returncode == 0, run.stderr
    lines: list[dict[str, Any]] = [__import__("json").loads(line)
                                   for line in run.stdout.splitlines()]
    assert lines[0]["loop"]["status"] == "running"
    assert [line["iteration"] for line in lines[1:]] == [0, 1, 2, 3]
    assert lines[-1]["status"] == "finished"
    shown = as_json(cli("agent", "loops", "-w", str(workspace), "--json"), 0)
    assert shown["loops"][0]["iteration"] == 4
    bad = cli("agent", "loop", "cli", "-w", str(workspace), "-c", "import os")
    assert bad.returncode == 2 and "refused before it ran" in bad.stderr
    # No kernel runs: the loop started by a kernel that the command shuts down waits for
    # the next one, which --follow starts (and keeps until the loop ends).
    waiting = cli("agent", "loop", "cli", "-w", str(workspace), "-c", "x = 1", "--max", "2")
    assert waiting.returncode == 0 and "waits for the next one" in waiting.stderr
    followed = cli("agent", "loop", "cli", "-w", str(workspace), "--follow")
    assert followed.returncode == 0, followed.stderr
    # (the kernel may finish the loop before the command asks about it: either way, the end)
    assert re.fullmatch(r"cli: iteration 1 committed \(op \d+\); the loop is finished|"
                        r"cli: the loop is finished at iteration 2 \(max_iterations=2 "
                        r"reached\)", followed.stdout.splitlines()[-1]), followed.stdout
    assert as_json(cli("agent", "loops", "-w", str(workspace), "--json"), 0)["loops"][0][
        "iteration"] == 2


PRINTING = "print('step', loop_state()['iteration'], 'done\\x1b[2J')\nprint('second line')"


def test_follow_prints_each_iteration_s_output_and_loops_its_last_line(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace)   # the commands below use it: one kernel's memory
    committed(kernel, "agents.add('talker')")
    run = cli("agent", "loop", "talker", "-w", str(workspace), "-c", PRINTING, "--max", "3",
              "--follow")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    starts = [index for index, line in enumerate(lines) if " committed (op " in line]
    assert len(starts) == 3, run.stdout
    for iteration, index in enumerate(starts):
        # under each iteration, what it printed; the escape reaches the terminal as text
        assert lines[index + 1:index + 3] == [f"  | step {iteration} done\\x1b[2J",
                                              "  | second line"], run.stdout
    assert "\x1b" not in run.stdout
    listed = cli("agent", "loops", "-w", str(workspace))
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[-2:] == ["last", "output"] and row.endswith("second line"), listed
    # A new kernel holds no outputs (they are never written down): the JSON says null.
    kernel.stop()
    shown = as_json(cli("agent", "loops", "-w", str(workspace), "--json"), 0)
    assert shown["loops"][0]["output"] is None and shown["loops"][0]["iteration"] == 3


def test_a_restarted_kernel_resumes_a_running_loop_and_not_a_paused_one(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace)
    committed(kernel, f"agents.add('on')\nagents.add('off')\n"
                      f"agents.loop('on', {STEP!r}, every_ms=20, max_iterations=1000)\n"
                      f"agents.loop('off', {STEP!r}, every_ms=20)")
    advances(kernel, "off", 0)
    committed(kernel, "agents.pause('off')")
    kernel.stop()
    kernel = kernel_factory(workspace)
    at = loop_of(kernel, "on")["iteration"]
    advances(kernel, "on", at)
    holds_still(kernel, "off")


def test_an_open_circuit_parks_the_loop_until_the_human_resets_it(kernel: Kernel,
                                                                  tmp_path: Path) -> None:
    from tests.integration.test_loop import loop_records

    committed(kernel, f"agents.add('runaway')\nagents.policy('runaway', iterations=3)\n"
                      f"agents.loop('runaway', {STEP!r}, max_iterations=6)")
    workspace = tmp_path / "workspace"

    def refused() -> list[dict[str, Any]]:
        return [record for record in loop_records(workspace) if record["status"] == "refused"]

    deadline = time.monotonic() + 120
    while not refused():
        assert time.monotonic() < deadline, "the policy never refused an iteration"
        time.sleep(0.05)
    time.sleep(QUIET)  # parked: no op is tried while the circuit stays open
    assert len(refused()) == 1, refused()
    # The trip was announced at once, in an op of the supervisor's, with no cell or request.
    chain = (workspace / "audit" / "chain.jsonl").read_text(encoding="utf-8").splitlines()
    announced = [record for record in map(json.loads, chain) if record.get("type") == "op"
                 and record.get("kind") == "supervisor" and record.get("status") == "committed"]
    assert len(announced) == 1, announced
    state = loop_of(kernel, "runaway")
    assert (state["status"], state["iteration"]) == ("running", 3)
    assert kernel.value("agents.circuit('runaway')['policy']") == "iterations"
    committed(kernel, "agents.reset('runaway')")
    finished = wait_for(kernel, "runaway", lambda s: s["status"] == "finished")
    assert finished["iteration"] == 6
    assert names_of(kernel, "runaway")["seen"] == list(range(6))


def test_a_kernel_shut_down_while_a_loop_turns_exits_cleanly_and_the_next_resumes_it(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    from support import raw_kernel

    workspace = tmp_path / "ws"
    with raw_kernel(tmp_path, {"KERNOS_WORKSPACE": str(workspace)}) as (process, client):
        start = (f"agents.add('busy')\n"
                 f"agents.loop('busy', {STEP!r}, every_ms=0, max_iterations=100000)")
        reply = client.execute(start, reply=True, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        deadline = time.monotonic() + 120
        while iteration_of(client) < 20:  # running, one iteration after another
            assert time.monotonic() < deadline, "the loop never turned"
            time.sleep(0.05)
        client.shutdown()
        stderr = process.communicate(timeout=60)[1]
    assert process.returncode == 0, (process.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    kernel = kernel_factory(workspace)
    state = loop_of(kernel, "busy")
    assert state["status"] == "running" and state["iteration"] > 0
    assert names_of(kernel, "busy")["seen"][:state["iteration"]] == list(
        range(state["iteration"]))
    advances(kernel, "busy", state["iteration"])
    committed(kernel, "agents.stop('busy')")
    final = loop_of(kernel, "busy")
    assert names_of(kernel, "busy")["seen"] == list(range(final["iteration"]))


def iteration_of(client: Any) -> int:
    """The first loop's iteration, through a raw kernel client."""
    printed: list[str] = []

    def collect(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])

    reply = client.execute_interactive("print(agents.loops()[0]['iteration'])",
                                       output_hook=collect, timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    return int("".join(printed).strip())
