"""LLM calls from agent code and from the human: grants, budgets, rollbacks, the audit."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness_support import Env
from kernos.agents import AgentRuntime, Agents, Limits
from kernos.errors import LLMBudgetExceeded, OpVetoed
from kernos.llm import Budget, LlmClient, LlmStore, Mode, build_request, set_mode
from llm_support import SECRET, Meter, metered, user

LIMITS = Limits(seconds=30, hard_seconds=600, memory_mb=4096)
BUDGET = 1000


class LlmEnv(Env):
    def reopen(self) -> None:
        super().reopen()
        self.runtime = AgentRuntime(self.image, default_limits=LIMITS)
        self.agents = Agents(lambda: self.runtime)

    def agent_op(self, agent: str, code: str, *, fail: bool = False) -> dict[str, Any]:
        """Run agent code as one op; its audit record."""
        op = self.image.begin(source=code)
        try:
            self.runtime.run(agent, code)
            if fail:
                raise ValueError("the op fails after its calls")
            op.commit()
        except OpVetoed:
            pass
        except BaseException as error:
            op.abort(error=error)
        record: dict[str, Any] = self.image.audit.records()[-1]
        return record


@pytest.fixture
def env(tmp_path: Path) -> Iterator[LlmEnv]:
    set_mode(Mode.OFF)  # fresh calls: every call is billed by the provider
    environment = LlmEnv(tmp_path / "ws")
    with environment.op("setup"):
        environment.agents.add("alice")
    yield environment
    environment.close()
    set_mode(None)


def call(model: str, text: str, max_tokens: int, catch: bool = False) -> str:
    line = f"answer = llm({model!r}, [{{'role': 'user', 'content': {text!r}}}], " \
           f"max_tokens={max_tokens})\n"
    if catch:
        return f"try:\n    {line}except Exception as error:\n    print('caught', error)\n"
    return line


def test_an_agent_needs_an_llm_grant_for_the_model(env: LlmEnv) -> None:
    with metered() as meter:
        record = env.agent_op("alice", call("meter/m", "hello", 10, catch=True))
        assert meter.calls == 0
    assert record["status"] == "denied"
    assert record["grants"]["denied"][0]["capability"] == "llm:meter/m"
    assert "llm" not in record  # no call was made: the key is absent, as for older records
    with env.op("grant"):
        env.agents.grant("alice", "llm:*", 100)
    with metered() as meter:
        record = env.agent_op("alice", call("meter/m", "hello", 10) + "print(answer)")
        assert meter.calls == 1
    assert record["status"] == "committed"
    [entry] = record["llm"]
    assert entry["principal"] == "alice" and entry["model"] == "meter/m"
    assert entry["tokens"]["total_tokens"] == meter.billed
    assert env.runtime.llm_client().store.get(entry["response"])["request"] == entry["request"]


def test_an_agent_gets_plain_data(env: LlmEnv) -> None:
    with env.op("grant"):
        env.agents.grant("alice", "llm:gpt-4o-mini", BUDGET)
    code = ("a = llm('gpt-4o-mini', [{'role': 'user', 'content': 'Say hi, please, kindly.'}], "
            "mock_response='hi', max_tokens=30)\n"
            "kept = [a['content'], a['usage']['total_tokens'], a['cost'], a['cached'], "
            "a['model'], a['tool_calls']]")
    assert env.agent_op("alice", code)["status"] == "committed"
    kept = env.ns_of("alice")["kept"]
    assert kept[:2] == ["hi", 30] and str(kept[2]) == "0.0000135"
    assert kept[3:] == [False, "gpt-4o-mini", []]
    assert env.agents.grants("alice")[0]["used"] == "30"  # from the ledger


def test_any_llm_error_rolls_the_op_back_even_if_caught(env: LlmEnv) -> None:
    with env.op("grant"):
        env.agents.grant("alice", "llm:gpt-4o-mini", BUDGET)
    code = ("note = 'kept?'\n"
            "try:\n"
            "    llm('gpt-4o-mini', [{'role': 'user', 'content': 'x'}], "
            "max_tokens=20, mock_response='litellm.RateLimitError')\n"
            "except Exception as error:\n"
            "    print('caught')\n")
    record = env.agent_op("alice", code)
    assert record["status"] == "failed"
    assert "LLMProviderError" in record["error"]["message"]
    assert record["llm"][0]["error"] == "LLMProviderError"
    assert "note" not in env.ns_of("alice")


def test_the_human_calls_without_a_grant_and_is_recorded(env: LlmEnv) -> None:
    with env.op("agents.llm(...)"):
        answer = env.agents.llm("gpt-4o-mini", user("Hello there, human here."),
                                mock_response="hello", mode="record")
    assert answer.content == "hello"
    record = env.image.audit.records()[-1]
    assert record["status"] == "committed" and record["llm"][0]["principal"] == "human"


def test_an_offered_tool_needs_the_callers_grant(env: LlmEnv) -> None:
    with env.op("tool"):
        env.agents.register_tool("lookup", lambda word: word, description="Look up",
                                 schema={"type": "object",
                                         "properties": {"word": {"type": "string"}}})
        env.agents.grant("alice", "llm:gpt-4o-mini", BUDGET)
    code = ("a = llm('gpt-4o-mini', [{'role': 'user', 'content': 'x'}], tools=['lookup'], "
            "max_tokens=50, "
            "mock_response='', mock_tool_calls=[{'id': 'c', 'type': 'function', 'function': "
            "{'name': 'lookup', 'arguments': '{\"word\": \"sea\"}'}}])\n"
            "got = a['tool_calls']")
    assert env.agent_op("alice", code)["status"] == "denied"
    with env.op("grant"):
        env.agents.grant("alice", "call:lookup")
    assert env.agent_op("alice", code)["status"] == "committed"
    assert env.ns_of("alice")["got"] == [{"id": "c", "name": "lookup",
                                          "arguments": {"word": "sea"}}]


def test_delegated_grants_spend_from_their_whole_chain(env: LlmEnv) -> None:
    with env.op("setup"):
        env.agents.grant("alice", "llm:meter/m", 300)
        env.agents.grant("alice", "agents:spawn")
    assert env.agent_op("alice", "spawn('helper')\n"
                                 "delegate(grants()[0]['id'], 'alice/helper', 300)"
                        )["status"] == "committed"
    with metered() as meter:
        env.agent_op("alice/helper", call("meter/m", "one two three", 200))
        spent = meter.billed
        # the parent's grant was charged too: what is left of 300 is all alice has
        record = env.agent_op("alice", call("meter/m", "one two three", 300 - spent + 1))
        assert record["status"] == "vetoed" and meter.billed == spent
    assert "grant g1 (llm:meter/m) of alice" in record["error"]["message"]


def test_the_per_op_limit_and_the_usd_budget(env: LlmEnv) -> None:
    with env.op("setup"):
        env.agents.grant("alice", "llm:gpt-4o-mini", 10**6)
        env.agents.limits("alice", llm_tokens=500)
    record = env.agent_op("alice", call("gpt-4o-mini", "x", 600))
    assert record["status"] == "vetoed" and "op " in record["error"]["message"]
    with env.op("usd"):
        env.agents.grant("alice", "spend:USD", 0)  # no money at all
    record = env.agent_op("alice", "answer = llm('gpt-4o-mini', [{'role': 'user', 'content': "
                                   "'x'}], max_tokens=10, mock_response='x')")
    assert record["status"] == "vetoed" and "USD" in record["error"]["message"]


def test_a_1000_token_budget_holds_across_any_sequence_of_calls(tmp_path: Path) -> None:
    """Random ops (commits, failures, caught budget errors, delegation), one budget."""
    set_mode(Mode.OFF)
    try:
        for seed in range(12):
            _sequence(tmp_path / f"ws{seed}", seed)
    finally:
        set_mode(None)


def _sequence(path: Path, seed: int) -> None:
    rng = random.Random(seed)
    env = LlmEnv(path)
    try:
        with env.op("setup"):
            env.agents.add("alice")
            env.agents.grant("alice", "llm:meter/m", BUDGET)
            env.agents.grant("alice", "agents:spawn")
        env.agent_op("alice", "spawn('sub')\n"
                              f"delegate(grants()[0]['id'], 'alice/sub', {rng.randint(1, 999)})")
        with metered(seed) as meter:
            for _ in range(15):
                agent = rng.choice(["alice", "alice", "alice/sub"])
                code = "".join(call("meter/m", "word " * rng.randint(1, 40),
                                    rng.randint(1, 400), catch=rng.random() < 0.3)
                               for _ in range(rng.randint(1, 3)))
                billed = meter.billed
                fail = rng.random() < 0.3
                record = env.agent_op(agent, code, fail=fail)
                assert meter.billed <= BUDGET, (seed, record)
                over = [entry for entry in record.get("llm", [])
                        if entry.get("error") == "LLMBudgetExceeded"]
                if over:  # each violation rolls its op back, and the audit says why
                    assert record["status"] == "vetoed", record
                    if not fail:  # else the record's error is the op's own failure
                        assert "LLM budget exceeded" in record["error"]["message"]
                calls = [entry for entry in record.get("llm", []) if "tokens" in entry]
                assert sum(entry["tokens"]["total_tokens"] for entry in calls) \
                    == meter.billed - billed
            ledger = env.runtime.llm_client().store.ledger
            grant = env.runtime.registry.grants["g1"]
            assert ledger.spent(f"grant:g1@{grant.op}").tokens == meter.billed
            assert meter.billed > BUDGET // 2, "the sequence never came near the budget"
    finally:
        env.close()


def test_concurrent_calls_cannot_promise_the_same_tokens_twice(tmp_path: Path) -> None:
    client = LlmClient(LlmStore(tmp_path))
    budget = Budget(key="grant:g1@1", label="grant g1", tokens=BUDGET)

    class Slow(Meter):
        def completion(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(0.05)  # every thread is past its check before any settles
            return super().completion(*args, **kwargs)

    failures: list[BaseException] = []
    with metered() as meter:
        slow = Slow()
        import litellm

        litellm.custom_provider_map = [{"provider": "meter", "custom_handler": slow}]

        def worker(number: int) -> None:
            request = build_request("meter/m", user(f"thread {number} asks"),
                                    {"max_tokens": 200})
            try:
                client.complete(request, principal="alice", op=number, budgets=[budget],
                                mode=Mode.OFF)
            except LLMBudgetExceeded as error:
                failures.append(error)

        threads = [threading.Thread(target=worker, args=(number,)) for number in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert meter.calls == 0
    assert slow.billed <= BUDGET and failures
    assert client.store.ledger.spent(budget.key).tokens == slow.billed


def test_the_key_in_the_environment_is_in_no_file_of_the_workspace(
        env: LlmEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with env.op("grant"):
        env.agents.grant("alice", "llm:meter/m", BUDGET)
    with metered() as meter:
        meter.leak_key = True
        assert env.agent_op("alice", call("meter/m", "hi", 10))["status"] == "committed"
        meter.fail = "AuthenticationError"
        assert env.agent_op("alice", call("meter/m", "hi", 10, catch=True))["status"] == \
            "failed"
    files = [path for path in env.path.rglob("*") if path.is_file()]
    assert any("llm" in path.parts for path in files)
    assert [path for path in files if SECRET.encode() in path.read_bytes()] == []
