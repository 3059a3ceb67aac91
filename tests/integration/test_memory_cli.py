"""``kernos memory recall|rebuild|stats`` and ``kernos replay`` of ops that recalled.

A real kernel runs on the workspace (the CLI borrows it through its
``kernel.json``); agents recall and remember through harness ops, the human
through ``agents.recall`` in a cell.  Then the kernel stops and ``kernos replay``
re-runs every op: each recall is answered from its op's audit record, so the
replayed images equal the originals (an agent that keeps what it recalled in
its namespace makes the answer part of the image).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kernos.client import KernosClient

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``kernos ARGS`` in a process of its own (this tree's Kernos, through PYTHONPATH)."""
    env = {key: value for key, value in os.environ.items() if key != "KERNOS_WORKSPACE"}
    return subprocess.run([sys.executable, "-m", "kernos.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _prepare(kernel: Kernel) -> None:
    assert kernel.run("kiwi_ledger = 'kiwi ledger of the human'\n"
                      "agents.add('alice'); agents.add('bob')\n"
                      "agents.grant('alice', 'memory:read')\n"
                      "agents.grant('alice', 'memory:write')\n"
                      "agents.grant('bob', 'memory:read')").committed
    with KernosClient.connect(kernel.workspace) as client:
        assert client.op("kiwi_note = 'kiwi of alice'\nremember('kiwi birds cannot fly')",
                         principal="alice").committed
        assert client.remember("kiwi fruit is green", principal="alice", tags=["food"])["op"]
        kept = client.op("found = recall('kiwi', k=10)\nbrief = context(60, 'kiwi')",
                         principal="alice")
        assert kept.committed, kept.error
        assert client.op("seen = recall('kiwi')", principal="bob").committed
    assert kernel.run("hits = agents.recall('kiwi', k=10)\n"
                      "theirs = agents.recall('kiwi', as_='alice', k=10)").committed


def test_memory_commands(kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    _prepare(kernel)
    workspace = str(kernel.workspace)

    result = cli("memory", "recall", "kiwi", "--as", "alice", "-k", "20", "--json",
                 "-w", workspace)
    assert result.returncode == 0, result.stderr
    memories = json.loads(result.stdout)["memories"]
    assert memories and {memory["principal"] for memory in memories} == {"alice"}
    result = cli("memory", "recall", "kiwi fly", "--as", "alice", "--kinds", "semantic",
                 "-k", "1", "-w", workspace)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[semantic] fact 1 (alice): kiwi birds cannot fly"
    result = cli("memory", "recall", "kiwi", "--as", "bob", "--json", "-w", workspace)
    assert {m["principal"] for m in json.loads(result.stdout)["memories"]} <= {"bob"}

    stats = json.loads(cli("memory", "stats", "--json", "-w", workspace).stdout)
    assert stats["entries"]["semantic"] == 2 and stats["entries"]["episodic"] >= 5
    rebuilt = cli("memory", "rebuild", "-w", workspace)
    assert rebuilt.returncode == 0 and rebuilt.stdout.startswith("Rebuilt "), rebuilt
    again = json.loads(cli("memory", "stats", "--json", "-w", workspace).stdout)
    assert again["entries"] == stats["entries"]
    assert again["built_to"] == stats["built_to"]

    # A missing index (deleted under the running kernel) is rebuilt at the next recall.
    (kernel.workspace / "memory" / "index.sqlite").unlink()
    result = cli("memory", "recall", "kiwi fly", "--as", "alice", "--kinds", "semantic",
                 "-k", "1", "-w", workspace)
    assert result.stdout.strip() == "[semantic] fact 1 (alice): kiwi birds cannot fly", result
    assert json.loads(cli("memory", "stats", "--json", "-w", workspace).stdout)[
        "entries"]["episodic"] == stats["entries"]["episodic"]

    for args, words in ((("--as", "nobody"), "nobody"), (("--kinds", "secrets"), "secrets"),
                        (("-k", "0"), "k from 1")):
        failed = cli("memory", "recall", "kiwi", *args, "-w", workspace)
        assert failed.returncode == 2, (args, failed.returncode, failed.stderr)
        assert failed.stderr.startswith("kernos memory: ") and words in failed.stderr, failed
        assert "Traceback" not in failed.stderr


def test_replay_answers_recalls_as_they_were(kernel_factory: Callable[..., Kernel],
                                              tmp_path: Path) -> None:
    kernel = kernel_factory()
    _prepare(kernel)
    kernel.stop()
    result = cli("replay", "--json", "--into", str(tmp_path / "replayed"), "-w",
                 str(kernel.workspace))
    report = json.loads(result.stdout)
    assert result.returncode == 0, (report.get("divergence"), result.stderr)
    assert report["divergence"] is None
    assert all(step["replayed"] == step["status"] for step in report["steps"])
    # The replayed ops recorded the same recalls as the originals.
    original = _recalls(kernel.workspace)
    assert original and _recalls(tmp_path / "replayed") == original


def _recalls(workspace: Path) -> list[object]:
    records = [json.loads(line) for line in
               (workspace / "audit" / "chain.jsonl").read_text().splitlines()]
    return [(record["op"], item["request"], item["answer"].get("sha256"))
            for record in records if record.get("type") == "op"
            for item in record.get("memory") or []]


def test_help() -> None:
    listed = cli("--help").stdout
    assert "memory" in listed
    for command in ("memory", "memory recall", "memory rebuild", "memory stats"):
        shown = cli(*command.split(), "--help")
        assert shown.returncode == 0 and "usage: kernos " + command in shown.stdout, shown
    for sub in ("recall", "rebuild", "stats"):
        shown = cli("memory", sub, "--help").stdout
        assert "exit status:" in shown and "--workspace" in shown and "--json" in shown
    assert "--as NAME" in cli("memory", "recall", "--help").stdout
