"""The documentation site builds with no warning (scripts/docs, a real sphinx-build).

Warnings are errors there: a relative link to a page or heading that does not exist,
a docstring that does not render, a page left out of every table of contents.  As
scripts/docs does, the build first runs the example notebooks on a real Kernos
kernel (scripts/execute-examples, into docs/examples), and the pages show those
outputs."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    executed = subprocess.run([sys.executable, str(ROOT / "scripts" / "execute-examples"),
                               str(ROOT / "docs" / "examples")],
                              cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert executed.returncode == 0, executed.stdout + executed.stderr
    out = tmp_path / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    assert "WARNING" not in build.stderr, build.stderr
    for page in ("index", "architecture", "api", "tutorials/researcher", "tutorials/harness",
                 "examples/01-researchers-day"):
        assert (out / f"{page}.html").is_file(), page
    researcher = (out / "examples" / "01-researchers-day.html").read_text()
    assert "cell_output" in researcher  # rendered with the outputs of the run
    api = (out / "api.html").read_text()
    assert "kernos.Image" in api and "KernosClient" in api  # autodoc found the public faces


def test_scripts_docs_builds_the_same_way() -> None:
    script = (ROOT / "scripts" / "docs").read_text()
    assert "scripts/execute-examples docs/examples" in script
    assert "-m sphinx -W --keep-going -b html" in script


def test_the_architecture_page_draws_the_floors_of_importlinter() -> None:
    """docs/architecture.md's table is the `layers` contract of .importlinter, in order."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    written = [[name.strip().strip("()") for name in line.split("|")]
               for line in config["importlinter:contract:floors"]["layers"].split("\n")
               if line.strip()]
    page = (ROOT / "docs" / "architecture.md").read_text()
    table = page.split("<!-- end of floors -->")[0].split("floors: copied from .importlinter")[1]
    drawn = [re.findall(r"`([\w.]+)`", row.split("|", 2)[2])
             for row in table.splitlines() if re.match(r"\| \d", row)]
    assert drawn == written
    for floor in written:                       # one paragraph per floor, in the same words
        assert "**" + " | ".join(f"`{name}`" for name in floor) + ".**" in page, floor


NOT_MODULES = {"kernos.json", "kernos.circuit.open"}  # a manifest's file name; an event topic


def test_every_module_the_pages_name_exists() -> None:
    """A page that names `kernos.x.y` names a module (or a name in one) that imports:
    modules move, and the prose must follow them."""
    import importlib

    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs").glob("*/*.md")]
    named = {name for page in pages if "examples" not in page.parts[-2:-1]
             for name in re.findall(r"`(kernos(?:\.\w+)+)`", page.read_text())}
    missing = []
    for name in sorted(named - NOT_MODULES):
        try:
            importlib.import_module(name)
        except ImportError:
            module, _, attribute = name.rpartition(".")
            try:
                getattr(importlib.import_module(module), attribute)
            except (ImportError, AttributeError):
                missing.append(name)
    assert not missing, f"the pages name modules that do not exist: {missing}"
