"""Agents' loops through a real kernel (kernos.agents.loop, kernos.kernel.loops).

* ``kill -9`` of the kernel at random points of a running loop, several times,
  and at named crash points of an iteration's commit: once the loop finishes
  in the last kernel, the agent's list is exactly ``range(N)`` and the audit
  has one committed record per iteration (a committed iteration never runs
  again, an uncommitted one always does);
* the loop never holds the op lock between iterations: cells complete while a
  loop with ``every_ms=0`` turns, and the loop advances between them;
* a failing step does not advance and is retried, until it passes;
* bad input (an unknown agent, a step that does not compile, agent code
  reaching for the controls) is refused clearly and changes nothing.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.agents_support import agent, committed, error_text, fails, names_of

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

WORKTREE = Path(__file__).resolve().parents[2]
STEP = ("if loop_state()['iteration'] == 0:\n    seen = []\n"
        "seen.append(loop_state()['iteration'])\n")
WAIT = 120.0
"""A safety bound on waiting for a loop (not a speed assertion): a stuck loop fails."""


def loop_of(kernel: Kernel, who: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = kernel.value("agents.loops()")
    return next(entry for entry in found if entry["agent"] == who)


def wait_for(kernel: Kernel, who: str, done: Callable[[dict[str, Any]], bool]
             ) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while True:
        state = loop_of(kernel, who)
        if done(state):
            return state
        assert time.monotonic() < deadline, f"the loop of {who!r} is stuck at {state}"
        time.sleep(0.05)


def loop_records(workspace: Path) -> list[dict[str, Any]]:
    """The audit's op records that name a loop, without the voided ones, oldest first."""
    lines = (workspace / "audit" / "chain.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    voided = {record["voids"] for record in records if record.get("type") == "void"}
    return [record for record in records if record.get("type") == "op" and "loop" in record
            and record["index"] not in voided]


def consistent(kernel: Kernel, who: str) -> tuple[int, int]:
    """The loop's counter and the length of the list its step appends to, in one op."""
    pair: tuple[int, int] = kernel.value(
        f"(lambda s, ns: (s['iteration'], len(ns.get('seen', []))))"
        f"(next(l for l in agents.loops() if l['agent'] == {who!r}), agents.namespace({who!r}))")
    return pair


def test_kill9_mid_loop_resumes_at_the_first_uncommitted_iteration(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    total = 400
    chance = random.Random(20)
    kernel: Kernel | None = kernel_factory(workspace)
    assert kernel is not None
    assert kernel.value("__import__('kernos').__file__").startswith(str(WORKTREE))
    committed(kernel, f"agents.add('counter')\n"
                      f"agents.loop('counter', {STEP!r}, every_ms=2, max_iterations={total})")
    killed_at = []
    # Random instants of a running loop; and named points of an iteration's commit, in a
    # kernel that runs no cell (so the point is reached in an iteration's op): its audit
    # record written and nothing synced (sealed), its record synced and its frame not (frame).
    # Each op of those kernels is an iteration: any count of commits lands in one, odd or even
    # (were the counter advanced in an op of its own, an even count would land there).
    for crash in (None, None, "sealed@8", None, "frame@6", "sealed@5", None):
        if crash is not None:
            die_at(kernel_factory, workspace, crash)
            continue
        if kernel is None:
            kernel = kernel_factory(workspace)
            counter, length = consistent(kernel, "counter")
            assert counter == length, (killed_at, counter, length)
        seen_before = loop_of(kernel, "counter")["iteration"]
        assert seen_before < total, "the loop finished before the kills were done"
        wait_for(kernel, "counter", lambda s, at=seen_before: s["iteration"] > at)
        time.sleep(chance.uniform(0.0, 0.4))
        kernel.kill9()
        killed_at.append(seen_before)
        kernel = None
    kernel = kernel_factory(workspace)
    counter, length = consistent(kernel, "counter")
    assert counter == length, (killed_at, counter, length)
    finished = wait_for(kernel, "counter", lambda s: s["status"] == "finished")
    assert finished["iteration"] == total
    assert names_of(kernel, "counter")["seen"] == list(range(total))
    iterations = [record["loop"]["iteration"] for record in loop_records(workspace)
                  if record["status"] == "committed"]
    assert sorted(iterations) == list(range(total)), "an iteration committed twice or never"
    assert all(record["loop"]["agent"] == "counter" and record["kind"] == "loop"
               and record["principal"] == "counter" for record in loop_records(workspace))


def die_at(kernel_factory: Callable[..., Kernel], workspace: Path, point: str) -> None:
    """Start a kernel that kills itself at ``point`` (KERNOS_CRASH_AT), and see it die.

    It may die before it answers ``kernel_info``: its loop starts as soon as its
    image is restored, and no cell of the test runs in it.
    """
    try:
        doomed = kernel_factory(workspace, env={"KERNOS_CRASH_AT": point})
    except RuntimeError as error:
        assert "died" in str(error), error
        return
    deadline = time.monotonic() + WAIT
    while doomed.manager.is_alive():
        assert time.monotonic() < deadline, f"{point} was never reached"
        time.sleep(0.05)
    doomed.client.stop_channels()


def test_cells_run_between_iterations_of_a_loop_that_never_waits(kernel: Kernel) -> None:
    committed(kernel, f"agents.add('busy')\nagents.loop('busy', {STEP!r}, every_ms=0)")
    seen = []
    for number in range(8):
        result = committed(kernel, f"cells = {number}\nprint(agents.loops()[0]['iteration'])")
        seen.append(int(result.stdout.strip()))
    assert kernel.value("cells") == 7
    assert seen[-1] > seen[0], f"the loop did not turn between the cells: {seen}"
    committed(kernel, "agents.stop('busy')")
    stopped = loop_of(kernel, "busy")
    assert stopped["status"] == "stopped"
    counter, length = consistent(kernel, "busy")
    assert counter == length == stopped["iteration"]


def test_a_failing_step_does_not_advance_and_is_retried(kernel: Kernel,
                                                        tmp_path: Path) -> None:
    committed(kernel, "flags = {'fail': True}\nagents.add('flaky')\n"
                      "agents.grant('flaky', 'read:flags')")
    step = STEP + ("if loop_state()['iteration'] == 2 and read('flags')['fail']:\n"
                   "    raise ValueError('not yet')\n")
    committed(kernel, f"agents.loop('flaky', {step!r}, max_iterations=5)")
    workspace = tmp_path / "workspace"

    def failures() -> list[dict[str, Any]]:
        return [record for record in loop_records(workspace) if record["status"] != "committed"]

    deadline = time.monotonic() + WAIT
    while len(failures()) < 3:
        assert time.monotonic() < deadline, "the failing iteration was not retried"
        time.sleep(0.05)
    assert loop_of(kernel, "flaky")["iteration"] == 2
    assert names_of(kernel, "flaky")["seen"] == [0, 1]
    assert {record["loop"]["iteration"] for record in failures()} == {2}
    assert all("not yet" in record["error"]["message"] for record in failures())
    committed(kernel, "flags['fail'] = False")
    wait_for(kernel, "flaky", lambda s: s["status"] == "finished")
    assert names_of(kernel, "flaky")["seen"] == [0, 1, 2, 3, 4]
    done = [record["loop"]["iteration"] for record in loop_records(workspace)
            if record["status"] == "committed"]
    assert done == [0, 1, 2, 3, 4]


def test_bad_input_is_refused_clearly_and_the_image_is_unchanged(kernel: Kernel) -> None:
    committed(kernel, f"agents.add('solo')\nagents.loop('solo', {STEP!r}, max_iterations=3)")
    wait_for(kernel, "solo", lambda s: s["status"] == "finished")
    before = kernel.value("agents.loops()"), names_of(kernel, "solo")
    fails(kernel, "agents.loop('nobody', 'pass')", "UnknownAgent", "There is no agent 'nobody'")
    fails(kernel, "agents.loop('solo', 'def (')", "AgentCodeRejected", "solo")
    fails(kernel, "agents.loop('solo', 'pass', every_ms=-5)", "UsageError", "every_ms")
    fails(kernel, "agents.pause('solo')", "UsageError", "finished (final)")
    # Agent code has no handle on the controls, and the loop builtins refuse outside a step.
    fails(kernel, agent("solo", "agents.stop('solo')"), "NameError", "agents")
    result = fails(kernel, agent("solo", "loop_finish('from a cell')"), "UsageError",
                   "only in the step of your own loop")
    assert "Traceback" not in error_text(result)
    assert (kernel.value("agents.loops()"), names_of(kernel, "solo")) == before


def test_an_iterations_external_effect_runs_once_after_it_commits(kernel: Kernel,
                                                                   tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    committed(kernel, f"""
def pay(amount, idempotency_key):
    with open({str(ledger)!r}, "a") as out:
        out.write(idempotency_key + "\\n")
    return {{"paid": amount}}
agents.register_tool("pay", pay, description="pays", effect="external", schema={{
    "type": "object", "properties": {{"amount": {{"type": "integer"}}}},
    "required": ["amount"]}})
agents.add("payer")
agents.grant("payer", "call:pay")
agents.loop("payer", "call('pay', amount=loop_state()['iteration'])", max_iterations=3)
""")
    # No cell runs meanwhile (a cell would run queued effects too): the driver runs them.
    deadline = time.monotonic() + WAIT
    while len(ledger.read_text().split() if ledger.exists() else []) < 3:
        assert time.monotonic() < deadline, "the iterations' effects did not run"
        time.sleep(0.05)
    assert wait_for(kernel, "payer", lambda s: s["status"] == "finished")["iteration"] == 3
    assert len(kernel.value("agents.effects('done')")) == 3
    keys = ledger.read_text().split()
    assert len(keys) == 3 and len(set(keys)) == 3, keys
