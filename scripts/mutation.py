"""Mutation testing of the core the invariants rest on (run by scripts/mutation).

Each target maps source files of ``kernel/kernos`` to the fast unit tests that
exercise them; mutmut runs only those tests, and for each mutant only the ones
that reach the mutated function.  mutmut 3 wants the code under ``src/``, so
every run works on a scratch copy in ``.mutation/<target>/`` (the worktree is
never mutated), and the survivors, with their diffs, are written to
``.mutation/survivors-<target>.txt``.

    scripts/mutation                     # every target
    scripts/mutation op transaction      # only these
    scripts/mutation store               # a group: every module of store/, one target each
    scripts/mutation --list              # the targets and their tests
    scripts/mutation --report op         # the last run's table again, without running
    scripts/mutation --survivors op      # re-test only the last run's survivors

Not part of pytest or CI: a full run takes tens of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"

KILLED = ("killed", "timeout", "caught by type check", "segfault")


@dataclass(frozen=True, kw_only=True)
class Target:
    files: tuple[str, ...]
    """Paths under kernel/kernos to mutate."""
    tests: tuple[str, ...]
    """Test files or directories (from the repository root) run against each mutant."""


TARGETS: dict[str, Target] = {
    "transaction": Target(
        files=("transaction.py",),
        tests=("tests/unit/test_transaction.py", "tests/unit/test_transaction_mutants.py"),
    ),
    "op": Target(
        files=("op.py", "image/changes.py", "image/rollback.py"),
        tests=(
            "tests/unit/test_image.py",
            "tests/unit/test_transaction.py",
            "tests/unit/test_unchanged_ops.py",
            "tests/unit/test_rollback_report.py",
            "tests/unit/test_readonly.py",
            "tests/unit/test_personal.py",
            "tests/unit/test_op_mutants.py",
            "tests/unit/agents/test_persistence.py",
        ),
    ),
    "capabilities": Target(
        files=("agents/capabilities.py",),
        tests=("tests/unit/agents/test_capabilities.py",
               "tests/unit/agents/test_capabilities_mutants.py"),
    ),
    "registry": Target(
        files=("agents/registry.py", "llm/schema.py"),
        tests=("tests/unit/agents/test_registry.py", "tests/unit/agents/test_registry_mutants.py"),
    ),
    "effects": Target(
        files=("effects.py",),
        tests=("tests/unit/test_effects.py", "tests/unit/test_effects_mutants.py"),
    ),
    "audit.log": Target(files=("audit/log.py",), tests=("tests/unit/audit",)),
    "audit.verify": Target(files=("audit/verify.py",), tests=("tests/unit/audit",)),
    **{
        f"store.{name}": Target(files=(f"store/{name}.py",), tests=("tests/unit/store",))
        for name in ("aligned", "buffers", "location", "lock", "loose", "maintenance",
                     "object_store", "objects", "packs", "retention", "snapshots", "streams",
                     "tail", "workspace")
    },
}


GROUPS: dict[str, tuple[str, ...]] = {
    group: tuple(name for name in TARGETS if name.startswith(group + "."))
    for group in ("audit", "store")
}
"""A package's modules, each a target of its own (its own scratch copy and results), so
that one module can be re-run, or several at once, without disturbing the others."""


def expand(names: list[str]) -> list[str]:
    """Targets and groups -> targets, in order, each once."""
    chosen: list[str] = []
    for name in names:
        for target in GROUPS.get(name, (name,)):
            if target not in chosen:
                chosen.append(target)
    return chosen


def module_name(file: str) -> str:
    """``agents/registry.py`` -> ``kernos.agents.registry``."""
    return "kernos." + file.removesuffix(".py").replace("/", ".")


def parse_results(text: str) -> dict[str, str]:
    """Mutant name -> status, from the lines of ``mutmut results --all true``."""
    statuses: dict[str, str] = {}
    for line in text.splitlines():
        name, colon, status = line.strip().rpartition(": ")
        if colon and "__mutmut_" in name:
            statuses[name] = status.strip()
    return statuses


def file_of(mutant: str, files: tuple[str, ...]) -> str | None:
    """The target file a mutant belongs to (its name starts ``<module>.x``)."""
    for file in files:
        if mutant.startswith(module_name(file) + ".x"):
            return file
    return None


def tally(statuses: dict[str, str], files: tuple[str, ...]) -> dict[str, Counter[str]]:
    """Per file: how many mutants ended in each status."""
    counts: dict[str, Counter[str]] = {file: Counter() for file in files}
    for mutant, status in statuses.items():
        file = file_of(mutant, files)
        if file is not None:
            counts[file][status] += 1
    return counts


def score(counts: Counter[str]) -> float:
    """Killed (timeouts included) over every mutant, untested ones counted as survivors."""
    total = sum(counts.values())
    return 100.0 * sum(counts[status] for status in KILLED) / total if total else 0.0


def prepare(name: str, target: Target) -> Path:
    """A scratch copy laid out as mutmut expects, configured for this target."""
    scratch = WORK / name
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "src").mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "labextension")
    shutil.copytree(ROOT / "kernel" / "kernos", scratch / "src" / "kernos", ignore=ignore)
    shutil.copytree(ROOT / "tests", scratch / "tests", ignore=ignore)
    tests = [test for test in target.tests if (ROOT / test).exists()]
    config = (ROOT / "pyproject.toml").read_text()
    config += "\n[tool.mutmut]\n"
    config += 'source_paths = ["src/kernos"]\n'
    config += f"only_mutate = {[f'src/kernos/{file}' for file in target.files]!r}\n"
    config += f"pytest_add_cli_args_test_selection = {tests!r}\n"
    config += 'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
    config += "use_git_change_detection = false\n"
    # Forked from mutmut's own process, after the tests ran there, every mutant of op.py
    # hit the CPU limit, whatever it changed: that process has run workspaces (threads,
    # locks).  A fork server that has only collected the tests starts them clean.
    config += 'process_isolation = "forkserver"\n'
    (scratch / "pyproject.toml").write_text(config)
    return scratch


def mutmut(scratch: Path, *args: str, quiet: bool = False) -> str:
    environment = {**os.environ, "PYTHONPATH": "", "NO_COLOR": "1"}
    result = subprocess.run(
        ["nice", "-n", "15", sys.executable, "-m", "mutmut", *args], cwd=scratch,
        env=environment, text=True, stdout=subprocess.PIPE if quiet else None,
    )
    if result.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed ({result.returncode}) in {scratch}")
    return result.stdout or ""


def run(name: str, target: Target, *, mode: str = "all") -> dict[str, Counter[str]]:
    """Run (``all``), re-test the last run's survivors (``survivors``) or re-read it."""
    scratch = WORK / name
    saved = scratch / "statuses.json"
    if mode != "all" and not saved.is_file():
        raise SystemExit(f"{name} has not been run yet (no {saved})")
    if mode == "report":
        statuses: dict[str, str] = json.loads(saved.read_text())
    else:
        previous: dict[str, str] = json.loads(saved.read_text()) if mode == "survivors" else {}
        again = [mutant for mutant, status in previous.items() if status not in KILLED]
        scratch = prepare(name, target)
        if previous:  # the fresh copy keeps the last run's results, should this run be stopped
            saved.write_text(json.dumps(previous, indent=0, sort_keys=True))
        if mode == "survivors" and not again:
            statuses = previous
        else:
            mutmut(scratch, "run", "--max-children", "1", *again, quiet=True)
            found = parse_results(mutmut(scratch, "results", "--all", "true", quiet=True))
            statuses = {**previous, **{mutant: found[mutant] for mutant in again}} \
                if again else found
        saved.write_text(json.dumps(statuses, indent=0, sort_keys=True))
    survivors = sorted(mutant for mutant, status in statuses.items() if status not in KILLED)
    (WORK / f"survivors-{name}.txt").write_text(
        "".join(f"# {mutant}: {statuses[mutant]}\n{diff}\n\n"
                for mutant, diff in zip(survivors, diffs(scratch, survivors), strict=True)))
    return tally(statuses, target.files)


# ``mutmut show`` starts a process per mutant; this asks for all the diffs in one.
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
print(json.dumps([get_diff_for_mutant(name) for name in json.load(sys.stdin)]))
"""


def diffs(scratch: Path, mutants: list[str]) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", _DIFFS], cwd=scratch, input=json.dumps(mutants), text=True,
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ""}, check=True,
    )
    found: list[str] = json.loads(result.stdout)
    return found


HEADER = (f"{'module':<28} {'mutants':>7} {'killed':>6} {'survived':>8} {'no tests':>8} "
          f"{'timeout':>7} {'score':>6}")


def row(file: str, counts: Counter[str]) -> str:
    """One line of the table: ``survived`` and ``no tests`` are both survivors."""
    return (f"{module_name(file):<28} {sum(counts.values()):>7} {counts['killed']:>6} "
            f"{counts['survived']:>8} {counts['no tests']:>8} {counts['timeout']:>7} "
            f"{score(counts):>5.1f}%")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", metavar="target",
                        help=f"any of: {', '.join(TARGETS)}, or a group: {', '.join(GROUPS)} "
                             "(default: all)")
    parser.add_argument("--list", action="store_true", help="show the targets and their tests")
    parser.add_argument("--report", action="store_true",
                        help="report the last run of each target again, without running")
    parser.add_argument("--survivors", action="store_true",
                        help="re-test only the last run's survivors (after adding tests); "
                             "the others keep their last status")
    options = parser.parse_args(argv)
    unknown = [name for name in options.targets if name not in TARGETS and name not in GROUPS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; choose from "
                     f"{', '.join([*TARGETS, *GROUPS])}")
    chosen = expand(options.targets) if options.targets else list(TARGETS)
    if options.list:
        for name in chosen:
            print(f"{name}: {', '.join(TARGETS[name].files)} <- {' '.join(TARGETS[name].tests)}")
        return 0
    print(HEADER, flush=True)
    for name in chosen:
        mode = "report" if options.report else "survivors" if options.survivors else "all"
        for file, counts in run(name, TARGETS[name], mode=mode).items():
            print(row(file, counts), flush=True)
    print(f"\nsurvivors: {WORK}/survivors-<target>.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
