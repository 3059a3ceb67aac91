"""Exactly-once external effects through real kernels, with kill -9 at each fault point.

The ``pay`` tool appends one line per real execution to a ledger file this
test owns (outside the kernel and its workspace).  A kernel started with
``KERNOS_CRASH_AT`` kills itself with SIGKILL at that point; a new kernel on
the same workspace recovers as it starts.  Then: every effect key is in the
ledger at most once, every effect of a committed op is recorded (done) or
flagged in-doubt, the image agrees with its history and audit log, and
``kernos audit verify`` passes.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kernos.audit.verify import verify
from kernos.client import KernosClient
from support import assert_workspace_sound

pytestmark = pytest.mark.kernel

SETUP = '''
import json, os
LEDGER = {ledger!r}
def pay(amount, to, idempotency_key):
    with open(LEDGER, "a") as f:
        f.write(json.dumps({{"key": idempotency_key, "amount": amount}}) + "\\n")
        f.flush()
        os.fsync(f.fileno())
    return {{"receipt": idempotency_key[-8:]}}
def find_payment(idempotency_key):
    if not os.path.exists(LEDGER):
        return False, None
    for line in open(LEDGER):
        if json.loads(line)["key"] == idempotency_key:
            return True, {{"receipt": idempotency_key[-8:]}}
    return False, None
agents.register_tool("pay", pay, description="pays", effect="external", resolve={resolve},
                     schema={{"type": "object", "properties": {{"amount": {{"type": "integer"}},
                              "to": {{"type": "string"}}}}, "required": ["amount", "to"]}})
before = "set up"
'''

PAY = "ticket = agents.call('pay', amount=5, to='bob')\nstate = 'paid'"
NEXT = "after = 'the next op'"

# point -> (did the paying op commit?, what the effect ends as after recovery)
WITH_RESOLVER = {
    "sealed": (False, None),             # during the paying op's commit: nothing queued
    "effect.before": (True, "done"),     # never started: executed on recovery
    "effect.started": (True, "done"),    # in doubt; the resolver finds no payment: executed
    "effect.executed": (True, "done"),   # in doubt; the resolver finds it: not executed again
    "effect.journaled": (True, "done"),  # done in the journal: recorded on recovery
    "effect.record": (True, "done"),     # the follow-up op begun, not committed
    "sealed@2": (True, "done"),          # during the follow-up op's commit
    "serialize@3": (True, "done"),       # during the next op
}
WITHOUT_RESOLVER = {
    "effect.started": "in-doubt",
    "effect.executed": "in-doubt",
    "effect.journaled": "done",
}


def ledger_keys(ledger: Path) -> list[str]:
    if not ledger.exists():
        return []
    return [json.loads(line)["key"] for line in ledger.read_text().splitlines()]


def wait_for_death(kernel: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while kernel.manager.is_alive():
        assert time.monotonic() < deadline, "the kernel did not die at its crash point"
        time.sleep(0.05)


def crash_and_recover(kernel_factory: Any, tmp_path: Path, point: str,
                      *, resolve: bool) -> tuple[Any, Path, int]:
    workspace, ledger = tmp_path / "ws", tmp_path / "ledger.jsonl"
    first = kernel_factory(workspace)
    setup = first.run(SETUP.format(ledger=str(ledger),
                                   resolve="find_payment" if resolve else "None"))
    assert setup.committed, setup.errors
    first.stop()
    head = setup.kernos["op"]

    doomed = kernel_factory(workspace, env={"KERNOS_CRASH_AT": point})
    doomed.client.execute(PAY)
    doomed.client.execute(NEXT)
    wait_for_death(doomed)
    assert doomed.manager.provisioner.process.returncode == -signal.SIGKILL
    doomed.client.stop_channels()
    return kernel_factory(workspace), ledger, head


def check_consistent(survivor: Any) -> None:
    """The image, its history and its audit log agree, and both verify."""
    survivor.stop()
    assert_workspace_sound(survivor.workspace)
    report = verify(survivor.workspace)
    assert report.ok, report.problems


@pytest.mark.parametrize("point", sorted(WITH_RESOLVER))
def test_each_effect_happens_at_most_once_whatever_the_crash(
        kernel_factory: Any, tmp_path: Path, point: str) -> None:
    survivor, ledger, setup_op = crash_and_recover(kernel_factory, tmp_path, point, resolve=True)
    paid, expected = WITH_RESOLVER[point]
    effects = survivor.value("agents.effects()")
    assert survivor.value("before") == "set up"
    assert survivor.value("'state' in dir()") is paid
    assert survivor.value("'after' in dir()") is False  # the next op never committed
    if not paid:
        assert effects == [] and ledger_keys(ledger) == []
    else:
        [effect] = effects
        assert effect["op"] == setup_op + 1
        assert effect["status"] == expected, effect
        assert ledger_keys(ledger) == [effect["key"]]  # exactly once, with its own key
        assert effect["result"] == {"receipt": effect["key"][-8:]}
        assert survivor.value("ticket['effect']") == effect["key"]
    # The survivor goes on: a new effect runs once too, and nothing old runs again.
    again = survivor.run(PAY)
    assert again.committed, again.errors
    assert max(Counter(ledger_keys(ledger)).values()) == 1
    assert len(ledger_keys(ledger)) == (2 if paid else 1)
    check_consistent(survivor)


@pytest.mark.parametrize("point", sorted(WITHOUT_RESOLVER))
def test_without_a_resolver_an_interrupted_effect_is_flagged_in_doubt(
        kernel_factory: Any, tmp_path: Path, point: str) -> None:
    survivor, ledger, _ = crash_and_recover(kernel_factory, tmp_path, point, resolve=False)
    [effect] = survivor.value("agents.effects()")
    assert effect["status"] == WITHOUT_RESOLVER[point], effect
    executed = point != "effect.started"
    assert ledger_keys(ledger) == ([effect["key"]] if executed else [])
    if effect["status"] == "in-doubt":
        # A person checks the ledger by the key and answers; nothing runs twice.
        answer = survivor.run(f"agents.resolve_effect({effect['key']!r}, executed={executed})")
        assert answer.committed, answer.errors
        [effect] = survivor.value("agents.effects()")
        assert effect["status"] == "done"
        assert ledger_keys(ledger) == [effect["key"]]
    check_consistent(survivor)


def test_a_thousand_duplicated_deliveries_execute_each_effect_once(tmp_path: Path) -> None:
    """Ops re-sent with their idempotency keys (a client retrying) never pay twice."""
    workspace, ledger = tmp_path / "ws", tmp_path / "ledger.jsonl"
    with KernosClient.start(workspace) as client:
        setup = client.op(SETUP.format(ledger=str(ledger), resolve="find_payment"))
        assert setup.status == "committed", setup.error
        ops = 10
        deliveries: Counter[str] = Counter()
        for delivery in range(1000):
            number = delivery % ops
            result = client.op(f"agents.call('pay', amount={number}, to='bob')",
                               key=f"pay-{number}")
            assert result.status == "committed", result.error
            deliveries["duplicate" if result.duplicate else "committed"] += 1
        assert deliveries == {"committed": ops, "duplicate": 1000 - ops}
        client.manager.kill()  # and a restart in the middle of it all
        client.manager.restart()
        for number in range(ops):
            assert client.op(f"agents.call('pay', amount={number}, to='bob')",
                             key=f"pay-{number}").duplicate
        effects = client.op("[e['status'] for e in agents.effects()]").value
    keys = ledger_keys(ledger)
    assert len(keys) == ops and len(set(keys)) == ops  # zero double executions
    assert effects is not None and effects.json == ["done"] * ops


HANG = '''
import time
def hang(idempotency_key):
    time.sleep(600)
agents.register_tool("hang", hang, description="never answers", effect="external",
                     timeout=1, schema={"type": "object", "properties": {}})
'''


def test_a_hanging_effect_leaves_the_kernel_free_and_the_effect_in_doubt(
        kernel_factory: Any, tmp_path: Path) -> None:
    """A cell whose effect never returns: after the tool's 1 s timeout the effect is in
    doubt and the same kernel runs the next cell; a restart leaves it in doubt."""
    kernel = kernel_factory(tmp_path / "ws")
    assert kernel.run(HANG).committed
    started = time.monotonic()
    assert kernel.run("ticket = agents.call('hang')").committed
    assert kernel.run("after = 1").committed  # the kernel is not stuck in the effect
    assert time.monotonic() - started < 30
    [effect] = kernel.value("agents.effects()")
    assert effect["status"] == "in-doubt" and "1 s timeout" in effect["error"]
    kernel.stop()
    survivor = kernel_factory(tmp_path / "ws")
    [effect] = survivor.value("agents.effects()")
    assert effect["status"] == "in-doubt"  # never run again after the restart
    check_consistent(survivor)
