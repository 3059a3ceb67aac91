"""ImageMemory in process: recorded recalls (sealed when they hold a subject's text), replayed
answers, facts stamped with the op's recorded clock, and argument checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness_support import Env
from kernos.audit import erase, verify
from kernos.errors import UsageError
from kernos.memory.service import MAX_K, MAX_QUERY_CHARS, check_request, recorded_recalls


def _last_op_record(env: Env) -> dict[str, object]:
    return next(record for record in reversed(list(env.image.audit.records()))
                if record["type"] == "op")


def test_a_recall_holding_a_subjects_text_is_recorded_sealed(tmp_path: Path) -> None:
    env = Env(tmp_path / "ws")
    with env.op("guest = personal('Brumbleweed', subject='c-9')"):
        from kernos.personal import personal

        env.ns["guest"] = personal("Brumbleweed", subject="c-9")
    with env.op("found = agents.recall('guest')"):
        found = env.agents.recall("guest")
    assert found and "Brumbleweed" in json.dumps(found)  # the op's sealed code, opened
    record = _last_op_record(env)
    memory = record["memory"]
    assert isinstance(memory, list) and memory[0]["answer"]["sealed"] == ["c-9"]
    assert b"Brumbleweed" not in (env.path / "audit" / "chain.jsonl").read_bytes()
    assert recorded_recalls(env.image.audit, record)[0]["answer"] == found
    report = erase(env.image.audit, "c-9")
    ref = memory[0]["answer"]["ref"]
    assert ref in report.payloads and env.image.audit.payload(ref) is None  # deleted
    assert recorded_recalls(env.image.audit, record)[0]["answer"] is None
    verified = verify(env.path)
    assert verified.ok, verified.summary()
    env.close()


def test_a_replay_answers_from_the_record_and_refuses_another_question(
        tmp_path: Path) -> None:
    env = Env(tmp_path / "ws")
    with env.op("x = 'numbat'"):
        env.ns["x"] = "numbat"
    memory = env.runtime.memory
    memory.replaying = [{"request": {"what": "recall", "principal": "human", "query": "numbat",
                                     "k": 5, "kinds": None},
                         "answer": [{"kind": "working", "text": "as recorded"}]}]
    op = env.image.begin(source="replayed")
    assert env.agents.recall("numbat") == [{"kind": "working", "text": "as recorded"}]
    with pytest.raises(UsageError, match="which the original did not"):
        env.agents.recall("numbat")
    memory.replaying = [{"request": {"what": "recall", "principal": "human", "query": "other",
                                     "k": 5, "kinds": None}, "answer": []}]
    with pytest.raises(UsageError, match="but the original asked"):
        env.agents.recall("numbat")
    op.abort()
    env.close()


def test_a_fact_is_stamped_with_the_ops_recorded_clock(tmp_path: Path) -> None:
    from kernos import determinism

    env = Env(tmp_path / "ws")
    determinism.install()
    with env.op("agents.remember('a fact')") as op:
        fact = env.agents.remember("a fact", tags=["t"])
        readings = list(op.clock)
    assert fact["op"] == op.id and fact["tags"] == ["t"]
    assert len(readings) == 1  # the stamp is one of the op's recorded readings
    env.close()


@pytest.mark.parametrize(("query", "k", "kinds", "words"), [
    (42, 5, None, "as a str"),
    ("x" * (MAX_QUERY_CHARS + 1), 5, None, "at most"),
    ("q", 0, None, "k from 1"),
    ("q", MAX_K + 1, None, "k from 1"),
    ("q", True, None, "k from 1"),
    ("q", 5, ["secret"], "knows the kinds"),
    ("q", 5, [1], "kinds must be"),
    ("q", 5, {"working": 1}, "kinds must be"),
    ("q", 5, ["working"] * 9, "knows the kinds"),
])
def test_requests_are_checked_by_exact_type_and_bounded(query: object, k: object,
                                                         kinds: object, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        check_request(query, k, kinds)


def test_verify_sees_a_recorded_answer_changed(tmp_path: Path) -> None:
    env = Env(tmp_path / "ws")
    with env.op("x = '" + "bilby " * 2000 + "'"):  # a long code: a big answer
        env.ns["x"] = "bilby " * 2000
    with env.op("found = agents.recall('bilby')"):
        assert env.agents.recall("bilby")
    answer = _last_op_record(env)["memory"][0]["answer"]  # type: ignore[index]
    path = env.path / "audit" / "payloads" / answer["ref"]
    assert path.exists()  # a big answer goes to a payload
    path.write_bytes(path.read_bytes().replace(b"bilby", b"bongo"))
    verified = verify(env.path)
    assert not verified.ok and "was modified" in verified.summary()
    env.close()
