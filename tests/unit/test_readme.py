"""The README's and the documentation's examples run, the README's set-up commands are
the ones CI runs, and its links into the site lead to pages that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
PAGES = sorted(path for path in DOCS.rglob("*.md")
               if not {"_build", "examples"} & set(path.relative_to(DOCS).parts))


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_the_core_api_example_runs() -> None:
    blocks = python_blocks(README)
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p.read_text())],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_documentation_examples_run(page: Path) -> None:
    for block in python_blocks(page.read_text()):
        exec(compile(block, str(page.relative_to(ROOT)), "exec"), {})


def test_the_moved_examples_are_still_run() -> None:
    """The examples that left the README for the site are run there (the test above)."""
    pages = {str(p.relative_to(ROOT / "docs")) for p in PAGES if python_blocks(p.read_text())}
    assert {"how-to/agents.md", "how-to/loops.md", "how-to/effects-and-llm.md",
            "how-to/events.md", "harness-protocol.md", "how-it-works.md",
            "tutorials/harness.md"} <= pages


def test_readme_starts_with_the_two_setup_commands_and_ci_runs_the_second() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["bash scripts/demo", "bash scripts/test"]
    assert "bash scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_readme_is_a_front_page_whose_links_lead_somewhere() -> None:
    assert len(README.splitlines()) < 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert "docs/index.md" in local and "docs/architecture.md" in local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
