"""Helpers for the audit (I6) and erasure (I8) integration tests.

* ``kernel_class`` / ``shut_down``: start a real kernel outside the function-scoped
  fixtures (for a module-scoped workspace) and stop it cleanly;
* ``cli`` / ``verify``: run ``kernos ...`` in a separate process, and
  ``kernos audit verify --json`` with its report parsed;
* ``chain_lines`` / ``write_chain_lines`` / ``resealed``: read and forge
  ``audit/chain.jsonl`` the way an attacker with write access would;
* ``git`` / ``objects_reached``: the history, read and written with git itself;
* ``files_of``: every file's bytes, to show that something changed nothing;
* ``scan``: a byte scanner over a whole directory: raw file bytes, the
  decompressed content of every loose git object, and every object git can
  list (``cat-file --batch-all-objects``: loose and packed, reachable or not).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernos.audit import record_hash
from kernos.audit.canonical import canonical
from kernos.audit.log import AuditLog
from kernos.audit.signing import sign
from kernos.personal import Keyring
from support import git_view_current

__all__ = [
    "Hit", "Verdict", "chain_lines", "cli", "files_of", "git", "git_dirs", "git_succeeds",
    "kernel_class",
    "key_needles", "loose_objects", "objects_reached", "resealed", "scan", "shut_down",
    "verify", "write_chain_lines",
]

TESTS = Path(__file__).resolve().parent
CONFTEST = TESTS / "integration" / "conftest.py"
CLI_TIMEOUT = 120


# -- kernels outside the function-scoped fixtures -----------------------------------------

def new_log(root: Path, **options: Any) -> AuditLog:
    """An ``AuditLog`` alone in ``root``, with its keyring beside it; it signs with the
    test's one key (``SIGNER``) unless given another, so no identity file is made."""
    options.setdefault("signer", SIGNER)
    return AuditLog(root, keyring=Keyring(root / "keys"), **options)


SIGNER = Ed25519PrivateKey.generate()
"""The key the logs of :func:`new_log` sign with."""


def kernel_class() -> type:
    """The ``Kernel`` class of tests/integration/conftest.py (as pytest imported it)."""
    for module in list(sys.modules.values()):
        if Path(getattr(module, "__file__", None) or "").resolve() == CONFTEST:
            return module.Kernel  # type: ignore[no-any-return]
    spec = importlib.util.spec_from_file_location("kernos_integration_conftest", CONFTEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module.Kernel  # type: ignore[no-any-return]


def shut_down(kernel: Any) -> None:
    """A clean shutdown (a shutdown_request, not a kill), then the channels and sockets."""
    if kernel.manager.has_kernel:
        kernel.manager.shutdown_kernel(now=False)
    kernel.stop()


# -- the CLI in a separate process -----------------------------------------------------------

def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``kernos ARGS`` as a separate process (no KERNOS_WORKSPACE inherited)."""
    env = dict(os.environ)
    env.pop("KERNOS_WORKSPACE", None)
    return subprocess.run([sys.executable, "-m", "kernos.cli", *args], capture_output=True,
                          text=True, env=env, timeout=CLI_TIMEOUT)


@dataclass(frozen=True)
class Verdict:
    """``kernos audit verify --json`` as seen from outside."""

    returncode: int
    report: dict[str, Any]
    stderr: str

    @property
    def ok(self) -> bool:
        return bool(self.report["ok"])

    @property
    def first_bad(self) -> int | None:
        return self.report["first_bad"]  # type: ignore[no-any-return]

    def problems(self) -> str:
        return "\n".join(f"{p['index']}: {p['what']}" for p in self.report["problems"])


def verify(workspace: Path, *, anchor: str | None = None, since: str | None = None) -> Verdict:
    """Run ``kernos audit verify -w WORKSPACE --json [--anchor A] [--since S]`` in a separate
    process."""
    args = ["audit", "verify", "-w", str(workspace), "--json"]
    if anchor is not None:
        args += ["--anchor", anchor]
    if since is not None:
        args += ["--since", since]
    done = cli(*args)
    assert done.returncode in (0, 1), (done.returncode, done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert report["ok"] is (done.returncode == 0), (done.returncode, report)
    return Verdict(done.returncode, report, done.stderr)


# -- the chain on disk ---------------------------------------------------------------------

def chain_path(workspace: Path) -> Path:
    return workspace / "audit" / "chain.jsonl"


def chain_lines(workspace: Path) -> list[bytes]:
    """The records' lines, without their newlines (the file ends with one)."""
    data = chain_path(workspace).read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def write_chain_lines(workspace: Path, lines: list[bytes]) -> None:
    chain_path(workspace).write_bytes(b"".join(line + b"\n" for line in lines))


def resealed(record: dict[str, Any], key: Ed25519PrivateKey | None = None) -> bytes:
    """The canonical line of ``record`` with its hash recomputed (a forger's tool); see
    :func:`reseal` for ``key``."""
    return canonical(reseal(record, key))


def reseal(record: dict[str, Any], key: Ed25519PrivateKey | None = None) -> dict[str, Any]:
    """``record`` signed again (if it was signed) and its hash recomputed: what a forger
    who holds the writer's key does.  ``key``: that key (:func:`writer_key` reads a
    workspace's); by default ``SIGNER``, which the tests of tests/unit/audit sign with
    (their conftest says so to every workspace they open)."""
    body = {name: value for name, value in record.items()
            if name not in ("hash", "signer", "sig")}
    if "signer" in record:
        body = sign(body, SIGNER if key is None else key)
    return {**body, "hash": record_hash(body)}


def writer_key(workspace: Path) -> Ed25519PrivateKey:
    """The signing key of ``workspace`` (a forger who can write the workspace reads it)."""
    secret = json.loads((workspace / "identity.json").read_text())["secret"]
    return Ed25519PrivateKey.from_private_bytes(
        base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4)))


# -- the history with git itself -------------------------------------------------------------

def git(workspace: Path, *args: str, check: bool = True) -> str:
    git_view_current(workspace)
    done = subprocess.run(["git", f"--git-dir={workspace / 'history.git'}", *args],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT)
    if check:
        assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def git_succeeds(workspace: Path, *args: str) -> bool:
    git_view_current(workspace)
    return subprocess.run(["git", f"--git-dir={workspace / 'history.git'}", *args],
                          capture_output=True, timeout=CLI_TIMEOUT).returncode == 0


def objects_reached(workspace: Path, commit: str) -> set[str]:
    """The commit, its root tree and everything in it (not its ancestors)."""
    tree = git(workspace, "rev-parse", f"{commit}^{{tree}}").strip()
    listed = git(workspace, "ls-tree", "-r", "-t", commit).splitlines()
    return {commit, tree} | {line.split()[2] for line in listed}


def loose_objects(git_dir: Path) -> dict[str, Path]:
    """Loose objects by id."""
    found = {}
    for fan in (git_dir / "objects").glob("[0-9a-f][0-9a-f]"):
        for path in fan.iterdir():
            if len(path.name) == 38:
                found[fan.name + path.name] = path
    return found


# -- what is on disk -----------------------------------------------------------------------

def _files(root: Path) -> Iterator[Path]:
    for directory, _subdirs, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            if path.is_file() and not path.is_symlink():
                yield path


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes)."""
    return {str(path.relative_to(root)): path.read_bytes() for path in _files(root)}


@dataclass(frozen=True)
class Hit:
    """Where the scanner found a needle."""

    needle: str
    channel: str
    """``file`` (raw bytes), ``loose`` (an inflated loose object) or ``packed`` (an
    object git lists that is not loose: it lives in a packfile)."""
    where: str


def git_dirs(root: Path) -> list[Path]:
    """Git repositories under ``root`` (bare or not)."""
    return sorted(path.parent for path in root.rglob("HEAD")
                  if (path.parent / "objects").is_dir())


def _all_objects(git_dir: Path) -> Iterator[tuple[str, bytes]]:
    """Every object git knows in ``git_dir`` (loose and packed), with its content."""
    done = subprocess.run(["git", f"--git-dir={git_dir}", "cat-file", "--batch-all-objects",
                           "--batch"], capture_output=True, timeout=CLI_TIMEOUT)
    assert done.returncode == 0, done.stderr
    data = done.stdout
    position = 0
    while position < len(data):
        end = data.index(b"\n", position)
        sha, _kind, size = data[position:end].split(b" ")
        start = end + 1
        yield sha.decode(), data[start:start + int(size)]
        assert data[start + int(size):start + int(size) + 1] == b"\n"
        position = start + int(size) + 1


def scan(root: Path, needles: Mapping[str, bytes]) -> list[Hit]:
    """Every place under ``root`` where one of ``needles`` occurs (see the module docstring)."""
    hits: list[Hit] = []

    def look(content: bytes, channel: str, where: str) -> None:
        hits.extend(Hit(name, channel, where) for name, needle in needles.items()
                    if needle in content)

    for path in _files(root):
        look(path.read_bytes(), "file", str(path.relative_to(root)))
    for git_dir in git_dirs(root):
        loose = loose_objects(git_dir)
        for sha, path in loose.items():
            look(zlib.decompress(path.read_bytes()), "loose", sha)
        for sha, content in _all_objects(git_dir):
            if sha not in loose:
                look(content, "packed", sha)
    return hits


def key_needles(key_hex: str) -> dict[str, bytes]:
    """The forms a 256-bit key could be stored in: raw, hex (both cases) and base64."""
    key = bytes.fromhex(key_hex)
    return {"key raw": key, "key hex": key.hex().encode(), "key HEX": key.hex().upper().encode(),
            "key base64": base64.b64encode(key)}
