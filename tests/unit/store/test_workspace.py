"""The workspace: where it is, who owns it, and what it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernos import (
    UnknownRef,
    Workspace,
    WorkspaceCorrupt,
    WorkspaceFormatError,
    WorkspaceLocked,
    default_workspace,
)


def test_explicit_environment_variable_wins(tmp_path: Path) -> None:
    assert default_workspace({"KERNOS_WORKSPACE": str(tmp_path / "w")}) == tmp_path / "w"


def test_each_notebook_gets_its_own_default_workspace() -> None:
    a = default_workspace({"JPY_SESSION_NAME": "/home/ada/analysis/day one.ipynb"})
    b = default_workspace({"JPY_SESSION_NAME": "/home/ada/other.ipynb"})
    assert a != b
    assert a.name == "home-ada-analysis-day-one"
    assert default_workspace({}).name == "default"


def test_from_a_checkout_workspaces_live_in_snapshots(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Wherever the code runs from (a checkout, a copy such as scripts/mutation's)."""
    from kernos.store import location as workspace_module

    checkout = tmp_path / "checkout"
    source = checkout / "kernel" / "kernos" / "store" / "workspace.py"
    source.parent.mkdir(parents=True)
    monkeypatch.setattr(workspace_module, "__file__", str(source))
    data = {"XDG_DATA_HOME": str(tmp_path / "data")}
    assert default_workspace(data) == tmp_path / "data" / "kernos" / "workspaces" / "default"
    (checkout / "pyproject.toml").write_text("")
    assert default_workspace(data) == tmp_path / "data" / "kernos" / "workspaces" / "default"
    (checkout / "snapshots").mkdir()
    (checkout / "snapshots" / "README.md").write_text("")
    assert default_workspace(data) == checkout / "snapshots" / "default"


def test_this_checkout_keeps_its_workspaces_in_its_snapshots_directory() -> None:
    checkout = Path(__file__).resolve().parents[3]
    if not (checkout / "snapshots" / "README.md").exists():
        pytest.skip("not run from a checkout (scripts/mutation runs the tests in a copy)")
    assert default_workspace({}) == checkout / "snapshots" / "default"


def test_new_workspace_is_a_valid_bare_repository(workspace: Workspace) -> None:
    assert json.loads((workspace.path / "workspace.json").read_text())["format"] == 1
    out = subprocess.run(["git", "-C", str(workspace.git_dir), "rev-parse", "--is-bare-repository"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "true"
    assert workspace.head() is None


def test_second_open_in_the_same_process_is_refused(workspace: Workspace) -> None:
    with pytest.raises(WorkspaceLocked, match="already"):
        Workspace.open(workspace.path)


def test_second_process_gets_a_clear_error_naming_the_owner(workspace: Workspace) -> None:
    code = (
        "import sys\nfrom kernos import Workspace, WorkspaceLocked\n"
        "try:\n    Workspace.open(sys.argv[1])\nexcept WorkspaceLocked as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(workspace.path)],
                            capture_output=True, text=True)
    assert result.returncode == 3, result.stderr
    assert str(workspace.path.resolve()) in result.stdout
    assert "pid" in result.stdout and "KERNOS_WORKSPACE" in result.stdout


def test_lock_is_released_when_the_owner_dies(tmp_path: Path) -> None:
    path = tmp_path / "w"
    code = ("import os, sys, signal\nfrom kernos import Workspace\n"
            "Workspace.open(sys.argv[1])\nos.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", code, str(path)])
    with Workspace.open(path) as reopened:
        assert reopened.writable


def test_read_only_open_needs_no_lock(workspace: Workspace) -> None:
    with Workspace.open(workspace.path, writable=False) as reader:
        assert not reader.writable
        assert reader.head() is None


def test_directory_that_is_not_a_workspace_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(WorkspaceFormatError, match="not empty"):
        Workspace.open(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with pytest.raises(WorkspaceFormatError, match="does not exist"):
        Workspace.open(tmp_path / "missing", writable=False)
    with pytest.raises(WorkspaceFormatError, match=r"no workspace\.json"):
        Workspace.open(tmp_path, writable=False)


def test_newer_format_is_refused(workspace: Workspace) -> None:
    path = workspace.path
    workspace.close()
    (path / "workspace.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(WorkspaceFormatError, match="newer Kernos"):
        Workspace.open(path)


def test_garbage_ref_is_reported_as_corruption(workspace: Workspace) -> None:
    (workspace.git_dir / "refs" / "heads" / "main").write_text("not a sha\n")
    with pytest.raises(WorkspaceCorrupt, match="refs/heads/main"):
        workspace.head()


def test_refs_resolve_by_op_by_offset_and_by_prefix(session) -> None:  # type: ignore[no-untyped-def]
    first = session.run("x = 1")
    second = session.run("x = 2")
    third = session.run("x = 3")
    workspace = session.image.workspace
    assert workspace.resolve("HEAD").hex() == third.commit
    assert workspace.resolve("HEAD~2").hex() == first.commit
    assert workspace.resolve(f"@{second.op}").hex() == second.commit
    assert workspace.resolve(second.commit[:8]).hex() == second.commit
    for bad in ("@99", "HEAD~9", "deadbeef", "no such ref"):
        with pytest.raises(UnknownRef, match="names no snapshot"):
            workspace.resolve(bad)


def test_a_workspace_opened_by_a_relative_path_survives_a_change_of_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KERNOS_WORKSPACE=ws, then the user's code calls os.chdir: the history stays put."""
    from conftest import Session

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    with Workspace.open("ws") as workspace:
        assert workspace.path == tmp_path / "ws"
        session = Session(workspace)
        session.run("x = 1")
        monkeypatch.chdir(tmp_path / "elsewhere")
        session.run("x += 1")
        assert workspace.head() is not None
    assert not (tmp_path / "elsewhere" / "ws").exists()
    with Workspace.open(tmp_path / "ws") as reopened:
        assert Session(reopened).namespace["x"] == 2
