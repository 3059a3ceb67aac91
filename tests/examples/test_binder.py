"""Simulate Binder: build the environment from binder/ alone, then run the examples in it.

repo2docker, given a ``binder/`` directory, uses only its files: it runs
``pip install -r binder/requirements.txt`` from the repository root, then
``binder/postBuild``, and launches the server through ``binder/start``.  Here
the same happens in a fresh venv in a temporary directory (pip's cache is
used, so a second run is quicker).  Jupyter's per-user directories point into
the temporary directory too, so that nothing installed for this machine's
user (a ``kernos`` kernelspec in ``~/.local/share/jupyter``, say) can make a
check pass: the kernelspec must be the venv's own.

By default the build runs in this working tree, as it is (a JupyterLab
extension already built here is reused).  ``KERNOS_BINDER_SOURCE=clone``
builds from a fresh ``git clone`` of the committed HEAD instead, which is
what Binder sees: nothing built, nothing uncommitted (slower: the extension
is built from source).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
INSTALL_TIMEOUT = 1500


@dataclass
class BinderEnv:
    root: Path
    """The repository the environment was built from (this tree, or a clone of it)."""
    venv: Path
    env: dict[str, str]
    """The environment every command runs with: the venv first on PATH, Jupyter dirs isolated."""
    install_seconds: float
    post_build: subprocess.CompletedProcess[str]

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def run(self, *command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)


def _isolated_env(venv: Path, home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("JUPYTER", "JPY_", "KERNOS_", "PYTHON")) and key != "VIRTUAL_ENV"}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        JUPYTER_CONFIG_DIR=str(home / "jupyter-config"),
        JUPYTER_DATA_DIR=str(home / "jupyter-data"),
        JUPYTER_RUNTIME_DIR=str(home / "jupyter-runtime"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "lab-workspaces"),
        XDG_DATA_HOME=str(home / "xdg-data"),
    )
    return env


@pytest.fixture(scope="module")
def binder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BinderEnv]:
    base = tmp_path_factory.mktemp("binder")
    venv, home = base / "venv", base / "home"
    home.mkdir()
    root = ROOT
    if os.environ.get("KERNOS_BINDER_SOURCE") == "clone":
        root = base / "repository"
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{ROOT}", str(root)],
                       check=True, timeout=300)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = _isolated_env(venv, home)
    started = time.monotonic()
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-r",
         "binder/requirements.txt"],
        cwd=root, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False)
    install_seconds = time.monotonic() - started
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-5000:]
    started = time.monotonic()
    post_build = subprocess.run(["bash", "binder/postBuild"], cwd=root, env=env,
                                capture_output=True, text=True, timeout=600, check=False)
    print(f"pip install -r binder/requirements.txt: {install_seconds:.0f} s; "
          f"postBuild: {time.monotonic() - started:.0f} s")
    yield BinderEnv(root, venv, env, install_seconds, post_build)


def test_binder_files_follow_repo2docker_rules() -> None:
    post_build = (BINDER / "postBuild").read_text()
    start = (BINDER / "start").read_text()
    assert post_build.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in post_build
    assert start.rstrip().splitlines()[-1] == 'exec "$@"'
    assert os.access(BINDER / "postBuild", os.X_OK) and os.access(BINDER / "start", os.X_OK)
    lines = [line.strip() for line in (BINDER / "requirements.txt").read_text().splitlines()]
    assert ".[frameworks]" in lines, \
        "requirements.txt must install Kernos from this repository, with the frameworks of 08"
    assert any(line.startswith("jupyterlab>=4.6") for line in lines)
    # The lab workspace opens every example, and only notebooks that exist.
    layout = json.loads((BINDER / "lab-workspace.json").read_text())
    opened = layout["data"]["layout-restorer:data"]["main"]["dock"]["widgets"]
    assert opened == [f"notebook:examples/{path.name}" for path in NOTEBOOKS]
    default_url = json.loads((BINDER / "jupyter_server_config.json").read_text())
    assert (ROOT / default_url["ServerApp"]["default_url"].removeprefix("/lab/tree/")).exists()


def test_kernelspec_is_the_venvs_own(binder: BinderEnv) -> None:
    listed = binder.run("jupyter", "kernelspec", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    specs = json.loads(listed.stdout)["kernelspecs"]
    assert "kernos" in specs, specs
    assert Path(specs["kernos"]["resource_dir"]).is_relative_to(binder.venv)
    assert specs["kernos"]["spec"]["display_name"] == "Kernos (Python 3)"


def test_post_build_succeeds(binder: BinderEnv) -> None:
    """Every check in postBuild passed, the kernos-jupyterlab extension among them."""
    done = binder.post_build
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Kernos kernel, extension and examples are ready" in done.stdout


def test_labextension_is_listed(binder: BinderEnv) -> None:
    listed = binder.run("jupyter", "labextension", "list")
    out = listed.stdout + listed.stderr  # JupyterLab prints the list on stderr
    assert listed.returncode == 0, out
    assert "kernos-jupyterlab" in out, out
    line = next(line for line in out.splitlines() if "kernos-jupyterlab" in line)
    assert "enabled" in line and "OK" in line, line


def test_lab_opens_on_the_examples(binder: BinderEnv) -> None:
    if binder.post_build.returncode != 0:
        pytest.skip("postBuild stopped before it set the lab up (see test_post_build_succeeds)")
    exported = binder.run("jupyter", "lab", "workspaces", "export", "default")
    assert exported.returncode == 0, exported.stderr
    workspace = json.loads(exported.stdout)
    opened = workspace["data"]["layout-restorer:data"]["main"]["dock"]["widgets"]
    assert opened[0] == "notebook:examples/01-researchers-day.ipynb"
    assert len(opened) == len(NOTEBOOKS)
    config = binder.venv / "etc/jupyter/jupyter_server_config.d/kernos-examples.json"
    assert json.loads(config.read_text())["ServerApp"]["default_url"].startswith("/lab/tree/")
    overrides = binder.venv / "share/jupyter/lab/settings/overrides.json"
    assert json.loads(overrides.read_text()) == json.loads((BINDER / "overrides.json").read_text())


def test_start_runs_the_command(binder: BinderEnv) -> None:
    done = binder.run("bash", "binder/start", "python", "-c", "print('server here')")
    assert done.returncode == 0 and done.stdout == "server here\n", done.stderr


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_in_the_binder_env(binder: BinderEnv, notebook: Path, tmp_path: Path,
                                         notebook_run: ModuleType, facts: ModuleType) -> None:
    report = tmp_path / "report.json"
    runner = Path(notebook_run.__file__)
    # This tree's notebooks (the ones facts.py describes), in the environment built from binder/.
    done = binder.run(binder.python, str(runner), str(notebook), str(tmp_path / "workspace"),
                      str(report), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    facts.check(notebook_run.NotebookRun.from_json(report.read_text()))
