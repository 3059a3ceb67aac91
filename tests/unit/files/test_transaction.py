"""Tracked files commit, roll back, survive a restart and a crash, and check out, with the op
(kernos.files; the in-process image of tests/core_support.py)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import kernos.files
from core_support import CoreEnv
from kernos import _faults
from kernos.errors import CommitFailed
from kernos.files import FilesParticipant
from kernos.store.snapshots import read_snapshot


@pytest.fixture
def env(tmp_path: Path) -> Iterator[CoreEnv]:
    opened = CoreEnv(tmp_path / "ws")
    yield opened
    opened.close()


def files(env: CoreEnv) -> dict[str, bytes]:
    """Every file under the workspace's files root, by relative path."""
    root = env.image.files.root()
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file() and not path.is_symlink()}


def write(env: CoreEnv, relative: str, data: bytes) -> None:
    path = kernos.files.path(relative)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def commit_files(env: CoreEnv, **contents: bytes) -> None:
    op = env.image.begin(source="# writes files")
    for name, data in contents.items():
        write(env, name.replace("__", "/"), data)
    op.commit()


def test_a_failed_op_leaves_no_file_it_wrote(env: CoreEnv) -> None:
    commit_files(env, kept=b"one", gone=b"still here", sub__deep=b"x")
    root = env.image.files.root()
    op = env.image.begin(source="# fails")
    (root / "kept").write_bytes(b"two, longer")
    (root / "gone").unlink()
    (root / "new").write_bytes(b"created")
    (root / "made" / "deeper").mkdir(parents=True)
    (root / "made" / "deeper" / "f").write_bytes(b"in a new directory")
    (root / "sub" / "deep").write_bytes(b"y")
    report = op.abort(error=RuntimeError("boom"))
    assert files(env) == {"kept": b"one", "gone": b"still here", "sub/deep": b"x"}
    assert not (root / "made").exists()
    assert sorted(report.files) == ["gone (deleted)", "kept (changed)", "made/deeper/f (removed)",
                                    "new (removed)", "sub/deep (changed)"]
    assert "files:" in report.summary()


def test_a_cell_that_raises_rolls_its_files_back(env: CoreEnv) -> None:
    env.run("import kernos.files\nkernos.files.path('a.csv').write_text('x,y\\n1,2\\n')")
    with pytest.raises(ZeroDivisionError):
        env.run("kernos.files.path('a.csv').write_text('broken')\n"
                "kernos.files.path('stray.png').write_bytes(b'png')\n1 / 0")
    assert files(env) == {"a.csv": b"x,y\n1,2\n"}


def test_committed_files_are_in_the_snapshot_and_survive_a_restart(env: CoreEnv) -> None:
    commit_files(env, report__r=b"# report\n", data=b"\x00\x01" * 5000)
    head = env.workspace.head() if env.workspace else None
    assert head is not None
    snapshot = read_snapshot(env.workspace, head)  # type: ignore[arg-type]
    assert snapshot.files_tree is not None
    assert snapshot.manifest["files"] == {"added": ["data", "report/r"]}
    env.reopen()
    assert files(env) == {"report/r": b"# report\n", "data": b"\x00\x01" * 5000}
    assert env.restore_report.recovery is None  # nothing had to be put back


def test_a_restart_puts_back_what_no_commit_holds(env: CoreEnv) -> None:
    commit_files(env, a=b"committed")
    root = env.image.files.root()
    env.close()
    (root / "a").write_bytes(b"changed while no kernel ran")
    (root / "b").write_bytes(b"new while no kernel ran")
    env.reopen()
    assert files(env) == {"a": b"committed"}
    assert "tracked files put back" in (env.restore_report.recovery or "")


def test_an_op_interrupted_in_its_commit_leaves_the_last_commit_after_a_restart(
        env: CoreEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    commit_files(env, a=b"committed", b=b"also")

    class Killed(BaseException):
        pass

    real = _faults.point

    def die(name: str) -> None:
        real(name)
        if name == "objects":
            raise Killed(name)

    # The process dies at "objects": nothing of the op is undone in it.
    monkeypatch.setattr(_faults, "point", die)
    monkeypatch.setattr(FilesParticipant, "abort", lambda self, txn: None)
    op = env.image.begin(source="# dies")
    write(env, "a", b"half of a new version")
    write(env, "c", b"new")
    (env.image.files.root() / "b").unlink()
    with pytest.raises(CommitFailed):
        op.commit()
    monkeypatch.undo()
    assert files(env) == {"a": b"half of a new version", "c": b"new"}
    env.reopen()
    assert files(env) == {"a": b"committed", "b": b"also"}


def test_a_kill_9_in_a_file_writing_op_leaves_the_last_commit(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    script = textwrap.dedent(f"""
        import kernos.files, types
        from kernos import Image, Workspace
        workspace = Workspace.open({str(workspace)!r})
        module = types.ModuleType("__main__")
        image = Image(workspace, module.__dict__, module=module)
        image.restore()
        for text in ("first", "second"):
            op = image.begin(source="# writes")
            kernos.files.path("out.txt").write_text(text)
            kernos.files.path(text).write_text(text)
            op.commit()
        """)
    environment = {**os.environ, "KERNOS_CRASH_AT": "objects@2",
                   "PYTHONPATH": str(Path(kernos.files.__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", script], env=environment, check=False,
                          capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    assert (workspace / "files" / "out.txt").read_text() == "second"
    env = CoreEnv(workspace)
    try:
        assert files(env) == {"out.txt": b"first", "first": b"first"}
    finally:
        env.close()


def test_a_checkout_brings_back_the_files_of_its_snapshot(env: CoreEnv) -> None:
    commit_files(env, a=b"v1", keep=b"same")
    first = env.image.head_op
    commit_files(env, a=b"v2", b=b"later")
    op = env.image.begin(source=None, kind="checkout")
    op.checkout(f"@{first}")
    op.commit()
    assert files(env) == {"a": b"v1", "keep": b"same"}
    env.reopen()
    assert files(env) == {"a": b"v1", "keep": b"same"}


def test_a_checkout_that_rolls_back_leaves_the_files_as_they_were(env: CoreEnv) -> None:
    commit_files(env, a=b"v1")
    first = env.image.head_op
    commit_files(env, a=b"v2", b=b"later")
    op = env.image.begin(source=None, kind="checkout")
    op.checkout(f"@{first}")
    assert files(env) == {"a": b"v1"}
    op.abort(error=RuntimeError("changed my mind"))
    assert files(env) == {"a": b"v2", "b": b"later"}


def test_a_full_disk_while_storing_file_contents_rolls_the_op_back(
        env: CoreEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    commit_files(env, a=b"small")
    head = env.workspace.head() if env.workspace else None
    objects = env.workspace.objects  # type: ignore[union-attr]
    real = objects.write

    def full(kind: bytes, data: bytes | memoryview, sha: bytes) -> int:
        if len(data) > 100_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(kind, data, sha)

    monkeypatch.setattr(objects, "write", full)
    op = env.image.begin(source="# big")
    write(env, "big", os.urandom(300_000))
    write(env, "a", b"changed")
    with pytest.raises(CommitFailed):
        op.commit()
    monkeypatch.undo()
    assert files(env) == {"a": b"small"}
    assert env.workspace.head() == head  # type: ignore[union-attr]
    env.reopen()
    assert files(env) == {"a": b"small"}
    commit_files(env, a=b"after")
    assert files(env) == {"a": b"after"}


def test_the_tracked_list_commits_rolls_back_and_survives_a_restart(
        env: CoreEnv, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "notes.txt").write_text("before")
    op = env.image.begin(source="# track")
    key = env.image.files.track(other)
    op.commit()
    env.reopen()
    assert key in env.image.files.roots
    op = env.image.begin(source="# fails")
    (other / "notes.txt").write_text("scribbled")
    (other / "junk").write_text("junk")
    op.abort(error=RuntimeError("no"))
    assert sorted(path.name for path in other.iterdir()) == ["notes.txt"]
    assert (other / "notes.txt").read_text() == "before"
    op = env.image.begin(source="# untrack, then fail")
    assert env.image.files.untrack(other)
    op.abort(error=RuntimeError("no"))
    assert key in env.image.files.roots


def test_a_checkout_without_a_kernel_brings_the_files_back_at_the_next_start(
        env: CoreEnv) -> None:
    from kernos import Workspace
    from kernos.audit.offline import checkout_offline

    commit_files(env, a=b"v1")
    first = env.image.head_op
    commit_files(env, a=b"v2", b=b"later")
    env.close()
    with Workspace.open(env.path) as workspace:
        checkout_offline(workspace, f"@{first}")
    env.reopen()
    assert files(env) == {"a": b"v1"}


def test_files_there_before_the_first_commit_outlive_a_failed_first_op(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")  # a new workspace: no snapshot yet
    env.close()
    root = tmp_path / "ws" / "files"
    root.mkdir()
    (root / "brought.csv").write_text("a,b\n")
    env.reopen()
    try:
        op = env.image.begin(source="# fails")
        (root / "stray").write_text("the op's")
        op.abort(error=RuntimeError("no"))
        assert files(env) == {"brought.csv": b"a,b\n"}
        env.run("x = 1")
        assert env.image.files.committed["files"].contents.files.keys() == {"brought.csv"}
    finally:
        env.close()
