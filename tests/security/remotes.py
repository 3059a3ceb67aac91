"""The scene of the hostile-remote tests, and the attacker's tools: plain git on the remote.

``Scene``: workspace A pushes to a bare remote R; B is a clone of R (trusting A's key, as
a person would after comparing it); A commits more and pushes.  The attacker then edits R
with plain git (:class:`Attacker`: ``hash-object``, a tree through a temporary index,
``commit-tree``, ``update-ref``), and B runs the real ``kernos pull``.
:func:`fingerprint` hashes every file of B (its lock aside, whose bytes name the last
process that held it) so a test can say "byte for byte as it was".

The scenes are set up in process (``CoreEnv``, the library's push and clone): real
workspaces on disk, real commits, real signatures; what is under test runs as the CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core_support import CoreEnv
from kernos import Workspace
from kernos.audit import verify
from kernos.audit.canonical import canonical
from kernos.audit.log import record_hash
from kernos.audit.signing import sign
from kernos.remote.transfer import RemoteConfig, clone, push
from kernos.store.identity import load_identity

__all__ = ["Attacker", "Scene", "cli", "fingerprint"]

LOCK = "lock"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300
        ) -> subprocess.CompletedProcess[str]:
    """The real ``kernos`` command, in a process of its own."""
    script = Path(sys.executable).with_name("kernos")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kernos.cli"]
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("KERNOS_CRASH", "KERNOS_PAUSE"))}
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout,
                          env={**environ, **(env or {})})


def fingerprint(workspace: Path) -> dict[str, str]:
    """relative path -> SHA-256 of every file under ``workspace`` (the lock aside)."""
    found = {}
    for directory, _dirs, files in os.walk(workspace):
        for name in files:
            path = Path(directory) / name
            relative = str(path.relative_to(workspace))
            if relative == LOCK:
                continue
            found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def run_ops(path: Path, *sources: str) -> None:
    env = CoreEnv(path)
    try:
        for source in sources:
            env.run(source)
    finally:
        env.close()


class Scene:
    """A pushes to R, B clones R (trusting A), A commits more and pushes.

    The scene is set up in process (the library's push and clone); what a test does to it
    (the pull under test, above all) goes through the real CLI.
    """

    def __init__(self, root: Path, *, more: int = 2) -> None:
        self.root = root
        self.a, self.b, self.remote = root / "a", root / "b", root / "remote.git"
        run_ops(self.a, "x = 1", "table = {'k': [1, 2, 3]}")
        RemoteConfig.load(self.a).add("origin", str(self.remote))
        push(self.a)
        self.a_key = self.key(self.a)
        clone(str(self.remote), self.b, trust=[self.a_key])
        if more:
            run_ops(self.a, *[f"x = {n}" for n in range(2, 2 + more)])
            push(self.a)
        self.attacker = Attacker(self.remote)

    @staticmethod
    def key(workspace: Path) -> str:
        return load_identity(workspace).key_id

    def head(self, workspace: Path) -> str | None:
        with Workspace.open(workspace, writable=False) as view:
            head = view.head()
        return None if head is None else head.hex()

    def pull_b(self, *extra: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
        return cli("pull", "-w", str(self.b), *extra, env=env)

    def verified(self, workspace: Path) -> bool:
        return verify(workspace).ok

    @contextmanager
    def restored(self) -> Iterator[Scene]:
        """The remote's refs are put back as they were after the block (what the attacker
        wrote stays as unreachable objects): for tests that share one scene, each leaving
        B as it was."""
        listing = self.attacker.git("for-each-ref", "--format=%(objectname) %(refname)")
        before = dict(line.split(" ", 1)[::-1] for line in listing.splitlines())
        try:
            yield self
        finally:
            listing = self.attacker.git("for-each-ref", "--format=%(objectname) %(refname)")
            now = dict(line.split(" ", 1)[::-1] for line in listing.splitlines())
            for ref, sha in before.items():
                if now.get(ref) != sha:
                    self.attacker.git("update-ref", ref, sha)
            for ref in set(now) - set(before):
                self.attacker.git("update-ref", "-d", ref)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.args, result.returncode, result.stdout,
                                    result.stderr)
    return result.stdout


class Attacker:
    """Someone who can write to the remote, with nothing but git."""

    def __init__(self, remote: Path) -> None:
        self.remote = remote

    def git(self, *args: str, data: bytes | None = None, env: dict[str, str] | None = None
            ) -> str:
        done = subprocess.run(["git", "--git-dir", str(self.remote), *args], input=data,
                              capture_output=True, check=True,
                              env={**os.environ, **(env or {})})
        return done.stdout.decode().strip()

    def ref(self, ref: str) -> str:
        return self.git("rev-parse", ref)

    def files(self, ref: str) -> dict[str, str]:
        """path -> blob id of the tree ``ref`` names."""
        listing = self.git("ls-tree", "-r", ref)
        return {line.split("\t", 1)[1]: line.split()[2] for line in listing.splitlines()}

    def blob(self, sha: str) -> bytes:
        return subprocess.run(["git", "--git-dir", str(self.remote), "cat-file", "blob", sha],
                              capture_output=True, check=True).stdout

    def chain(self) -> list[dict[str, Any]]:
        files = self.files("refs/kernos/audit")
        lines = b"".join(self.blob(files[path]) for path in sorted(files)
                         if path.startswith("chain/"))
        return [json.loads(line) for line in lines.splitlines()]

    def rewrite(self, ref: str, changes: dict[str, bytes | None], *,
                mode: str = "100644") -> str:
        """Commit on ``ref`` a tree with ``changes`` (path -> new bytes, None: removed), as
        a push would, then move the ref: plain git throughout."""
        with tempfile.TemporaryDirectory() as scratch:
            env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
            self.git("read-tree", ref, env=env)
            for path, data in changes.items():
                if data is None:
                    self.git("update-index", "--index-info", env=env,
                             data=f"0 {'0' * 40}\t{path}\n".encode())
                    continue
                sha = self.git("hash-object", "-w", "--stdin", data=data)
                self.git("update-index", "--add", "--cacheinfo", f"{mode},{sha},{path}",
                         env=env)
            tree = self.git("write-tree", env=env)
        commit = self.git("commit-tree", tree, "-p", self.ref(ref), "-m", "edited",
                          env=_author())
        self.git("update-ref", ref, commit)
        return commit

    def set_chain(self, records: list[dict[str, Any]] | list[bytes]) -> str:
        """Replace the remote's chain with ``records`` (or raw lines), cut in segments of
        64 as a push cuts them."""
        lines = [r if isinstance(r, bytes) else canonical(r) + b"\n" for r in records]
        files = self.files("refs/kernos/audit")
        changes: dict[str, bytes | None] = {path: None for path in files
                                            if path.startswith("chain/")}
        for start in range(0, len(lines), 64):
            index = start // 64
            changes[f"chain/{index // 256:05d}/{index:08d}.jsonl"] = b"".join(
                lines[start:start + 64])
        return self.rewrite("refs/kernos/audit", changes)

    def commit_on_main(self) -> str:
        """A commit added to main with commit-tree and update-ref: no record names it."""
        head = self.ref("refs/heads/main")
        tree = self.git("rev-parse", f"{head}^{{tree}}")
        commit = self.git("commit-tree", tree, "-p", head, "-m", "planted", env=_author())
        self.git("update-ref", "refs/heads/main", commit)
        return commit


def _author() -> dict[str, str]:
    return {"GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x", "GIT_COMMITTER_NAME": "x",
            "GIT_COMMITTER_EMAIL": "x@x"}


def sealed(record: dict[str, Any], key: Any = None) -> dict[str, Any]:
    """``record`` with its hash recomputed: signed with ``key`` if given (else left
    without a signature), as a forger would."""
    body = {k: v for k, v in record.items() if k not in ("hash", "signer", "sig")}
    if key is not None:
        body = sign(body, key)
    return {**body, "hash": record_hash(body)}
