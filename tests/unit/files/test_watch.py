"""The inotify watcher only says where to look: whatever happens between ops, a commit
stores exactly what the disk holds (kernos.files.watch)."""

from __future__ import annotations

import mmap
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core_support import CoreEnv
from kernos.files import scan, watch


@pytest.fixture
def env(tmp_path: Path) -> Iterator[CoreEnv]:
    opened = CoreEnv(tmp_path / "ws")
    yield opened
    opened.close()


def on_disk(root: Path) -> tuple[set[str], set[str]]:
    listing = scan.scan(str(root))
    return set(listing.entries), listing.dirs


def committed(env: CoreEnv) -> tuple[set[str], set[str]]:
    state = env.image.files.committed["files"]
    return set(state.contents.files), set(state.contents.dirs)


def churn(root: Path, rng: random.Random) -> None:
    """One random change: files and directories made, written, renamed and removed."""
    dirs = [root, *sorted(path for path in root.rglob("*") if path.is_dir())]
    files = sorted(path for path in root.rglob("*") if path.is_file())
    choice = rng.randrange(7)
    if choice == 0 or not files:
        (rng.choice(dirs) / f"f{rng.randrange(1000)}").write_bytes(os.urandom(rng.randrange(50)))
    elif choice == 1:
        made = rng.choice(dirs) / f"d{rng.randrange(1000)}"
        made.mkdir(exist_ok=True)
        (made / "inside").write_text("written at once")  # before any watch can be on it
    elif choice == 2:
        rng.choice(files).write_bytes(os.urandom(rng.randrange(50)))
    elif choice == 3:
        rng.choice(files).unlink()
    elif choice == 4:
        source = rng.choice(files)
        source.rename(rng.choice(dirs) / f"moved{rng.randrange(1000)}")
    elif choice == 5 and len(dirs) > 1:
        moved = rng.choice(dirs[1:])
        target = rng.choice(dirs) / f"r{rng.randrange(1000)}"
        if moved not in target.parents and not target.exists():
            moved.rename(target)
    elif len(dirs) > 1:
        shutil.rmtree(rng.choice(dirs[1:]))


@pytest.mark.parametrize("seed", range(4))
def test_every_commit_stores_what_the_disk_holds(env: CoreEnv, seed: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    full_looks: list[str] = []
    real = watch.Watcher._full

    def counted(self: watch.Watcher) -> scan.Listing:
        full_looks.append(self.root)
        return real(self)

    monkeypatch.setattr(watch.Watcher, "_full", counted)
    rng = random.Random(seed)
    root = env.image.files.root()
    for _ in range(40):
        for _ in range(rng.randrange(1, 4)):
            churn(root, rng)
        env.image.begin(source="# churn").commit()
        assert committed(env) == on_disk(root)
    assert len(full_looks) <= 12, len(full_looks)  # the first, and directories moved
    env.reopen()
    assert env.restore_report.recovery is None  # the bytes too: nothing to put back


def test_a_write_through_a_memory_map_is_seen_by_the_next_full_look(
        env: CoreEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    path = env.image.files.root() / "mapped"
    path.write_bytes(b"\0" * 4096)
    env.image.begin(source="# map").commit()
    time.sleep(scan.RACY_NS / 1e9 + 0.05)
    env.image.begin(source="# settle: read once more, then trusted").commit()
    monkeypatch.setattr(watch, "FULL_LOOK_SECONDS", 0.0)
    # Open for writing and not closed (closing would send an event): writes through the
    # map send none, but they move the file's mtime, which a full look sees.
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 4096) as memory:
        memory[:5] = b"hello"
        memory.flush()
        report = env.image.begin(source="# look").commit()
    assert report.files == {"changed": ["mapped"]}


def test_a_file_written_just_before_a_commit_is_read_again_by_the_next(
        env: CoreEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Racily clean files: a key taken within RACY_NS of the file's ctime is not trusted
    (here a write that sends no event, through a map, right after the commit)."""
    monkeypatch.setattr(watch, "FULL_LOOK_SECONDS", 3600.0)
    path = env.image.files.root() / "fresh"
    path.write_bytes(b"\0" * 4096)
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 4096) as memory:
        env.image.begin(source="# commit it").commit()
        memory[:5] = b"later"
        memory.flush()
        report = env.image.begin(source="# the next op").commit()
    assert report.files == {"changed": ["fresh"]}
