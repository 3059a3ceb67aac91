"""The workspace directory, pinned exactly: where it is, what a new one holds, what it refuses,
its settings, and how references resolve.

These close gaps mutation testing (scripts/mutation store.workspace) found: the
default directory outside a checkout, the files a new workspace is created with,
the exact refusals an open gives (and the path they name), the durability an open
picks from ``KERNOS_DURABILITY``, the settings file, a ref git has packed,
corruption reported as such by the readers, and the corners of
``snapshot_of_op`` and ``resolve`` (lower case, ``~N``, full ids off the branch,
ambiguous prefixes).  Histories are built with git itself (``commit-tree``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernos._version import __version__
from kernos.errors import (
    KernosError,
    UnknownRef,
    UsageError,
    WorkspaceCorrupt,
    WorkspaceFormatError,
    WorkspaceLocked,
)
from kernos.store import location
from kernos.store import workspace as workspace_module
from kernos.store.objects import CommitData
from kernos.store.workspace import Workspace, default_workspace, op_of

IDENTITY = {"GIT_AUTHOR_NAME": "human", "GIT_AUTHOR_EMAIL": "human@kernos.invalid",
            "GIT_COMMITTER_NAME": "human", "GIT_COMMITTER_EMAIL": "human@kernos.invalid",
            "GIT_AUTHOR_DATE": "1700000000 +0000", "GIT_COMMITTER_DATE": "1700000000 +0000"}


def git(workspace: Workspace, *args: str, input: str | bytes | None = None) -> str:
    done = subprocess.run(["git", f"--git-dir={workspace.git_dir}", *args],
                          input=input.encode() if isinstance(input, str) else input,
                          capture_output=True, env={**os.environ, **IDENTITY})
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout.decode().strip()


def empty_tree(workspace: Workspace) -> str:
    return git(workspace, "mktree", input="")


def commit(workspace: Workspace, message: str, *parents: str) -> str:
    arguments = [argument for parent in parents for argument in ("-p", parent)]
    return git(workspace, "commit-tree", empty_tree(workspace), *arguments, "-m", message)


def ops(workspace: Workspace, *numbers: int | None) -> list[str]:
    """A chain of commits, one per number (its ``Kernos-Op`` trailer; None: no trailer)."""
    commits: list[str] = []
    for number in numbers:
        message = "no op" if number is None else f"op {number}\n\nKernos-Op: {number}"
        commits.append(commit(workspace, message, *commits[-1:]))
    git(workspace, "update-ref", "refs/heads/main", commits[-1])
    return commits


def corrupt(raised: pytest.ExceptionInfo[WorkspaceCorrupt], workspace: Workspace) -> str:
    """The problem a corruption error reports, once it is checked to name the workspace."""
    assert raised.value.path == str(workspace.path)
    assert str(raised.value).startswith(f"The workspace {workspace.path} is damaged: ")
    return raised.value.problem


def unknown(raised: pytest.ExceptionInfo[UnknownRef], workspace: Workspace) -> str:
    """The reference an unknown-ref error names, once it is checked to name the workspace."""
    assert raised.value.workspace == str(workspace.path)
    return raised.value.ref


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    with Workspace.open(tmp_path / "ws", durable=False) as opened:
        yield opened


# -- where -------------------------------------------------------------------------------------


def test_outside_a_checkout_the_default_is_under_the_data_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "site" / "kernos" / "store" / "workspace.py"
    monkeypatch.setattr(location, "__file__", str(source))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    session = {"JPY_SESSION_NAME": "/home/ada/My Notes (v2).ipynb"}
    assert default_workspace(session) == (
        tmp_path / "home" / ".local" / "share" / "kernos" / "workspaces" / "home-ada-My-Notes-v2")
    assert default_workspace({**session, "XDG_DATA_HOME": ""}) == (
        tmp_path / "home" / ".local" / "share" / "kernos" / "workspaces" / "home-ada-My-Notes-v2")
    assert default_workspace({"JPY_SESSION_NAME": "../.hidden.ipynb",
                              "XDG_DATA_HOME": "/data"}) == Path("/data/kernos/workspaces/hidden")
    assert default_workspace({"JPY_SESSION_NAME": "/..."}).name == "default"
    assert default_workspace({"JPY_SESSION_NAME": "X/notes X.ipynb"}).name == "X-notes-X"
    assert default_workspace({"JPY_SESSION_NAME": ""}).name == "default"
    # An empty KERNOS_WORKSPACE is no choice; one with ~ is the user's.
    assert default_workspace({"KERNOS_WORKSPACE": "", "XDG_DATA_HOME": "/data"}) == Path(
        "/data/kernos/workspaces/default")
    assert default_workspace({"KERNOS_WORKSPACE": "~/w"}) == tmp_path / "home" / "w"
    monkeypatch.setenv("KERNOS_WORKSPACE", str(tmp_path / "from-env"))
    assert default_workspace() == tmp_path / "from-env"


# -- creating and opening ----------------------------------------------------------------------


def test_a_new_workspace_holds_exactly_what_git_and_kernos_need(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(workspace_module, "fsync_dir", synced.append)
    root = tmp_path / "deep" / "er" / "ws"
    with Workspace.open(root, durable=False) as opened:
        assert opened.path == root and opened.git_dir == root / "history.git"
        assert opened.recovery_note is None and opened.writable
    assert synced[0] == root
    git_dir = root / "history.git"
    assert (git_dir / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert (git_dir / "config").read_text() == (
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n"
        "\tlogAllRefUpdates = false\n[gc]\n\tauto = 0\n")
    assert (git_dir / "description").read_text() == "Kernos image history\n"
    assert all((git_dir / sub).is_dir() for sub in ("objects", "refs/heads", "refs/tags", "info"))
    text = (root / "workspace.json").read_text()
    meta = json.loads(text)
    assert text == json.dumps(meta, indent=2) + "\n"
    assert set(meta) == {"format", "created_by", "created_at"}
    assert meta["format"] == 1 and meta["created_by"] == f"kernos {__version__}"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", meta["created_at"])
    assert not (root / "workspace.json.tmp").exists()
    # An empty directory that exists is made a workspace too.
    (tmp_path / "empty").mkdir()
    with Workspace.open(tmp_path / "empty", durable=False) as made:
        assert made.head() is None
    assert (tmp_path / "empty" / "workspace.json").exists()


def test_a_used_workspace_has_the_documented_layout(tmp_path: Path) -> None:
    from core_support import CoreEnv

    env = CoreEnv(tmp_path / "ws")
    assert sorted(os.listdir(tmp_path / "ws")) == ["audit", "history.git", "identity.json",
                                                   "lock", "workspace.json"]
    env.run("x = 1")  # a small commit: a frame in the tail
    env.run("import numpy as np\ny = np.arange(300_000.0)")  # a big buffer: a pack
    env.close()
    assert sorted(os.listdir(tmp_path / "ws")) == ["audit", "history.git", "identity.json",
                                                   "lock", "pending", "tail", "tmp",
                                                   "workspace.json"]
    assert list((tmp_path / "ws" / "tmp").iterdir()) == []
    assert (tmp_path / "ws" / "tail").read_bytes() == b""  # folded at close


def test_open_takes_the_default_directory_or_a_path_with_a_tilde(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with Workspace.open("~/ws", durable=False) as opened:
        assert opened.path == tmp_path / "home" / "ws"
    monkeypatch.setenv("KERNOS_WORKSPACE", str(tmp_path / "chosen"))
    with Workspace.open(durable=False) as chosen:
        assert chosen.path == tmp_path / "chosen"
    assert (tmp_path / "chosen" / "workspace.json").exists()


def test_the_lock_records_what_holds_it(tmp_path: Path) -> None:
    with Workspace.open(tmp_path / "a", durable=False):
        assert json.loads((tmp_path / "a" / "lock").read_text())["purpose"] == "kernos process"
    with Workspace.open(tmp_path / "a", purpose="kernos prune", durable=False) as opened:
        assert json.loads((tmp_path / "a" / "lock").read_text())["purpose"] == "kernos prune"
        assert opened.lock is not None and opened.lock.held
        with Workspace.open(tmp_path / "a", writable=False) as reader:
            assert reader.lock is None and not reader.writable
            assert reader.recovery_note is None  # a reader recovers nothing
    assert not opened.writable  # closed: the lock is let go
    with Workspace.open(tmp_path / "a") as again:
        assert again.writable


def test_refusals_name_the_path_and_say_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    for options in ({"writable": False}, {"create": False}):
        with pytest.raises(WorkspaceFormatError) as raised:
            Workspace.open(missing, **options)  # type: ignore[arg-type]
        assert str(raised.value) == (
            f"{missing} does not exist. Check the path (or KERNOS_WORKSPACE); a kernel "
            "creates its workspace when it first starts.")
        assert raised.value.path == str(missing)
        assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    for options in ({"writable": False}, {"create": False}):
        with pytest.raises(WorkspaceFormatError) as raised:
            Workspace.open(empty, **options)  # type: ignore[arg-type]
        assert str(raised.value) == (
            f"{empty} is not a Kernos workspace (it has no workspace.json). Check the path, "
            "or open it from a kernel to create it.")
        assert raised.value.path == str(empty)
        assert list(empty.iterdir()) == []
    (empty / "notes.txt").write_text("mine")
    with pytest.raises(WorkspaceFormatError) as raised:
        Workspace.open(empty)
    assert str(raised.value) == (
        f"{empty} exists and is not empty, but is not a Kernos workspace. Choose an empty or "
        "new directory for KERNOS_WORKSPACE.")
    assert raised.value.path == str(empty)
    assert sorted(path.name for path in empty.iterdir()) == ["notes.txt"]


def test_the_open_checks_the_format(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    Workspace.open(root, durable=False).close()
    meta = root / "workspace.json"
    for text in ("{torn", json.dumps({"format": "one"}), json.dumps({"version": 1}),
                 json.dumps([1])):
        meta.write_text(text)
        for writable in (True, False):
            with pytest.raises(WorkspaceCorrupt) as raised:
                Workspace.open(root, writable=writable)
            assert raised.value.problem.startswith("workspace.json is unreadable (")
            assert raised.value.path == str(root)
    meta.write_text(json.dumps({"format": 2}))
    with pytest.raises(WorkspaceFormatError) as newer:
        Workspace.open(root, writable=False)
    assert str(newer.value) == (f"{root} was written by a newer Kernos (format 2; this one "
                                "reads format 1). Upgrade Kernos to open it.")
    assert newer.value.path == str(root)
    meta.write_text(json.dumps({"format": 1}))
    (root / "history.git" / "objects").rename(root / "elsewhere")
    with pytest.raises(WorkspaceCorrupt) as raised:
        Workspace.open(root)
    assert raised.value.problem == "history.git/objects is missing"
    assert raised.value.path == str(root)
    (root / "elsewhere").rename(root / "history.git" / "objects")
    with Workspace.open(root, writable=False) as reader:
        assert reader.head() is None


def test_durability_follows_kernos_durability_unless_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ws"
    found = {}
    for value in ("process", "full", None):
        if value is None:
            monkeypatch.delenv("KERNOS_DURABILITY", raising=False)
        else:
            monkeypatch.setenv("KERNOS_DURABILITY", value)
        with Workspace.open(root) as opened:
            found[value] = (opened.durable, opened.objects.durable, opened.tail.durable)
    assert found == {"process": (False, False, False), "full": (True, True, True),
                     None: (True, True, True)}
    monkeypatch.setenv("KERNOS_DURABILITY", "process")
    with Workspace.open(root, durable=True) as opened:
        assert opened.durable


def test_a_failed_recovery_closes_the_workspace_and_lets_the_lock_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.store import retention

    root = tmp_path / "ws"
    Workspace.open(root, durable=False).close()

    def failing(workspace: Workspace) -> str | None:
        raise KernosError("recovery failed")

    monkeypatch.setattr(retention, "finish_interrupted", failing)
    with pytest.raises(KernosError, match="recovery failed"):
        Workspace.open(root)
    monkeypatch.setattr(retention, "finish_interrupted", lambda workspace: "pruned it")
    (root / "pending").write_text("junk\n")  # a journal a crash left: the batch is discarded
    with Workspace.open(root) as opened:
        assert opened.recovery_note == "discarded a half-written commit (0 packs or objects); " \
                                       "pruned it"
        with pytest.raises(WorkspaceLocked):
            Workspace.open(root)


# -- settings ----------------------------------------------------------------------------------


def test_settings_default_change_durably_and_refuse_what_they_do_not_know(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ws.setting("on_error") == "rollback"
    replaced: list[tuple[Path, bytes, bool, Path | None]] = []
    real = workspace_module.replace_file

    def replace_file(path: Path, data: bytes, *, durable: bool,
                     temporary: Path | None = None) -> None:
        replaced.append((path, data, durable, temporary))
        real(path, data, durable=durable, temporary=temporary)

    monkeypatch.setattr(workspace_module, "replace_file", replace_file)
    ws.durable = True
    ws.set_setting("on_error", "keep")
    path = ws.path / "settings.json"
    assert replaced == [(path, b'{\n  "on_error": "keep"\n}\n', True,
                         ws.path / "settings.json.tmp")]
    assert ws.setting("on_error") == "keep"
    ws.set_setting("on_error", "rollback")
    assert json.loads(path.read_text()) == {"on_error": "rollback"}
    for call in (lambda: ws.setting("colour"), lambda: ws.set_setting("colour", "red")):
        with pytest.raises(UsageError) as raised:
            call()
        assert str(raised.value) == "there is no setting 'colour'; settings: on_error"
    with pytest.raises(UsageError) as raised:
        ws.set_setting("on_error", "ignore")
    assert str(raised.value) == "on_error takes one of rollback, keep, not 'ignore'"
    assert ws.setting("on_error") == "rollback"
    with Workspace.open(ws.path, writable=False) as reader:
        with pytest.raises(UsageError) as raised:
            reader.set_setting("on_error", "keep")
        assert str(raised.value) == "settings change only in a workspace opened writable"
        assert reader.setting("on_error") == "rollback"


def test_a_stored_setting_that_is_not_allowed_reads_as_the_default_and_garbage_is_corruption(
        ws: Workspace) -> None:
    path = ws.path / "settings.json"
    path.write_text(json.dumps({"on_error": "explode", "other": 1}))
    assert ws.setting("on_error") == "rollback"
    ws.set_setting("on_error", "keep")
    assert json.loads(path.read_text()) == {"on_error": "keep"}  # only known settings stay
    for garbage in ("{torn", "[1, 2]"):
        path.write_text(garbage)
        with pytest.raises(WorkspaceCorrupt) as raised:
            ws.setting("on_error")
        problem = corrupt(raised, ws)
        assert problem.startswith("settings.json is unreadable (")
        assert problem.endswith("); fix or delete it")


# -- the branch --------------------------------------------------------------------------------


def test_a_ref_git_packed_is_read_from_packed_refs(ws: Workspace) -> None:
    first, second = ops(ws, 1, 2)
    (ws.git_dir / "refs" / "heads" / "main").unlink()
    assert ws.git_ref() is None and ws.head() is None  # no loose ref, no packed-refs
    packed = ws.git_dir / "packed-refs"
    packed.write_text(f"# pack-refs with: peeled fully-peeled sorted \n{first} refs/heads/backup\n"
                      f"{second} refs/heads/main\n")
    assert ws.git_ref() == bytes.fromhex(second)
    packed.write_text(f"{first} refs/heads/backup\n")
    assert ws.git_ref() is None
    (ws.git_dir / "refs" / "heads" / "main").write_text("")
    assert ws.git_ref() is None


def test_a_ref_that_is_no_commit_id_is_corruption(ws: Workspace) -> None:
    ref = ws.git_dir / "refs" / "heads" / "main"
    for text, shown in (("abcd", "'abcd'"), ("ab" * 21, repr("ab" * 21)),
                        ("ab" * 40, repr("ab" * 30)), ("z" * 80, repr("z" * 60))):
        ref.write_text(text + "\n")
        with pytest.raises(WorkspaceCorrupt) as raised:
            ws.git_ref()
        assert corrupt(raised, ws) == f"refs/heads/main holds {shown}"


# -- reading -----------------------------------------------------------------------------------


def test_readers_report_what_they_cannot_read_as_corruption(ws: Workspace) -> None:
    tree = empty_tree(ws)
    with pytest.raises(WorkspaceCorrupt) as raised:
        ws.read_commit(bytes.fromhex(tree))
    assert corrupt(raised, ws) == f"{tree} is a tree, not a commit"
    missing = bytes.fromhex("0" * 40)
    with pytest.raises(WorkspaceCorrupt) as raised:
        ws.read_object(missing)
    assert corrupt(raised, ws).startswith(f"object {'0' * 40} is unreadable (")
    with pytest.raises(WorkspaceCorrupt) as raised:
        ws.read_blob_into(missing, memoryview(bytearray(1)))
    assert corrupt(raised, ws).startswith(f"object {'0' * 40} is unreadable (")
    # A loose blob whose bytes are not zlib: zlib.error is corruption too.
    content = b"hello"
    sha = hashlib.sha1(b"blob 5\0" + content).hexdigest()
    path = ws.git_dir / "objects" / sha[:2] / sha[2:]
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(zlib.compress(b"blob 5\0" + content)[:-6] + b"garbage")
    with pytest.raises(WorkspaceCorrupt) as raised:
        ws.read_blob_into(bytes.fromhex(sha), memoryview(bytearray(5)))
    assert corrupt(raised, ws).startswith(f"object {sha} is unreadable (")


def test_history_walks_first_parents_from_any_start(ws: Workspace) -> None:
    c = ops(ws, 1, 2, 3)
    other = commit(ws, "elsewhere")
    merge = commit(ws, "op 4\n\nKernos-Op: 4", c[2], other)
    git(ws, "update-ref", "refs/heads/main", merge)
    assert [sha.hex() for sha, _ in ws.history()] == [merge, c[2], c[1], c[0]]
    assert [sha.hex() for sha, _ in ws.history(bytes.fromhex(c[1]))] == [c[1], c[0]]
    assert [op_of(data) for _, data in ws.history()] == [4, 3, 2, 1]


def test_snapshot_of_op_exact_or_the_newest_before(ws: Workspace) -> None:
    with pytest.raises(UnknownRef) as raised:
        ws.snapshot_of_op(1, exact=False)
    assert unknown(raised, ws) == "@1"
    c = ops(ws, 1, 2, None, 5, 7)
    assert ws.snapshot_of_op(5, exact=True).hex() == c[3]
    assert ws.snapshot_of_op(5, exact=False).hex() == c[3]
    assert ws.snapshot_of_op(4, exact=False).hex() == c[1]  # op 4 wrote none: op 2's is newest
    assert ws.snapshot_of_op(9, exact=False).hex() == c[4]
    for op in (4, 9, 3):
        with pytest.raises(UnknownRef) as raised:
            ws.snapshot_of_op(op, exact=True)
        assert unknown(raised, ws) == f"@{op}"
    with pytest.raises(UnknownRef) as raised:
        ws.snapshot_of_op(0, exact=False, ref="before the first")  # op 1 is the oldest
    assert unknown(raised, ws) == "before the first"
    assert ws.snapshot_of_op(2, exact=False).hex() == c[1]


def test_resolve_reads_head_offsets_ops_and_ids_in_any_case(ws: Workspace) -> None:
    with pytest.raises(UnknownRef) as raised:
        ws.resolve("HEAD")
    assert unknown(raised, ws) == "HEAD"
    c = ops(ws, 1, 2, 3)
    off_branch = commit(ws, "op 9\n\nKernos-Op: 9")
    cases = {"HEAD": c[2], "head": c[2], " HEAD ": c[2], "": c[2], "HEAD~0": c[2],
             "HEAD~1": c[1], "head~2": c[0], "~1": c[1], "@1": c[0], "@3": c[2],
             c[1]: c[1], c[1].upper(): c[1], c[0][:4]: c[0], c[0][:4].upper(): c[0],
             off_branch: off_branch, off_branch.upper(): off_branch}
    assert {ref: ws.resolve(ref).hex() for ref in cases} == cases
    tree = empty_tree(ws)
    # The error names the reference as it was given.
    for bad in ("HEAD~3", "Head", "HEAD~", "@9", " @9 ", "@x", c[0][:3], "0" * 40, tree,
                "HEAD^", c[0] + "0"):
        with pytest.raises(UnknownRef) as raised:
            ws.resolve(bad)
        assert unknown(raised, ws) == bad


def test_an_ambiguous_prefix_is_refused_with_the_count(ws: Workspace) -> None:
    # Two commits of the branch whose ids share their first four digits.
    first = ops(ws, 1)[0]
    header = f"tree {empty_tree(ws)}\nparent {first}\nauthor a <a@b> 1 +0000\n".encode()
    for n in range(1_000_000):
        data = header + b"committer a <a@b> 1 +0000\n\nop 2 try %d\n" % n
        sha = hashlib.sha1(b"commit %d\0" % len(data) + data).hexdigest()
        if sha[:4] == first[:4]:
            break
    assert git(ws, "hash-object", "-t", "commit", "-w", "--stdin", input=data) == sha
    git(ws, "update-ref", "refs/heads/main", sha)
    with pytest.raises(UnknownRef) as raised:
        ws.resolve(first[:4])
    assert unknown(raised, ws) == f"{first[:4]} (ambiguous: 2 commits)"
    assert ws.resolve(first[:12]).hex() == first


# -- the rest ----------------------------------------------------------------------------------


def test_repo_is_one_git_repository_for_the_history(ws: Workspace) -> None:
    c = ops(ws, 1)
    repo = ws.repo
    assert ws.repo is repo
    assert repo.head.commit.hexsha == c[0]
    assert Path(repo.git_dir) == ws.git_dir
    ws.close()
    assert ws._repo is None


def test_disk_usage_is_the_size_of_every_file_of_the_history(ws: Workspace) -> None:
    ops(ws, 1, 2)
    expected = sum(path.lstat().st_size for path in ws.git_dir.rglob("*")
                   if not path.is_dir())
    assert ws.disk_usage() == expected > 0


def test_disk_usage_skips_a_file_deleted_while_it_counts(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    ops(ws, 1, 2)
    files = [path for path in ws.git_dir.rglob("*") if not path.is_dir()]
    # The first file of its directory as os.walk lists it (others follow it there) is
    # deleted meanwhile, as a repack deletes what it merged.
    gone = Path(next(entry.path for entry in os.scandir(ws.git_dir) if entry.is_file()))
    assert len([path for path in files if path.parent == ws.git_dir]) > 1
    real = os.lstat

    def lstat(path: str) -> os.stat_result:
        if Path(path) == gone:
            raise FileNotFoundError(path)
        return real(path)

    monkeypatch.setattr(os, "lstat", lstat)
    assert ws.disk_usage() == sum(real(path).st_size for path in files if path != gone)


def test_a_full_disk_while_moving_the_ref_says_what_and_leaves_no_lock_file(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.errors import DiskFull
    from kernos.store.space import NOT_FOLDED, NOTHING_COMMITTED

    first, second = ops(ws, 1, 2)
    git(ws, "update-ref", "refs/heads/main", first)

    def full(fd: int, data: bytes | memoryview) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(workspace_module, "write_all", full)
    ref = ws.git_dir / "refs" / "heads" / "main"
    with pytest.raises(DiskFull) as raised:
        ws.set_head(bytes.fromhex(second))
    assert (raised.value.what, raised.value.path, raised.value.then) == (
        "the branch's ref", str(ref.with_name("main.lock")), NOTHING_COMMITTED)
    assert not ref.with_name("main.lock").exists()
    assert ref.read_text().strip() == first
    # A fold says instead that the tail keeps its commits.
    from kernos.store.tail import Frame

    ws.tail.append(Frame(bytes.fromhex(second), bytes.fromhex(first), {}, b""), sync=False)
    with pytest.raises(DiskFull) as raised:
        ws.fold()
    assert (raised.value.what, raised.value.then) == ("the branch's ref", NOT_FOLDED)
    assert len(ws.tail.frames) == 1 and ref.read_text().strip() == first


def test_the_ref_is_written_rw_r__r__and_a_failed_create_of_its_lock_file_is_reported(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.errors import DiskFull

    first, second = ops(ws, 1, 2)
    ref = ws.git_dir / "refs" / "heads" / "main"
    old_umask = os.umask(0o022)
    try:
        ws.set_head(bytes.fromhex(first))
    finally:
        os.umask(old_umask)
    assert ref.read_text() == first + "\n"
    assert ref.stat().st_mode & 0o777 == 0o644
    real_open = os.open

    def full_open(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        if os.fspath(path).endswith("main.lock"):
            raise OSError(28, "No space left on device")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", full_open)
    with pytest.raises(DiskFull) as raised:  # not the FileNotFoundError of cleaning up
        ws.set_head(bytes.fromhex(second))
    assert raised.value.what == "the branch's ref"
    assert ref.read_text() == first + "\n"


def test_a_frame_without_its_record_syncs_the_audit_log_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.errors import DiskFull
    from kernos.store.objects import encode_commit, object_id
    from kernos.store.space import NOTHING_COMMITTED

    with Workspace.open(tmp_path / "ws", durable=True) as workspace:
        head = bytes.fromhex(ops(workspace, 1)[0])
        data = encode_commit(CommitData(tree=bytes.fromhex(empty_tree(workspace)),
                                        parents=(head,), author="a <a@b>", timestamp=1,
                                        message="op 2\n\nKernos-Op: 2\n"))
        sha = object_id(b"commit", data)
        workspace.objects.begin()
        workspace.objects.write(b"commit", data, sha)
        workspace.objects.seal(sha, parent=head)  # small: kept for the tail
        chain = workspace.path / "audit" / "chain.jsonl"
        chain.parent.mkdir(exist_ok=True)
        chain.write_bytes(b"{}\n")
        synced: list[list[Path | int]] = []

        def full(paths: list[Path | int]) -> None:
            synced.append(list(paths))
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(workspace_module, "fsync_all", full)
        with pytest.raises(DiskFull) as raised:
            workspace.set_head(sha, sync_with=[chain])
        assert (raised.value.what, raised.value.path, raised.value.then) == (
            "the audit log (fsync)", str(chain), NOTHING_COMMITTED)
        assert synced == [[chain]] and not workspace.tail.frames
        assert workspace.head() == head
        monkeypatch.setattr(workspace_module, "fsync_all", synced.append)
        workspace.set_head(sha, sync_with=[chain])
        assert synced[1:] == [(chain,)]
        assert [frame.commit for frame in workspace.tail.frames] == [sha]
        assert workspace.tail.frames[0].record == b"" and workspace.head() == sha
        # Its fold syncs the ref's new file alone: no frame carries a record to sync.
        assert workspace.fold() == 1
        assert synced[2:] == [[workspace.git_dir / "refs" / "heads" / "main.lock"]]
        assert workspace.git_ref() == sha and not workspace.tail.frames


def test_a_packed_commit_syncs_its_pack_the_new_ref_and_the_audit_log_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.store import object_store as objects_module
    from kernos.store.objects import encode_commit, object_id

    with Workspace.open(tmp_path / "ws", durable=True) as workspace:
        head = bytes.fromhex(ops(workspace, 1)[0])
        data = encode_commit(CommitData(tree=bytes.fromhex(empty_tree(workspace)),
                                        parents=(head,), author="a <a@b>", timestamp=1,
                                        message="op 2\n\nKernos-Op: 2\n"))
        sha = object_id(b"commit", data)
        workspace.objects.begin()
        workspace.objects.write(b"commit", data, sha)
        workspace.objects.seal(sha)  # no parent given: written as a pack
        chain = workspace.path / "audit" / "chain.jsonl"
        chain.parent.mkdir(exist_ok=True)
        chain.write_bytes(b"{}\n")
        synced: list[list[Path | int]] = []
        monkeypatch.setattr(objects_module, "fsync_all", lambda jobs: synced.append(list(jobs)))
        workspace.set_head(sha, sync_with=[chain])
        assert len(synced) == 1
        jobs = synced[0]
        ref = workspace.git_dir / "refs" / "heads" / "main"
        assert ref.with_name("main.lock") in jobs and chain in jobs
        packs = [job for job in jobs if isinstance(job, Path) and job.suffix == ".pack"]
        assert len(packs) == 1 and packs[0].with_suffix(".idx") in jobs
        assert ref.read_text() == sha.hex() + "\n" and not workspace.tail.frames


def test_a_commit_whose_ref_moved_before_a_crash_is_kept_at_the_next_open(
        tmp_path: Path) -> None:
    from kernos.store.objects import encode_commit, object_id

    with Workspace.open(tmp_path / "ws", durable=False) as workspace:
        head = bytes.fromhex(ops(workspace, 1)[0])
        data = encode_commit(CommitData(tree=bytes.fromhex(empty_tree(workspace)),
                                        parents=(head,), author="a <a@b>", timestamp=1,
                                        message="op 2\n\nKernos-Op: 2\n"))
        sha = object_id(b"commit", data)
        workspace.objects.begin()
        workspace.objects.write(b"commit", data, sha)
        workspace.objects.seal(sha)  # a pack, named in the journal
        workspace.set_head(sha)  # the ref moved; the journal was not finished: a crash
        workspace.objects.close()
        assert workspace.lock is not None
        workspace.lock.release()
        with Workspace.open(tmp_path / "ws", durable=False) as reopened:
            assert reopened.recovery_note == (
                f"the interrupted commit {sha.hex()[:12]} had completed; kept it")
            assert reopened.head() == sha and reopened.read_commit(sha).parents == (head,)


def test_close_survives_a_fold_that_fails_and_the_next_open_folds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from core_support import CoreEnv

    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    workspace = env.workspace
    assert workspace is not None and len(workspace.tail.frames) == 1
    head = workspace.head()

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(workspace.objects, "pack_tail", full_disk)
    env.close()  # no error: the frame is durable in the tail
    assert not workspace.writable
    with Workspace.open(tmp_path / "ws") as reopened:
        assert reopened.recovery_note == "folded 1 commit(s) from the tail into the history"
        assert reopened.git_ref() == head


def test_the_open_says_what_it_folded_and_which_records_it_put_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from core_support import CoreEnv

    env = CoreEnv(tmp_path / "ws")
    env.run("x = 0")
    env.run("x += 1")
    workspace = env.workspace
    assert workspace is not None and len(workspace.tail.frames) == 2
    head = workspace.head()
    chain = tmp_path / "ws" / "audit" / "chain.jsonl"
    whole = chain.read_bytes()
    workspace.objects.close()  # the process dies: no fold, no close
    assert workspace.lock is not None
    workspace.lock.release()
    chain.write_bytes(whole[:-len(whole.splitlines(keepends=True)[-1])])  # a power cut
    from kernos.audit import log

    durably: list[bool] = []
    real_restore = log.restore_records

    def restore_records(path: Path, records: list[bytes], *, durable: bool) -> int:
        durably.append(durable)
        return real_restore(path, records, durable=durable)

    monkeypatch.setattr(log, "restore_records", restore_records)
    with Workspace.open(tmp_path / "ws", durable=True) as reopened:
        assert durably == [True]
        assert reopened.recovery_note == ("folded 2 commit(s) from the tail into the history; "
                                          "put back 1 audit record(s) from the tail")
        assert reopened.git_ref() == head and not reopened.tail.frames
    assert chain.read_bytes() == whole


def test_a_fold_packs_then_moves_the_ref_then_empties_the_tail_syncing_the_audit_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from core_support import CoreEnv
    from kernos import _faults

    monkeypatch.setenv("KERNOS_DURABILITY", "full")
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    workspace = env.workspace
    assert workspace is not None and workspace.durable
    before, head = workspace.git_ref(), workspace.head()
    seen: list[tuple[str, bytes | None, int]] = []
    real_point = _faults.point

    def point(name: str) -> None:
        if name.startswith("fold."):
            seen.append((name, workspace.git_ref(), len(workspace.tail.frames)))
        real_point(name)

    monkeypatch.setattr(_faults, "point", point)
    synced: list[list[Path | int]] = []
    monkeypatch.setattr(workspace_module, "fsync_all", synced.append)
    assert workspace.fold() == 1
    assert seen == [("fold.packed", before, 1), ("fold.published", head, 1)]
    # The frame carried the op's audit record: the chain is synced with the ref's new file.
    assert synced == [[workspace.git_dir / "refs" / "heads" / "main.lock",
                       tmp_path / "ws" / "audit" / "chain.jsonl"]]
    assert not workspace.tail.frames and workspace.git_ref() == head
    env.close()


def test_a_fold_without_an_audit_log_syncs_only_the_ref(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.store.tail import Frame

    with Workspace.open(tmp_path / "ws", durable=True) as workspace:
        first, second = ops(workspace, 1, 2)
        git(workspace, "update-ref", "refs/heads/main", first)
        workspace.tail.append(Frame(bytes.fromhex(second), bytes.fromhex(first), {}, b"{}"),
                              sync=False)
        synced: list[list[Path | int]] = []
        monkeypatch.setattr(workspace_module, "fsync_all", synced.append)
        assert workspace.fold() == 1
        assert synced == [[workspace.git_dir / "refs" / "heads" / "main.lock"]]
        assert workspace.git_ref() == bytes.fromhex(second)


def test_a_fold_without_durability_syncs_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.store.tail import Frame

    with Workspace.open(tmp_path / "ws", durable=False) as workspace:
        first, second = ops(workspace, 1, 2)
        git(workspace, "update-ref", "refs/heads/main", first)
        workspace.tail.append(Frame(bytes.fromhex(second), bytes.fromhex(first), {}, b""),
                              sync=False)
        synced: list[list[Path | int]] = []
        monkeypatch.setattr(workspace_module, "fsync_all", synced.append)
        assert workspace.fold() == 1
        assert synced == [] and workspace.git_ref() == bytes.fromhex(second)


def test_only_the_writer_folds(tmp_path: Path) -> None:
    from core_support import CoreEnv

    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    writer = env.workspace
    assert writer is not None and len(writer.tail.frames) == 1
    before = writer.git_ref()
    with Workspace.open(tmp_path / "ws", writable=False) as reader:
        assert reader.head() == writer.head() != before
        assert reader.fold() == 0
        assert reader.git_ref() == before and reader.head() == writer.head()
    assert len(writer.tail.frames) == 1 and (tmp_path / "ws" / "tail").stat().st_size > 0
    env.close()


def test_a_tail_a_crash_left_after_its_fold_is_emptied_at_the_next_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from core_support import CoreEnv

    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    workspace = env.workspace
    assert workspace is not None
    monkeypatch.setattr(workspace.tail, "clear", lambda: None)  # dies before emptying it
    assert workspace.fold() == 1
    head = workspace.git_ref()
    workspace.objects.close()
    assert workspace.lock is not None
    workspace.lock.release()
    assert (tmp_path / "ws" / "tail").stat().st_size > 0
    with Workspace.open(tmp_path / "ws", durable=False) as reopened:
        assert reopened.recovery_note is None  # nothing to fold, nothing lost
        assert (tmp_path / "ws" / "tail").read_bytes() == b""
        assert reopened.head() == head and not reopened.tail.frames


def test_op_of_reads_only_a_whole_trailer_line() -> None:
    def data(message: str) -> CommitData:
        return CommitData(tree=b"", parents=(), author="a", timestamp=0, message=message)

    assert op_of(data("op 12\n\nKernos-Op: 12\n")) == 12
    assert op_of(data("Kernos-Op: 3\nmore text\n")) == 3
    assert op_of(data("op\n\nKernos-Op: 12 or so\n")) is None
    assert op_of(data("op\n\nKernos-Op: x\n")) is None
    assert op_of(data("see Kernos-Op: 4\n")) is None
