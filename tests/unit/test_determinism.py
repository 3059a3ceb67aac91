"""kernos.determinism: seeded randomness and a recorded clock inside ops."""

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


def draws(identity: str, op: int) -> tuple[float, str]:
    determinism.seed_op(identity, op)
    try:
        return random.random(), str(uuid.uuid4())
    finally:
        determinism.end_op()


def test_randomness_is_a_function_of_the_workspace_and_the_op() -> None:
    assert draws("ws1", 5) == draws("ws1", 5)
    assert draws("ws1", 5) != draws("ws1", 6)
    assert draws("ws1", 5) != draws("ws2", 5)
    assert uuid.uuid4() != uuid.uuid4()  # outside ops: the OS's randomness, as ever


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
