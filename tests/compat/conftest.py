"""The compatibility corpus: a report of every notebook's comparison at the end of the run.

Each test of ``test_corpus.py`` adds its summary lines here; they are printed
as a section of pytest's terminal summary, whether the tests passed or not,
so that the run says how many cells were compared and why each difference
was allowed.  ``python3_runs`` keeps the stock kernel's run of a notebook for
the keep-mode test, which compares a second Kernos run against it.
"""

from __future__ import annotations

import pytest

from compat.corpus import NotebookRun

_REPORT = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def corpus_report(pytestconfig: pytest.Config) -> list[str]:
    return pytestconfig.stash.setdefault(_REPORT, [])


@pytest.fixture(scope="session")
def python3_runs() -> dict[str, NotebookRun]:
    return {}


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    lines = config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.write_sep("=", "compatibility corpus: python3 against kernos")
        for line in lines:
            terminalreporter.write_line(line)
