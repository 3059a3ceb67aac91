"""``KERNOS_PAUSE_AT``: a pause at every pass of a point, or only at its Nth pass."""

from __future__ import annotations

import importlib
import types
from collections.abc import Iterator

import pytest

import kernos._faults


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    yield kernos._faults
    monkeypatch.delenv("KERNOS_PAUSE_AT", raising=False)
    importlib.reload(kernos._faults)  # unarmed again for the other tests


def armed(monkeypatch: pytest.MonkeyPatch, spec: str) -> list[float]:
    monkeypatch.setenv("KERNOS_PAUSE_AT", spec)
    module = importlib.reload(kernos._faults)
    slept: list[float] = []
    monkeypatch.setattr(module, "time", types.SimpleNamespace(sleep=slept.append))
    return slept


def test_a_pause_point_sleeps_every_time(faults: types.ModuleType,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    slept = armed(monkeypatch, "tail.sync:0.25")
    for _ in range(3):
        faults.pause("tail.sync")
    faults.pause("restore.background")
    assert slept == [0.25, 0.25, 0.25]


def test_the_nth_pass_only_and_crash_points_pause_too(faults: types.ModuleType,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    slept = armed(monkeypatch, "ref.locked@2:3")
    faults.point("ref.locked")
    assert slept == []
    faults.point("ref.locked")
    assert slept == [3.0]
    faults.point("ref.locked")
    faults.point("frame")
    assert slept == [3.0]
