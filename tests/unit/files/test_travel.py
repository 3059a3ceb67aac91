"""Tracked files travel (fork, push, pull, clone) and a snapshot from elsewhere is hostile:
an absolute directory is written only where this machine tracked it, and a files tree is
checked whole before anything is written (kernos.files.here, kernos.files.contents)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core_support import CoreEnv
from kernos.errors import RemoteRefused, WorkspaceCorrupt
from kernos.files import contents as stored_files
from kernos.files.here import RECORD
from kernos.fork import fork
from kernos.op import CommitReport
from kernos.remote.transfer import RemoteConfig, clone, pull, push
from kernos.store.objects import BLOB_MODE, TREE_MODE, TreeEntry
from kernos.store.snapshots import SnapshotWriter
from remote_support import signers_of


def on_disk(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file() and not path.is_symlink()}


def commit_cell(env: CoreEnv, source: str) -> str:
    return env.run(source).commit


def change(env: CoreEnv, files: dict[str, bytes | None]) -> str:
    """Write (or, for None, delete) files in ``env``'s own files root, in one op.  (Not
    ``kernos.files.path``: it names the files root of the image made last in this process,
    and these tests hold several.)"""
    op = env.image.begin(source="# writes files")
    root = env.path / "files"
    for name, data in files.items():
        if data is None:
            (root / name).unlink()
        else:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
    return op.commit().commit


def track(env: CoreEnv, path: Path) -> CommitReport:
    op = env.image.begin(source=f"%kernos track {path}")
    env.image.files.track(path)
    return op.commit()


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Callable[[str], CoreEnv]]:
    opened: list[CoreEnv] = []

    def make(name: str) -> CoreEnv:
        env = CoreEnv(tmp_path / name)
        opened.append(env)
        return env

    yield make
    for env in opened:
        env.close()


# -- travel ------------------------------------------------------------------------------


def test_fork_and_clone_carry_the_files_and_pull_brings_a_change(
        tmp_path: Path, made: Callable[[str], CoreEnv]) -> None:
    url = tmp_path / "remote.git"
    a = made("a")
    RemoteConfig.load(a.path).add("origin", str(url))
    change(a, {"report.md": b"# first\n", "sub/data.bin": bytes(range(256)) * 9000})
    push(a.path)
    expected = on_disk(a.path / "files")
    assert set(expected) == {"report.md", "sub/data.bin"}

    forked = fork(a.path, tmp_path / "forked")
    assert not (Path(forked.dest) / "files").exists()  # nothing but the history travels
    f = made("forked")
    assert on_disk(f.path / "files") == expected  # opening puts them on disk

    clone(str(url), tmp_path / "b", trust=signers_of(url))
    b = made("b")
    assert on_disk(b.path / "files") == expected
    b.close()

    change(a, {"report.md": b"# second\n", "sub/data.bin": None})
    push(a.path)
    pull(tmp_path / "b")
    b = made("b")
    assert on_disk(b.path / "files") == {"report.md": b"# second\n"}


def test_an_absolute_directory_tracked_elsewhere_is_left_alone(
        tmp_path: Path, made: Callable[[str], CoreEnv]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    url = tmp_path / "remote.git"
    a = made("a")
    RemoteConfig.load(a.path).add("origin", str(url))
    track(a, outside)
    (outside / "results.csv").write_text("a,b\n1,2\n")
    commit_cell(a, "x = 1")
    assert json.loads((a.path / RECORD).read_text())["directories"] == [str(outside)]
    push(a.path)
    a.close()

    # The owner's machine changes the directory; a clone must not put it back.
    (outside / "results.csv").write_text("mine now\n")
    (outside / "extra").write_text("not the image's\n")
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    assert not (tmp_path / "b" / RECORD).exists()  # the grant never travels
    b = made("b")
    report = b.run("y = 2")
    assert on_disk(outside) == {"results.csv": b"mine now\n", "extra": b"not the image's\n"}
    notices = report.files.get("notices", [])
    assert any(str(outside) in notice and "%kernos track" in notice for notice in notices)
    # ... and its commits keep the directory in the history as it was.
    report = b.run("z = 3")
    assert "notices" not in report.files  # told once
    tree = b.image.files.tree
    assert tree is not None
    roots, trees = stored_files.read_index(b.workspace, tree)  # type: ignore[arg-type]
    assert roots["outside"] == {"path": str(outside), "base": "absolute"}
    kept = stored_files.read_contents(b.workspace, trees["outside"])  # type: ignore[arg-type]
    assert set(kept.files) == {"results.csv"}
    # A rollback leaves it alone too.
    with pytest.raises(ZeroDivisionError):
        b.run(f"open({str(outside / 'by-b')!r}, 'w').write('x')\n1 / 0")
    assert (outside / "by-b").exists()

    # A fork is another workspace: the same.
    forked = fork(a.path, tmp_path / "forked")
    (outside / "by-b").unlink()
    f = made("forked")
    f.run("w = 1")
    assert on_disk(outside) == {"results.csv": b"mine now\n", "extra": b"not the image's\n"}
    assert not (Path(forked.dest) / RECORD).exists()

    # Accepting it: the op commits what it holds here.
    report = track(b, outside)
    assert sorted(report.files["added"]) == ["outside:extra"]
    assert report.files["changed"] == ["outside:results.csv"]
    assert json.loads((b.path / RECORD).read_text())["directories"] == [str(outside)]


# -- hostile trees -----------------------------------------------------------------------


def index(writer: SnapshotWriter, roots: dict[str, object], trees: dict[str, bytes],
          *, extra: dict[str, object] | None = None) -> bytes:
    data = json.dumps({"format": 1, "roots": roots, **(extra or {})}).encode()
    return writer.tree([TreeEntry(BLOB_MODE, "index.json", writer.blob(data)),
                        *(TreeEntry(TREE_MODE, key, sha) for key, sha in trees.items())])


OWN = {"path": "files", "base": "workspace"}


def craft(env: CoreEnv, build: Callable[[SnapshotWriter], bytes]) -> str:
    """Commit an op whose files/ tree is ``build``'s (a writer trusted here gone bad)."""
    files = env.image.files
    honest = files.prepare
    head_tree = files.tree

    def crafted(writer: SnapshotWriter):  # type: ignore[no-untyped-def]
        prepared = honest(writer)
        prepared.tree = build(writer)
        return prepared

    files.prepare = crafted  # type: ignore[method-assign]
    try:
        commit = env.run("crafted = True").commit
    finally:
        del files.prepare
        files.tree = head_tree
    return commit


def one_file(writer: SnapshotWriter, entry: TreeEntry) -> bytes:
    return index(writer, {"files": OWN}, {"files": writer.tree([entry])})


HOSTILE: dict[str, tuple[Callable[[SnapshotWriter], bytes], str]] = {
    "dot-dot entry": (lambda w: one_file(w, TreeEntry(BLOB_MODE, "f..", w.blob(b"x"))),
                      "leaves the directory"),
    "dot-dot directory": (lambda w: one_file(w, TreeEntry(
        TREE_MODE, "d..", w.tree([TreeEntry(BLOB_MODE, "fevil", w.blob(b"x"))]))),
        "leaves the directory"),
    "symlink mode as a file": (lambda w: one_file(w, TreeEntry(
        b"120000", "fevil", w.blob(b"/etc/passwd"))), "mode 120000"),
    "submodule": (lambda w: one_file(w, TreeEntry(b"160000", "fsub", b"\1" * 20)),
                  "mode 160000"),
    "link out": (lambda w: one_file(w, TreeEntry(b"120000", "levil", w.blob(b"../.."))),
                 "climbs above"),
    "absolute link": (lambda w: one_file(w, TreeEntry(b"120000", "levil", w.blob(b"/etc"))),
                      "outside"),
    "link through a link": (lambda w: index(w, {"files": OWN}, {"files": w.tree([
        TreeEntry(b"120000", "lhere", w.blob(b".")),
        TreeEntry(b"120000", "levil", w.blob(b"here/here/.."))])}), "climbs above"),
    "gap in chunks": (lambda w: one_file(w, TreeEntry(TREE_MODE, "cbig", w.tree([
        TreeEntry(BLOB_MODE, "000000", w.blob(b"a")),
        TreeEntry(BLOB_MODE, "000002", w.blob(b"b"))]))), "without a gap"),
    "twice": (lambda w: one_file(w, TreeEntry(BLOB_MODE, "fa", w.blob(b"a")))
              if False else index(w, {"files": OWN}, {"files": w.tree([
                  TreeEntry(BLOB_MODE, "fa", w.blob(b"a")),
                  TreeEntry(TREE_MODE, "da", w.tree([]))])}), "listed twice"),
    "workspace base elsewhere": (lambda w: index(
        w, {"files": OWN, "x": {"path": "../..", "base": "workspace"}},
        {"files": w.tree([]), "x": w.tree([])}), "relative to the workspace"),
    "relative absolute": (lambda w: index(
        w, {"files": OWN, "x": {"path": "tmp/../x", "base": "absolute"}},
        {"files": w.tree([]), "x": w.tree([])}), "normalised absolute"),
    "unknown key": (lambda w: index(w, {"files": OWN}, {"files": w.tree([])},
                                    extra={"hooks": "rm -rf"}), "exactly 'format'"),
    "unknown spec key": (lambda w: index(
        w, {"files": {**OWN, "mode": "777"}}, {"files": w.tree([])}), "exactly a 'path'"),
    "no own root": (lambda w: index(w, {}, {}), "own files root"),
    "unlisted tree": (lambda w: index(w, {"files": OWN},
                                      {"files": w.tree([]), "ghost": w.tree([])}),
                      "does not list"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_files_tree_is_refused_whole(case: str, tmp_path: Path,
                                               made: Callable[[str], CoreEnv]) -> None:
    build, problem = HOSTILE[case]
    a = made("a")
    first = change(a, {"kept.txt": b"as committed"})
    bad = craft(a, build)
    before = on_disk(a.path / "files")
    parent = tmp_path.parent
    outside_before = sorted(p.name for p in parent.iterdir())

    op = a.image.begin(source="# checkout")
    with pytest.raises(WorkspaceCorrupt) as refused:
        op.checkout(bad)
    op.abort()
    assert bad[:12] in str(refused.value) and problem in str(refused.value)
    assert "no tracked file was changed" in str(refused.value)
    assert on_disk(a.path / "files") == before
    op = a.image.begin(source="# checkout")
    op.checkout(first)  # a good one still checks out
    op.commit()

    # At open, with the bad snapshot at the head: the same refusal, nothing written.
    a.run("again = 1")
    bad = craft(a, build)
    a.close()
    (a.path / "files" / "kept.txt").write_text("changed while no kernel ran")
    with pytest.raises(WorkspaceCorrupt) as refused:
        a.reopen()
    assert bad[:12] in str(refused.value) and problem in str(refused.value)
    assert on_disk(a.path / "files") == {"kept.txt": b"changed while no kernel ran"}
    assert sorted(p.name for p in parent.iterdir()) == outside_before


def test_links_that_stay_inside_are_restored(made: Callable[[str], CoreEnv]) -> None:
    a = made("a")
    a.run("import kernos.files, os\n"
          "(kernos.files.root() / 'd').mkdir()\n"
          "kernos.files.path('d/t.txt').write_text('target')\n"
          "os.symlink('../d/t.txt', kernos.files.path('d/up'))\n"
          "os.symlink(str(kernos.files.path('d')), kernos.files.path('abs'))\n")
    a.close()
    for name in ("d/up", "abs"):
        (a.path / "files" / name).unlink()
    a.reopen()
    assert (a.path / "files" / "d" / "up").read_text() == "target"
    assert (a.path / "files" / "abs").is_symlink()


def test_a_link_on_disk_is_never_followed_by_a_restore(
        tmp_path: Path, made: Callable[[str], CoreEnv]) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    a = made("a")
    change(a, {"sub/f": b"in the image"})
    a.close()
    root = a.path / "files"
    (root / "sub" / "f").unlink()
    (root / "sub").rmdir()
    (root / "sub").symlink_to(outside)  # planted while no kernel ran
    a.reopen()
    assert list(outside.iterdir()) == []
    assert not (root / "sub").is_symlink()
    assert (root / "sub" / "f").read_text() == "in the image"


@pytest.mark.parametrize("case", ["dot-dot entry", "symlink mode as a file", "link out",
                                  "unknown key", "workspace base elsewhere"])
def test_a_pull_or_clone_refuses_a_hostile_files_tree(
        case: str, tmp_path: Path, made: Callable[[str], CoreEnv]) -> None:
    build, problem = HOSTILE[case]
    url = tmp_path / "remote.git"
    a = made("a")
    RemoteConfig.load(a.path).add("origin", str(url))
    change(a, {"kept.txt": b"as committed"})
    push(a.path)
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    b_before = {path: path.read_bytes() for path in sorted((tmp_path / "b").rglob("*"))
                if path.is_file()}
    bad = craft(a, build)
    push(a.path)

    with pytest.raises(RemoteRefused) as refused:
        pull(tmp_path / "b")
    assert bad[:12] in str(refused.value) and problem in str(refused.value)
    assert {path: path.read_bytes() for path in sorted((tmp_path / "b").rglob("*"))
            if path.is_file()} == b_before
    with pytest.raises(RemoteRefused) as refused:
        clone(str(url), tmp_path / "c", trust=signers_of(url))
    assert problem in str(refused.value)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
