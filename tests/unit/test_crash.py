"""Durability in-process: a process killed at each point of a commit loses nothing committed.

The child process builds state with one committed op, then runs a second op
with ``KERNOS_CRASH_AT`` set, which SIGKILLs it at that point of the commit.
The parent then opens the workspace as the next kernel would.

Three paths are crashed: a small commit (its frame goes to the tail), the
fold of the tail into a pack and the ref (the op was acknowledged before
it), and a commit too big for a frame (written as a pack, ``big``).
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
        phase, path = sys.argv[2], sys.argv[3]
        os.environ["KERNOS_CRASH_AT"] = phase
        import kernos._faults
        kernos._faults._armed = phase
        extra = ("\\nimport random\\nblob = random.Random(7).randbytes(1_500_000)"
                 if path == "big" else "")
        run("items.append(3)\\nbig[7] = -1.0\\nfresh = 'new'" + extra)
        print("acknowledged", flush=True)
        if path == "fold":
            workspace.fold()
        print("survived")
""")

CASES = [
    # (crash point, path, what the recovery says or None, whether op 2 is kept)
    ("serialize", "small", "rolled back", False),
    ("objects", "small", "rolled back", False),  # objects still in memory: nothing to delete
    ("sealed", "small", "voided", False),  # audit record written, nothing synced
    ("frame", "small", "voided", False),  # audit record synced, frame never written
    ("published", "small", "folded", True),  # frame synced: committed, never acknowledged
    ("pack.index", "fold", "folded", True),  # the fold's index half written, not renamed
    ("pack", "fold", "folded", True),  # the fold's pack half there: the tail folds again
    ("fold.packed", "fold", "folded", True),  # pack written, ref not moved
    ("ref.locked", "fold", "folded", True),  # the ref's lock file synced, not renamed
    ("fold.published", "fold", None, True),  # ref moved, tail not emptied: nothing to fold
    ("pack.index", "big", "discarded", False),  # the index half written under its tmp name
    ("pack", "big", "discarded", False),  # the batch's pack was on disk: recovery deleted it
    ("sealed", "big", "discarded", False),
    ("ref.locked", "big", "discarded", False),  # synced, the ref's lock file not renamed
    ("published", "big", "completed", True),  # the ref moved: committed
]
IDS = [f"{point}-{path}" for point, path, _said, _kept in CASES]


def child(workspace: Path, phase: str, path: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, str(workspace), phase, path],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("phase", "path", "said", "kept"), CASES, ids=IDS)
def test_kill_at_each_point_of_a_commit_leaves_a_consistent_workspace(
    workspace_dir: Path, reopen, phase: str, path: str, said: str | None, kept: bool,
) -> None:  # type: ignore[no-untyped-def]
    assert child(workspace_dir, "setup").returncode == 0
    crashed = child(workspace_dir, phase, path)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert "survived" not in crashed.stdout
    assert ("acknowledged" in crashed.stdout) == (path == "fold")

    session = reopen()
    ns = session.namespace
    if kept:
        assert ns["items"] == [1, 2, 3] and ns["big"][7] == -1.0 and ns["fresh"] == "new"
    else:
        assert ns["items"] == [1, 2] and ns["big"][7] == 7.0 and "fresh" not in ns
    if said is None:
        assert session.restore_report.recovery is None
    else:
        assert said in (session.restore_report.recovery or "")
    assert not session.image.workspace.tail.frames  # folded at the open
    tail = session.image.workspace.path / "tail"
    assert not tail.exists() or tail.stat().st_size == 0
    assert ns["alias"]["items"] is ns["items"]
    workspace = session.image.workspace
    journal = workspace.path / "pending"  # no batch pending: the journal is empty or gone
    assert not journal.exists() or journal.read_bytes() == b""
    assert list((workspace.path / "tmp").iterdir()) == []
    assert not (workspace.git_dir / "refs" / "heads" / "main.lock").exists()  # git may move it
    fsck = subprocess.run(["git", "-C", str(workspace.git_dir), "fsck", "--full", "--strict",
                           "--dangling", "--no-reflogs"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr
    assert "dangling" not in fsck.stdout + fsck.stderr
    assert session.run("items.append(4)").changed == ["alias", "items"]


@pytest.mark.parametrize(("phase", "path", "said", "kept"), CASES, ids=IDS)
def test_the_audit_tells_the_truth_after_a_kill_at_each_point(
    workspace_dir: Path, reopen, phase: str, path: str, said: str | None, kept: bool,
) -> None:  # type: ignore[no-untyped-def]
    """Every op has one final word in the chain, which verifies, whatever the crash point."""
    from kernos.audit import verify

    assert child(workspace_dir, "setup").returncode == 0
    assert child(workspace_dir, phase, path).returncode == -signal.SIGKILL
    session = reopen()
    log = session.image.audit
    ops = [record for record in log.records(limit=None) if record.get("op") == 2]
    final = {record["type"]: record for record in ops}
    if kept:  # committed: its record was durable before the commit point
        assert [r["type"] for r in ops] == ["op"] and final["op"]["status"] == "committed"
        assert final["op"]["commit"] == session.image.head.hex()
    elif phase in ("sealed", "frame", "ref.locked"):  # record written, never committed: voided
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


@pytest.mark.parametrize(("phase", "path", "said", "kept"), CASES, ids=IDS)
def test_verify_before_the_next_open_reports_an_unfinished_op_not_tampering(
    workspace_dir: Path, phase: str, path: str, said: str | None, kept: bool,
) -> None:
    """``kernos audit verify`` (and ``git fsck``) on a dead process's workspace, before
    anything recovers it: a record whose commit was never published is the op the next
    open voids, said so."""
    from kernos.audit import verify

    assert child(workspace_dir, "setup").returncode == 0
    assert child(workspace_dir, phase, path).returncode == -signal.SIGKILL
    report = verify(workspace_dir)
    assert report.ok, report.summary()
    # git's own check too: what a commit writes is invisible to git until it is whole.
    fsck = subprocess.run(["git", f"--git-dir={workspace_dir / 'history.git'}", "fsck",
                           "--full", "--strict"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr
    voided = said == "voided" or (said == "discarded" and phase in ("sealed", "ref.locked"))
    if voided:
        assert report.unfinished is not None and "(op 2)" in report.unfinished
        assert "unfinished: record" in report.summary()
    else:
        assert report.unfinished is None, report.unfinished


@pytest.mark.parametrize(("phase", "path", "said", "kept"), CASES, ids=IDS)
def test_replay_before_the_next_open_skips_the_unfinished_op_and_says_so(
    workspace_dir: Path, tmp_path: Path, phase: str, path: str, said: str | None, kept: bool,
) -> None:
    """``kernos replay`` of a dead process's workspace, before anything recovers it,
    re-runs what committed and leaves out the op the next open voids, saying so."""
    from kernos.replay import replay

    assert child(workspace_dir, "setup").returncode == 0
    assert child(workspace_dir, phase, path).returncode == -signal.SIGKILL
    report = replay(workspace_dir, into=tmp_path / "replayed")
    assert report.ok, report.summary()
    voided = said == "voided" or (said == "discarded" and phase in ("sealed", "ref.locked"))
    assert report.unfinished == (2 if voided else None)
    assert [step.op for step in report.steps] == ([1, 2] if kept else [1])
    if voided:
        assert "op 2 not replayed" in report.summary()
