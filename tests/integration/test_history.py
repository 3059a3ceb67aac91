"""History from a notebook: ``%kernos log/show/diff/checkout/status`` on a real kernel.

The history is a git repository, so the tests also read it with git itself:
a checkout must add exactly one commit on top of the old ones (history is never
rewritten), and every commit message names its op and principal.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support import git_view_current

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

CELLS = [
    "x = 1\ny = [1, 2]\nlabel = 'first'",              # op 1
    "y.append(3)\nz = {'k': 'zed'}",                    # op 2
    "del x\nw = 5.5\nlabel = 'third'",                  # op 3
]


def git(workspace: Path, *args: str) -> str:
    git_view_current(workspace)
    return subprocess.run(["git", "-C", str(workspace / "history.git"), *args],
                          check=True, capture_output=True, text=True, timeout=60).stdout


def commits(workspace: Path) -> list[str]:
    """The commit ids of the branch, newest first."""
    return git(workspace, "rev-list", "main").split()


def build(kernel: Kernel) -> None:
    for number, cell in enumerate(CELLS, start=1):
        result = kernel.run(cell)
        assert result.committed and result.kernos["op"] == number, result.kernos


def user_names(kernel: Kernel) -> dict[str, object]:
    return kernel.value("{k: v for k, v in globals().items() if k in "
                        "('x', 'y', 'z', 'w', 'label', 'later')}")


def test_log_lists_ops_with_principal_and_changes(kernel: Kernel) -> None:
    build(kernel)
    result = kernel.run("%kernos log")
    assert result.status == "ok", result.errors
    lines = result.stdout.strip().splitlines()
    header, rows = lines[0].split(), lines[1:]
    assert header[:2] == ["op", "commit"] and "who" in header and "changes" in header
    by_op = {int(row.split()[0]): row for row in rows}
    assert sorted(by_op) == [1, 2, 3], result.stdout      # newest first, all of them
    assert [int(row.split()[0]) for row in rows] == [3, 2, 1]
    for op, row in by_op.items():
        assert " human " in row, row
        commit = row.split()[1]
        assert commits(kernel.workspace)[-op].startswith(commit)
    assert "+x" in by_op[1] and "+y" in by_op[1] and "+label" in by_op[1]
    assert "+z" in by_op[2] and "~y" in by_op[2]
    assert "-x" in by_op[3] and "+w" in by_op[3] and "~label" in by_op[3]
    assert "y.append(3)" in by_op[2], "the log should show what the op ran"

    limited = kernel.run("%kernos log 2")
    assert len(limited.stdout.strip().splitlines()) == 3   # the header and two ops
    bad = kernel.run("%kernos log many")
    assert bad.status == "error" and "number" in bad.errors[0]["evalue"]


def test_show_gives_the_source_and_the_names(kernel: Kernel) -> None:
    build(kernel)
    head = kernel.run("%kernos show")       # default: HEAD, which is op 3 here
    assert "op 3 by human" in head.stdout and "del x" in head.stdout, head.stdout
    result = kernel.run("%kernos show @2")
    assert result.status == "ok", result.errors
    text = result.stdout
    assert "op 2 by human" in text
    assert "    y.append(3)\n    z = {'k': 'zed'}\n" in text, text
    names = text.split("names:", 1)[1]
    assert re.search(r"^\s+y\s+list\b.*\[1, 2, 3\]", names, re.MULTILINE), names
    assert re.search(r"^\s+z\s+dict\b.*'zed'", names, re.MULTILINE), names
    assert re.search(r"^\s+x\s+int\b", names, re.MULTILINE), names
    assert " w " not in names, "op 2's snapshot shows a name created later"

    # The same snapshot by HEAD~N and by commit prefix.  Every show is an op
    # too, but one that changes nothing writes no snapshot: HEAD is still op 3.
    commit = commits(kernel.workspace)[-2]
    assert commit in text
    for ref in ("HEAD~1", commit[:8], commit.upper()[:10]):
        again = kernel.run(f"%kernos show {ref}")
        assert again.status == "ok" and f"commit {commit}" in again.stdout, (ref, again.errors)


def test_diff_shows_added_changed_and_deleted_with_summaries(kernel: Kernel) -> None:
    build(kernel)
    result = kernel.run("%kernos diff @1 @3")
    assert result.status == "ok", result.errors
    rows = {line.split()[1]: line.split(None, 3) for line in result.stdout.splitlines()[1:]
            if line.strip()[:1] in "+-~"}
    assert set(rows) == {"x", "y", "z", "w", "label"}, result.stdout
    assert rows["z"][0] == "+" and "zed" in rows["z"][3]
    assert rows["w"][0] == "+" and "5.5" in rows["w"][3]
    assert rows["x"][0] == "-" and rows["x"][2] == "int"
    assert rows["y"][0] == "~" and "[1, 2]" in rows["y"][3] and "[1, 2, 3]" in rows["y"][3]
    assert rows["label"][0] == "~" and "'first'" in rows["label"][3] \
        and "'third'" in rows["label"][3]

    same = kernel.run("%kernos diff @3 @3")
    assert "no names differ" in same.stdout
    default = kernel.run("%kernos diff @2")          # B defaults to HEAD
    assert "+  w" in default.stdout and "-  x" in default.stdout


def test_checkout_is_a_new_op_and_survives_kill9(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    build(kernel)
    kernel.run("later = 'added after op 1'")
    workspace = kernel.workspace
    before = commits(workspace)
    snapshot_one = {"x": 1, "y": [1, 2], "label": "first"}

    result = kernel.run("%kernos checkout @1")
    assert result.status == "ok" and result.committed, (result.errors, result.kernos)
    report = result.kernos
    assert report["kind"] == "checkout" and report["op"] == len(before) + 1
    assert sorted(report["deleted"]) == ["later", "w", "z"]
    assert report["added"] == ["x"] and sorted(report["changed"]) == ["label", "y"]

    after = commits(workspace)
    assert len(after) == len(before) + 1 and after[1:] == before, "history was rewritten"
    assert after[0] == report["commit"]
    assert git(workspace, "rev-parse", f"{after[0]}^{{tree}}") != \
        git(workspace, "rev-parse", f"{before[0]}^{{tree}}")
    assert user_names(kernel) == snapshot_one

    # Later ops build on the checked-out image, and all of it survives kill -9.
    kernel.run("y.append('after checkout')")
    kernel.kill9()
    restored = kernel_factory(workspace)
    assert user_names(restored) == {**snapshot_one, "y": [1, 2, "after checkout"]}
    message = git(workspace, "log", "-1", "--format=%B", after[0])
    assert message.startswith(f"op {report['op']} by human: checkout ")
    assert "Kernos-Kind: checkout" in message


def test_checkout_errors_change_nothing(kernel: Kernel) -> None:
    build(kernel)
    before_names = user_names(kernel)
    before = commits(kernel.workspace)
    for ref in ("@99", "deadbeef", "HEAD~50", "no-such-ref"):
        result = kernel.run(f"%kernos checkout {ref}")
        assert result.status == "error", f"checkout {ref} succeeded"
        assert result.rolled_back, result.kernos
        error = result.errors[0]
        assert error["ename"] == "UnknownRef", error
        assert ref in error["evalue"] and "names no snapshot" in error["evalue"]
    missing = kernel.run("%kernos checkout")
    assert missing.status == "error" and "wrong arguments" in missing.errors[0]["evalue"]
    assert commits(kernel.workspace) == before
    assert user_names(kernel) == before_names


def test_a_checkout_in_a_failing_cell_rolls_back(kernel: Kernel) -> None:
    build(kernel)
    before_names = user_names(kernel)
    before = commits(kernel.workspace)
    result = kernel.run("%kernos checkout @1\nraise RuntimeError('changed my mind')")
    assert result.status == "error" and result.rolled_back, result.kernos
    assert commits(kernel.workspace) == before
    assert user_names(kernel) == before_names


def test_status_shows_workspace_head_and_size(kernel: Kernel) -> None:
    build(kernel)
    kernel.run("blob = bytes(3_000_000)")
    head = commits(kernel.workspace)[0]
    result = kernel.run("%kernos status")
    assert result.status == "ok", result.errors
    fields = {line.split()[0]: line.split(None, 1)[1] for line in result.stdout.splitlines()
              if line and not line.startswith(" ")}
    assert fields["workspace"] == str(kernel.workspace)
    assert fields["head"].startswith(head[:12]) and "op 4" in fields["head"]
    size = re.search(r"([\d.]+) MB stored", fields["image"])
    assert size and float(size.group(1)) >= 3.0, fields["image"]
    assert re.search(r"\b5 names\b", fields["image"]), fields["image"]
    assert fields["history"].startswith("4 snapshots")


def test_unknown_commands_give_a_clear_error(kernel: Kernel) -> None:
    result = kernel.run("%kernos bogus")
    assert result.status == "error"
    error = result.errors[0]
    assert error["ename"] == "UsageError"
    assert "unknown command 'bogus'" in error["evalue"] and "%kernos log" in error["evalue"]
    help_text = kernel.run("%kernos help").stdout
    for command in ("log", "show", "diff", "checkout", "status", "scan"):
        assert f"%kernos {command}" in help_text
    unparsable = kernel.run("%kernos show 'unclosed")
    assert unparsable.status == "error" and "cannot parse" in unparsable.errors[0]["evalue"]


def test_every_commit_message_names_its_op_and_principal(kernel: Kernel) -> None:
    build(kernel)
    kernel.run("%kernos checkout @2")
    kernel.run("1 / 0")                       # rolled back: no commit
    kernel.run("%kernos log")
    bodies = git(kernel.workspace, "log", "--format=%H%n%B%x00").split("\x00")
    bodies = [body.strip() for body in bodies if body.strip()]
    assert len(bodies) == len(commits(kernel.workspace)) == 4
    ops = []
    for body in bodies:
        _sha, headline, *rest = body.splitlines()
        match = re.match(r"op (\d+) by human: \S", headline)
        assert match, headline
        op = int(match.group(1))
        ops.append(op)
        assert f"Kernos-Op: {op}" in rest and "Kernos-Principal: human" in rest, body
    assert ops == [4, 3, 2, 1], \
        "the rolled-back op 5 and the read-only op 6 (%kernos log) must leave no commit"
    assert git(kernel.workspace, "log", "-1", "--format=%an <%ae>").strip() == \
        "human <human@kernos.invalid>"
    fsck = subprocess.run(["git", "-C", str(kernel.workspace / "history.git"), "fsck",
                           "--strict"], capture_output=True, text=True, timeout=120)
    assert fsck.returncode == 0, fsck.stderr
