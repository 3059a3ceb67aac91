"""``kernos fork`` with real kernels: fork beside a running kernel, restore, diverge, verify,
replay (with a recorded LLM call), all through the real CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from audit_support import cli, verify

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

ASK = ("a = llm('gpt-4o-mini', [{'role': 'user', 'content': 'Please answer briefly: what "
       "colour is the sea on a clear and sunny day, {}?'}], max_tokens=40, "
       "mock_response='Blue.')\nanswers = [a['content']]\n")


def _ask(kernel: Kernel, who: str) -> None:
    done = kernel.run(f"agents.run('alice', {ASK.replace('{}', who)!r})")
    assert done.committed, done.errors


def test_a_fork_of_a_running_kernels_workspace_restores_diverges_verifies_and_replays(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    source, dest = tmp_path / "src", tmp_path / "dst"
    kernel = kernel_factory(source)
    here = kernel.run("import kernos; print(kernos.__file__)")
    assert here.stdout.strip() == str(Path(__file__).parents[2] / "kernel/kernos/__init__.py")
    assert kernel.run("agents.add('alice')\nagents.grant('alice', 'llm:gpt-4o-mini', 1000)"
                      ).committed
    _ask(kernel, "source")
    assert kernel.run("import numpy as np\nplan = {'step': 1}\nbig = np.arange(5)\n"
                      "double = (1, 2)").committed
    fork_op = kernel.run("shared = [plan, plan]").kernos["op"]
    assert kernel.run("plan['step'] = 2\nafter = True").committed

    # Forked from an old snapshot while the kernel holds the source (its commits may
    # still be in the tail).
    done = cli("fork", f"{source}@@{fork_op}", str(dest), "--json")
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["op"] == fork_op and made["linked"] + made["tail_objects"] > 0

    forked = kernel_factory(dest)
    assert forked.value("plan") == {"step": 1}
    assert forked.value("[double[1] * 3, big.tolist(), shared[0] is shared[1], 'after' in dir()]"
                        ) == [6, [0, 1, 2, 3, 4], True, False]
    assert forked.value("agents.namespace('alice')['answers']") == ["Blue."]

    # Each goes its own way.
    _ask(forked, "fork")
    assert forked.run("plan['step'] = 'fork'").committed
    assert kernel.run("plan['step'] = 'source'").committed
    assert forked.value("plan") == {"step": "fork"}
    assert kernel.value("plan") == {"step": "source"}
    kernel.stop()
    forked.stop()

    for path in (source, dest):
        verdict = verify(path)
        assert verdict.ok, verdict.problems()
    origin = verify(dest).report["origin"]
    assert origin.startswith(f"forked from {source} at {made['commit'][:12]}")
    assert "confirmed" in origin

    for path, name in ((source, "src-replayed"), (dest, "dst-replayed")):
        replayed = cli("replay", "-w", str(path), "--into", str(tmp_path / name), "--json")
        assert replayed.returncode == 0, (replayed.stdout, replayed.stderr)
        report = json.loads(replayed.stdout)
        assert report["ok"] and report["divergence"] is None
    ops = [step["op"] for step in report["steps"]]
    assert min(ops) > fork_op  # the fork's replay starts from the snapshot it was forked at
    log = (dest / "audit" / "chain.jsonl").read_text().splitlines()
    assert any(json.loads(line).get("llm") for line in log[1:])  # a call the replay answered
