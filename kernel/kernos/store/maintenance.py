"""``kernos gc``: merge a workspace's packs and loose objects into one pack, now.

The kernel already keeps the packs few (a geometric repack in the
background, :class:`kernos.store.object_store.ObjectStore`); this is the full
repack a person runs before copying a workspace, or after a long life.  It
uses git's own ``repack -a -d --keep-unreachable``, which writes the new pack durably before it
deletes what it replaces, so it is safe under ``kill -9`` and safe beside a
running kernel: a pack the kernel writes meanwhile is left alone.  Nothing
reachable or unreachable is deleted (an erasure in Kernos destroys keys, not
objects), so the audit chain is untouched and still verifies.  Deleting old
snapshots for good is ``kernos prune`` (``retention.py``).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kernos.errors import KernosError
from kernos.store import repack
from kernos.store.object_store import GIT_FSYNC
from kernos.store.workspace import Workspace

__all__ = ["Footprint", "footprint", "gc", "loosen"]


@dataclass(frozen=True)
class Footprint:
    """What a repository's objects take on disk."""

    packs: int
    loose: int
    files: int
    bytes: int

    def to_json(self) -> dict[str, int]:
        return {"packs": self.packs, "loose": self.loose, "files": self.files,
                "bytes": self.bytes}


def footprint(git_dir: Path) -> Footprint:
    packs = loose = files = size = 0
    for directory, _subdirectories, names in os.walk(git_dir / "objects"):
        for name in names:
            try:
                size += os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue
            files += 1
            if name.endswith(".pack"):
                packs += 1
            elif len(name) == 38 and len(os.path.basename(directory)) == 2:
                loose += 1
    return Footprint(packs=packs, loose=loose, files=files, bytes=size)


def gc(path: Path, *, timeout: float = 3600) -> tuple[Footprint, Footprint]:
    """Repack every object of the workspace at ``path`` into one pack; before and after."""
    with Workspace.open(path, writable=False) as workspace:
        git_dir = workspace.git_dir
    # A kernel's background repack (or a dead kernel's, still ending) and this one
    # never run at once: gc waits for it and holds the lock (kernos.store.repack).
    with repack.held(git_dir, timeout) as free:
        if not free:
            raise KernosError(f"a repack still runs in {git_dir} (a kernel's background one, "
                              f"or another kernos gc) after {timeout:.0f} s; run kernos gc "
                              "again when it has ended. Nothing was changed")
        before = footprint(git_dir)
        # --keep-unreachable: a kernel may be between writing a pack (a commit's, a fold's)
        # and moving its ref; without it `-a -d` would drop that pack's objects.
        for command in (["repack", "-a", "-d", "-q", "--keep-unreachable"],
                        ["prune-packed", "-q"]):
            done = subprocess.run(["git", *GIT_FSYNC, f"--git-dir={git_dir}", *command],
                                  capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                raise KernosError(f"git {command[0]} failed in {git_dir}: "
                                  f"{done.stderr.strip()[:500]}; the workspace is as it was "
                                  "(git replaces packs only once the new one is complete)")
        return before, footprint(git_dir)


def loosen(git_dir: Path) -> None:
    """Turn every packed object into a loose one: the layout of workspaces before packs.

    For the tests that tamper with one object's bytes and for the benchmark
    that compares layouts; a workspace works either way.  The packs are moved
    aside first (git does not unpack an object a pack still holds) and
    deleted once their objects are loose.
    """
    for index in sorted((git_dir / "objects" / "pack").glob("pack-*.idx")):
        pack = index.with_suffix(".pack")
        aside = git_dir / f"unpacking-{pack.name}"
        aside_index = aside.with_suffix(".idx")
        os.replace(index, aside_index)  # the index first: then git no longer sees the pack
        os.replace(pack, aside)
        with open(aside, "rb") as stream:
            done = subprocess.run(["git", f"--git-dir={git_dir}", "unpack-objects", "-q"],
                                  stdin=stream, capture_output=True, text=True)
        if done.returncode != 0:
            os.replace(aside, pack)
            os.replace(aside_index, index)
            raise KernosError(f"git unpack-objects failed on {pack.name}: {done.stderr[:500]}")
        aside.unlink()
        aside_index.unlink()

