"""Fixtures shared by the store's unit tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An empty bare git repository."""
    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "r.git")], check=True)
    return tmp_path / "r.git"
