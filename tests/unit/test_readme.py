"""The README's examples run, and its set-up commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_core_api_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_readme_starts_with_the_two_setup_commands_and_ci_runs_the_second() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["bash scripts/demo", "bash scripts/test"]
    assert "bash scripts/test" in (ROOT / ".ci" / "run").read_text()
