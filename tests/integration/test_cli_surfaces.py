"""What the ``kernos`` command tells a user (issue 34): which workspaces there are and
how ``-w`` names one, where a fork goes, what became of the ops that wrote no snapshot,
how an instance changed, what a placeholder is, and each command's own exit statuses.

Workspaces are built in-process (``CoreEnv``, no kernel) under a temporary
workspaces root (``$KERNOS_WORKSPACE_ROOT``); what is under test runs as the
installed ``kernos`` command, in a separate process.  Only ``kernos run`` needs a
kernel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from core_support import CoreEnv, abort
from integration.test_cli import kernos_command
from kernos.fork import fork_destination
from kernos.store.workspace import default_workspace, notebook_workspace_name, workspaces_root

if TYPE_CHECKING:
    from conftest import Kernel

ACCOUNT = ("class Account:\n    def __init__(self, balance):\n        self.balance = balance\n"
           "acct = Account(100)")


def cli(*args: str, root: Path, cwd: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``kernos ARGS`` with ``root`` as the workspaces root and no $KERNOS_WORKSPACE."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("KERNOS_WORKSPACE", "KERNEL_WORKSPACE", "JPY_SESSION_NAME")}
    environment.update(KERNOS_WORKSPACE_ROOT=str(root), **(env or {}))
    return subprocess.run([*kernos_command(), *args], capture_output=True, text=True,
                          env=environment, cwd=cwd or root, timeout=120)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], command: str) -> str:
    """Exit 2, nothing on stdout, one line on stderr: the line."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kernos {command}: "), result.stderr
    return lines[0]


def build(path: Path, *cells: str) -> CoreEnv:
    """A workspace at ``path`` with ``cells`` committed, one op each (then closed)."""
    env = CoreEnv(path)
    for cell in cells:
        env.run(cell)
    env.close()
    return env


@pytest.fixture
def root(tmp_path: Path) -> Path:
    made = tmp_path / "workspaces"
    made.mkdir()
    return made


# -- item 4: which workspaces there are, and -w NAME ----------------------------------------


def test_the_notebook_name_is_the_one_rule_for_default_workspaces(tmp_path: Path) -> None:
    """The name folds the notebook's directories in; `default_workspace` uses that name
    under `workspaces_root`, so `kernos workspaces` lists what kernels open."""
    assert notebook_workspace_name("/tmp/ux3/lab/Untitled.ipynb") == "tmp-ux3-lab-Untitled"
    assert notebook_workspace_name("") == "default"
    environ = {"JPY_SESSION_NAME": "/tmp/ux3/lab/Untitled.ipynb",
               "XDG_DATA_HOME": str(tmp_path)}
    assert default_workspace(environ) == workspaces_root(environ) / "tmp-ux3-lab-Untitled"
    gateway = {"KERNOS_WORKSPACE_ROOT": str(tmp_path), "KERNEL_WORKSPACE": "team"}
    assert workspaces_root(gateway) == tmp_path and default_workspace(gateway) == tmp_path / "team"


def test_workspaces_lists_them_and_w_takes_a_name(root: Path, tmp_path: Path) -> None:
    build(root / "tmp-lab-Untitled", "x = 1", "y = 2")
    build(root / "analysis", "z = 3")
    (root / "not-a-workspace").mkdir()
    elsewhere = tmp_path / "elsewhere" / "mine"
    build(elsewhere, "w = 4")

    listed = ok(cli("workspaces", root=root, env={"KERNOS_WORKSPACE": str(elsewhere)}))
    rows = {line.split()[0]: line.split() for line in listed.splitlines()[1:-1]}
    assert set(rows) == {"analysis", "tmp-lab-Untitled", "mine"}, listed
    assert rows["tmp-lab-Untitled"][1] == "2" and rows["analysis"][1] == "1"
    assert str(root / "analysis") in listed and str(elsewhere) in listed
    assert listed.splitlines()[-1].startswith(f"root: {root};"), listed
    document = json.loads(ok(cli("workspaces", "--json", root=root)))
    assert document["root"] == str(root) and document["default"] == str(root / "default")
    [untitled] = [item for item in document["workspaces"] if item["name"] == "tmp-lab-Untitled"]
    assert untitled["head_op"] == 2 and untitled["path"] == str(root / "tmp-lab-Untitled")
    assert untitled["bytes"] > 0 and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                                                  untitled["last_used"])
    assert [item["name"] for item in document["workspaces"]] == ["analysis", "tmp-lab-Untitled"]

    # -w: the whole name, the notebook's name (with or without .ipynb), or a path.
    for given in ("tmp-lab-Untitled", "Untitled", "Untitled.ipynb",
                  str(root / "tmp-lab-Untitled")):
        shown = ok(cli("log", "-w", given, root=root))
        assert [line.split()[0] for line in shown.splitlines()[1:]] == ["2", "1"], given
    assert "z" in ok(cli("objects", "-w", "analysis", root=root))
    # A bare name that is no workspace under the root, but one here, is read as before.
    assert "w" in ok(cli("objects", "-w", "mine", root=root, cwd=elsewhere.parent))

    unknown = failed(cli("log", "-w", "nope", root=root), "log")
    assert "no workspace is named 'nope'" in unknown and "`kernos workspaces`" in unknown
    assert "analysis, tmp-lab-Untitled" in unknown and "./nope" in unknown
    build(root / "other-Untitled", "q = 0")
    ambiguous = failed(cli("log", "-w", "Untitled", root=root), "log")
    assert "could name 2 workspaces" in ambiguous
    assert "other-Untitled, tmp-lab-Untitled" in ambiguous and "kernos workspaces" in ambiguous
    as_json = cli("log", "-w", "Untitled", "--json", root=root)
    assert json.loads(as_json.stdout)["error"]["kind"] == "unknown_workspace"


def test_a_missing_default_workspace_names_the_way_out(root: Path) -> None:
    none = failed(cli("log", root=root), "log")
    assert f"no workspace at {root / 'default'}" in none and "no workspace under" in none

    build(root / "tmp-lab-Untitled", "x = 1")
    one = failed(cli("log", root=root), "log")
    assert "The only workspace under" in one and "kernos log -w tmp-lab-Untitled" in one
    build(root / "analysis", "y = 1")
    two = failed(cli("show", root=root), "show")
    assert "2 workspaces are under" in two and "`kernos workspaces`" in two and "-w" in two

    build(root / "default", "z = 1")
    assert ok(cli("log", root=root)).splitlines()[1].split()[0] == "1"
    marked = ok(cli("workspaces", root=root))
    assert re.search(r"^default \*\s", marked, re.MULTILINE), marked


# -- item 3: one rule for a bare fork name ---------------------------------------------------


def test_a_bare_fork_name_goes_beside_the_source_a_path_where_it_says(root: Path,
                                                                      tmp_path: Path) -> None:
    build(root / "tmp-lab-Untitled", "x = 1", "x = 2")
    here = tmp_path / "here"
    here.mkdir()

    made = json.loads(ok(cli("fork", "Untitled@@1", "trial", "--json", root=root, cwd=here)))
    assert made["dest"] == str(root / "trial") and made["op"] == 1
    assert not (here / "trial").exists(), "a bare name is a sibling of the source, not ./NAME"
    assert (root / "trial" / "workspace.json").exists()
    text = ok(cli("fork", "trial", "again", root=root, cwd=here))
    assert f"{root / 'again'} starts at" in text and "-w again" in text

    beside = ok(cli("fork", str(root / "trial"), "./local", root=root, cwd=here))
    assert (here / "local" / "workspace.json").exists(), beside
    refused = failed(cli("fork", "trial", "..hidden", root=root, cwd=here), "fork")
    assert "is neither a fork name" in refused and "./NAME" in refused

    # The rule itself, which the inspector's Fork (a bare name, beside) goes through too.
    source = root / "tmp-lab-Untitled"
    assert fork_destination(source, "b") == root / "b"
    assert fork_destination(source, str(here / "c")) == here / "c"
    assert fork_destination(source, Path("d")) == root / "d"


# -- item 5: the ops that wrote no snapshot ---------------------------------------------------


def _with_gaps(path: Path) -> None:
    """Ops 1 and 2 commit, 3 fails, 4 only reads, 5 commits."""
    env = CoreEnv(path)
    env.run("x = 1")
    env.run("y = [1]")
    abort(env, "x = 2\nraise ValueError('no such account')")
    env.run("print(x)")
    env.run("y.append(2)")
    env.close()


def test_log_all_lists_every_op_and_show_says_what_became_of_one(root: Path) -> None:
    _with_gaps(root / "ws")
    plain = ok(cli("log", "-w", "ws", root=root))
    assert [line.split()[0] for line in plain.splitlines()[1:-1]] == ["5", "2", "1"]
    assert plain.splitlines()[-1] == ("ops 3, 4 wrote no snapshot: 1 rolled back, 1 "
                                      "read-only; `kernos log --all` lists every op")

    every = ok(cli("log", "-w", "ws", "--all", root=root)).splitlines()
    assert [line.split()[0] for line in every[1:]] == ["5", "4", "3", "2", "1"]
    assert re.match(r"4\s+\(read-only\)\s.*print\(x\)$", every[2]), every
    assert re.match(r"3\s+\(failed\)\s.*x = 2 \(\+1 lines\) \[ValueError: no such account\]$",
                    every[3]), every
    ops = json.loads(ok(cli("log", "-w", "ws", "--all", "-n", "3", "--json", root=root)))["ops"]
    assert [(op["op"], op["outcome"]) for op in ops] == [
        (5, "committed"), (4, "read-only"), (3, "failed")]
    assert ops[2]["commit"] is None and ops[2]["error"] == "ValueError: no such account"

    rolled = failed(cli("show", "-w", "ws", "@3", root=root), "show")
    assert "'@3' names no snapshot: op 3 failed and was rolled back: ValueError: no such " \
           "account" in rolled and "`kernos log --all`" in rolled
    read_only = failed(cli("diff", "-w", "ws", "@4", root=root), "diff")
    assert "op 4 changed nothing (read-only" in read_only and "print(x)" in read_only
    missing = failed(cli("show", "-w", "ws", "@9", root=root), "show")
    assert "'@9' names no snapshot" in missing  # no op 9 at all: as before


# -- item 9: values ---------------------------------------------------------------------------


def test_diff_shows_which_attribute_changed_and_objects_shows_placeholders(root: Path
                                                                           ) -> None:
    build(root / "ws", ACCOUNT, "acct.balance = 70", "handle = open('/dev/null')")
    shown = ok(cli("diff", "-w", "ws", "@1", "@2", root=root))
    assert re.search(r"~\s+acct\s+Account\s+balance: 100 -> 70$", shown, re.MULTILINE), shown
    assert "object at 0x" not in shown
    changed = json.loads(ok(cli("diff", "-w", "ws", "@1", "@2", "--json", root=root)))
    assert changed["changed"] == [{"name": "acct", "type": "Account",
                                   "before": "Account(balance=100)",
                                   "after": "Account(balance=70)",
                                   "fields": {"balance": ["100", "70"]}}]

    listed = ok(cli("objects", "-w", "ws", root=root))
    [handle] = [line for line in listed.splitlines() if line.startswith("handle")]
    assert re.match(r"handle\s+Unpersisted\s.*placeholder for _io.TextIOWrapper: could not be "
                    r"persisted \(open files", handle), listed
    assert "name='" not in handle  # not the old text of the file it was
    objects = json.loads(ok(cli("objects", "-w", "ws", "--json", root=root)))["objects"]
    [info] = [item for item in objects if item["name"] == "handle"]
    assert info["type"] == "Unpersisted" and info["placeholders"][0]["type_name"] == \
        "_io.TextIOWrapper"
    assert [item["summary"] for item in objects if item["name"] == "acct"] == [
        "Account(balance=70)"]


def test_the_images_own_names_are_left_out_unless_asked(root: Path) -> None:
    build(root / "ws", "import random\nx = random.random()", "y = random.random()")
    listed = ok(cli("objects", "-w", "ws", root=root))
    assert "kernos:random" not in listed.splitlines()[0:-1] and listed.split()[:1] == ["name"]
    assert listed.splitlines()[-1] == ("(not listed: kernos:random, the image's own; "
                                       "--internal lists it)"), listed
    assert "kernos:random" in ok(cli("objects", "-w", "ws", "--internal", root=root))
    names = [item["name"] for item in json.loads(ok(cli("objects", "-w", "ws", "--json",
                                                        root=root)))["objects"]]
    assert "kernos:random" in names  # JSON is for programs: everything
    shown = ok(cli("diff", "-w", "ws", "@1", "@2", root=root))
    assert re.search(r"^  \+\s+y\s+float", shown, re.MULTILINE) and "~  kernos:random" not in shown
    assert shown.rstrip().endswith("(also kernos:random, the image's own; --internal shows it)")
    assert re.search(r"~\s+kernos:random", ok(cli("diff", "-w", "ws", "@1", "@2", "--internal",
                                                   root=root)))
    log = ok(cli("log", "-w", "ws", root=root))
    assert "kernos:" not in log and re.search(r"^2 .*\+y\s", log, re.MULTILINE), log
    assert "~kernos:random" in ok(cli("log", "-w", "ws", "--internal", root=root))


# -- item 10: the smaller things ---------------------------------------------------------------


def test_each_help_lists_only_its_own_exit_statuses(root: Path) -> None:
    def statuses(*command: str) -> dict[str, str]:
        text = ok(cli(*command, "--help", root=root))
        table = text[text.index("exit status:"):]
        return {found.group(1): found.group(2) for found in
                re.finditer(r"^  (\d+)\s+(.*)$", table, re.MULTILINE)}

    fork = statuses("fork")
    assert set(fork) == {"0", "2", "5", "130"} and fork["0"] == "success", fork
    assert set(statuses("log")) == {"0", "2", "5", "130"}
    run = statuses("run")
    assert set(run) == {"0", "1", "2", "3", "4", "5", "130"}
    assert run["0"].startswith("success (an op committed") and "precondition" in run["3"]
    assert set(statuses("audit", "verify")) == {"0", "1", "2", "5", "130"}
    assert set(statuses("push")) == {"0", "2", "3", "5", "130"}
    assert "4" in statuses("events") and "3" not in statuses("events")
    assert set(statuses("memory", "stats")) == {"0", "1", "2", "4", "5", "130"}
    whole = statuses()  # `kernos --help`: the whole table
    assert set(whole) == {"0", "1", "2", "3", "4", "5", "130"}
    # Every subcommand has its own list (one the table forgot would get the whole table).
    import argparse

    from kernos.cli._argtypes import _EXITS
    from kernos.cli._parser import build_parser

    [commands] = [action for action in build_parser()._actions
                  if isinstance(action, argparse._SubParsersAction)]
    assert set(commands.choices) <= set(_EXITS), set(commands.choices) - set(_EXITS)


def test_events_says_when_there_are_none(root: Path) -> None:
    build(root / "ws", "x = 1")
    assert ok(cli("events", "-w", "ws", root=root)) == (
        "No events: no committed op has emitted one yet.\n")
    assert ok(cli("events", "-w", "ws", "--topic", "orders.*", root=root)) == (
        "No events on orders.*.\n")
    assert ok(cli("events", "-w", "ws", "--json", root=root)) == ""  # a stream of none


def test_audit_verify_counts_a_forks_snapshots_and_audit_log_reads_requests(root: Path
                                                                             ) -> None:
    env = CoreEnv(root / "src")
    env.run("x = 1")
    env.run("x = 2")
    op = env.image.begin(source=json.dumps({"tool": "double", "arguments": {"n": 21}},
                                           sort_keys=True), kind="harness")
    op.note = "call double"
    env.ns["doubled"] = 42
    op.commit()
    env.close()
    ok(cli("fork", "src", "copy", root=root))

    verified = ok(cli("audit", "verify", "-w", "copy", root=root))
    assert verified.startswith("ok: 1 records, 3 snapshots (0 committed here, 3 adopted from "
                               "the source, up to the fork)"), verified
    report = json.loads(ok(cli("audit", "verify", "-w", "copy", "--json", root=root)))
    assert (report["commits"], report["adopted"]) == (0, 3)
    assert json.loads(ok(cli("audit", "verify", "-w", "src", "--json", root=root)))[
        "adopted"] == 0

    records = ok(cli("audit", "log", "-w", "src", root=root))
    [called] = [line for line in records.splitlines() if line.startswith("3 ")]
    assert called.endswith("call double(n=21)"), records
    assert "{" not in called


@pytest.mark.kernel
def test_run_says_which_op_it_committed(kernel_factory: Callable[..., Kernel],
                                        root: Path) -> None:
    kernel = kernel_factory(root / "live")
    done = cli("run", "-w", "live", "x = 1", root=root)
    assert ok(done) == ""
    assert re.fullmatch(r"kernos: op (\d+) committed \(\+x\), commit [0-9a-f]{12}\n",
                        done.stderr), done.stderr
    read = cli("run", "-w", "live", "print(x)", root=root)
    assert ok(read) == "1\n" and "committed (no name changed)" in read.stderr
    quiet = cli("run", "-w", "live", "-q", "x = 2", root=root)
    assert (ok(quiet), quiet.stderr) == ("", "")
    assert kernel.value("x") == 2


def test_a_running_kernel_lists_a_restored_placeholder_as_one(
        kernel_factory: Callable[..., Kernel], root: Path) -> None:
    kernel = kernel_factory(root / "live")
    assert kernel.run("handle = open('/dev/null')\nkept = 1").committed
    kernel.kill9()
    kernel = kernel_factory(root / "live")
    assert kernel.value("type(handle).__name__") == "Unpersisted"
    listed = ok(cli("objects", "-w", "live", "--json", root=root))
    found = json.loads(listed)
    assert found["source"] == "kernel", found
    [handle] = [item for item in found["objects"] if item["name"] == "handle"]
    assert handle["type"] == "Unpersisted", handle
    assert handle["summary"].startswith("placeholder for _io.TextIOWrapper: could not be "
                                        "persisted (open files"), handle
