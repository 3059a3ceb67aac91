"""Git plumbing for remotes: the staging repository, objects written by hand, the git CLI.

Remotes are reached through the ``git`` command (``push``, ``fetch``,
``ls-remote``), as the store reaches git for repacks: any URL git takes works
(a bare repository on disk, ``ssh://``, ``https://``).

The *staging repository* ``<workspace>/remote.git`` is a bare repository
whose ``objects/info/alternates`` names ``../../history.git/objects``: git
sees every object of the history through it without a copy, and what a push
needs beyond it is written here, never into ``history.git`` (which belongs to
the process holding the workspace lock):

* the objects of commits still in the commit tail (``kernos.store.tail``), so a
  push carries every committed op while a kernel runs;
* the audit, LLM and metadata trees and commits built for each push;
* what a fetch brings from the remote (``refs/remotes/<name>/...``).

A push packs its loose objects when they pass :data:`LOOSE_LIMIT`
(:meth:`Staging.tidy`), so the directory holds a handful of files however
many pushes it has seen.

:func:`push_refs` makes a push's one atomic ``git push`` (fast-forward, or
compare-and-swap with ``--force-with-lease`` on the value read), and names
the writer that refused it.

Every push, pull and lease change holds ``remote.git/kernos.lock`` (a POSIX
record lock), so a kernel's background pusher and a ``kernos push`` typed
beside it take turns.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import subprocess
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from kernos.errors import RemoteDiverged, RemoteError
from kernos.store.objects import BLOB_MODE, TREE_MODE, TreeEntry, encode_tree, object_id

__all__ = ["Staging", "describe_pusher", "git", "ls_remote", "push_refs", "pusher_trailers"]

STAGING = "remote.git"
EMPTY_TREE = bytes.fromhex("4b825dc642cb6eb9a060e54bf8d69288fbee4904")
_read: dict[tuple[bytes, str], bytes] = {}
LOOSE_LIMIT = 512
"""Loose objects the staging repository may hold before a push packs them."""
_QUIET = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}


class Copy(Protocol):
    """This copy of a workspace as a pusher (a ``kernos.remote.config.RemoteConfig``)."""

    @property
    def id(self) -> str: ...


def git(git_dir: Path | None, *args: str, check: bool = True, stdin: bytes | None = None,
        what: str = "") -> subprocess.CompletedProcess[bytes]:
    """Run ``git`` (on ``git_dir`` if given); a failure is a :class:`RemoteError`."""
    command = ["git"] + ([f"--git-dir={git_dir}"] if git_dir is not None else []) + list(args)
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(_QUIET)
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, env=env, check=False)
    except FileNotFoundError:
        raise RemoteError("the git command is not installed; install git (it moves "
                          "workspaces between machines)") from None
    if check and done.returncode != 0:
        detail = " ".join(done.stderr.decode(errors="replace").split())[:400]
        raise RemoteError(f"{what or 'git ' + args[0]} failed: {detail or 'no message'}")
    return done


class Staging:
    """The staging repository of one workspace (see the module docstring)."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.git_dir = workspace / STAGING
        self.objects = self.git_dir / "objects"
        self._lock_fd: int | None = None

    def ensure(self) -> None:
        if (self.git_dir / "HEAD").exists():
            return
        for sub in ("objects/info", "refs/heads", "refs/tags"):
            (self.git_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.objects / "info" / "alternates").write_text("../../history.git/objects\n")
        (self.git_dir / "config").write_text(
            "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"
            "\tlogAllRefUpdates = false\n[gc]\n\tauto = 0\n")
        temporary = self.git_dir / "HEAD.tmp"
        temporary.write_text("ref: refs/heads/main\n")
        os.replace(temporary, self.git_dir / "HEAD")  # HEAD last: it marks the repo whole

    @contextlib.contextmanager
    def locked(self) -> Iterator[Staging]:
        """Hold the staging lock (pushes, pulls and lease changes take turns)."""
        self.ensure()
        fd = os.open(self.git_dir / "kernos.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)  # closing drops the record lock

    # -- objects -----------------------------------------------------------------

    def write(self, kind: bytes, data: bytes) -> bytes:
        """Store one object (if it is not here yet); its id."""
        sha = object_id(kind, data)
        path = self.objects / sha[:1].hex() / sha[1:].hex()
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temporary.write_bytes(zlib.compress(b"%s %d\0" % (kind, len(data)) + data, 1))
            os.replace(temporary, path)
        return sha

    def tree(self, files: dict[str, bytes]) -> bytes:
        """Write a tree of ``path -> blob id`` (paths with ``/`` make subtrees); its id."""
        here: list[TreeEntry] = []
        below: dict[str, dict[str, bytes]] = {}
        for path, sha in files.items():
            top, _, rest = path.partition("/")
            if rest:
                below.setdefault(top, {})[rest] = sha
            else:
                here.append(TreeEntry(BLOB_MODE, top, sha))
        here += [TreeEntry(TREE_MODE, name, self.tree(sub)) for name, sub in below.items()]
        return self.write(b"tree", encode_tree(here))

    def commit(self, tree: bytes, parent: bytes | None, message: str, when: int) -> bytes:
        lines = [f"tree {tree.hex()}"] + ([f"parent {parent.hex()}"] if parent else [])
        who = f"kernos <kernos@kernos.invalid> {when} +0000"
        lines += [f"author {who}", f"committer {who}"]
        text = "\n".join(lines) + "\n\n" + message.rstrip("\n") + "\n"
        return self.write(b"commit", text.encode())

    def cat(self, sha: bytes, kind: str = "blob") -> bytes:
        key = (sha, kind)
        found = _read.get(key)
        if found is None:  # objects never change: one read per process is enough
            found = git(self.git_dir, "cat-file", kind, sha.hex(),
                        what="reading a fetched object").stdout
            if len(_read) > 4096:
                _read.clear()
            _read[key] = found
        return found

    def update_refs(self, refs: Mapping[str, bytes | None]) -> None:
        """Set several refs of the staging repository at once (None: delete it)."""
        lines = "".join(f"update {ref} {sha.hex()}\n" if sha is not None else f"delete {ref}\n"
                        for ref, sha in refs.items())
        git(self.git_dir, "update-ref", "--stdin", stdin=lines.encode(),
            what="recording the pushed refs")

    def forget_pruned(self) -> None:
        """Delete the staging refs naming a snapshot (or tag) the history no longer has:
        a prune deleted it, and git refuses to fetch into a repository holding a ref it
        cannot walk.  Each push sets them again.  Only under :meth:`locked`."""
        listing = git(self.git_dir, "for-each-ref", "--format=%(objectname) %(refname)",
                      "refs/kernos-pushing/heads", "refs/kernos-pushing/tags", "refs/remotes",
                      what="listing the staging refs").stdout.decode()
        refs = {name: sha for sha, _, name in (line.partition(" ")
                                                for line in listing.splitlines())
                if "/heads/" in name or "/tags/" in name}
        if not refs:
            return
        # Asked of the history itself: a commit staged from the commit tail is not there
        # yet either, which only costs the next push re-setting its ref.
        found = git(self.workspace / "history.git", "cat-file", "--batch-check",
                    stdin="".join(f"{sha}\n" for sha in refs.values()).encode(),
                    what="looking up the staged snapshots").stdout.decode().split("\n")
        gone = {sha for sha, line in zip(refs.values(), found, strict=False)
                if line.endswith(" missing")}
        if gone:
            self.update_refs({name: None for name, sha in refs.items() if sha in gone})

    def tree_files(self, tree: bytes) -> dict[str, bytes]:
        """``path -> blob id`` of every blob under ``tree``."""
        listing = git(self.git_dir, "ls-tree", "-r", "-z", tree.hex(),
                      what="reading a fetched tree").stdout
        files = {}
        for item in listing.split(b"\0"):
            if item:
                meta, _, path = item.partition(b"\t")
                files[path.decode()] = bytes.fromhex(meta.split()[2].decode())
        return files

    def tree_of(self, commit: bytes) -> bytes:
        header = self.cat(commit, "commit").partition(b"\n\n")[0]
        return bytes.fromhex(header.split(b"\n")[0].split()[1].decode())

    def message_of(self, commit: bytes) -> str:
        return self.cat(commit, "commit").partition(b"\n\n")[2].decode(errors="replace")

    def is_ancestor(self, older: bytes, newer: bytes) -> bool:
        if older == newer:
            return True
        done = git(self.git_dir, "merge-base", "--is-ancestor", older.hex(), newer.hex(),
                   check=False)
        return done.returncode == 0

    def has(self, sha: bytes) -> bool:
        return git(self.git_dir, "cat-file", "-e", sha.hex(), check=False).returncode == 0

    def tidy(self, *, loose_limit: int | None = None) -> bool:
        """Pack the staging repository's own objects once it holds ``loose_limit`` loose
        ones (each push adds a few); whether it did.  Only under :meth:`locked`."""
        counted = git(self.git_dir, "count-objects", what="counting staged objects").stdout
        if int(counted.split()[0]) < (LOOSE_LIMIT if loose_limit is None else loose_limit):
            return False
        # -l: objects the history already has stay there; prune: what no ref reaches.
        git(self.git_dir, "repack", "-a", "-d", "-l", "-q", what="packing staged objects")
        git(self.git_dir, "prune", "--expire=now", what="pruning staged objects")
        return True

    # -- the remote ----------------------------------------------------------------

    def fetch(self, url: str, name: str, refs: Sequence[str], *,
              advertised_only: Sequence[str] = ()) -> dict[str, bytes]:
        """Fetch ``refs`` of ``url`` to ``refs/remotes/<name>/...``; ``ref -> id`` of those
        the remote has (a ref it lacks is left out).  The refs of ``advertised_only`` are
        only read, not fetched (a push after a prune must not fetch the history it pruned)."""
        advertised = ls_remote(url, [*refs, *advertised_only])
        wanted = [ref for ref in refs if ref in advertised]
        for ref in refs:  # a ref gone from the remote is gone from our copy too
            if ref not in advertised:
                git(self.git_dir, "update-ref", "-d", self.tracking(name, ref), check=False)
        if wanted:
            git(self.git_dir, "fetch", "--no-tags", "--no-write-fetch-head", "--quiet", url,
                *[f"+{ref}:{self.tracking(name, ref)}" for ref in wanted],
                what=f"fetching from {url}")
        return {ref: advertised[ref] for ref in [*wanted, *advertised_only]
                if ref in advertised}

    @staticmethod
    def tracking(name: str, ref: str) -> str:
        return f"refs/remotes/{name}/{ref.removeprefix('refs/')}"


# -- pushing -------------------------------------------------------------------------------


def pusher_trailers(config: Copy) -> str:
    """The trailers that name the pusher (host, this copy's id, pid, time) in a commit."""
    return (f"Kernos-Host: {socket.gethostname()}\nKernos-Workspace: {config.id}\n"
            f"Kernos-Pid: {os.getpid()}\nKernos-At: {_utc(time.time())}\n")


def _utc(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def describe_pusher(stage: Staging, meta: bytes | None) -> str:
    if meta is None:
        return "another writer (the remote does not say who)"
    found = dict(re.findall(r"^Kernos-(\w+): (.*)$", stage.message_of(meta), re.MULTILINE))
    return (f"workspace {found.get('Workspace', '?')} on host {found.get('Host', '?')} "
            f"(pid {found.get('Pid', '?')}, pushed at {found.get('At', '?')})")


def push_refs(stage: Staging, url: str, name: str, updates: Mapping[str, bytes | None],
               leases: Mapping[str, bytes], *, seen: bytes | None, meta_ref: str) -> None:
    """One atomic push, never forced: git refuses a ref that would not fast-forward, and
    the receiving side moves each ref only from the id the push saw (a compare-and-swap),
    so a writer that pushed since our fetch makes the whole push fail.  The refs of
    ``leases`` (the main a prune rewrote, the tags it moved) are moved or deleted only from
    the id given there (``--force-with-lease``): the same compare-and-swap, explicitly."""
    # Keep the pushed objects reachable in the staging repository.
    stage.update_refs({f"refs/kernos-pushing/{ref.removeprefix('refs/')}": sha
                       for ref, sha in updates.items() if sha is not None})
    done = git(stage.git_dir, "push", "--atomic", "--porcelain", "--quiet",
               *[f"--force-with-lease={ref}:{old.hex()}" for ref, old in leases.items()], url,
               *[f"{sha.hex() if sha else ''}:{ref}" for ref, sha in updates.items()],
               check=False)
    if done.returncode != 0:
        text = " ".join((done.stdout + done.stderr).decode(errors="replace").split())
        if any(sign in text for sign in ("rejected", "fetch first", "non-fast-forward",
                                         "stale info")):
            writer = _concurrent_writer(stage, url, name, seen, meta_ref)
            raise RemoteDiverged(
                f"Refused: the remote {name} moved while this push ran: {writer} pushed "
                "after this push read it, and each ref moves only from the value read (a "
                f"compare-and-swap). Nothing was changed; run `kernos push {name}` again to "
                "see whether the two histories can still meet.", remote=name, writer=writer)
        raise RemoteError(f"pushing to {url} failed: {text[:400]}", remote=name)
    stage.update_refs({stage.tracking(name, ref): sha for ref, sha in updates.items()})


def _concurrent_writer(stage: Staging, url: str, name: str, seen: bytes | None,
                       meta_ref: str) -> str:
    """Who moved the remote during a push, as far as its meta ref says."""
    try:
        meta = stage.fetch(url, name, [meta_ref]).get(meta_ref)
    except RemoteError:
        return "a concurrent pusher"
    if meta is not None and meta != seen:
        return describe_pusher(stage, meta)
    return ("a writer that left no Kernos push record (the remote's main was moved by plain "
            f"git; its last Kernos push was by {describe_pusher(stage, meta)})")


def ls_remote(url: str, refs: Iterable[str]) -> dict[str, bytes]:
    """The ids the remote's refs name (only those it has)."""
    wanted = set(refs)
    listing = git(None, "ls-remote", url, *sorted(wanted), what=f"reading the remote {url}")
    found = {}
    for line in listing.stdout.decode().splitlines():
        sha, _, ref = line.partition("\t")
        if ref in wanted:
            found[ref] = bytes.fromhex(sha)
    return found
