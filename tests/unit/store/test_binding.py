"""A notebook's ``metadata.kernos.workspace``: honoured only for a real workspace of ours."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kernos import Workspace, WorkspaceError, default_workspace
from kernos.store import binding
from kernos.store.binding import notebook_binding


def notebook(path: Path, metadata: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"cells": [], "metadata": metadata, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


@pytest.fixture
def fork(tmp_path: Path) -> Path:
    Workspace.open(tmp_path / "fork").close()
    return tmp_path / "fork"


def test_a_bound_notebook_wins_over_kernos_workspace(tmp_path: Path, fork: Path) -> None:
    bound = notebook(tmp_path / "on fork.ipynb", {"kernos": {"workspace": str(fork)}})
    environ = {"JPY_SESSION_NAME": str(bound), "KERNOS_WORKSPACE": str(tmp_path / "server")}
    assert default_workspace(environ) == fork
    # A gateway's root is the operator's choice: a notebook cannot name a path there.
    rooted = {**environ, "KERNOS_WORKSPACE_ROOT": str(tmp_path / "root")}
    assert default_workspace(rooted) == tmp_path / "root" / "default"


def test_a_notebook_without_a_binding_changes_nothing(tmp_path: Path) -> None:
    for metadata in ({}, {"kernos": {}}, {"kernos": {"workspace": None}}):
        plain = notebook(tmp_path / "plain.ipynb", metadata)
        assert notebook_binding({"JPY_SESSION_NAME": str(plain)}) is None
        assert default_workspace({"JPY_SESSION_NAME": str(plain),
                                  "KERNOS_WORKSPACE": str(tmp_path / "w")}) == tmp_path / "w"
    # No such file, not a notebook, not JSON: nothing a kernel could have been opened for.
    (tmp_path / "broken.ipynb").write_text("{")
    for session in (str(tmp_path / "missing.ipynb"), str(tmp_path / "broken.ipynb"),
                    "Console 1", ""):
        assert notebook_binding({"JPY_SESSION_NAME": session}) is None


def test_a_relative_session_name_is_found_in_the_kernels_directory(
        tmp_path: Path, fork: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    notebook(tmp_path / "sub" / "nb.ipynb", {"kernos": {"workspace": str(fork)}})
    monkeypatch.chdir(tmp_path / "sub")
    assert notebook_binding({"JPY_SESSION_NAME": "sub/nb.ipynb"}) == fork


@pytest.mark.parametrize(("named", "why"), [
    ("relative/fork", "is not an absolute path"),
    (42, "is not a path"),
    ("", "is not a path"),
    ("/nowhere/at/all", "does not exist"),
    ("EMPTY", "is not a Kernos workspace"),
    ("FILE", "is not a directory"),
    ("HALF", "is not a Kernos workspace"),
])
def test_anything_but_a_workspace_is_refused_and_nothing_is_touched(
        tmp_path: Path, named: object, why: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "workspace.json").write_text("{}")  # no history.git
    places = {"EMPTY": tmp_path / "empty", "FILE": tmp_path / "file",
              "HALF": tmp_path / "half"}
    if isinstance(named, str) and named in places:
        named = str(places[named])
    bad = notebook(tmp_path / "bad.ipynb", {"kernos": {"workspace": named}})
    before = sorted(str(path) for path in tmp_path.rglob("*"))
    with pytest.raises(WorkspaceError, match=why) as raised:
        default_workspace({"JPY_SESSION_NAME": str(bad),
                           "KERNOS_WORKSPACE": str(tmp_path / "server")})
    assert "No workspace was opened or changed" in str(raised.value)
    assert "metadata.kernos.workspace" in str(raised.value)
    assert sorted(str(path) for path in tmp_path.rglob("*")) == before


def test_metadata_kernos_must_be_an_object(tmp_path: Path) -> None:
    bad = notebook(tmp_path / "bad.ipynb", {"kernos": "/tmp"})
    with pytest.raises(WorkspaceError, match=r"metadata\.kernos is not an object"):
        notebook_binding({"JPY_SESSION_NAME": str(bad)})


def test_another_users_directory_is_refused(tmp_path: Path, fork: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    bound = notebook(tmp_path / "nb.ipynb", {"kernos": {"workspace": str(fork)}})
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(fork).st_uid + 1)
    with pytest.raises(WorkspaceError, match="belongs to another user"):
        notebook_binding({"JPY_SESSION_NAME": str(bound)})


def test_a_huge_notebook_binds_only_if_it_mentions_no_workspace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binding, "MAX_NOTEBOOK_BYTES", 100)
    monkeypatch.setattr(binding, "_CHUNK", 16)
    big = notebook(tmp_path / "big.ipynb", {"note": "x" * 200})
    assert notebook_binding({"JPY_SESSION_NAME": str(big)}) is None
    named = notebook(tmp_path / "named.ipynb", {"kernos": {"workspace": "/w" + "x" * 200}})
    with pytest.raises(WorkspaceError, match="too big"):
        notebook_binding({"JPY_SESSION_NAME": str(named)})
