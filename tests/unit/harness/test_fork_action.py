"""The harness ``fork`` action: a new workspace beside this one, by name only, as ``human``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness_support import Harness
from kernos.audit import verify
from kernos.inspector.backend import refuse


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    opened = Harness(tmp_path / "ws")
    yield opened
    opened.env.close()


def test_fork_makes_a_named_workspace_beside_this_one(harness: Harness, tmp_path: Path) -> None:
    first = harness.op("plan = 'A'")
    harness.op("plan = 'B'")
    records = len(harness.env.image.audit.records())
    result = harness.ok(action="fork", ref=f"@{first['op']}", dest="try-a.1")
    dest = tmp_path / "try-a.1"
    assert result["dest"] == str(dest) and result["op"] == first["op"]
    assert result["open"] == {"env": {"KERNOS_WORKSPACE": str(dest)}}
    assert verify(dest).ok
    forked = Harness(dest)
    try:
        assert forked.env.ns["plan"] == "A"
    finally:
        forked.env.close()
    assert harness.env.ns["plan"] == "B"  # the source's image is untouched
    assert len(harness.env.image.audit.records()) == records  # a fork is no op of this one


@pytest.mark.parametrize("dest", ["../escape", "/tmp/abs", "a/b", ".hidden", "", "x" * 101,
                                  "sp ace", "ümlaut"])
def test_fork_takes_a_name_never_a_path(harness: Harness, tmp_path: Path, dest: str) -> None:
    harness.op("x = 1")
    before = sorted(path.name for path in tmp_path.iterdir())
    error = harness.error(action="fork", dest=dest)
    assert error["kind"] in ("invalid", "malformed")
    assert sorted(path.name for path in tmp_path.iterdir()) == before


def test_fork_errors_are_the_protocols(harness: Harness, tmp_path: Path) -> None:
    harness.op("x = 1")
    assert harness.error(action="fork", dest="f", ref="@99")["kind"] == "unknown_ref"
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("mine")
    error = harness.error(action="fork", dest="taken")
    assert "not empty" in error["message"]
    assert harness.error(action="fork")["kind"] == "malformed"  # dest is required


def test_an_inspector_may_fork() -> None:
    assert refuse({"v": 1, "action": "fork", "dest": "x"}) is None
