"""``AgentRuntime.embed_texts``: grants, budgets, ops and their records, replay, erasure."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from core_support import CoreEnv
from harness_support import Env, Harness
from kernos.agents import AgentRuntime, Agents, Limits, context
from kernos.agents.context import BoundedOutput, RunContext
from kernos.audit import erase, verify
from kernos.errors import (
    CapabilityDenied,
    LLMBudgetExceeded,
    LLMProviderError,
    LLMRecordingErased,
    LLMRequestInvalid,
    OpVetoed,
    UnknownAgent,
    UsageError,
)
from kernos.llm import LEDGER_FILE, Mode, _provider, set_mode
from kernos.llm._store import read_calls
from kernos.op import Op
from kernos.personal import personal
from kernos.replay.driver import replay

litellm = _provider.litellm()  # imported with the offline price list, as Kernos does
MODEL = "text-embedding-3-small"
MOCK = {"mock_response": [0.1, 0.2, 0.3]}


class Provider:
    """Stands in for ``litellm.embedding``: one vector per text, 5 tokens a text."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fail: Exception | None = None

    def __call__(self, *, model: str, input: list[str], **params: Any) -> object:
        self.calls.append(list(input))
        if self.fail is not None:
            raise self.fail
        return {"model": model, "usage": {"prompt_tokens": 5 * len(input)},
                "data": [{"index": n, "embedding": [float(len(text)), 1.0]}
                         for n, text in enumerate(input)]}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    set_mode(None)
    environment = Env(tmp_path / "ws")
    with environment.op("setup"):
        environment.agents.add("alice")
    yield environment
    environment.close()
    set_mode(None)


@pytest.fixture
def provider(env: Env) -> Provider:
    stand_in = Provider()
    env.runtime.llm_client().embedding = stand_in
    return stand_in


@contextlib.contextmanager
def agent_code(env: Env, principal: str, op: Op, limits: Limits | None = None
               ) -> Iterator[RunContext]:
    """As while ``principal``'s code runs in ``op`` (a recall's call to the memory)."""
    ctx = RunContext(runtime=env.runtime, principal=principal, op=op,
                     limits=limits or env.runtime.limits_for(principal),
                     output=BoundedOutput(1000))
    token = context.enter(ctx)
    try:
        yield ctx
    finally:
        context.leave(token)


def in_op(env: Env, body: Callable[[Op], object]) -> dict[str, Any]:
    """Run ``body`` in an op (errors it raises are caught, as agent code may); its record."""
    op = env.image.begin(source="embed")
    caught = None
    try:
        body(op)
    except Exception as error:
        caught = type(error).__name__
    with contextlib.suppress(OpVetoed):  # a vetoed op is recorded all the same
        op.commit()
    record: dict[str, Any] = dict(env.image.audit.records()[-1])
    record["caught"] = caught  # what the body raised (the test's note, not the record's)
    return record


def ledger(env: Env) -> list[dict[str, Any]]:
    return read_calls(env.path / LEDGER_FILE)


# -- who may embed -------------------------------------------------------------------------


def test_the_human_needs_no_grant_and_the_op_records_every_text(env: Env,
                                                                provider: Provider) -> None:
    found: list[Any] = []
    record = in_op(env, lambda op: found.append(
        env.runtime.embed_texts("human", MODEL, ["sea", "salt"])))
    assert record["status"] == "committed"
    assert found == [[[3.0, 1.0], [4.0, 1.0]]] and type(found[0][0][0]) is float
    assert [(e["kind"], e["principal"], e["cached"], e["call"]) for e in record["llm"]] == [
        ("embedding", "human", False, 1)] * 2
    [call] = ledger(env)
    assert (call["kind"], call["op"], call["keys"], call["tokens"]) == (
        "embedding", record["op"], ["principal:human", f"op:{record['op']}"], 10)


def test_outside_an_op_only_the_principal_is_charged(env: Env, provider: Provider) -> None:
    records = len(env.image.audit.records())
    assert env.runtime.embed_texts("human", MODEL, ["sea"]) == [[3.0, 1.0]]
    with pytest.raises(CapabilityDenied, match="llm:text-embedding-3-small"):
        env.runtime.embed_texts("alice", MODEL, ["salt"])
    with env.op("grant"):
        grant = env.agents.grant("alice", f"llm:{MODEL}", 100)
    env.runtime.embed_texts("alice", MODEL, ["salt"])
    human, alice = ledger(env)
    assert (human["op"], human["keys"]) == (None, ["principal:human"])
    assert (alice["op"], alice["keys"]) == (None, ["principal:alice",
                                                   f"grant:{grant['id']}@{grant['op']}"])
    assert len(env.image.audit.records()) == records + 1  # the grant's op only
    assert len(provider.calls) == 2


def test_an_agent_needs_an_active_llm_grant_for_the_model(env: Env, provider: Provider
                                                          ) -> None:
    def ask(op: Op) -> None:
        with agent_code(env, "alice", op):
            env.runtime.embed_texts("alice", MODEL, ["sea"])

    record = in_op(env, ask)
    assert record["status"] == "denied" and provider.calls == []
    assert record["grants"]["denied"][0]["capability"] == f"llm:{MODEL}"
    assert "llm" not in record  # nothing was asked
    with env.op("grant"):
        env.agents.grant("alice", "llm:*", 100)
    record = in_op(env, ask)
    assert record["status"] == "committed" and len(provider.calls) == 1
    assert [used["capability"] for used in record["grants"]["used"]] == ["llm:*"]
    with env.op("revoke"):
        env.agents.revoke("alice", "llm:*")
    provider.calls.clear()
    record = in_op(env, ask)
    assert record["status"] == "denied" and provider.calls == []
    # From host code too (the human recalls as the agent): the same denial, noted.
    record = in_op(env, lambda op: env.runtime.embed_texts("alice", MODEL, ["wind"]))
    assert record["status"] == "denied" and provider.calls == []
    assert record["caught"] == "CapabilityDenied"
    with pytest.raises(CapabilityDenied) as caught:
        env.runtime.embed_texts("alice", MODEL, ["sea"])
    assert "%kernos grant alice llm:text-embedding-3-small" in str(caught.value)


def test_a_model_the_grant_does_not_name_is_denied(env: Env, provider: Provider) -> None:
    with env.op("grant"):
        env.agents.grant("alice", "llm:text-embedding-3-large", 100)
    with pytest.raises(CapabilityDenied):
        env.runtime.embed_texts("alice", MODEL, ["sea"])
    assert provider.calls == []


def test_bad_arguments_are_refused(env: Env, provider: Provider) -> None:
    with pytest.raises(UsageError, match="at most 256 texts, not 257 of them"):
        env.runtime.embed_texts("human", MODEL, ["x"] * 257)
    with pytest.raises(UsageError, match="not a tuple"):
        env.runtime.embed_texts("human", MODEL, ("x",))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="a principal and a model name"):
        env.runtime.embed_texts("human", 3, ["x"])  # type: ignore[arg-type]
    with pytest.raises(UnknownAgent):
        env.runtime.embed_texts("mallory", MODEL, ["x"])
    with pytest.raises(LLMRequestInvalid, match="api_base"):
        env.runtime.embed_texts("human", MODEL, ["x"], params={"api_base": "http://evil"})
    assert env.runtime.embed_texts("human", MODEL, []) == []
    assert len(env.runtime.embed_texts("human", MODEL, [f"t{n}" for n in range(256)])) == 256
    assert [len(call) for call in provider.calls] == [64] * 4


def test_an_agents_bad_request_vetoes_its_op(env: Env, provider: Provider) -> None:
    with env.op("grant"):
        env.agents.grant("alice", f"llm:{MODEL}", 100)

    def ask(op: Op) -> None:
        with agent_code(env, "alice", op):
            env.runtime.embed_texts("alice", MODEL, ["x" * 40_000])

    record = in_op(env, ask)
    assert record["status"] == "denied" and record["caught"] == "LLMRequestInvalid"
    assert provider.calls == []


# -- budgets and vetoes ---------------------------------------------------------------------


def test_any_llm_error_vetoes_the_op_even_if_caught(env: Env, provider: Provider) -> None:
    provider.fail = litellm.RateLimitError(message="slow", llm_provider="openai", model=MODEL)

    def ask(op: Op) -> None:
        env.ns["note"] = "kept?"
        op.touch("note")
        env.runtime.embed_texts("human", MODEL, ["sea"])

    record = in_op(env, ask)
    assert record["status"] == "failed" and "LLMProviderError" in record["error"]["message"]
    assert record["llm"][0]["error"] == "LLMProviderError"
    assert "note" not in env.ns
    with pytest.raises(LLMProviderError):  # outside an op: raised, nothing to veto
        env.runtime.embed_texts("human", MODEL, ["sea"])


def test_embeddings_and_completions_spend_one_grant(env: Env, provider: Provider) -> None:
    with env.op("grant"):
        env.agents.grant("alice", "llm:*", 30)
    record = in_op(env, lambda op: env.runtime.embed_texts("alice", MODEL, ["sea", "salt"]))
    assert record["status"] == "committed"  # 10 of 30 used
    ask = ("a = llm('gpt-4o-mini', [{'role': 'user', 'content': 'hi'}], max_tokens=15, "
           "mock_response='x')")  # 8 prompt tokens + 15: fits 30, not the 20 left
    op = env.image.begin(source=ask)
    with pytest.raises(LLMBudgetExceeded, match="has 10 of 30 tokens used"):
        env.runtime.run("alice", ask)
    with pytest.raises(OpVetoed):
        op.commit()
    record = env.image.audit.records()[-1]
    assert record["status"] == "vetoed" and "grant g1 (llm:*) of alice" in \
        record["error"]["message"]


def test_the_grant_budget_is_checked_before_any_call(env: Env, provider: Provider) -> None:
    with env.op("grant"):
        env.agents.grant("alice", f"llm:{MODEL}", 12)

    def ask(*texts: str) -> Callable[[Op], object]:
        def run(op: Op) -> None:
            with agent_code(env, "alice", op):
                env.runtime.embed_texts("alice", MODEL, list(texts))
        return run

    assert in_op(env, ask("sea", "salt"))["status"] == "committed"  # 10 of 12 used
    record = in_op(env, ask("the wind is strong today"))  # 5 counted: over 12
    assert record["status"] == "vetoed" and record["caught"] == "LLMBudgetExceeded"
    assert "grant g1 (llm:text-embedding-3-small) of alice" in record["error"]["message"]
    assert len(provider.calls) == 1
    assert env.agents.grants("alice")[0]["used"] == "10"  # the ledger's count
    with env.op("limits"):
        env.agents.limits("alice", llm_tokens=3)
    record = in_op(env, ask("wind"))
    assert record["status"] == "vetoed" and "op " in record["error"]["message"]


def test_the_usd_budget_and_the_op_limit_bind_an_agent_from_host_code(
        env: Env, provider: Provider) -> None:
    with env.op("grant"):
        env.agents.grant("alice", f"llm:{MODEL}", 10**6)
        env.agents.grant("alice", "spend:USD", 0)
    record = in_op(env, lambda op: env.runtime.embed_texts("alice", MODEL, ["sea"]))
    assert record["status"] == "vetoed" and "USD" in record["error"]["message"]
    with env.op("no money limit"):
        env.agents.revoke("alice", "spend:USD")
        env.agents.limits("alice", llm_tokens=1)
    record = in_op(env, lambda op: env.runtime.embed_texts("alice", MODEL, ["the sea"]))
    assert record["status"] == "vetoed" and f"op {record['op']}" in record["error"]["message"]
    assert provider.calls == []


def test_the_human_has_no_budget(env: Env, provider: Provider) -> None:
    with env.op("limits"):
        env.agents.limits("alice", llm_tokens=1)
    record = in_op(env, lambda op: env.runtime.embed_texts("human", MODEL, ["the long sea"]))
    assert record["status"] == "committed"


# -- replay ---------------------------------------------------------------------------------


EMBED = ("v = agents.runtime.embed_texts('bob', 'text-embedding-3-small', ['the sea', 'salt'], "
         "params={'mock_response': [0.1, 0.2]})\n"
         "h = agents.runtime.embed_texts('human', 'text-embedding-3-small', ['wind'], "
         "params={'mock_response': [0.3]})\n"
         "c = agents.llm('gpt-4o-mini', [{'role': 'user', 'content': 'hi'}], "
         "mock_response='yo', max_tokens=5).content\n")


def harness(path: Path) -> Harness:
    made = Harness(path)
    made.env.ns.update(agents=made.env.agents)
    made.env.image.is_persistent = (  # type: ignore[method-assign]
        lambda name: name != "agents" and not name.startswith("__"))
    return made


def calls_of(workspace: Path, op: int) -> list[tuple[str, list[str], int, str]]:
    return [(call["kind"], sorted(call["keys"]), call["tokens"], call["cost"])
            for call in read_calls(workspace / LEDGER_FILE) if call["op"] == op]


def test_a_replayed_op_leaves_the_ledger_as_the_original_did(tmp_path: Path) -> None:
    session = harness(tmp_path / "ws")
    session.op("agents.add('bob')\nagents.grant('bob', 'llm:text-embedding-3-small', 1000)")
    embedded = session.op(EMBED)
    assert embedded["status"] == "committed"
    session.op("after = 1")
    session.env.close()
    original = calls_of(tmp_path / "ws", embedded["op"])
    assert [kind for kind, *_ in original] == ["embedding"] * 3 + ["completion"]
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.summary()
    assert sorted(calls_of(tmp_path / "replayed", embedded["op"])) == sorted(original)
    # ... and not by asking again: the replay's embedding lines are all absorbed ones.
    lines = [line for line in
             (tmp_path / "replayed" / LEDGER_FILE).read_text().splitlines() if line]
    assert '"embedding"' in "".join(lines)
    assert not any('"type":"reserve"' in line and '"embedding"' in line for line in lines)


def test_a_replay_tells_completions_what_they_were_told_whatever_embeddings_say(
        tmp_path: Path) -> None:
    session = harness(tmp_path / "ws")
    session.op("v = agents.runtime.embed_texts('human', 'text-embedding-3-small', ['sea'], "
               "params={'mock_response': [0.5]})")
    both = session.op(  # the embedding is recorded (cached), the completion fresh
        "w = agents.runtime.embed_texts('human', 'text-embedding-3-small', ['sea'], "
        "params={'mock_response': [0.5]})\n"
        "c = agents.llm('gpt-4o-mini', [{'role': 'user', 'content': 'hi'}], "
        "mock_response='yo', max_tokens=5).cached")
    assert both["status"] == "committed"
    session.env.close()
    reopened = Harness(tmp_path / "ws")
    try:
        calls = reopened.env.image.audit.records()[-1]["llm"]
    finally:
        reopened.env.close()
    assert [(entry.get("kind"), entry["cached"]) for entry in calls] == [
        ("embedding", True), (None, False)]
    report = replay(tmp_path / "ws", into=tmp_path / "replayed")
    assert report.ok, report.summary()


# -- erasure --------------------------------------------------------------------------------


def test_an_embedding_of_a_subjects_text_is_sealed_and_erased_with_it(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    runtime = AgentRuntime(env.image)
    Agents(lambda: runtime)
    op = env.image.begin(source="who = personal('Ada Lovelace', subject='c-e1-7')")
    env.ns["who"] = personal("Ada Lovelace", subject="c-e1-7")
    op.commit()

    def embed(text: str, *, reveal: bool, mode: Mode | None = None) -> list[list[float]]:
        op = env.image.begin(source="embed")
        try:
            if reveal:  # the name comes out of the wrapper in this op
                text = text.replace("Lovelace", env.ns["who"].reveal().split()[1])
            if mode is not None:
                set_mode(mode)
            found = runtime.embed_texts("human", MODEL, [text], params=MOCK)
        except BaseException:
            op.abort()
            raise
        finally:
            set_mode(None)
        op.commit()
        return found

    embed("A letter to Lovelace", reveal=True)  # revealed in this op: sealed
    embed("A note about the Baltic", reveal=False)  # no personal data: plain
    stored = b"".join(path.read_bytes() for path in (tmp_path / "ws" / "llm").rglob("*")
                      if path.is_file())
    assert b"Lovelace" not in stored and b"the Baltic" in stored
    assert stored.count(b"$kernos_sealed") == 2  # the request and the vector
    assert len(read_calls(tmp_path / "ws" / LEDGER_FILE)) == 2
    embed("A letter to Lovelace", reveal=True)  # from its sealed recording: no new call
    assert len(read_calls(tmp_path / "ws" / LEDGER_FILE)) == 2

    report = erase(env.image.audit, "c-e1-7")
    assert report.recordings == 2
    stored = b"".join(path.read_bytes() for path in (tmp_path / "ws" / "llm").rglob("*")
                      if path.is_file())
    assert b"$kernos_sealed" not in stored and b"the Baltic" in stored
    with pytest.raises(LLMRecordingErased, match="c-e1-7"):
        embed("A letter to Lovelace", reveal=False, mode=Mode.REPLAY)
    assert verify(tmp_path / "ws").ok
    env.close()


def test_a_recording_erased_is_asked_again_outside_replay(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    runtime = AgentRuntime(env.image)
    op = env.image.begin(source="who")
    env.ns["who"] = personal("Grace Hopper", subject="c-e1-8")
    op.commit()
    op = env.image.begin(source="embed")
    runtime.embed_texts("human", MODEL, [env.ns["who"].reveal()], params=MOCK)
    op.commit()
    erase(env.image.audit, "c-e1-8")
    op = env.image.begin(source="embed again")
    assert runtime.embed_texts("human", MODEL, ["Grace Hopper"], params=MOCK) == [
        MOCK["mock_response"]]
    op.commit()
    assert len(read_calls(tmp_path / "ws" / LEDGER_FILE)) == 2
    env.close()


def test_a_budget_refusal_inside_an_op_is_a_veto(env: Env, provider: Provider) -> None:
    with env.op("grant"):
        env.agents.grant("alice", f"llm:{MODEL}", 0)
    record = in_op(env, lambda op: env.runtime.embed_texts("alice", MODEL, ["sea"]))
    assert record["status"] == "vetoed" and record["caught"] == LLMBudgetExceeded.__name__
