"""``kernos fork SRC[@REF] DST``: a new workspace that starts from any snapshot of another.

The contract:

* **DST's branch is REF's commit**, and a kernel started on DST restores
  exactly the image REF holds.  REF is read as the rest of Kernos reads refs
  (``HEAD``, ``HEAD~N``, ``@N``, a commit id or prefix; default ``HEAD``),
  including commits that only SRC's tail holds (``kernos.store.tail``: not
  yet folded into git).  SRC is opened read-only and never written: a fork
  works while a kernel holds SRC, and leaves SRC's files as they were.
* **DST holds nothing SRC can still lose.**  Under a group commit SRC's
  kernel writes a commit's frame (and its audit record) before it syncs
  them, and acknowledges the op only after the sync; a fork that read such a
  frame and then saw SRC's machine lose power would name a commit and a
  record SRC's chain never kept (:func:`check_origin` would fail, or worse,
  meet another record at that index).  So the fork makes durable what it
  read before it builds DST: one ``fdatasync`` of SRC's tail and of its audit
  chain, through read-only descriptors opened before anything is read (the
  same files, even if a fold empties the tail meanwhile).  That writes no
  byte of SRC; it asks the disk to keep what SRC wrote, which SRC's own next
  sync does anyway, so an op DST holds is one SRC restores after any crash
  (acknowledged or not, as for any op whose sync finished before its reply
  went out).  A sync the disk refuses refuses the fork.  Left open: after a
  disk I/O error, Linux may report the error to only one of the descriptors
  that sync a file, so if SRC's own sync saw it first (and SRC then cuts its
  frame off) the fork's sync can succeed on a frame SRC drops; that needs a
  failing disk, and SRC's kernel stops committing on it.
* **Objects are shared, not copied: every pack (and loose object) of SRC is
  hard-linked into DST**, as ``git clone --local`` does.  A pack is never
  changed once written (Kernos and git only create packs and unlink them),
  so the two names share disk blocks for as long as both exist, and each
  workspace owns its names: SRC's ``kernos gc``, ``kernos prune``, its
  background geometric repack, or deleting SRC altogether, unlink SRC's
  names and leave DST's objects whole.  git alternates
  (``objects/info/alternates``) were rejected: DST would read objects that
  SRC may delete at its next prune or gc (a fork silently losing its
  history), and Kernos's own pack reader does not follow them.  The cost of
  this design: where hard links are impossible (SRC and DST on different
  filesystems) the packs are copied, and :class:`Forked` says how many
  files were linked and how many copied.  Objects of SRC's tail are written
  into DST as one pack of its own.
* **DST has its own audit chain.**  Its genesis record adopts REF's commit
  (``adopts``, as a log started on existing history does) and carries
  ``forked_from`` (see ``kernos.audit.log``): SRC's path, its
  ``workspace.json`` creation time, REF's commit and op, and the index and
  hash of SRC's newest audit record when the fork was made, so the origin
  can be checked against SRC's chain (:func:`check_origin`, which
  ``kernos audit verify`` runs on a fork).  SRC's chain is unchanged: the fork
  only reads SRC, and a reader must not append to a chain whose writer may
  be running.
* **LLM recordings** (``llm/objects``, ``llm/recordings``) are hard-linked
  (an erasure replaces such a file by rename, never in place), so replay of
  DST finds every recording SRC had.  **The spending ledger** is copied up to
  REF: the calls of ops up to REF's op (and calls outside any op), so the
  budgets in DST's image go on from where REF left them; SRC's spending
  after REF is not DST's history.  **The supervisor's journal** likewise keeps
  its lines about ops up to REF (``kernos.agents.supervisor.copy_journal``):
  a circuit open at REF is open in DST, until DST's human resets it.
* **Keys** (``keys/``, :mod:`kernos.personal`) are *copied*, never linked:
  a fork on one machine has the same owner and must restore the same
  personal values, and erasure overwrites a key file in place, which
  through a link would erase the subject in both.  So erasing a subject in
  one workspace leaves the other's copy of its key: erase it in every fork
  (``kernos erase SUBJECT -w DST``).
* **Tracked files** (:mod:`kernos.files`) travel in the snapshots: the first
  kernel on DST puts its files root (``DST/files``) as REF holds it; SRC's
  own files root is not copied.  ``files-here.json``, the absolute
  directories SRC's human tracked on this machine (:mod:`kernos.files.here`),
  is never copied: DST leaves those directories alone (two workspaces
  restoring one directory would undo each other's files) until its human
  runs ``%kernos track PATH`` there.
* ``settings.json`` is copied; the lock, ``kernel.json``, the tail, the
  buffer cache, ``tmp/``, ``pending`` and the audit payloads never are.
* **Crash safety.**  DST is built in a hidden directory beside it
  (``.DST.forking-PID``), synced, and renamed into place last: a fork that
  dies leaves no half workspace at DST (only that directory, which the next
  fork to DST removes).
* **Where DST goes** (:func:`fork_destination`, the one rule for the CLI and the
  inspector's Fork): a bare name (no ``/``) is made *beside SRC*, as its sibling;
  anything with a ``/`` (``./NAME`` for the current directory) is that path.
* **Errors.**  DST that exists and is not empty (:class:`WorkspaceError`),
  SRC that is not a workspace (:class:`WorkspaceFormatError`), REF that
  names no snapshot (:class:`UnknownRef`); each names what to do.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernos._durable import fsync_dir
from kernos.audit import AuditLog, open_audit
from kernos.audit.origin import Origin, check_origin
from kernos.errors import UsageError, WorkspaceCorrupt, WorkspaceError
from kernos.personal import Keyring
from kernos.store.catalog import is_path
from kernos.store.trust import require_trusted
from kernos.store.workspace import AUDIT_CHAIN, Workspace, op_of

__all__ = ["FORK_NAME", "Forked", "Origin", "check_origin", "fork", "fork_destination",
           "split_source"]

FORK_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
"""A bare fork name: 1-100 letters, digits, '.', '_' or '-', not starting with '.'."""

_LINK_ATTEMPTS = 5
"""How often the packs are listed again when a repack in SRC deleted one meanwhile."""


@dataclass(frozen=True, kw_only=True)
class Forked:
    """What :func:`fork` made."""

    source: str
    """SRC's absolute path."""
    dest: str
    """DST's absolute path."""
    commit: str
    """The commit DST's branch names (REF's)."""
    op: int | None
    """The op that wrote REF's snapshot."""
    genesis: str
    """The hash of DST's first audit record, the one that names its origin."""
    forked_from: dict[str, Any]
    """The genesis record's ``forked_from`` field."""
    linked: int
    """Object files shared with SRC by a hard link."""
    copied: int
    """Object files copied (hard links impossible: another filesystem)."""
    tail_objects: int
    """Objects taken from SRC's tail (not yet in its packs)."""

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "dest": self.dest, "commit": self.commit,
                "op": self.op, "genesis": self.genesis, "forked_from": self.forked_from,
                "linked": self.linked, "copied": self.copied,
                "tail_objects": self.tail_objects}


def split_source(text: str) -> tuple[str, str]:
    """``SRC[@REF]`` as (SRC, REF): the first ``@`` after the path's last ``/`` starts REF
    (so ``ws@@3`` is op 3 of ``ws``, and ``/a@b/ws`` is a path)."""
    slash = text.rfind("/")
    at = text.find("@", slash + 1)
    if at <= slash + 1:  # none, or the name itself would be empty
        return text, "HEAD"
    return text[:at], text[at + 1:] or "HEAD"


def fork_destination(source: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Where a fork of ``source`` named ``dest`` is made: a bare name beside ``source``
    (its sibling), a path (with a ``/``; ``./NAME`` for the current directory) where it
    says.  The CLI's ``kernos fork SRC DST`` and the inspector's Fork (which sends a bare
    name) both go through :func:`fork`, which asks this."""
    text = os.fspath(dest)
    if is_path(text):
        return Path(os.path.abspath(Path(text).expanduser()))
    if not FORK_NAME.fullmatch(text):
        raise UsageError(f"{text[:60]!r} is neither a fork name (1-100 letters, digits, '.', "
                         "'_' or '-', not starting with '.'; made beside the source) nor a "
                         "path with a '/' (./NAME makes it in the current directory)")
    return Path(os.path.abspath(Path(source).expanduser())).parent / text


def fork(source: str | os.PathLike[str], dest: str | os.PathLike[str],
         ref: str = "HEAD") -> Forked:
    """Make the workspace ``dest`` from snapshot ``ref`` of ``source`` (see the module
    docstring for the contract; a bare name ``dest`` is made beside ``source``)."""
    source_path = Path(os.path.abspath(Path(source).expanduser()))
    dest_path = fork_destination(source_path, dest)
    _check_dest(dest_path, source_path)
    staging = dest_path.parent / f".{dest_path.name}.forking-{os.getpid()}"
    # A fork of an untrusted clone would be a workspace nobody marked untrusted.
    require_trusted(source_path)
    with Workspace.open(source_path, writable=False, create=False) as src, \
            _SourceFiles(src.path) as written:
        commit = src.resolve(ref)
        op = op_of(src.read_commit(commit))
        forked_from = _origin_facts(src, commit, op)
        dest_path.parent.mkdir(parents=True, exist_ok=True)
        for stale in dest_path.parent.glob(f".{dest_path.name}.forking-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a fork that died
        try:
            result = _build(src, staging, commit, op, forked_from, written)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    try:
        _publish(staging, dest_path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Forked(source=str(source_path), dest=str(dest_path), commit=commit.hex(), op=op,
                  forked_from=forked_from, **result)


def _check_dest(dest: Path, source: Path) -> None:
    if dest == source or source in dest.parents:
        raise UsageError(f"the fork {dest} would be inside its source {source}: give a "
                         "directory outside it")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise WorkspaceError(f"{dest} exists and is not empty: a fork makes a new workspace. "
                             "Give a new (or empty) directory, or delete that one first.",
                             path=str(dest))


def _origin_facts(src: Workspace, commit: bytes, op: int | None) -> dict[str, Any]:
    """The genesis's ``forked_from``: read after REF resolved, so SRC's newest record is
    at least the one of the op that wrote REF (a record precedes its commit point)."""
    log = open_audit(src)
    try:
        index, digest = log.head() if len(log) else (-1, None)
    finally:
        log.close()
    try:
        created = json.loads((src.path / "workspace.json").read_text()).get("created_at")
    except (OSError, ValueError, AttributeError):
        created = None
    return {"workspace": str(src.path), "created_at": created, "commit": commit.hex(),
            "op": op, "audit": {"index": index, "hash": digest}}


class _SourceFiles:
    """Read-only descriptors of SRC's tail and audit chain, opened before the fork reads
    them; :meth:`make_durable` syncs what SRC wrote to them (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.descriptors: list[tuple[Path, int]] = []

    def __enter__(self) -> _SourceFiles:
        for path in (self.root / "tail", self.root / AUDIT_CHAIN):
            try:
                self.descriptors.append((path, os.open(path, os.O_RDONLY)))
            except FileNotFoundError:
                continue  # nothing written there yet: nothing to lose
        return self

    def __exit__(self, *exc: object) -> None:
        for _path, fd in self.descriptors:
            os.close(fd)
        self.descriptors = []

    def make_durable(self) -> None:
        """Everything SRC wrote to these files so far is on disk, or a clear error."""
        for path, fd in self.descriptors:
            try:
                os.fdatasync(fd)
            except OSError as error:
                raise WorkspaceError(
                    f"the disk did not confirm {path} of the source (fdatasync: "
                    f"{error.strerror or error}), so its newest commits may still be lost "
                    "there; nothing was forked. Check the source's disk, then fork again.",
                    path=str(path)) from error


def _build(src: Workspace, staging: Path, commit: bytes, op: int | None,
           forked_from: dict[str, Any], written: _SourceFiles) -> dict[str, Any]:
    # The tail first: a fold that runs meanwhile turns it into a pack that the listing
    # below then finds; read after the listing, a fold could hide commits from both.
    src.tail.refresh()
    tail_objects = dict(src.tail.objects.items())
    # Everything the fork takes from SRC has been read by now (REF, the audit head, the
    # tail's objects): make it as durable in SRC as it is about to be in DST.
    written.make_durable()
    with Workspace.open(staging, purpose="kernos fork") as dst:
        linked, copied = _share_objects(src.git_dir / "objects", dst.git_dir / "objects")
        dst.objects.add_packed(tail_objects.items())
        dst.objects.packs.refresh()
        _check_connected(dst, commit, src)
        dst.set_head(commit)
        _copy_outside_history(src.path, dst.path, op)
        # Not open_audit: its recovery would write a genesis without the origin first.
        log = AuditLog(dst.path, keyring=Keyring(dst.path / "keys", durable=dst.durable),
                       durable=dst.durable)
        try:
            genesis = log.append({"type": "genesis", "adopts": commit.hex(),
                                  "forked_from": forked_from})
        finally:
            log.close()
    _sync_tree(staging)
    return {"genesis": genesis["hash"], "linked": linked, "copied": copied,
            "tail_objects": len(tail_objects)}


def _share_objects(source: Path, dest: Path) -> tuple[int, int]:
    """Hard-link SRC's packs and loose objects into DST (copy across filesystems)."""
    linked = copied = 0
    for _attempt in range(_LINK_ATTEMPTS):
        try:
            for name in _pack_files(source / "pack"):
                made = _link_or_copy(source / "pack" / name, dest / "pack" / name)
                linked, copied = linked + made, copied + (1 - made)
            break
        except FileNotFoundError:
            continue  # a repack replaced packs while they were listed: list them again
    else:
        raise WorkspaceError(f"the packs of {source.parent.parent} kept changing while they "
                             "were linked (a repack running?); try the fork again",
                             path=str(source))
    for directory in sorted(source.glob("[0-9a-f][0-9a-f]")):
        for loose in sorted(directory.iterdir()):
            with contextlib.suppress(FileNotFoundError):  # packed and deleted meanwhile
                made = _link_or_copy(loose, dest / directory.name / loose.name)
                linked, copied = linked + made, copied + (1 - made)
    return linked, copied


def _pack_files(pack_dir: Path) -> list[str]:
    """Complete packs only (their index written last), the index after its pack."""
    try:
        names = set(os.listdir(pack_dir))
    except FileNotFoundError:
        return []
    found = []
    for name in sorted(names):
        if name.startswith("pack-") and name.endswith(".idx") and name[:-4] + ".pack" in names:
            stem = name[:-4]
            found.append(stem + ".pack")
            if stem + ".rev" in names:
                found.append(stem + ".rev")
            found.append(name)
    return found


def _link_or_copy(source: Path, dest: Path) -> int:
    """1 if ``dest`` is now a hard link to ``source``, 0 if a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        return 1 if dest.stat().st_ino == source.stat().st_ino else 0
    try:
        os.link(source, dest)
        return 1
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
    shutil.copy2(source, dest)
    return 0


def _check_connected(dst: Workspace, commit: bytes, src: Workspace) -> None:
    """Every object REF reaches is in DST, or the fork is refused (not published)."""
    done = subprocess.run(["git", f"--git-dir={dst.git_dir}", "rev-list", "--objects",
                           "--quiet", commit.hex()], capture_output=True, text=True)
    if done.returncode != 0:
        raise WorkspaceCorrupt(str(src.path), f"the snapshot {commit.hex()[:12]} reaches "
                               "objects that could not be shared into the fork (was the source "
                               f"pruned meanwhile?): {done.stderr.strip()[:300]}; nothing was "
                               "forked, try again")


def _copy_outside_history(source: Path, dest: Path, op: int | None) -> None:
    settings = source / "settings.json"
    if settings.exists():
        shutil.copy2(settings, dest / "settings.json")
    keys = source / "keys"
    if keys.is_dir():
        (dest / "keys").mkdir(mode=0o700, exist_ok=True)
        for key in keys.glob("*.key"):
            shutil.copy2(key, dest / "keys" / key.name)  # copied: erasure overwrites in place
    for part in ("objects", "recordings"):
        directory = source / "llm" / part
        if directory.is_dir():
            for item in sorted(directory.iterdir()):
                if item.is_file():
                    _link_or_copy(item, dest / "llm" / part / item.name)
    _copy_ledger(source / "llm" / "calls.jsonl", dest / "llm" / "calls.jsonl", op)
    from kernos.agents.supervisor import JOURNAL_FILE, copy_journal

    copy_journal(source / JOURNAL_FILE, dest / JOURNAL_FILE, op)


def _copy_ledger(source: Path, dest: Path, op: int | None) -> None:
    """The ledger's lines for the calls of ops up to ``op`` (and of no op)."""
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        return
    ops: dict[int, int | None] = {}
    kept = []
    for line in data[:data.rfind(b"\n") + 1].splitlines(keepends=True):
        entry = json.loads(line)
        call = entry.get("call")
        if entry.get("type") == "reserve":
            ops[call] = entry.get("op")
        owner = ops.get(call)
        if owner is None or (op is not None and owner <= op):
            kept.append(line)
    if kept:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(b"".join(kept))


def _sync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (the fork is durable before it is
    published by its rename)."""
    for directory, _subdirectories, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(directory))


def _publish(staging: Path, dest: Path) -> None:
    for leftover in ("lock", "pending", "tail", "buffers"):
        # A fresh workspace's own files: the next kernel makes them again.
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            (staging / leftover).unlink()
    os.replace(staging, dest)  # onto a missing or empty directory
    fsync_dir(dest.parent)
