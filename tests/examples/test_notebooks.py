"""Every example notebook runs top to bottom on a real Kernos kernel and shows what it says.

Each notebook gets a fresh workspace.  A cell fails the test if it raises
without the ``raises-exception`` tag, or carries the tag and does not raise;
the kernel is restarted before cells tagged ``kernos-restart-before``, killed
with SIGKILL and started again before ``kernos-kill-before``, and the agents'
loops are let run to rest before ``kernos-wait-loops``; then
``facts.py`` checks what the notebook claims (the state after the restart
equals the state before it, the denied op left nothing, ...).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import nbformat
import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))


def test_the_examples_are_there() -> None:
    assert [path.name[:3] for path in NOTEBOOKS] == [f"{n:02}-" for n in range(1, 9)]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_and_shows_its_facts(notebook: Path, tmp_path: Path,
                                           notebook_run: ModuleType, facts: ModuleType) -> None:
    run = notebook_run.run_notebook(notebook, tmp_path / "workspace")
    facts.check(run)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_is_committed_clean(notebook: Path) -> None:
    """Outputs cleared, the kernos kernelspec, valid nbformat 4."""
    document = nbformat.read(notebook, as_version=4)
    nbformat.validate(document)
    assert document.nbformat == 4
    assert document.metadata["kernelspec"]["name"] == "kernos"
    assert document.metadata["kernelspec"]["display_name"] == "Kernos (Python 3)"
    for cell in document.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.id
