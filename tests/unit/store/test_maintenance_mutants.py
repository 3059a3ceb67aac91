"""``kernos gc``, the footprint it reports, and ``loosen``, pinned exactly.

These close gaps mutation testing (``scripts/mutation store.maintenance``)
found: what the footprint counts as a pack, a loose object or a file, and how
many bytes (``kernos gc`` and ``kernos prune`` report it), a file that goes
while it is counted, the git commands gc runs (durable: git's fsync settings
on every one, and the caller's timeout), the error a failing git gives (the
command, the workspace, git's own words, cut to a length) and that
``loosen`` puts a pack back as it was when git cannot unpack it.
"""

from __future__ import annotations

import os
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernos import Image, Workspace
from kernos.errors import KernosError
from kernos.store import maintenance
from kernos.store.maintenance import Footprint, footprint, gc, loosen
from kernos.store.object_store import GIT_FSYNC


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True,
                          text=True, check=True).stdout.strip()


def sessions(path: Path, count: int) -> None:
    """``count`` sessions of one op each: each leaves a pack of its own when it closes."""
    for number in range(count):
        with Workspace.open(path, purpose="test") as workspace:
            module = types.ModuleType("__main__")
            image = Image(workspace, module.__dict__, module=module)
            image.restore()
            op = image.begin(source=f"n = {number}")
            module.__dict__["n"] = number
            op.commit()


def test_the_footprint_counts_packs_loose_objects_files_and_bytes(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    files = {
        "ab/" + "c" * 38: 11,  # a loose object
        "ab/" + "d" * 37: 5,  # not an object's name: a file, not a loose object
        "abc/" + "e" * 38: 7,  # not in a fan-out directory
        "pack/pack-1.pack": 100,
        "pack/pack-1.idx": 20,
        "pack/pack-1.rev": 3,
        "info/packs": 2,
        "f" * 40: 1,  # forty letters at the top: not a loose object either
    }
    for name, size in files.items():
        (objects / name).parent.mkdir(parents=True, exist_ok=True)
        (objects / name).write_bytes(b"x" * size)
    (tmp_path / "HEAD").write_text("not counted: outside objects/")
    found = footprint(tmp_path)
    assert found == Footprint(packs=1, loose=1, files=8, bytes=sum(files.values()))
    assert found.to_json() == {"packs": 1, "loose": 1, "files": 8, "bytes": 149}
    assert footprint(tmp_path / "nowhere") == Footprint(packs=0, loose=0, files=0, bytes=0)


def test_a_file_that_goes_while_it_is_counted_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pack = tmp_path / "objects" / "pack"
    pack.mkdir(parents=True)
    (pack / "pack-2.pack").write_bytes(b"y" * 9)

    def walk(top: Path) -> Iterator[tuple[str, list[str], list[str]]]:
        # A concurrent repack deleted pack-1 after the directory was listed.
        yield str(pack), [], ["pack-1.pack", "pack-1.idx", "pack-2.pack"]

    monkeypatch.setattr(maintenance.os, "walk", walk)
    assert footprint(tmp_path) == Footprint(packs=1, loose=0, files=1, bytes=9)


def test_gc_beside_a_kernel_leaves_one_pack_keeps_every_object_and_runs_git_durably(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ws"
    sessions(path, 3)
    git_dir = path / "history.git"
    head = git(git_dir, "rev-parse", "main")
    stray = subprocess.run(  # a loose object nothing refers to
        ["git", f"--git-dir={git_dir}", "hash-object", "-w", "--stdin"],
        input="unreachable, and kept", capture_output=True, text=True, check=True).stdout.strip()
    calls: list[tuple[list[str], dict[str, Any]]] = []
    real = subprocess.run

    def recorded(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append((command, kwargs))
        return real(command, **kwargs)

    monkeypatch.setattr(maintenance.subprocess, "run", recorded)
    with Workspace.open(path, purpose="kernel"):  # safe beside a running kernel
        before, after = gc(path, timeout=77)
    assert (before.packs, before.loose) == (3, 1) and before.files >= 7  # a .pack and .idx each
    assert (after.packs, after.loose) == (1, 0) and after.files < before.files
    assert after == footprint(git_dir)
    assert [command[len(GIT_FSYNC) + 2] for command, _ in calls] == ["repack", "prune-packed"]
    for command, kwargs in calls:
        assert command[: len(GIT_FSYNC) + 2] == ["git", *GIT_FSYNC, f"--git-dir={git_dir}"]
        assert kwargs["timeout"] == 77  # the caller's bound on a long repack
        assert kwargs["capture_output"] is True and kwargs["text"] is True  # git's words
    assert "--keep-unreachable" in calls[0][0] and "-a" in calls[0][0] and "-d" in calls[0][0]
    monkeypatch.undo()
    assert git(git_dir, "rev-parse", "main") == head
    assert git(git_dir, "cat-file", "blob", stray) == "unreachable, and kept"
    assert subprocess.run(["git", f"--git-dir={git_dir}", "fsck", "--full"],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("failing", ["repack", "prune-packed"])
def test_a_git_that_fails_in_gc_is_named_with_its_own_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    path = tmp_path / "ws"
    sessions(path, 1)
    git_dir = path / "history.git"
    ran: list[str] = []

    def fake(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        verb = command[len(GIT_FSYNC) + 2]
        ran.append(verb)
        if verb == failing:
            return subprocess.CompletedProcess(command, 128, "", "\n  fatal: " + "y" * 600)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(maintenance.subprocess, "run", fake)
    with pytest.raises(KernosError) as failed:
        gc(path)
    said = ("fatal: " + "y" * 600)[:500]
    assert str(failed.value) == (
        f"git {failing} failed in {git_dir}: {said}; the workspace is as it was "
        "(git replaces packs only once the new one is complete)")
    assert ran == ["repack", "prune-packed"][: ran.index(failing) + 1] and ran[-1] == failing


def test_gc_never_runs_beside_another_repack(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A repack holding the lock (a kernel's background one, a dead kernel's still ending):
    gc waits for it, refuses after its timeout with nothing changed, and while gc repacks
    no background repack starts."""
    import fcntl
    import os

    from kernos.store import repack

    path = tmp_path / "ws"
    sessions(path, 2)
    git_dir = path / "history.git"
    other = os.open(git_dir / repack.LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)  # another process's repack, as the lock sees it
    try:
        before = footprint(git_dir)
        with pytest.raises(KernosError, match="a repack still runs"):
            gc(path, timeout=0.2)
        assert footprint(git_dir) == before
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)
    started: list[object] = []
    real_run = maintenance.subprocess.run

    def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        started.append(repack.start(git_dir, ["true"]))  # a kernel asking meanwhile
        return real_run(command, **kwargs)

    monkeypatch.setattr(maintenance.subprocess, "run", run)
    _, after = gc(path)
    assert started == [None, None] and after.packs == 1


def test_loosen_turns_every_pack_into_loose_objects(tmp_path: Path) -> None:
    path = tmp_path / "ws"
    sessions(path, 2)
    git_dir = path / "history.git"
    objects = set(git(git_dir, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
                  .split())
    loosen(git_dir)
    assert sorted(os.listdir(git_dir / "objects" / "pack")) == []
    assert not list(git_dir.glob("unpacking-*"))
    found = footprint(git_dir)
    assert found.packs == 0 and found.loose == len(objects)
    assert set(git(git_dir, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
               .split()) == objects


def test_loosen_puts_back_a_pack_git_cannot_unpack(tmp_path: Path) -> None:
    git_dir = tmp_path / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True)
    pack_dir = git_dir / "objects" / "pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    for name, content in (("pack-1.pack", b"PACK damaged"), ("pack-1.idx", b"index 1"),
                          ("pack-2.pack", b"PACK two"), ("pack-2.idx", b"index 2")):
        (pack_dir / name).write_bytes(content)
    with pytest.raises(KernosError) as failed:
        loosen(git_dir)
    said = subprocess.run(["git", f"--git-dir={git_dir}", "unpack-objects", "-q"],
                          input=b"PACK damaged", capture_output=True).stderr.decode()
    assert said  # git's own words, whatever they are in this version
    assert str(failed.value) == f"git unpack-objects failed on pack-1.pack: {said[:500]}"
    assert {name: (pack_dir / name).read_bytes() for name in os.listdir(pack_dir)} == {
        "pack-1.pack": b"PACK damaged", "pack-1.idx": b"index 1",
        "pack-2.pack": b"PACK two", "pack-2.idx": b"index 2"}  # the first fails: all as was
    assert not list(git_dir.glob("unpacking-*"))


def test_loosen_cuts_git_s_words_to_a_length(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    git_dir = tmp_path / "repo.git"
    pack_dir = git_dir / "objects" / "pack"
    pack_dir.mkdir(parents=True)
    (pack_dir / "pack-1.pack").write_bytes(b"PACK")
    (pack_dir / "pack-1.idx").write_bytes(b"index")

    def chatty(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 128, "", "w" * 600)

    monkeypatch.setattr(maintenance.subprocess, "run", chatty)
    with pytest.raises(KernosError) as failed:
        loosen(git_dir)
    assert str(failed.value) == "git unpack-objects failed on pack-1.pack: " + "w" * 500
    assert sorted(os.listdir(pack_dir)) == ["pack-1.idx", "pack-1.pack"]
