"""Real-browser tests of the JupyterLab extension: a JupyterLab server, and chromium.

``lab_server`` starts ``jupyter lab`` from this interpreter on 127.0.0.1, on a
free port with a random token, in a temporary root directory, with every
Jupyter directory (config, data, runtime, settings, workspaces) isolated so
the user's settings never leak in, and ``KERNOS_WORKSPACE`` set to a fresh
workspace.  At teardown it shuts the server down through its API and kills
whatever survives, the kernels included.

``browser_context`` launches Debian's chromium through playwright (which
cannot download browsers here) on a fresh profile.  ``open_notebook`` writes a
notebook into the server's root and opens it (``pages.NotebookPage``); every
step a test names with ``notebook.shot(...)`` is saved as a PNG under
``tests/browser/artifacts/<run>/<test>/`` (or under ``$KERNOS_BROWSER_ARTIFACTS``),
and so is the page when a test fails, with the browser console and the server log.
Each run gets a folder of its own (``artifacts/latest`` links to the newest), since
several people may run these tests in one tree at once; the oldest are pruned.

The extension (labextension ``kernos-jupyterlab``) must be installed; these
tests fail, never skip, when it is not.  ``KERNOS_LABEXTENSION=DIR`` serves the
built extension in DIR instead (a worktree's ``kernel/kernos/labextension``,
through the server's own ``JUPYTER_PATH``), so a build can be tested without
installing it where other people's tests run.

Run them with ``.venv/bin/python -m pytest tests/browser`` (about a minute).
``KERNOS_CHROMIUM`` names another chromium binary.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from browser.pages import STEP_TIMEOUT_MS, LabServer, NotebookPage, write_notebook

ARTIFACTS = Path(os.environ.get("KERNOS_BROWSER_ARTIFACTS")
                 or Path(__file__).resolve().parent / "artifacts")
KEEP_RUNS = 10
CHROMIUM = os.environ.get("KERNOS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
EXTENSION = "kernos-jupyterlab"
OVERRIDE = os.environ.get("KERNOS_LABEXTENSION")
SERVER_START_TIMEOUT = 90

BUILD_HINT = (
    "Build it and install it into this environment:\n"
    "    cd extension && jlpm install && jlpm build   (writes kernel/kernos/labextension)\n"
    "then either reinstall the package (pip install -e .), which ships it as shared-data, or\n"
    "link it as `jupyter labextension develop` would:\n"
    f"    ln -s $PWD/kernel/kernos/labextension "
    f"{sys.prefix}/share/jupyter/labextensions/{EXTENSION}"
)


# -- the extension ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def labextension() -> Path:
    """The installed ``kernos-jupyterlab`` labextension directory (fails if it is missing)."""
    installed = (Path(OVERRIDE).resolve() if OVERRIDE else
                 Path(sys.prefix) / "share" / "jupyter" / "labextensions" / EXTENSION)
    package = installed / "package.json"
    if not package.is_file():
        pytest.fail(f"The JupyterLab extension {EXTENSION!r} is not installed: {package} "
                    f"does not exist.\n{BUILD_HINT}", pytrace=False)
    if not any((installed / "static").glob("remoteEntry.*.js")):
        pytest.fail(f"The JupyterLab extension {EXTENSION!r} at {installed} is not built: "
                    f"static/remoteEntry.*.js is missing.\n{BUILD_HINT}", pytrace=False)
    return installed


# -- the server ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def _user_settings(settings: Path) -> None:
    """Settings that keep a run deterministic: no news or update toasts, no auto-closing."""
    files = {
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
            {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
            {"codeCellConfig": {"autoClosingBrackets": False}},
    }
    for name, value in files.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """This run's artifact folder (``ARTIFACTS/<time>-<pid>``); ``ARTIFACTS/latest`` links it."""
    run = ARTIFACTS / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run.mkdir(parents=True)
    latest = ARTIFACTS / "latest"
    with contextlib.suppress(OSError):
        staged = ARTIFACTS / f".latest-{os.getpid()}"
        staged.unlink(missing_ok=True)
        staged.symlink_to(run.name)
        staged.replace(latest)
    runs = sorted(folder for folder in ARTIFACTS.iterdir()
                  if folder.is_dir() and not folder.is_symlink() and folder.name[:1].isdigit())
    for old in runs[:-KEEP_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
    return run


@pytest.fixture(scope="module")
def lab_options() -> dict[str, Any]:
    """Extra ``jupyter lab`` arguments (``args``) and environment (``env``) for the module's
    server; a test module overrides it (the gateway test adds ``--gateway-url``)."""
    return {"args": [], "env": {}}


@pytest.fixture(scope="module")
def lab_server(labextension: Path, artifacts: Path, lab_options: dict[str, Any],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """A real JupyterLab server with the installed extension, isolated from the user's setup."""
    base = tmp_path_factory.mktemp("lab")
    root, workspace, jupyter = base / "root", base / "workspace", base / "jupyter"
    root.mkdir()
    settings = jupyter / "lab-settings"
    _user_settings(settings)
    log = artifacts / f"server-{base.name}.log"
    token = secrets.token_hex(16)
    port = _free_port()
    env = dict(os.environ)
    for leaking in ("JPY_SESSION_NAME", "JUPYTER_PATH", "JUPYTER_CONFIG_PATH",
                    "JUPYTERLAB_DIR", "KERNOS_WORKSPACE"):
        env.pop(leaking, None)
    env.update(
        KERNOS_WORKSPACE=str(workspace),
        JUPYTER_CONFIG_DIR=str(jupyter / "config"),
        JUPYTER_DATA_DIR=str(jupyter / "data"),
        JUPYTER_RUNTIME_DIR=str(jupyter / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(jupyter / "lab-workspaces"),
        IPYTHONDIR=str(jupyter / "ipython"),
        PYTHONUNBUFFERED="1",
    )
    if OVERRIDE:  # JUPYTER_PATH comes before sys.prefix: this build wins
        served = jupyter / "path" / "labextensions"
        served.mkdir(parents=True)
        (served / EXTENSION).symlink_to(labextension)
        env["JUPYTER_PATH"] = str(jupyter / "path")
    env.update(lab_options["env"])
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
        f"--port={port}", "--port-retries=0", "--allow-root",
        f"--ServerApp.token={token}", "--ServerApp.password=",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        *lab_options["args"],
    ]
    started = time.monotonic()
    with log.open("ab") as sink:
        sink.write(f"\n===== {' '.join(command)}\n".encode())
        sink.flush()
        process = subprocess.Popen(command, cwd=root, env=env, stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = LabServer(url=f"http://127.0.0.1:{port}", token=token, root=root,
                       workspace=workspace, log=log, pid=process.pid)
    try:
        _wait_for_status(server, process, started)
        yield server
    finally:
        _stop(server, process)


def _wait_for_status(server: LabServer, process: subprocess.Popen[bytes],
                     started: float) -> None:
    deadline = started + SERVER_START_TIMEOUT
    while True:
        if process.poll() is not None:
            pytest.fail(f"jupyter lab exited ({process.returncode}) while starting:\n"
                        f"{server.log_tail()}", pytrace=False)
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            server.api("/api/status")
            print(f"jupyter lab answered in {time.monotonic() - started:.1f} s at {server.url}")
            return
        if time.monotonic() > deadline:
            pytest.fail(f"jupyter lab did not answer /api/status in {SERVER_START_TIMEOUT} s:\n"
                        f"{server.log_tail()}", pytrace=False)
        time.sleep(0.2)


def _stop(server: LabServer, process: subprocess.Popen[bytes]) -> None:
    """Shut the server down (it shuts its kernels down), then kill whatever survives."""
    server.remember_kernels()
    if process.poll() is None:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            server.api("/api/shutdown", method="POST")
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    # Kernels run in sessions of their own, so killing the server's group misses them.
    deadline = time.monotonic() + 10
    survivors = {pid for pid in server.kernel_pids if _alive(pid)}
    while survivors and time.monotonic() < deadline:
        time.sleep(0.1)
        survivors = {pid for pid in survivors if _alive(pid)}
    for pid in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- the browser -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def playwright_driver() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        yield driver


@pytest.fixture
def browser_context(playwright_driver: Any, tmp_path: Path) -> Iterator[Any]:
    """A headless chromium on a fresh profile (user-data-dir), 1400x900."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"chromium is not at {CHROMIUM}: apt-get install -y chromium, or set "
                    "KERNOS_CHROMIUM to a chromium binary", pytrace=False)
    context = playwright_driver.chromium.launch_persistent_context(
        user_data_dir=str(tmp_path / "chromium-profile"), executable_path=CHROMIUM,
        headless=True, args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 900})
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        yield context
    finally:
        context.close()


# -- notebooks and artifacts -----------------------------------------------------------------


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so fixtures know at teardown if the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _artifact_dir(run: Path, item: pytest.Item) -> Path:
    folder = run / re.sub(r"[^A-Za-z0-9_.-]+", "-", item.name).strip("-")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def open_notebook(lab_server: LabServer, browser_context: Any, artifacts: Path,
                  request: pytest.FixtureRequest) -> Iterator[Callable[..., NotebookPage]]:
    """``open_notebook(name, kernel="kernos")``: write ``name.ipynb``, open it, return its page.

    Each test starts on an empty workspace: no kernel runs when it starts, so the
    previous test's workspace is removed.  The kernel is started and idle when this
    returns.  At teardown every kernel is shut down, after a ``failure`` screenshot
    if the test failed.
    """
    for kernel in lab_server.api("/api/kernels"):
        lab_server.api(f"/api/kernels/{kernel['id']}", method="DELETE")
    shutil.rmtree(lab_server.workspace, ignore_errors=True)
    folder = _artifact_dir(artifacts, request.node)
    pages: list[NotebookPage] = []

    def _open(name: str, kernel: str = "kernos") -> NotebookPage:
        write_notebook(lab_server.root / f"{name}.ipynb", kernel)
        page = NotebookPage(browser_context.new_page(), lab_server, folder, f"{name}.ipynb",
                            kernel)
        pages.append(page)
        page.open()
        return page

    yield _open
    failed = any(getattr(getattr(request.node, f"report_{when}", None), "failed", False)
                 for when in ("setup", "call"))
    for page in pages:
        if failed:
            with contextlib.suppress(Exception):
                page.shot("failure")
        with contextlib.suppress(Exception):
            page.write_console_log()
    lab_server.remember_kernels()
    with contextlib.suppress(Exception):
        for kernel in lab_server.api("/api/kernels"):
            lab_server.api(f"/api/kernels/{kernel['id']}", method="DELETE")

