"""The compatibility corpus: a report of every notebook's comparison at the end of the run.

Each test of ``test_corpus.py`` writes its summary lines through ``corpus_report``;
they travel with the test's report (as ``user_properties``, so also from a
pytest-xdist worker) and ``tests/conftest.py`` prints them as a section of
pytest's terminal summary, whether the tests passed or not, so that the run
says how many cells were compared and why each difference was allowed.
``python3_runs`` keeps the stock kernel's run of a notebook for the keep-mode
test, which compares a second Kernos run against it (the corpus runs on one
worker; a keep-mode test without that run makes its own).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from compat.corpus import NotebookRun

TITLE = "compatibility corpus: python3 against kernos"


@pytest.fixture
def corpus_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Adds a line to the corpus's report."""

    def report(line: str) -> None:
        request.node.user_properties.append((f"summary:{TITLE}", line))

    return report


@pytest.fixture(scope="session")
def python3_runs() -> dict[str, NotebookRun]:
    return {}
