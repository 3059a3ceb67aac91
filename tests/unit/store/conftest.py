"""Fixtures shared by the store's unit tests."""

from __future__ import annotations

import os

import pytest

from kernos.store import tail as tail_module


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors the commit tail syncs (``fdatasync``), in order."""
    seen: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        seen.append(fd)
        real(fd)

    monkeypatch.setattr(tail_module.os, "fdatasync", counted)
    return seen
