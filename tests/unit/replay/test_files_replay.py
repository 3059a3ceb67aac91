"""Replay reproduces tracked files hash for hash, writes them in its own workspace, and
names a file that comes out otherwise (kernos.replay.files)."""

from __future__ import annotations

from pathlib import Path

from core_support import CoreEnv
from kernos.replay.driver import replay
from kernos.store.snapshots import read_snapshot
from kernos.store.workspace import Workspace

WRITES = [
    "import kernos.files\nkernos.files.path('out.csv').write_text('a,b\\n1,2\\n')\nx = 1",
    "import os\n(kernos.files.root() / 'plots').mkdir()\n"
    "kernos.files.path('plots/fig.bin').write_bytes(bytes(range(256)) * 5000)\n"
    "os.chmod(kernos.files.path('out.csv'), 0o755)",
    "kernos.files.path('out.csv').unlink()\nwith open(kernos.files.path('log.txt'), 'a') as f:\n"
    "    f.write('line\\n' * 3)",
]


def source(tmp_path: Path, cells: list[str]) -> Path:
    with CoreEnv(tmp_path / "source") as env:
        for cell in cells:
            env.run(cell)
    return tmp_path / "source"


def files_trees(path: Path) -> list[str | None]:
    with Workspace.open(path, writable=False) as workspace:
        trees = []
        for commit, _data in workspace.history():
            tree = read_snapshot(workspace, commit).files_tree
            trees.append(None if tree is None else tree.hex())
    return trees


def test_replayed_files_are_the_same_hash_for_hash(tmp_path: Path) -> None:
    path = source(tmp_path, WRITES)
    before = sorted(p.name for p in (path / "files").rglob("*"))
    report = replay(path, into=tmp_path / "replayed")
    assert report.ok, report.summary()
    assert [step.files for step in report.steps] == [step.original_files
                                                     for step in report.steps]
    assert all(step.files is not None for step in report.steps)
    assert files_trees(tmp_path / "replayed")[:3] == files_trees(path)[:3]
    # The replay wrote its own files root, and left the source's as it was.
    replayed = tmp_path / "replayed" / "files"
    assert (replayed / "plots" / "fig.bin").read_bytes() == bytes(range(256)) * 5000
    assert (replayed / "log.txt").read_text() == "line\n" * 3
    assert sorted(p.name for p in (path / "files").rglob("*")) == before


def test_a_file_written_otherwise_is_a_divergence_naming_it(tmp_path: Path) -> None:
    # The OS's randomness is not seeded (time.time() is: kernos.determinism records it).
    path = source(tmp_path, [WRITES[0], "import os\n"
                             "kernos.files.path('plots').mkdir()\n"
                             "kernos.files.path('plots/noise.bin').write_bytes(os.urandom(16))"
                             "\ny = 2"])
    report = replay(path, into=tmp_path / "replayed")
    assert not report.ok
    divergence = report.divergence
    assert divergence is not None and divergence.op == 2
    assert "tracked files" in divergence.reason
    assert set(divergence.names) == {"files/plots/noise.bin"}
    assert "bytes differ" in divergence.names["files/plots/noise.bin"]
    assert "files/plots/noise.bin" in report.summary()
    assert report.steps[0].matches and not report.steps[1].matches


def test_a_replay_leaves_directories_tracked_outside_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    with CoreEnv(tmp_path / "source") as env:
        env.run(f"import kernos.files\nkernos.files.current().track({str(outside)!r})")
        (outside / "table.csv").write_text("as committed\n")
        env.run("x = 1")
        env.run("y = 2")
    (outside / "table.csv").write_text("the user's own, since\n")
    # From op 2's snapshot: the base checks out a directory tracked elsewhere.
    report = replay(tmp_path / "source", start="@2", into=tmp_path / "replayed")
    assert report.ok, report.summary()
    assert report.steps[-1].files == report.steps[-1].original_files
    assert (outside / "table.csv").read_text() == "the user's own, since\n"
    assert sorted(p.name for p in outside.iterdir()) == ["table.csv"]
    # From the start: the op that tracked it cannot track it in the replay.
    report = replay(tmp_path / "source", into=tmp_path / "again")
    assert report.divergence is not None and report.divergence.op == 1
    assert "'failed' in the replay" in report.divergence.reason
    assert (outside / "table.csv").read_text() == "the user's own, since\n"
