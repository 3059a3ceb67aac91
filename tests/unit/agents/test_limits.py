"""Limits: the deadline and recursion bounds, and how a breach vetoes the op.

The watchdog's hard deadline and memory cap kill the *process* (here: pytest), so
every Supervisor in this file gets a hard deadline far beyond the test's run.
"""

from __future__ import annotations

import sys
import time

import pytest

from kernos.agents.limits import (
    AGENT_FILENAME_PREFIX,
    DeadlineExceeded,
    LimitExceeded,
    Limits,
    RecursionLimitExceeded,
    Supervisor,
)
from kernos.errors import AgentCodeRejected, InvalidGrant, OpVetoed

SAFE = Limits(seconds=1, hard_seconds=600, memory_mb=4096, recursion=30)


def supervised(source: str, limits: Limits = SAFE, **names: object) -> Supervisor:
    """Run plain Python as if it were agent code (its filename is an agent's)."""
    code = compile(source, f"{AGENT_FILENAME_PREFIX}test>", "exec")
    supervisor = Supervisor(limits, describe="the test")
    supervisor.start()
    try:
        exec(code, dict(names))
    finally:
        supervisor.stop()
    return supervisor


def test_breaches_are_not_exceptions() -> None:
    for breach in (LimitExceeded, DeadlineExceeded, RecursionLimitExceeded):
        assert issubclass(breach, BaseException)
        assert not issubclass(breach, Exception)


def test_the_deadline_stops_an_endless_loop() -> None:
    trace = sys.gettrace()
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="the test ran over its 1 s deadline"):
        supervised("while True:\n    pass")
    assert 0.9 < time.monotonic() - started < 5
    assert sys.gettrace() is trace


def test_the_deadline_is_not_caught_by_except_exception() -> None:
    caught: list[object] = []
    with pytest.raises(DeadlineExceeded):
        supervised("try:\n    while True:\n        pass\nexcept Exception as e:\n"
                   "    caught.append(e)", caught=caught)
    assert caught == []


def test_recursion_is_bounded() -> None:
    with pytest.raises(RecursionLimitExceeded, match="nested calls over 30 deep"):
        supervised("def f(n):\n    return f(n + 1)\nf(0)")
    supervised("def f(n):\n    return 0 if n == 0 else f(n - 1)\nf(25)")


def host_recursion(n: int) -> int:
    return 0 if n == 0 else host_recursion(n - 1)


def test_host_frames_are_not_counted() -> None:
    supervised("x = depth(200)", depth=host_recursion)


def test_a_clean_run_leaves_no_breach() -> None:
    supervisor = supervised("total = sum(i for i in range(1000))")
    assert supervisor.breach is None


@pytest.mark.parametrize(("overrides", "words"), [
    ({"seconds": 0}, "positive int"), ({"seconds": -1}, "positive int"),
    ({"seconds": True}, "positive int"), ({"seconds": 1.5}, "positive int"),
    ({"seconds": "2"}, "positive int"), ({"seconds": 10**9 + 1}, "positive int"),
    ({"recursion": None}, "positive int"), ({"minutes": 1}, "unknown limit 'minutes'"),
])
def test_limit_overrides_are_checked(overrides: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidGrant, match=words):
        Limits().with_overrides(overrides)


def test_limit_overrides() -> None:
    limits = Limits().with_overrides({"seconds": 2, "recursion": 300})
    assert (limits.seconds, limits.recursion, limits.hard_seconds) == (2, 300, 30)
    with pytest.raises(InvalidGrant, match="recursion limit is at most 300"):
        Limits().with_overrides({"recursion": 301})
    assert Limits() == Limits(seconds=10, hard_seconds=30, memory_mb=512, recursion=100,
                              output_bytes=65536, source_bytes=65536, ast_depth=60)


# -- through the runtime ----------------------------------------------------------------


@pytest.fixture
def env(env):  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice", seconds=1, recursion=30)
    return env


def test_a_deadline_breach_vetoes_the_op(env) -> None:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    started = time.monotonic()
    with pytest.raises(OpVetoed, match="ran over its 1 s deadline") as raised:
        env.runtime.run("alice", "caught = []\ntry:\n    while True:\n        pass\n"
                                 "except Exception:\n    caught.append(1)")
    assert time.monotonic() - started < 5
    assert raised.value.op == op.id
    assert env.ns_of("alice")["caught"] == []
    assert op.vetoes
    with pytest.raises(OpVetoed):
        op.commit()
    assert "caught" not in env.ns_of("alice")


def test_a_recursion_breach_vetoes_the_op(env) -> None:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    with pytest.raises(OpVetoed, match="nested calls over 30 deep"):
        env.runtime.run("alice", "def f(n):\n    try:\n        return f(n + 1)\n"
                                 "    except Exception:\n        return -1\nx = f(0)")
    with pytest.raises(OpVetoed):
        op.commit()
    assert env.ns_of("alice") == {}
    assert env.run("alice", "def f(n):\n    return 0 if n == 0 else f(n - 1)\n"
                            "print(f(20))") == "0\n"


def test_finally_is_refused_so_nothing_runs_while_a_breach_unwinds(env) -> None:  # type: ignore[no-untyped-def]
    # A breach is raised by the trace function, which CPython then drops: a
    # finally block would run unsupervised, so the dialect has none.
    op = env.image.begin(source="")
    with pytest.raises(AgentCodeRejected, match="finally"):
        env.runtime.run("alice", "try:\n    while True:\n        pass\nfinally:\n"
                                 "    done = 1")
    op.abort()
    assert "done" not in env.ns_of("alice")


def test_a_breach_is_not_caught_by_except_exception(env) -> None:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    with pytest.raises(OpVetoed):
        env.runtime.run("alice", """
log = []
try:
    while True:
        pass
except Exception:
    log.append('caught')
    n = 0
    while n < 300000:
        n += 1
    log.append('handler finished')
""")
    assert env.ns_of("alice")["log"] == []
    op.abort()


def test_limits_are_per_agent(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("bob")
        assert env.agents.limits("bob").seconds == env.limits.seconds
        assert env.agents.limits("alice").seconds == 1
        assert env.agents.limits("bob", seconds=3, recursion=7).recursion == 7
        with pytest.raises(InvalidGrant):
            env.agents.limits("bob", seconds=0)
        with pytest.raises(InvalidGrant):
            env.agents.add("carol", seconds=-1)
    assert env.runtime.registry.principal("bob").limits == {"seconds": 3, "recursion": 7}
    assert "carol" not in env.runtime.agents()
    env.reopen()
    assert env.agents.limits("bob").seconds == 3
    assert env.agents.limits("alice").recursion == 30


def test_source_limits_apply_to_agents(env) -> None:  # type: ignore[no-untyped-def]
    from kernos.errors import AgentCodeRejected

    with env.op():
        env.agents.limits("alice", source_bytes=40, ast_depth=5)
    with pytest.raises(AgentCodeRejected, match="over the limit of 40"):
        env.run("alice", "x = 1\n" * 7)
    with pytest.raises(AgentCodeRejected, match="over the limit of 5"):
        env.run("alice", "x = ((((1 + 2) * 3) - 4) / 5)")
    assert env.run("alice", "x = 1\nprint(x)") == "1\n"
