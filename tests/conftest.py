"""Shared fixtures (a fresh workspace directory, an in-process image on it), the
markers and pytest-xdist groups of the collected tests, and the run's summaries."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernos import Image, Workspace

# Folders whose tests share one expensive session (a JupyterLab server and a browser,
# an Enterprise Gateway, the stock kernel's runs of the corpus): under pytest-xdist
# each runs whole on one worker.  Every other test file is a group of its own, so
# its module-scoped fixtures (a Binder venv, a seeded history) are built once.
SHARED_SESSIONS = ("browser", "gateway", "compat")
SUMMARY = "summary:"
"""``user_properties`` named ``summary:TITLE`` are printed under TITLE at the end of the run."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that need the built JupyterLab extension (a real browser, Binder),
    and put each in the pytest-xdist group it must share a worker with."""
    tests = Path(__file__).resolve().parent
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if "browser" in path.parts or path.name == "test_binder.py":
            item.add_marker(pytest.mark.extension)
        folder = path.relative_to(tests).parts[0] if path.is_relative_to(tests) else ""
        group = folder if folder in SHARED_SESSIONS else str(path)
        item.add_marker(pytest.mark.xdist_group(group))


class _Summaries:
    """Collects the ``summary:`` lines tests leave as ``user_properties`` (which
    pytest-xdist carries from its workers to the process that reports) and prints
    them, one section per title, at the end of the run, failed or not."""

    def __init__(self) -> None:
        self.sections: dict[str, list[str]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name.startswith(SUMMARY):
                self.sections.setdefault(name[len(SUMMARY):], []).append(str(value))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for title, lines in self.sections.items():
            terminalreporter.write_sep("=", title)
            for line in lines:
                terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Summaries(), "kernos-summaries")


@pytest.fixture
def workspace_dir(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


@pytest.fixture
def workspace(workspace_dir: Path) -> Iterator[Workspace]:
    with Workspace.open(workspace_dir) as opened:
        yield opened


class Session:
    """An in-process image, with a helper that runs code as one op (like a cell)."""

    def __init__(self, workspace: Workspace) -> None:
        self.module = types.ModuleType("__main__")
        self.namespace = self.module.__dict__
        self.image = Image(workspace, self.namespace, module=self.module)
        self.restore_report = self.image.restore()

    def run(self, source: str):  # type: ignore[no-untyped-def]
        """Run ``source`` as an op: commit if it succeeds, roll back (and re-raise) if not."""
        op = self.image.begin(source=source)
        try:
            exec(compile(source, f"<op {op.id}>", "exec"), self.namespace)
        except BaseException:
            op.abort()
            raise
        return op.commit()

    @property
    def user(self) -> dict[str, object]:
        return {k: v for k, v in self.namespace.items() if not k.startswith("__")}


@pytest.fixture
def session(workspace: Workspace) -> Session:
    return Session(workspace)


@pytest.fixture
def reopen(workspace_dir: Path) -> Iterator[object]:
    """Open the workspace again in a new in-process session (after closing the old one)."""
    opened: list[Workspace] = []

    def _reopen(previous: Workspace | None = None) -> Session:
        if previous is not None:
            previous.close()
        for workspace in opened:
            workspace.close()
        workspace = Workspace.open(workspace_dir)
        opened.append(workspace)
        return Session(workspace)

    yield _reopen
    for workspace in opened:
        workspace.close()


@pytest.fixture
def points_passed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The crash points (``kernos._faults.point``) the test passes, in order; each still
    does what it does (crashes, if one is armed)."""
    from kernos import _faults

    passed: list[str] = []
    real = _faults.point

    def point(name: str) -> None:
        passed.append(name)
        real(name)

    monkeypatch.setattr(_faults, "point", point)
    return passed
