"""Durability in-process: a process killed at each point of a commit loses nothing committed.

The child process builds state with one committed op, then runs a second op
with ``KERNOS_CRASH_AT`` set, which SIGKILLs it at that point of the commit.
The parent then opens the workspace as the next kernel would.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent("""
    import os, sys, types
    from kernos import Image, Workspace
    module = types.ModuleType("__main__")
    ns = module.__dict__
    workspace = Workspace.open(sys.argv[1])
    image = Image(workspace, ns, module=module)
    image.restore()
    def run(source):
        op = image.begin(source=source)
        exec(source, ns)
        return op.commit()
    if sys.argv[2] == "setup":
        import numpy
        run("import numpy\\nbig = numpy.arange(3_000_000, dtype=float)\\nitems = [1, 2]\\n"
            "alias = {'items': items}")
    else:
        os.environ["KERNOS_CRASH_AT"] = sys.argv[2]
        import kernos._faults
        kernos._faults._armed = sys.argv[2]
        run("items.append(3)\\nbig[7] = -1.0\\nfresh = 'new'")
        print("survived")
""")

PHASES = ["serialize", "objects", "pack", "sealed", "published"]


def child(workspace: Path, phase: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, str(workspace), phase],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("phase", PHASES)
def test_kill_at_each_point_of_a_commit_leaves_a_consistent_workspace(
    workspace_dir: Path, reopen, phase: str,
) -> None:  # type: ignore[no-untyped-def]
    assert child(workspace_dir, "setup").returncode == 0
    crashed = child(workspace_dir, phase)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert "survived" not in crashed.stdout

    session = reopen()
    ns = session.namespace
    if phase == "published":  # the ref moved: the op is committed, though never acknowledged
        assert ns["items"] == [1, 2, 3] and ns["big"][7] == -1.0 and ns["fresh"] == "new"
        assert "completed" in (session.restore_report.recovery or "")
    else:
        assert ns["items"] == [1, 2] and ns["big"][7] == 7.0 and "fresh" not in ns
        if phase in ("pack", "sealed"):  # the batch's pack was on disk: recovery deleted it
            assert "discarded" in (session.restore_report.recovery or "")
        elif phase == "objects":  # the objects were still in memory: nothing to delete
            assert "rolled back" in (session.restore_report.recovery or "")
    assert ns["alias"]["items"] is ns["items"]
    workspace = session.image.workspace
    journal = workspace.path / "pending"  # no batch pending: the journal is empty or gone
    assert not journal.exists() or journal.read_bytes() == b""
    assert list((workspace.path / "tmp").iterdir()) == []
    fsck = subprocess.run(["git", "-C", str(workspace.git_dir), "fsck", "--full", "--strict",
                           "--dangling", "--no-reflogs"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr
    assert "dangling" not in fsck.stdout + fsck.stderr
    assert session.run("items.append(4)").changed == ["alias", "items"]


@pytest.mark.parametrize("phase", PHASES)
def test_the_audit_tells_the_truth_after_a_kill_at_each_point(
    workspace_dir: Path, reopen, phase: str,
) -> None:  # type: ignore[no-untyped-def]
    """Every op has one final word in the chain, which verifies, whatever the crash point."""
    from kernos.audit import verify

    assert child(workspace_dir, "setup").returncode == 0
    assert child(workspace_dir, phase).returncode == -signal.SIGKILL
    session = reopen()
    log = session.image.audit
    ops = [record for record in log.records(limit=None) if record.get("op") == 2]
    final = {record["type"]: record for record in ops}
    if phase == "published":  # committed: its record was written before the ref moved
        assert [r["type"] for r in ops] == ["op"] and final["op"]["status"] == "committed"
        assert final["op"]["commit"] == session.image.head.hex()
    elif phase == "sealed":  # record written, commit point never reached: voided
        assert [r["type"] for r in ops] == ["op", "void"]
        assert final["void"]["voids"] == final["op"]["index"]
        assert "voided" in (session.restore_report.recovery or "")
    else:  # died before any record: the next start records that it died
        assert [r["type"] for r in ops] == ["died"]
        assert "died" in (session.restore_report.recovery or "")
    assert log.events_since(0) == []
    report = verify(workspace_dir)
    assert report.ok, report.summary()
    # The next op gets a fresh id, never the dead op's.
    assert session.run("fresh2 = 1").op == 3
