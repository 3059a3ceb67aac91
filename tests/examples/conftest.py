"""The example notebooks (``examples/*.ipynb``), run on real Kernos kernels.

``notebook_run.py`` runs a notebook cell by cell and is also a script, so
that the simulated Binder environment runs notebooks with its own
interpreter; ``facts.py`` holds what each notebook must show beyond "no
error".  Both are loaded by path, as siblings of this file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent


def load_sibling(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def notebook_run() -> ModuleType:
    return load_sibling("notebook_run")


@pytest.fixture(scope="session")
def facts() -> ModuleType:
    return load_sibling("facts")
