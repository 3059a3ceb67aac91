"""kernos.determinism: the generators' state in the image, uuid4 and the clock inside ops."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator

import pytest

from kernos import determinism
from kernos._time import utc_now


@pytest.fixture(autouse=True)
def installed() -> Iterator[None]:
    determinism.install()
    yield
    determinism.end_op()


def draws(identity: str, op: int) -> str:
    determinism.seed_op(identity, op)
    try:
        return str(uuid.uuid4())
    finally:
        determinism.end_op()


def test_uuid4_inside_ops_is_a_function_of_the_workspace_and_the_op() -> None:
    assert draws("ws1", 5) == draws("ws1", 5)
    assert draws("ws1", 5) != draws("ws1", 6)
    assert draws("ws1", 5) != draws("ws2", 5)
    assert uuid.uuid4() != uuid.uuid4()  # outside ops: the OS's randomness, as ever


def test_uuid4_inside_ops_never_moves_the_users_random_stream() -> None:
    random.seed(3)
    expected = [random.random() for _ in range(3)]
    random.seed(3)
    determinism.seed_op("ws", 1)
    try:
        got = []
        for _ in range(3):
            uuid.uuid4()
            got.append(random.random())
    finally:
        determinism.end_op()
    assert got == expected


def test_a_captured_state_is_plain_data_and_applies_exactly() -> None:
    import pickle

    numpy = pytest.importorskip("numpy")
    random.seed(11)
    numpy.random.seed(12)
    numpy.random.standard_normal()  # leaves a cached gaussian in the legacy state
    state = determinism.capture_state("ws")
    assert "numpy" not in pickle.dumps(state).decode("latin-1")  # no numpy objects in it
    expected = (random.random(), numpy.random.standard_normal(), numpy.random.rand())
    random.seed(0)
    numpy.random.seed(0)
    determinism.apply_state(state, "ws")
    assert (random.random(), numpy.random.standard_normal(), numpy.random.rand()) == expected


def test_a_workspace_without_a_state_starts_from_one_derived_from_its_identity() -> None:
    determinism.apply_state(None, "ws1")
    first = random.random()
    determinism.apply_state(None, "ws1")
    assert random.random() == first
    determinism.apply_state(None, "ws2")
    assert random.random() != first
    assert determinism.same_state(determinism.fresh_state("ws1"), determinism.fresh_state("ws1"))
    determinism.apply_state(None, "ws2")
    assert not determinism.ensure_state(None, "ws2")  # already at ws2's start: unchanged
    random.random()
    assert determinism.ensure_state(None, "ws2")  # moved on: put back
    assert random.random() != first


def test_the_ops_own_clock_readings_are_recorded_and_kernos_reads_the_real_clock() -> None:
    readings: list[int] = []
    determinism.seed_op("ws", 1, readings=readings)
    first, second = time.time_ns(), time.time()
    utc_now()  # Kernos' own reading: not the op's
    determinism.end_op()
    assert readings == [first, readings[1]] and abs(readings[1] / 1e9 - second) < 1e-6
    time.time()  # outside an op: nothing recorded
    assert len(readings) == 2


def test_a_replay_hands_the_op_its_original_readings_then_the_real_clock() -> None:
    readings: list[int] = []
    determinism.seed_op("ws", 1, readings=readings, clock=[1_000_000_000, 2_500_000_000])
    assert time.time() == 1.0 and time.time_ns() == 2_500_000_000
    assert time.time() > 1_700_000_000  # more readings than the original: the real clock
    determinism.end_op()
    assert readings[:2] == [1_000_000_000, 2_500_000_000]


def test_environment_reads_are_fingerprinted_never_recorded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import os

    monkeypatch.setenv("KERNOS_TEST_SECRET", "s3cret-value")
    monkeypatch.delenv("KERNOS_TEST_UNSET", raising=False)
    reads: list[list[str | None]] = []
    determinism.seed_op("ws", 1, environ=reads)
    assert os.getenv("KERNOS_TEST_SECRET") == "s3cret-value"
    assert os.environ.get("KERNOS_TEST_UNSET") is None
    determinism.end_op()
    os.getenv("KERNOS_TEST_SECRET")  # outside an op: not noted
    assert reads == [["KERNOS_TEST_SECRET", hashlib.sha256(b"s3cret-value").hexdigest()],
                     ["KERNOS_TEST_UNSET", None]]
    assert "s3cret-value" not in repr(reads)
