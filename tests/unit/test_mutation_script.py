"""scripts/mutation reads mutmut's results and scores them as it says (no mutmut run here)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mutation.py"


@pytest.fixture(scope="module")
def mutation() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kernos_mutation_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


RESULTS = """\
    kernos.agents.registry.x_shown__mutmut_1: killed
    kernos.agents.registry.xǁRegistryǁgrant__mutmut_3: survived
    kernos.store.lock.x_f__mutmut_2: timeout
    kernos.store.lock.x_f__mutmut_3: no tests
    kernos.store.lock.x_f__mutmut_4: killed
    something else entirely
"""


def test_results_are_parsed_by_mutant(mutation: ModuleType) -> None:
    assert mutation.parse_results(RESULTS) == {
        "kernos.agents.registry.x_shown__mutmut_1": "killed",
        "kernos.agents.registry.xǁRegistryǁgrant__mutmut_3": "survived",
        "kernos.store.lock.x_f__mutmut_2": "timeout",
        "kernos.store.lock.x_f__mutmut_3": "no tests",
        "kernos.store.lock.x_f__mutmut_4": "killed",
    }


def test_mutants_are_counted_per_file_and_scored(mutation: ModuleType) -> None:
    files = ("agents/registry.py", "store/lock.py", "store/tail.py")
    counts = mutation.tally(mutation.parse_results(RESULTS), files)
    assert counts["agents/registry.py"] == Counter(killed=1, survived=1)
    assert counts["store/lock.py"] == Counter({"timeout": 1, "no tests": 1, "killed": 1})
    assert counts["store/tail.py"] == Counter()
    assert mutation.score(counts["agents/registry.py"]) == 50.0
    # Timeouts count as killed; untested mutants as survivors.
    assert mutation.score(counts["store/lock.py"]) == pytest.approx(200 / 3)
    assert mutation.score(Counter()) == 0.0
    assert mutation.row("store/lock.py", counts["store/lock.py"]).split() == [
        "kernos.store.lock", "3", "1", "0", "1", "1", "66.7%"]


def test_a_module_prefix_does_not_claim_a_longer_module(mutation: ModuleType) -> None:
    assert mutation.file_of("kernos.op.x_outcome__mutmut_1", ("op.py",)) == "op.py"
    assert mutation.file_of("kernos.operators.x_f__mutmut_1", ("op.py",)) is None


def test_every_target_names_files_and_tests_that_exist(mutation: ModuleType) -> None:
    root = SCRIPT.parents[1]
    for target in mutation.TARGETS.values():
        for file in target.files:
            assert (root / "kernel" / "kernos" / file).is_file(), file
        assert any((root / test).exists() for test in target.tests)


def test_groups_expand_to_their_modules_in_order_and_once(mutation: ModuleType) -> None:
    assert mutation.GROUPS["audit"] == ("audit.log", "audit.verify")
    store = [name for name in mutation.TARGETS if name.startswith("store.")]
    assert len(mutation.GROUPS["store"]) == len(store) >= 9
    assert all(name.startswith("store.") for name in mutation.GROUPS["store"])
    assert mutation.expand(["op", "audit", "audit.log", "op"]) == [
        "op", "audit.log", "audit.verify"]
    assert mutation.expand(["store.tail"]) == ["store.tail"]
