"""Fixtures of the security corpus: the world payloads attack, and real kernels.

The harness itself (the world, the goal checks, the forked runner) is in
``harness.py``; the payloads are in ``corpus*.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from security.goals import World
from security.harness import build_world
from security.kernels import RealKernel


@pytest.fixture
def world(tmp_path: Path) -> World:
    """A committed workspace: the human's secrets, ``mallory`` and ``victim``."""
    return build_world(tmp_path)


@pytest.fixture
def real_kernel() -> Iterator[Callable[[Path], RealKernel]]:
    """Start kernels on a workspace; all are stopped (or reaped) at the end of the test."""
    started: list[RealKernel] = []

    def start(workspace: Path) -> RealKernel:
        kernel = RealKernel(workspace)
        started.append(kernel)
        return kernel

    yield start
    for kernel in started:
        kernel.stop()
