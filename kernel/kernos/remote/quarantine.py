"""The quarantine a pull fetches into, and the workspace as the pull would leave it.

:class:`Quarantine` is ``<workspace>/incoming/``: a bare repository,
``q.git``, whose ``objects/info/alternates`` borrows the history's objects (and
the staging repository's, so less is fetched), and which a pull fetches the
remote's refs into in one ``git fetch``; nothing else in the workspace changes
until the pull's checks (:mod:`kernos.remote.pull`) pass.  A refusal
deletes it; so does the next writable open after a crash
(:mod:`kernos.remote.land`).

:class:`Candidate` is what :func:`kernos.audit.verify.verify_candidate`
reads: the history with the fetched objects and ``main`` where the pull would
put it; :class:`Joined` is the chain it would have (this workspace's, then the
remote's new lines), read as one file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kernos.errors import RemoteError, RemoteRefused
from kernos.remote.git import git
from kernos.store.objects import CommitData, decode_commit
from kernos.store.workspace import BRANCH

__all__ = ["QUARANTINE", "Candidate", "CatFile", "Entry", "Joined", "Quarantine"]

QUARANTINE = "incoming"
"""Where a pull keeps what it fetched and checked, inside the workspace (only while it runs)."""


class Quarantine:
    """``<workspace>/incoming``: a repository borrowing the history's objects, and the
    files a pull has checked (see the module docstring)."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.root = workspace / QUARANTINE
        self.git_dir = self.root / "q.git"
        self._reader: CatFile | None = None

    def create(self) -> None:
        """Make it afresh (what an earlier pull left is deleted first)."""
        self.discard()
        for sub in ("objects/info", "refs"):
            (self.git_dir / sub).mkdir(parents=True, exist_ok=True)
        borrowed = [self.workspace / "history.git" / "objects"]
        staging = self.workspace / "remote.git" / "objects"
        if staging.is_dir():  # the audit trees of earlier pushes: less to fetch
            borrowed.append(staging)
        (self.git_dir / "objects" / "info" / "alternates").write_text(
            "".join(f"{path}\n" for path in borrowed))
        (self.git_dir / "config").write_text(
            "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"
            "\tlogAllRefUpdates = false\n[gc]\n\tauto = 0\n"
            "[uploadpack]\n\tallowAnySHA1InWant = true\n")
        (self.git_dir / "HEAD").write_text("ref: refs/heads/main\n")

    def discard(self) -> None:
        """Delete it: a refusal leaves nothing."""
        self.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def fetch(self, url: str, name: str, have: Sequence[bytes]) -> dict[str, bytes]:
        """Fetch the remote's main and Kernos refs in one go; ``ref -> id`` of those it has.

        ``have``: commits this workspace has (its head), so only what it lacks is sent.
        """
        if have:
            git(self.git_dir, "update-ref", "--stdin", stdin="".join(
                f"update refs/have/{number} {sha.hex()}\n"
                for number, sha in enumerate(have)).encode(), what="noting what we have")
        done = git(self.git_dir, "fetch", "--no-tags", "--no-write-fetch-head", "--quiet",
                   url, f"+{BRANCH}:refs/pull/{BRANCH}",
                   "+refs/kernos/*:refs/pull/refs/kernos/*", check=False)
        if done.returncode != 0:
            detail = " ".join(done.stderr.decode(errors="replace").split())[:400]
            if "couldn't find remote ref" in detail:  # no main yet: the Kernos refs only
                git(self.git_dir, "fetch", "--no-tags", "--no-write-fetch-head", "--quiet",
                    url, "+refs/kernos/*:refs/pull/refs/kernos/*",
                    what=f"fetching from the remote {name} ({url})")
            else:
                raise RemoteError(f"fetching from the remote {name} ({url}) failed: "
                                  f"{detail or 'no message'}", remote=name)
        listing = git(self.git_dir, "for-each-ref", "--format=%(objectname) %(refname)",
                      "refs/pull/", what="listing what was fetched").stdout.decode()
        found = {}
        for line in listing.splitlines():
            sha, _, ref = line.partition(" ")
            found[ref.removeprefix("refs/pull/")] = bytes.fromhex(sha)
        return found

    def reader(self) -> CatFile:
        if self._reader is None:
            self._reader = CatFile(self.git_dir)
        return self._reader

    def tree(self, commit: bytes, remote: str, what: str) -> list[Entry]:
        """Every entry under ``commit``'s tree, with its mode, type and size."""
        kind, _data = self.reader().read(commit)
        if kind != b"commit":
            raise RemoteRefused(f"Refused: the remote {remote}'s {what} ref names a {kind.decode()}"
                                ", not a commit; it is not a Kernos remote, or it was tampered "
                                "with. Nothing was changed here.", remote=remote)
        listing = git(self.git_dir, "ls-tree", "-r", "-l", "-z", "--full-tree",
                      commit.hex(), what=f"reading the remote's {what} tree").stdout
        entries = []
        for item in listing.split(b"\0"):
            if not item:
                continue
            meta, _, path = item.partition(b"\t")
            mode, kind_text, sha, size = meta.decode().split()
            entries.append(Entry(mode=mode, kind=kind_text, sha=bytes.fromhex(sha),
                                  size=int(size) if size.isdigit() else -1,
                                  path=path.decode(errors="replace")))
        return entries

    def cat(self, sha: bytes) -> bytes:
        return self.reader().read(sha)[1]


class CatFile:
    """One ``git cat-file --batch`` process on a repository: objects read by id, one round
    trip each."""

    def __init__(self, git_dir: Path) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
        self.process = subprocess.Popen(
            ["git", f"--git-dir={git_dir}", "cat-file", "--batch"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

    def read(self, sha: bytes) -> tuple[bytes, bytes]:
        """(kind, data) of object ``sha``; FileNotFoundError if it is not there."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(sha.hex().encode() + b"\n")
        self.process.stdin.flush()
        header = self.process.stdout.readline().split()
        if len(header) != 3:
            raise FileNotFoundError(sha.hex())
        data = self.process.stdout.read(int(header[2]))
        self.process.stdout.read(1)  # the newline after the object
        return header[1], data

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@dataclass(frozen=True, kw_only=True)
class Entry:
    mode: str
    kind: str
    sha: bytes
    size: int
    path: str


# -- the candidate: the workspace as the pull would leave it ------------------------------


class _Objects:
    """The candidate's objects: the quarantine's, which borrows the history's."""

    def __init__(self, reader: CatFile, journal: Path) -> None:
        self.reader = reader
        self.journal = journal

    def read(self, sha: bytes) -> tuple[bytes, bytes]:
        return self.reader.read(sha)


class Candidate:
    """What :func:`~kernos.audit.verify.verify_candidate` checks: the history with the
    fetched objects, and ``main`` where the pull would put it."""

    def __init__(self, workspace: Path, quarantine: Quarantine, head: bytes | None,
                 remote: str) -> None:
        self.path = workspace
        self.objects = _Objects(quarantine.reader(), quarantine.root / "no-journal")
        self._head = head
        self._remote = remote

    def head(self) -> bytes | None:
        return self._head


    def read_object(self, sha: bytes) -> tuple[bytes, bytes]:
        try:
            return self.objects.read(sha)
        except FileNotFoundError:
            raise ValueError(f"object {sha.hex()} is missing") from None

    def read_commit(self, sha: bytes) -> CommitData:
        kind, data = self.read_object(sha)
        if kind != b"commit":
            raise ValueError(f"{sha.hex()} is not a commit")
        try:
            return decode_commit(data)
        except (ValueError, IndexError) as error:
            raise RemoteRefused(
                f"Refused: the remote {self._remote}'s commit {sha.hex()[:12]} is malformed "
                f"({type(error).__name__}); it was tampered with. Nothing was changed here.",
                remote=self._remote, commit=sha.hex()) from None

    def history(self, start: bytes | None = None) -> Iterator[tuple[bytes, CommitData]]:
        sha = self._head if start is None else start
        seen: set[bytes] = set()
        while sha is not None and sha not in seen:
            seen.add(sha)
            try:
                commit = self.read_commit(sha)
            except ValueError as error:
                raise RemoteRefused(
                    f"Refused: the remote {self._remote}'s history is incomplete ({error}); "
                    "it was tampered with. Nothing was changed here.",
                    remote=self._remote, commit=sha.hex()) from None
            yield sha, commit
            sha = commit.parents[0] if commit.parents else None


class Joined:
    """A file's first ``size`` bytes followed by ``more``, read as one (the candidate chain:
    this workspace's, then the remote's new records), for the backwards reader."""

    def __init__(self, handle: IO[bytes] | None, size: int, more: bytes) -> None:
        self.handle, self.size, self.more = handle, size, more
        self.position = 0

    def seek(self, position: int, whence: int = 0) -> int:
        self.position = position if whence == 0 else self.size + len(self.more) + position
        return self.position

    def read(self, count: int = -1) -> bytes:
        end = self.size + len(self.more) if count < 0 else self.position + count
        out = b""
        if self.position < self.size and self.handle is not None:
            self.handle.seek(self.position)
            out = self.handle.read(min(end, self.size) - self.position)
        if end > self.size:
            out += self.more[max(self.position, self.size) - self.size:end - self.size]
        self.position = end
        return out
