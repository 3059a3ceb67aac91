"""Fixtures shared by the store's unit tests."""

from __future__ import annotations

import os

import pytest

from kernos.store import tail as tail_module


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The files the commit tail syncs (``fdatasync``), in order, by inode number: a sync
    may use a descriptor of its own (a duplicate) for the same file."""
    seen: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        seen.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(tail_module.os, "fdatasync", counted)
    return seen
