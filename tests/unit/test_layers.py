"""The shape of the codebase, checked: the floors hold, their holes are explained,
and every module is short enough to read.

- ``lint-imports`` (import-linter) checks the contracts of ``.importlinter``: the
  floors of ``kernos`` (a ``layers`` contract), no circle among the modules of
  any package (``acyclic_siblings``), and a store that knows nothing of what is
  stored in it (``forbidden``).  It runs here, as a real subprocess, so CI
  checks them on every run.
- A contract is weakened by an ``ignore_imports`` entry: each one must carry,
  on the line above it, a comment that says why that arrow has to stay.  The
  check is run on the real file and, to show it can fail, on a planted one.
- The three contracts exist, over the whole package: deleting one, or
  narrowing it, is a weakening too.
- No module of ``kernel/kernos`` is longer than 600 lines.
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / ".importlinter"
PACKAGE = ROOT / "kernel" / "kernos"
LONGEST = 600


def unexplained_ignores(text: str) -> list[str]:
    """The ``ignore_imports`` entries of a contract file with no reason above them.

    An entry is explained when the line right above it is a comment of at least
    three words (``# the kernel's magics need ...``); an entry right after
    another entry, or after the ``ignore_imports =`` key, is not.
    """
    unexplained: list[str] = []
    in_ignores = False
    previous = ""
    for line in text.splitlines():
        stripped = line.strip()
        if re.match(r"^ignore_imports\s*[=:]", line):
            in_ignores = True
            value = line.split("=", 1)[1].strip() if "=" in line else ""
            if value:  # an entry on the key's own line has nothing above it
                unexplained.append(value)
            previous = ""
            continue
        if in_ignores:
            if line and not line[0].isspace() and not stripped.startswith("#"):
                in_ignores = False  # the next key or section
            elif stripped and not stripped.startswith("#"):
                reason = previous[1:].strip() if previous.startswith("#") else ""
                if len(reason.split()) < 3:
                    unexplained.append(stripped)
        previous = stripped
    return unexplained


def contracts() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(CONTRACTS, encoding="utf-8")
    return parser


def test_the_contracts_hold() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "kernel")}
    result = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command as run; run()",
         "--no-cache", "--config", str(CONTRACTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, (
        "an import points the wrong way (see .importlinter and docs/architecture.md):\n"
        + result.stdout[-6000:] + result.stderr[-2000:]
    )
    assert "0 broken" in result.stdout, result.stdout[-2000:]


def test_every_ignored_import_says_why() -> None:
    assert unexplained_ignores(CONTRACTS.read_text(encoding="utf-8")) == []


def test_an_unexplained_ignore_is_found(tmp_path: Path) -> None:
    planted = CONTRACTS.read_text(encoding="utf-8") + (
        "\n[importlinter:contract:planted]\n"
        "name = planted\n"
        "type = forbidden\n"
        "source_modules =\n    kernos.store\n"
        "forbidden_modules =\n    kernos.op\n"
        "ignore_imports =\n"
        "    # the workspace reads the op's id while it recovers\n"
        "    kernos.store.workspace -> kernos.op\n"
        "    kernos.store.snapshots -> kernos.op\n"
        "    # ok\n"
        "    kernos.store.retention -> kernos.op\n"
    )
    assert unexplained_ignores(planted) == [
        "kernos.store.snapshots -> kernos.op",
        "kernos.store.retention -> kernos.op",
    ]


def test_the_contracts_cover_the_whole_package() -> None:
    parser = contracts()
    assert parser["importlinter"]["root_package"].strip() == "kernos"
    by_type: dict[str, configparser.SectionProxy] = {}
    for name in parser.sections():
        if name.startswith("importlinter:contract:"):
            by_type.setdefault(parser[name]["type"].strip(), parser[name])
    floors = by_type["layers"]
    assert floors["containers"].split() == ["kernos"]
    layered = {
        name.strip().strip("()")
        for line in floors["layers"].splitlines()
        for name in re.split(r"[|:]", line)
        if name.strip()
    }
    # every top-level module and package of kernos sits on a floor
    present = {
        path.stem for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    } - {"__main__"}
    assert present - layered == set(), "modules on no floor of .importlinter"
    assert by_type["acyclic_siblings"]["ancestors"].split() == ["kernos"]
    assert "depth" not in by_type["acyclic_siblings"]
    store = by_type["forbidden"]
    assert store["source_modules"].split() == ["kernos.store"]
    assert {"kernos.audit", "kernos.op", "kernos.image"} <= set(store["forbidden_modules"].split())


def test_every_module_is_short_enough_to_read() -> None:
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
               for path in PACKAGE.rglob("*.py")}
    assert len(lengths) > 100, "the package's modules were not found"
    too_long = {module: lines for module, lines in lengths.items() if lines > LONGEST}
    assert not too_long, (
        f"past {LONGEST} lines: {too_long}; split each along a seam a reader would name")
