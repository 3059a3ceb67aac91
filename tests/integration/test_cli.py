"""The ``kernos`` command: history without a kernel, the installer and the wheel.

A real kernel writes a workspace with three ops; the CLI then reads it (and
checks out an old snapshot) as a separate process, and a new kernel restores
what the CLI recorded.  Bad input must exit with status 2 and one clear line
on stderr, and change nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support import git_view_current

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]
CELLS = ["x = 1\ny = [1, 2]", "y.append(3)\nz = 'zed'", "del x\nw = 5"]


def kernos_command() -> list[str]:
    script = Path(sys.executable).with_name("kernos")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kernos.cli"]


def cli(*args: str, workspace_env: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("KERNOS_WORKSPACE", None)
    if workspace_env is not None:
        env["KERNOS_WORKSPACE"] = workspace_env
    return subprocess.run([*kernos_command(), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def git_commits(workspace: Path) -> list[str]:
    git_view_current(workspace)
    return subprocess.run(["git", "-C", str(workspace / "history.git"), "rev-list", "main"],
                          check=True, capture_output=True, text=True,
                          timeout=60).stdout.split()


@pytest.fixture
def workspace(kernel_factory: Callable[..., Kernel]) -> Path:
    """A workspace with ops 1-3 (CELLS), whose kernel has been shut down."""
    kernel = kernel_factory()
    for cell in CELLS:
        assert kernel.run(cell).committed
    kernel.stop()
    return kernel.workspace


def assert_clear_failure(result: subprocess.CompletedProcess[str], command: str) -> str:
    """Exit status 2, nothing on stdout, and one line on stderr without a traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"kernos {command}: "), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def test_log_show_and_diff_read_the_history(workspace: Path, tmp_path: Path) -> None:
    log = cli("log", "-w", str(workspace), workspace_env=str(tmp_path / "elsewhere"))
    assert log.returncode == 0, log.stderr
    rows = [line.split() for line in log.stdout.strip().splitlines()[1:]]
    assert [row[0] for row in rows] == ["3", "2", "1"]
    assert all("human" in row for row in rows)
    assert "+z" in log.stdout and "~y" in log.stdout and "-x" in log.stdout
    assert git_commits(workspace)[0].startswith(rows[0][1])
    assert not (tmp_path / "elsewhere").exists(), "-w must win over $KERNOS_WORKSPACE"

    # Without -w the CLI uses $KERNOS_WORKSPACE.
    assert cli("log", "-n", "1", workspace_env=str(workspace)).stdout.count("\n") == 2

    show = cli("show", "-w", str(workspace), "@2")
    assert show.returncode == 0, show.stderr
    assert "op 2 by human" in show.stdout
    assert "    y.append(3)\n    z = 'zed'\n" in show.stdout

    diff = cli("diff", "-w", str(workspace), "@1", "@3")
    assert diff.returncode == 0, diff.stderr
    marks = {line.split()[1]: line.split()[0] for line in diff.stdout.splitlines()[1:]
             if line.split()[0] in ("+", "-", "~")}
    assert marks == {"w": "+", "z": "+", "x": "-", "y": "~"}, diff.stdout
    assert re.search(r"~\s+y\s+list\s+\[1, 2\]\s+->\s+\[1, 2, 3\]", diff.stdout)


def test_json_output_of_the_history(workspace: Path) -> None:
    """log, show, diff and an offline checkout print one JSON document each."""
    ws = ["-w", str(workspace)]
    log = cli("log", *ws, "--json", "-n", "2")
    assert log.returncode == 0, log.stderr
    snapshots = json.loads(log.stdout)["snapshots"]
    assert [(s["op"], s["principal"], s["kind"]) for s in snapshots] == [
        (3, "human", "cell"), (2, "human", "cell")]
    assert snapshots[0]["commit"] == git_commits(workspace)[0]
    assert snapshots[0]["changes"] == {"added": ["w"], "changed": [], "deleted": ["x"]}

    show = json.loads(cli("show", *ws, "--json", "@2").stdout)
    assert (show["op"], show["code"]) == (2, CELLS[1])
    assert {name: (meta["version"], meta["summary"]) for name, meta in show["names"].items()
            } == {"x": (1, "1"), "y": (2, "[1, 2, 3]"), "z": (1, "'zed'")}

    diff = json.loads(cli("diff", *ws, "--json", "@1", "@3").stdout)
    assert (diff["a"], diff["b"]) == (git_commits(workspace)[2], git_commits(workspace)[0])
    assert [e["name"] for e in diff["added"]] == ["w", "z"]
    assert [e["name"] for e in diff["deleted"]] == ["x"]
    assert diff["changed"] == [{"name": "y", "type": "list", "before": "[1, 2]",
                                "after": "[1, 2, 3]"}]

    checkout = cli("checkout", *ws, "--json", "@1")
    assert checkout.returncode == 0, checkout.stderr
    result = json.loads(checkout.stdout)
    assert (result["status"], result["op"], result["kernel"]) == ("committed", 4, None)
    assert result["commit"] == git_commits(workspace)[0]
    assert result["checkout"]["commit"] == git_commits(workspace)[3]
    assert result["checkout"]["names"] == 2

    bad = cli("show", *ws, "--json", "@42")
    assert bad.returncode == 2 and "names no snapshot" in bad.stderr
    assert json.loads(bad.stdout)["error"]["kind"] == "unknown_ref"


def test_reading_works_while_a_kernel_owns_the_workspace(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    kernel.run("a = 1")
    result = cli("log", "-w", str(kernel.workspace))
    assert result.returncode == 0 and "+a" in result.stdout, result.stderr
    # Writing offline does not: the kernel holds the lock, and nothing changes.
    # (checkout goes through the running kernel instead: test_cli_harness.py.)
    before = git_commits(kernel.workspace)
    line = assert_clear_failure(cli("erase", "-w", str(kernel.workspace), "c-1"), "erase")
    assert "in use" in line
    assert git_commits(kernel.workspace) == before
    assert kernel.value("a") == 1


def test_checkout_records_a_snapshot_the_next_kernel_restores(
        workspace: Path, kernel_factory: Callable[..., Kernel]) -> None:
    before = git_commits(workspace)
    result = cli("checkout", "-w", str(workspace), "@1")
    assert result.returncode == 0, result.stderr
    after = git_commits(workspace)
    assert len(after) == 4 and after[1:] == before, "history was rewritten"
    assert after[0][:12] in result.stdout

    log = cli("log", "-w", str(workspace), "-n", "1").stdout.splitlines()[1].split()
    assert log[0] == "4" and "human" in log and "checkout" in log

    kernel = kernel_factory(workspace)
    assert kernel.value("{k: v for k, v in globals().items() if k in 'xyzw'}") == {
        "x": 1, "y": [1, 2]}
    result = kernel.run("y.append('next')")
    # Op 5 was the value() cell above: numbering goes on from the checkout's op 4.
    assert result.committed and result.kernos["op"] == 6, result.kernos


@pytest.mark.parametrize("command", [
    ["show", "@42"], ["diff", "@1", "@42"], ["diff", "nope"], ["checkout", "@42"],
    ["checkout", "HEAD~9"], ["show", "0123abcd"],
])
def test_an_unknown_ref_fails_clearly_and_changes_nothing(
        workspace: Path, command: list[str]) -> None:
    before = git_commits(workspace)
    files = sorted(str(path) for path in workspace.rglob("*"))
    line = assert_clear_failure(cli(command[0], "-w", str(workspace), *command[1:]),
                                command[0])
    assert "names no snapshot" in line and command[-1] in line
    assert git_commits(workspace) == before
    assert sorted(str(path) for path in workspace.rglob("*")) == files


@pytest.mark.parametrize("command", [
    ["log"], ["show", "@1"], ["diff", "@1", "@2"], ["checkout", "@1"],
])
def test_a_directory_that_is_not_a_workspace_fails_clearly(
        tmp_path: Path, command: list[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "project"
    other.mkdir()
    (other / "notes.txt").write_text("not a workspace")
    missing = tmp_path / "missing" / "deeper"
    for directory in (empty, other, missing):
        line = assert_clear_failure(cli(command[0], "-w", str(directory), *command[1:]),
                                    command[0])
        expected = "does not exist" if directory == missing else "not a Kernos workspace"
        assert str(directory) in line and expected in line
    # Nothing was created or touched.
    assert list(empty.iterdir()) == []
    assert [path.name for path in other.iterdir()] == ["notes.txt"]
    assert not (tmp_path / "missing").exists()


COMMANDS = ("install", "demo", "run", "objects", "grants", "log", "show", "diff", "checkout",
            "gc", "prune", "events", "audit", "erase", "mcp")


def test_help_lists_the_commands_and_the_exit_statuses() -> None:
    result = cli("--help")
    assert result.returncode == 0, result.stderr
    for command in COMMANDS:
        assert re.search(rf"^\s+{command}\s", result.stdout, re.MULTILINE), command
    assert re.search(r"^  3 +conflict", result.stdout, re.MULTILINE), result.stdout
    for command in [*COMMANDS, "audit verify", "audit log"]:
        sub = cli(*command.split(), "--help")
        assert sub.returncode == 0 and "usage: kernos " + command in sub.stdout, sub.stderr
        assert "exit status:" in sub.stdout, command
    # `kernos mcp` takes its options from kernos.mcp.
    assert "--transport" in cli("mcp", "--help").stdout
    for usage in ([], ["nope"], ["log", "--bogus"], ["show", "a", "b"]):
        failed = cli(*usage)
        assert failed.returncode == 2 and failed.stdout == "", usage
        assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
        assert failed.stderr.startswith("kernos") and "--help'" in failed.stderr


def test_install_prefix_writes_a_usable_kernelspec(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    result = cli("install", "--prefix", str(prefix))
    assert result.returncode == 0, result.stderr
    spec_dir = prefix / "share" / "jupyter" / "kernels" / "kernos"
    spec = json.loads((spec_dir / "kernel.json").read_text())
    python = Path(spec["argv"][0])
    assert python.is_absolute() and python.exists() and os.access(python, os.X_OK)
    assert spec["argv"][1:] == ["-m", "kernos.kernel", "-f", "{connection_file}"]
    assert spec["display_name"] == "Kernos (Python 3)"
    assert spec["language"] == "python"
    assert (spec_dir / "logo-svg.svg").exists()
    assert str(spec_dir) in result.stdout

    from jupyter_client.kernelspec import KernelSpecManager

    manager = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)])
    found = manager.get_kernel_spec("kernos")
    assert found.display_name == "Kernos (Python 3)" and found.argv[0] == str(python)


@pytest.mark.slow
@pytest.mark.extension
def test_the_wheel_ships_the_kernelspec(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("kernos-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        specs = [name for name in names if re.fullmatch(
            r"kernos-[^/]+\.data/data/share/jupyter/kernels/kernos/kernel\.json", name)]
        assert len(specs) == 1, [name for name in names if ".data/" in name]
        spec = json.loads(archive.read(specs[0]))
        assert any(name.endswith("share/jupyter/kernels/kernos/logo-svg.svg")
                   for name in names)
        assert "kernos/kernel/kernel.py" in names and "kernos/py.typed" in names
        # The JupyterLab extension, built, as shared-data (no node on the user's machine).
        lab = "share/jupyter/labextensions/kernos-jupyterlab/"
        assert any(name.endswith(lab + "package.json") for name in names), names
        assert any(re.search(re.escape(lab) + r"static/remoteEntry\.[0-9a-f]+\.js$", name)
                   for name in names), [name for name in names if lab in name]
    assert spec["display_name"] == "Kernos (Python 3)"
    assert spec["argv"] == ["python", "-m", "kernos.kernel", "-f", "{connection_file}"]


def test_audit_log_and_events_read_the_durable_log(
        kernel_factory: Callable[..., Kernel]) -> None:
    """`kernos audit log` and `kernos events` read what a kernel recorded, also while it runs."""
    kernel = kernel_factory()
    assert kernel.run("events.emit('orders.created', {'id': 1})").committed
    assert kernel.run("events.emit('orders.created', {'id': 2})\n1/0").rolled_back
    assert kernel.run("events.emit('ledger.debit', {'usd': 5})").committed
    workspace = str(kernel.workspace)

    records = cli("audit", "log", "-w", workspace, "--json")
    assert records.returncode == 0, records.stderr
    found = [json.loads(line) for line in records.stdout.splitlines()]
    assert [(r["type"], r.get("status")) for r in found] == [
        ("genesis", None), ("op", "committed"), ("op", "failed"), ("op", "committed")]
    assert found[2]["error"]["kind"] == "ZeroDivisionError" and found[2]["events"] == []
    failed = cli("audit", "log", "-w", workspace, "--status", "failed")
    assert failed.returncode == 0 and "ZeroDivisionError" in failed.stdout
    assert "committed" not in failed.stdout

    events = cli("events", "-w", workspace, "--json")
    assert events.returncode == 0, events.stderr
    assert [(e["seq"], e["topic"], e["payload"]) for e in map(json.loads,
            events.stdout.splitlines())] == [(1, "orders.created", {"id": 1}),
                                             (2, "ledger.debit", {"usd": 5})]
    after = cli("events", "-w", workspace, "--since", "1", "--topic", "ledger.*")
    assert after.returncode == 0 and after.stdout.count("\n") == 1
    assert "ledger.debit" in after.stdout

    verify = cli("audit", "verify", "-w", workspace, "--json", "--progress")
    assert verify.returncode == 0 and json.loads(verify.stdout)["ok"] is True, verify.stderr
    assert "kernos: verifying" in verify.stderr and "done in" in verify.stderr
    assert cli("audit", "verify", "-w", workspace).stderr == "", "progress only when asked"

    bad = cli("events", "-w", workspace, "--topic", "a..b")
    assert "is not a topic pattern" in assert_clear_failure(bad, "events")
    missing = cli("audit", "log", "-w", str(Path(workspace) / "nope"))
    assert "does not exist" in assert_clear_failure(missing, "audit")
