"""Agents get files, under grants (issue 36), through a real kernel.

``%%agent`` cells call ``files.write`` and friends; the human grants
``file:write:reports/*`` with ``%kernos grant``.  With the grant the report is
committed (on disk under the workspace's files root, in the snapshot's
manifest, in the audit record) and survives ``kill -9``; without it the write
is refused, the op vetoed, and nothing of it remains: no file, no name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents_support import agent, committed, denials, error_text, fails, names_of
from kernos import Workspace
from kernos.store.snapshots import read_snapshot

pytestmark = pytest.mark.kernel

REPORT = "# Report\n\nAll good.\n"


def head_manifest(workspace: Path) -> dict[str, Any]:
    with Workspace.open(workspace, writable=False) as reader:
        head = reader.head()
        assert head is not None
        return read_snapshot(reader, head).manifest


def op_records(workspace: Path) -> list[dict[str, Any]]:
    lines = (workspace / "audit" / "chain.jsonl").read_text(encoding="utf-8").splitlines()
    return [record for record in map(json.loads, lines) if record.get("type") == "op"]


def test_with_the_grant_the_report_is_committed_and_survives_kill9(
        kernel_factory: Any) -> None:
    kernel = kernel_factory()
    workspace = kernel.workspace
    committed(kernel, "%kernos agent add alice\n%kernos grant alice file:write:reports/*")
    result = committed(kernel, agent("alice", (
        f"n = files.write('reports/r.md', {REPORT!r})\n"
        "print(n, files.list('reports'), files.read('reports/r.md') == "
        f"{REPORT!r})")))
    assert result.stdout == f"{len(REPORT)} ['reports/r.md'] True\n", result.stdout
    path = workspace / "files" / "reports" / "r.md"
    assert path.read_text() == REPORT
    assert head_manifest(workspace)["files"] == {"added": ["reports/r.md"]}
    record = op_records(workspace)[-1]
    assert record["status"] == "committed"
    assert record["grants"]["used"] == [{"id": "g1", "capability": "file:write:reports/*"}]
    assert [(a["action"], a["path"], a["outcome"], a.get("grant"))
            for a in record["file_access"]] == [
        ("write", "reports/r.md", "ok", "g1"), ("list", "reports", "ok", None),
        ("read", "reports/r.md", "ok", "g1")]

    kernel.kill9()
    again = kernel_factory(workspace)
    assert path.read_text() == REPORT
    shown = committed(again, agent("alice", "print(files.read('reports/r.md'))"))
    assert shown.stdout == REPORT + "\n"


def test_without_the_grant_the_write_is_refused_and_the_op_vetoed(kernel: Any) -> None:
    workspace = kernel.workspace
    committed(kernel, "%kernos agent add bob\n%kernos grant bob file:read:reports/*")
    fails(kernel, agent("bob", (
        "draft = 'kept?'\n"
        "files.write('agents/bob/draft.md', 'its own subtree needs no grant')\n"
        f"files.write('reports/r.md', {REPORT!r})\n")),
        "CapabilityDenied", "'bob'", "file:write:reports/r.md")
    assert not (workspace / "files" / "reports").exists()
    assert not (workspace / "files" / "agents" / "bob").exists()  # rolled back with the op
    assert "draft" not in names_of(kernel, "bob")
    assert [d["capability"] for d in denials(workspace)] == ["file:write:reports/r.md"]
    record = next(r for r in op_records(workspace) if r["principal"] == "bob")
    assert record["status"] == "denied"
    assert record["file_access"][-1] == {"principal": "bob", "action": "write",
                                         "path": "reports/r.md", "outcome": "denied"}

    # Caught by the agent, the denial still vetoes the op.
    result = kernel.run(agent("bob", (
        "caught = True\n"
        "try:\n"
        "    files.write('reports/r.md', 'x')\n"
        "except CapabilityDenied:\n"
        "    print('caught')\n")))
    assert result.status == "error" and result.rolled_back, (result.kernos, result.stdout)
    assert "caught" in result.stdout, error_text(result)
    assert "caught" not in names_of(kernel, "bob")
    assert not (workspace / "files" / "reports").exists()

    # Its own subtree, alone, commits.
    committed(kernel, agent("bob", "files.write('agents/bob/draft.md', 'mine')"))
    assert (workspace / "files" / "agents" / "bob" / "draft.md").read_text() == "mine"


def test_bad_paths_and_links_are_refused_in_agent_code(kernel: Any, tmp_path: Path) -> None:
    workspace = kernel.workspace
    committed(kernel, "%kernos agent add carol\n%kernos grant carol file:read:**")
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    committed(kernel, f"import os, kernos.files\nos.symlink({str(secret)!r}, "
                      "kernos.files.path('link.txt'))")
    for path, words in (("../../etc/passwd", "'..' component"),
                        ("/etc/passwd", "absolute"),
                        ("link.txt", "symbolic link")):
        fails(kernel, agent("carol", f"print(files.read({path!r}))"), "PathRefused", words)
    assert "SECRET" not in committed(kernel, agent("carol", "print(files.list())")).stdout
    assert (workspace / "files" / "link.txt").is_symlink()
