"""The loop's core (kernos.agents.loop), in process: one op per iteration whose counter
commits with the step or not at all, builtins that exist only in the step, the human's
controls, and refusals that name what was wrong and change nothing."""

from __future__ import annotations

from typing import Any

import pytest

from kernos.agents import loop
from kernos.errors import (
    AgentCodeRejected,
    CapabilityDenied,
    CircuitOpen,
    OpVetoed,
    UnknownAgent,
    UsageError,
)

APPEND = ("if loop_state()['iteration'] == 0:\n    seen = []\n"
          "seen.append(loop_state()['iteration'])\n")


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
        env.agents.add("bob")
    return env


def start(env, step: str = APPEND, agent: str = "alice", **options: Any) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    with env.op():
        return env.agents.loop(agent, step, **options)


def turns(env, n: int, agent: str = "alice") -> list[loop.Turn]:  # type: ignore[no-untyped-def]
    return [loop.run_once(env.runtime, agent) for _ in range(n)]


def records(env) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    return [r for r in env.image.audit.records() if r["type"] == "op" and "loop" in r]


def test_each_iteration_is_one_op_that_advances_the_counter_and_survives_a_reopen(env) -> None:  # type: ignore[no-untyped-def]
    start(env, max_iterations=3)
    done = turns(env, 3)
    assert [t.outcome for t in done] == ["committed"] * 3
    assert [t.result.iteration for t in done if t.result] == [0, 1, 2]
    assert env.ns_of("alice")["seen"] == [0, 1, 2]
    [described] = env.agents.loops()
    assert described["status"] == "finished" and described["iteration"] == 3
    assert described["reason"] == "max_iterations=3 reached"
    assert described["last_op"] == done[-1].op
    committed = [r for r in records(env) if r["status"] == "committed"]
    assert [(r["loop"], r["kind"], r["principal"]) for r in committed] == [
        ({"agent": "alice", "iteration": i}, "loop", "alice") for i in range(3)]
    topics = [(e["topic"], e["principal"])
              for t in done for e in t.report.events]  # type: ignore[union-attr]
    # The runtime reports the iteration, attributed to whom it is about (alice holds no
    # emit grant).
    assert topics == [(loop.ITERATION_TOPIC, "alice")] * 3
    env.reopen()
    assert env.agents.loops()[0]["iteration"] == 3
    assert env.ns_of("alice")["seen"] == [0, 1, 2]
    with env.op(), pytest.raises(UsageError, match="finished"):
        loop.iterate(env.runtime, "alice")


def test_the_human_sees_what_the_last_iteration_printed(env) -> None:  # type: ignore[no-untyped-def]
    start(env, APPEND + "print('turn', loop_state()['iteration'])\n")
    assert env.agents.loops()[0]["output"] is None
    turns(env, 2)
    [described] = env.agents.loops()
    assert described["output"]["text"] == "turn 1\n" and described["output"]["iteration"] == 1
    env.reopen()  # held in the kernel's memory only, never in the image
    assert env.agents.loops()[0]["output"] is None


def test_a_failing_step_does_not_advance_and_runs_again(env) -> None:  # type: ignore[no-untyped-def]
    step = APPEND + ("if loop_state()['iteration'] == 1 and read('flags')['fail']:\n"
                     "    raise ValueError('flaky')\n")
    env.cell("flags = {'fail': True}")
    with env.op():
        env.agents.grant("alice", "read:flags")
    start(env, step)
    first, failed = turns(env, 2)
    env.cell("flags['fail'] = False")
    [again] = turns(env, 1)
    assert first.committed and not failed.committed and again.committed
    assert isinstance(failed.error, ValueError) and failed.outcome == "failed"
    assert env.ns_of("alice")["seen"] == [0, 1]  # the failed append rolled back with the counter
    assert env.agents.loops()[0]["iteration"] == 2
    tried = [(r["loop"]["iteration"], r["status"]) for r in records(env)]
    assert tried == [(0, "committed"), (1, "failed"), (1, "committed")]


def test_loop_update_and_finish_apply_when_the_step_returns(env) -> None:  # type: ignore[no-untyped-def]
    step = ("s = loop_state()\n"
            "work = list(s['pending'])\n"
            "done = work.pop(0)\n"
            "loop_update(pending=work, notes={'last': done}, plan='go on')\n"
            "if not work:\n    loop_finish('queue empty')\n")
    start(env, step, plan="start", pending=["a", "b"])
    a, b = turns(env, 2)
    assert a.result.status == "running" and b.result.status == "finished"  # type: ignore[union-attr]
    state = loop.state_of(env.image, "alice")
    assert state is not None
    assert (state.pending, state.notes, state.plan, state.reason) == (
        [], {"last": "b"}, "go on", "queue empty")


def test_a_vetoed_iteration_leaves_the_loop_as_it_was(env) -> None:  # type: ignore[no-untyped-def]
    # The step catches its denial: the op is vetoed at commit all the same.
    step = ("loop_update(plan='changed')\n"
            "try:\n    read('secret')\nexcept Exception:\n    pass\n")
    start(env, step, plan="original")
    turn = loop.run_once(env.runtime, "alice")
    assert turn.outcome == "denied" and isinstance(turn.error, OpVetoed)
    state = loop.state_of(env.image, "alice")
    assert state is not None and (state.iteration, state.plan) == (0, "original")


def test_the_builtins_exist_only_in_the_step_of_ones_own_loop(env) -> None:  # type: ignore[no-untyped-def]
    start(env, "pass")
    for call in ("loop_state()", "loop_update(plan=1)", "loop_finish('x')"):
        op = env.image.begin(source=call)
        with pytest.raises(UsageError, match="only in the step of your own loop"):
            env.runtime.run("alice", call)
        with pytest.raises(OpVetoed):  # a refused call vetoes the op, caught or not
            op.commit()
    # bob's code in alice's loop op (an event handler, say) sees nothing of it
    with env.op():
        loop.start(env.runtime, "bob", "pass")
    state = loop.state_of(env.image, "alice")
    assert state is not None and state.iteration == 0


def test_loop_state_is_a_copy_of_plain_data(env) -> None:  # type: ignore[no-untyped-def]
    step = ("s = loop_state()\ns['pending'].append('mine')\ns['iteration'] = 99\n"
            "kept = (s, loop_state())\n")
    start(env, step, pending=[1])
    assert loop.run_once(env.runtime, "alice").committed
    mine, fresh = env.ns_of("alice")["kept"]
    assert fresh == {"iteration": 0, "plan": None, "pending": [1], "notes": None}
    assert loop.state_of(env.image, "alice").pending == [1]  # type: ignore[union-attr]
    assert mine["pending"] == [1, "mine"]


def test_non_plain_updates_are_refused_and_veto(env) -> None:  # type: ignore[no-untyped-def]
    start(env, "class C:\n    pass\nloop_update(plan=C())\n")
    turn = loop.run_once(env.runtime, "alice")
    assert not turn.committed
    assert "cannot pass" in str(turn.error) or "denied" in turn.outcome
    assert loop.state_of(env.image, "alice").plan is None  # type: ignore[union-attr]


def test_pause_resume_stop(env) -> None:  # type: ignore[no-untyped-def]
    start(env)
    with env.op():
        assert env.agents.pause("alice")["status"] == "paused"
    assert loop.running(env.image) == []
    with env.op(), pytest.raises(UsageError, match="paused"):
        loop.iterate(env.runtime, "alice")
    with env.op():
        assert env.agents.resume("alice")["status"] == "running"
        assert env.agents.resume("alice")["status"] == "running"  # already: no change
    assert [s.agent for s in loop.running(env.image)] == ["alice"]
    with env.op():
        stopped = env.agents.stop("alice", reason="enough")
    assert (stopped["status"], stopped["reason"]) == ("stopped", "enough")
    with env.op(), pytest.raises(UsageError, match="final"):
        env.agents.resume("alice")
    start(env, "pass")  # a final loop may be replaced
    assert env.agents.loops()[0]["iteration"] == 0


def test_a_status_change_rolls_back_with_its_op(env) -> None:  # type: ignore[no-untyped-def]
    start(env)
    op = env.image.begin(source="pause")
    env.agents.pause("alice")
    op.abort()
    assert env.agents.loops()[0]["status"] == "running"


@pytest.mark.parametrize(("call", "error", "fragment"), [
    (lambda a: a.loop("nobody", "pass"), UnknownAgent, "There is no agent 'nobody'"),
    (lambda a: a.loop("human", "pass"), UsageError, "the human has no loop"),
    (lambda a: a.loop("alice", "def ("), AgentCodeRejected, "alice"),
    (lambda a: a.loop("alice", "import os"), AgentCodeRejected, "alice"),
    (lambda a: a.loop("alice", ""), UsageError, "non-empty"),
    (lambda a: a.loop("alice", 42), UsageError, "not 42"),
    (lambda a: a.loop("alice", "pass", every_ms=-1), UsageError, "every_ms"),
    (lambda a: a.loop("alice", "pass", every_ms=True), UsageError, "every_ms"),
    (lambda a: a.loop("alice", "pass", max_iterations=0), UsageError, "max_iterations"),
    (lambda a: a.loop("alice", "pass", plan=object()), UsageError, "plain data"),
    (lambda a: a.loop("alice", "pass", pending="abc"), UsageError, "pending"),
    (lambda a: a.pause("bob"), UsageError, "has no loop to pause"),
    (lambda a: a.stop("nobody"), UnknownAgent, "nobody"),
])
def test_bad_input_is_refused_clearly_and_changes_nothing(env, call, error, fragment) -> None:  # type: ignore[no-untyped-def]
    before = dict(env.image.system)
    op = env.image.begin(source="bad")
    with pytest.raises(error, match=fragment):
        call(env.agents)
    op.abort()
    assert dict(env.image.system).keys() == before.keys()
    assert env.agents.loops() == []


def test_a_second_loop_of_a_running_agent_is_refused(env) -> None:  # type: ignore[no-untyped-def]
    start(env)
    with env.op(), pytest.raises(UsageError, match="already has a running loop"):
        env.agents.loop("alice", "pass")


def test_agent_code_cannot_start_or_steer_loops(env) -> None:  # type: ignore[no-untyped-def]
    start(env)
    from kernos.agents import context
    from kernos.agents.context import BoundedOutput, RunContext

    op = env.image.begin(source="as alice")
    ctx = RunContext(runtime=env.runtime, principal="alice", op=op, limits=env.limits,
                     output=BoundedOutput(100))
    token = context.enter(ctx)
    try:
        with pytest.raises(CapabilityDenied, match="only the human"):
            loop.set_status(env.runtime, "alice", "stopped")
        with pytest.raises(CapabilityDenied, match="only the human"):
            loop.start(env.runtime, "bob", "pass")
    finally:
        context.leave(token)
    op.abort()
    assert env.agents.loops()[0]["status"] == "running"


def test_an_open_circuit_trips_the_turn_and_nothing_runs(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.policy("alice", iterations=2)
    start(env)
    done = turns(env, 3)
    assert [t.outcome for t in done] == ["committed", "committed", "tripped"]
    assert isinstance(done[2].error, CircuitOpen)
    assert env.ns_of("alice")["seen"] == [0, 1]
    with env.op():
        env.agents.reset("alice")
    assert loop.run_once(env.runtime, "alice").committed
    assert env.ns_of("alice")["seen"] == [0, 1, 2]


def test_a_step_that_keeps_failing_is_the_same_op_for_the_repeats_policy(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.policy("alice", repeats=2)
    start(env, "x = loop_state()['iteration']\nif x >= 1:\n    raise ValueError(x)\n")
    done = turns(env, 5)
    # iteration 0 commits; iteration 1 fails twice with the same state, the third is refused
    assert [t.outcome for t in done[:4]] == ["committed", "failed", "failed",
                                             "tripped"]
