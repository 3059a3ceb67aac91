"""The workspace directory: where an image's history lives, and who owns it.

Layout::

    <workspace>/
        workspace.json    format version and creation facts
        settings.json     the user's settings for this workspace (``on_error``)
        lock              held by the one process that may write (see lock.py)
        history.git/      a bare git repository: one commit per committed op
        tail              small commits not yet folded into git (see tail.py)
        pending           exists only while a commit is being written
        pruning           exists only while a ``kernos prune`` is not finished
        pulling           exists only while a ``kernos pull`` or clone is landing
        incoming/         what a pull fetched and checked, while it runs
                          (see kernos.remote.pull and kernos.remote.land)
        identity.json     this copy as a writer: its id and signing key, never pushed
                          (see kernos.store.identity)
        trust.json        the writer keys whose records it accepts (kernos.store.trust)
        tmp/              temporary object files, renamed into history.git
        audit/            the audit log (see kernos.audit.log)
        llm/              LLM requests, answers, recordings and the spending ledger,
                          outside the image: they survive rollbacks (see kernos.llm)
        memory/index.sqlite  the agents' searchable memory: an SQLite FTS5 cache rebuilt
                          from the audit chain and the image (see kernos.memory); never
                          pushed, never forked; delete at will
        files/            the workspace's own files root, tracked (see kernos.files)
        files-here.json   directories outside it tracked here (kernos.files.here)
        remotes.json      this copy's id and its git remotes (see kernos.remote.transfer)
        remote.git/       staging repository for pushes and fetches, its objects borrowed
                          from history.git (see kernos.remote.git; delete at will
                          when no push runs)

Which directory a workspace is, is decided in :mod:`kernos.store.location`.  A
writable open recovers what a crash left (the tail, the pending journal), then
finishes what the floors above registered (:func:`restore_records_with`,
:func:`finish_at_open`): the audit records the tail carries, a pull, a prune.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernos import _faults
from kernos._durable import fsync_all, fsync_dir, replace_file, write_all
from kernos._version import __version__
from kernos.errors import (
    KernosError,
    UnknownRef,
    UsageError,
    WorkspaceCorrupt,
    WorkspaceError,
    WorkspaceFormatError,
)
from kernos.store.location import (
    WORKSPACE_NAME,
    check_workspace_name,
    default_workspace,
    notebook_workspace_name,
    workspaces_root,
)
from kernos.store.lock import WorkspaceLock
from kernos.store.object_store import ObjectStore
from kernos.store.objects import CommitData, decode_commit
from kernos.store.space import NOT_FOLDED, NOTHING_COMMITTED, reporting_full_disk
from kernos.store.tail import FOLD_BYTES, FOLD_FRAMES, Tail

if TYPE_CHECKING:
    import git

__all__ = ["FORMAT", "INTERRUPTED", "SETTINGS", "WORKSPACE_NAME", "Workspace",
           "check_workspace_name", "default_workspace", "finish_at_open",
           "notebook_workspace_name", "restore_records_with", "workspaces_root"]

FORMAT = 1
BRANCH = "refs/heads/main"
AUDIT_CHAIN = "audit/chain.jsonl"
"""The audit chain (``kernos.audit.log``), which a fold syncs for the records frames carry."""
SETTINGS: dict[str, tuple[str, ...]] = {
    "on_error": ("rollback", "keep"),
}
"""Each setting and its allowed values, the first being the default.

``on_error``: what happens to a notebook cell that raises.  ``rollback`` (the
default) rolls it back; ``keep`` commits the state it reached before it raised,
as an op marked failed, as IPython keeps it.  Agent ops always roll back.
"""


# -- what a writable open finishes: registration points for the floors above -------

RestoreRecords = Callable[[Path, Sequence[bytes], bool], int]
"""``restore(chain, records, durable)`` puts back in the audit chain at ``chain`` the
records that the commit tail's frames carry and a crash kept from it; returns how many
(``kernos.audit.log.restore_records``)."""
Finish = Callable[["Workspace"], "str | None"]
"""Finishes (or forgets) work a crash interrupted in a workspace; says what, or None."""

INTERRUPTED = ("pull", "prune")
"""What a writable open finishes after its own recovery, in this order: a pull that was
landing (registered by ``kernos.remote``), then a prune (``kernos.store.retention``)."""

_restore_records: list[RestoreRecords] = []
_finish: dict[str, Finish] = {}


def restore_records_with(restore: RestoreRecords) -> None:
    """Register who puts back the tail's audit records at a writable open (the audit log,
    from ``kernos.audit._store_hooks``; the store knows only this shape)."""
    _restore_records[:] = [restore]


def finish_at_open(name: str, finish: Finish) -> None:
    """Register what a writable open finishes for ``name``, one of :data:`INTERRUPTED`."""
    if name not in INTERRUPTED:
        raise ValueError(f"{name!r} is not one of {INTERRUPTED}")
    _finish[name] = finish


def _unwired(what: str) -> RuntimeError:
    return RuntimeError(f"nothing is registered to {what}: kernel/kernos/__init__.py "
                        "imports the modules that register (import the package whole)")


class Workspace:
    """An open workspace: its repository, its objects and (if writable) its lock."""

    def __init__(self, path: Path, *, lock: WorkspaceLock | None, durable: bool) -> None:
        self.path = path
        self.git_dir = path / "history.git"
        self.lock = lock
        self.durable = durable
        self.tail = Tail(path / "tail", ref=self.git_ref, writable=lock is not None,
                         durable=durable)
        self.objects = ObjectStore(
            self.git_dir, journal=path / "pending", scratch=path / "tmp", durable=durable,
            tail=self.tail,
        )
        if lock is not None:  # a raw second copy of big buffers that older releases kept
            with contextlib.suppress(OSError):
                (path / "buffers").unlink(missing_ok=True)
        self.recovery_note: str | None = None
        self._repo: git.Repo | None = None
        self._grouping = 0
        self._branch = threading.RLock()
        """Held while the branch moves (``set_head``, ``fold``, ``close``): one thread at a
        time writes the ref's lock file, packs the tail and empties it.  A kernel folds from
        its loop when idle and from its control thread at shutdown; without this the second
        ``open(O_TRUNC)`` of ``main.lock`` let the first rename it away, and the second's
        rename failed (``refs/heads/main.lock: No such file``)."""

    def __getstate__(self) -> dict[str, object]:
        # A value that refers to the workspace copies it; the lock stays with this process.
        return {**self.__dict__, "_branch": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._branch = threading.RLock()

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        writable: bool = True,
        create: bool = True,
        purpose: str = "kernos process",
        durable: bool | None = None,
    ) -> Workspace:
        """Open (and, if allowed, create) a workspace.

        A writable workspace takes the lock, so a second writer gets
        :class:`~kernos.errors.WorkspaceLocked`, and finishes or discards a
        commit (or a ``kernos prune``) that a crash interrupted.  A read-only
        one takes no lock.
        """
        # Absolute, once: the user's code may os.chdir, and the history must not follow it.
        root = (Path(path).expanduser() if path is not None else default_workspace()).absolute()
        if durable is None:
            durable = os.environ.get("KERNOS_DURABILITY", "full") != "process"
        if not (root / "workspace.json").exists():
            if not root.exists() and (not create or not writable):
                raise WorkspaceFormatError(
                    f"{root} does not exist. Check the path (or KERNOS_WORKSPACE); a kernel "
                    "creates its workspace when it first starts.",
                    path=str(root),
                )
            if not create or not writable:
                raise WorkspaceFormatError(
                    f"{root} is not a Kernos workspace (it has no workspace.json). Check "
                    "the path, or open it from a kernel to create it.",
                    path=str(root),
                )
            cls._create(root)
        cls._check_format(root)
        lock = WorkspaceLock.acquire(root, purpose) if writable else None
        workspace = cls(root, lock=lock, durable=durable)
        if writable:
            try:
                folded = workspace._recover_tail()
                note = workspace.objects.recover(workspace.head())
                # A pull, then a prune, that a crash interrupted is finished (or forgotten).
                notes = [folded, note]
                for name in INTERRUPTED:
                    if name not in _finish:
                        raise _unwired(f"finish an interrupted {name}")
                    notes.append(_finish[name](workspace))
                workspace.recovery_note = "; ".join(n for n in notes if n) or None
            except BaseException:
                workspace.close()
                raise
        return workspace

    @staticmethod
    def _create(root: Path) -> None:
        if root.exists() and any(root.iterdir()):
            raise WorkspaceFormatError(
                f"{root} exists and is not empty, but is not a Kernos workspace. Choose an "
                "empty or new directory for KERNOS_WORKSPACE.",
                path=str(root),
            )
        root.mkdir(parents=True, exist_ok=True)
        git_dir = root / "history.git"
        for sub in ("objects", "refs/heads", "refs/tags", "info"):
            (git_dir / sub).mkdir(parents=True, exist_ok=True)
        (git_dir / "HEAD").write_text(f"ref: {BRANCH}\n")
        (git_dir / "config").write_text(
            "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n"
            "\tlogAllRefUpdates = false\n[gc]\n\tauto = 0\n"
        )
        (git_dir / "description").write_text("Kernos image history\n")
        meta = {"format": FORMAT, "created_by": f"kernos {__version__}",
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        temporary = root / "workspace.json.tmp"
        temporary.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(temporary, root / "workspace.json")
        fsync_dir(root)

    @staticmethod
    def _check_format(root: Path) -> None:
        try:
            meta = json.loads((root / "workspace.json").read_text())
            version = int(meta["format"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise WorkspaceCorrupt(str(root), f"workspace.json is unreadable ({error})") from None
        if version > FORMAT:
            raise WorkspaceFormatError(
                f"{root} was written by a newer Kernos (format {version}; this one reads "
                f"format {FORMAT}). Upgrade Kernos to open it.",
                path=str(root),
            )
        if not (root / "history.git" / "objects").is_dir():
            raise WorkspaceCorrupt(str(root), "history.git/objects is missing")

    def close(self) -> None:
        with self._branch:  # after a fold another thread runs; a fold after this does nothing
            if self.writable and self.tail.frames:
                # The frames are durable already: a fold that fails here is done at the next
                # open.
                with contextlib.suppress(OSError):
                    self.fold()
            self.objects.close()
            if self._repo is not None:
                self._repo.close()
                self._repo = None
            if self.lock is not None:
                self.lock.release()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def writable(self) -> bool:
        return self.lock is not None and self.lock.held

    # -- settings --------------------------------------------------------------

    def setting(self, name: str) -> str:
        """The value of setting ``name`` (its default unless it was set)."""
        allowed = SETTINGS.get(name)
        if allowed is None:
            raise UsageError(f"there is no setting {name!r}; settings: {', '.join(SETTINGS)}")
        try:
            stored = json.loads((self.path / "settings.json").read_text()).get(name)
        except FileNotFoundError:
            return allowed[0]
        except (OSError, ValueError, AttributeError) as error:
            raise WorkspaceCorrupt(str(self.path), f"settings.json is unreadable ({error}); "
                                   "fix or delete it") from None
        return stored if stored in allowed else allowed[0]

    def set_setting(self, name: str, value: str) -> None:
        """Change a setting (durably, at once: settings are not part of the image)."""
        allowed = SETTINGS.get(name)
        if allowed is None:
            raise UsageError(f"there is no setting {name!r}; settings: {', '.join(SETTINGS)}")
        if value not in allowed:
            raise UsageError(f"{name} takes one of {', '.join(allowed)}, not {value!r}")
        if not self.writable:
            raise UsageError("settings change only in a workspace opened writable")
        settings = {key: self.setting(key) for key in SETTINGS}
        settings[name] = value
        path = self.path / "settings.json"
        replace_file(path, (json.dumps(settings, indent=2) + "\n").encode(),
                     durable=self.durable, temporary=path.with_name(path.name + ".tmp"))

    # -- the branch ------------------------------------------------------------

    def head(self) -> bytes | None:
        """The commit the branch names (with the commits of the tail), or None if empty."""
        if not self.tail.writable:
            self.tail.refresh()  # a reader: the writer may have appended or folded since
        return self.tail.head or self.git_ref()

    def git_ref(self) -> bytes | None:
        """The commit git's own ref names (the tail may hold newer commits)."""
        ref = self.git_dir / BRANCH
        try:
            text = ref.read_text().strip()
        except FileNotFoundError:
            text = self._packed_ref()
        if not text:
            return None
        try:
            sha = bytes.fromhex(text)
        except ValueError:
            raise WorkspaceCorrupt(str(self.path), f"{BRANCH} holds {text[:60]!r}") from None
        if len(sha) != 20:
            raise WorkspaceCorrupt(str(self.path), f"{BRANCH} holds {text[:60]!r}")
        return sha

    def _packed_ref(self) -> str:
        try:
            lines = (self.git_dir / "packed-refs").read_text().splitlines()
        except FileNotFoundError:
            return ""
        for line in lines:
            sha, _, name = line.partition(" ")
            if name == BRANCH:
                return sha
        return ""

    def set_head(self, commit: bytes, *, sync_with: Iterable[Path | int] = (),
                 record: bytes = b"") -> None:
        """Make ``commit`` the branch's head: the atomic commit point of an op.

        A batch the objects kept for the tail, continuing the head, becomes a
        frame carrying a copy of the op's audit ``record``, appended and synced
        (:mod:`kernos.store.tail`); ``sync_with`` (the audit log) is synced
        later, by a fold.  Otherwise the tail is folded first, and with
        durability the sealed objects, the new ref's file and ``sync_with`` are
        synced together (``ObjectStore.sync``), then the ref is renamed into
        place and its directory synced.
        """
        with self._branch:
            if not self.writable:  # closed meanwhile (a shutdown on another thread)
                raise WorkspaceError(
                    f"the workspace {self.path} was closed before this op could commit (the "
                    "kernel is shutting down); nothing was committed. Run the op again once "
                    "the kernel has restarted.", path=str(self.path))
            objects = self.objects
            others = tuple(sync_with)
            parent = objects.framed_parent
            if parent is not ...:
                if parent == self.head():
                    if others and not record and self.durable:
                        with reporting_full_disk(self.path / AUDIT_CHAIN,
                                                 "the audit log (fsync)",
                                                 then=NOTHING_COMMITTED):
                            fsync_all(others)  # no copy in the frame: durable before it
                    objects.append_frame(record, sync=not self._grouping)
                    if len(self.tail.frames) >= FOLD_FRAMES or self.tail.size >= FOLD_BYTES:
                        # The op is durable already: a fold that fails is retried by the next.
                        with contextlib.suppress(OSError):
                            self.fold()
                    return
                objects.unframe()
            if self.tail.frames:
                self.fold()
            self._move_ref(commit, lambda temporary: objects.sync(temporary, *others),
                           then=NOTHING_COMMITTED)

    @contextlib.contextmanager
    def group_commit(self) -> Iterator[None]:
        """Small commits made in here append their frames without syncing them.

        The caller must call :meth:`make_durable` (or see :meth:`durable_through`
        its :attr:`commit_ticket`) before it tells anyone of those commits or of
        anything that depends on them; meanwhile other ops may run and commit,
        and one sync then covers them all (``kernos.store.tail``, group commit).
        """
        self._grouping += 1
        try:
            yield
        finally:
            self._grouping -= 1

    @property
    def commit_ticket(self) -> int:
        """A ticket for every commit made so far: see :meth:`durable_through`."""
        return self.tail.appended

    def durable_through(self, ticket: int) -> bool:
        """Whether the commits of ``ticket`` (:attr:`commit_ticket`) are durable."""
        return self.tail.synced >= ticket

    def make_durable(self) -> None:
        """Make every commit made so far durable (one sync at most; from any thread).
        Raises ``OSError`` if the disk refuses: see ``Tail.sync``."""
        self.tail.sync()

    def fold(self) -> int:
        """Fold the tail's commits into git: one pack, then the ref; how many there were.

        Each step is durable before the next, and the tail is emptied last, so a
        crash at any point loses nothing (the tail's rule 4).
        """
        tail = self.tail
        with self._branch:
            if not self.writable or not tail.frames:  # closed: the lock may be someone else's
                return 0
            count = len(tail.frames)
            head = tail.frames[-1].commit
            self.objects.pack_tail()
            _faults.point("fold.packed")
            chain = self.path / AUDIT_CHAIN  # the frames' records: synced before they go
            synced = ([chain] if any(frame.record for frame in tail.frames) and chain.exists()
                      else [])
            self._move_ref(head, lambda temporary: fsync_all([temporary, *synced])
                           if self.durable else None, then=NOT_FOLDED)
            _faults.point("fold.published")
            tail.clear()
            return count

    def _recover_tail(self) -> str | None:
        """At a writable open: fold what the tail holds; cut off what it must not."""
        stale = self.tail.load()
        # A crash between writing the ref's lock file and renaming it (``ref.locked``)
        # leaves the file, and git refuses to move the branch while it exists.  The
        # workspace lock is ours: no one else is moving it.
        (self.git_dir / (BRANCH + ".lock")).unlink(missing_ok=True)
        records = [frame.record for frame in self.tail.frames if frame.record]
        restored = 0
        if records:
            if not _restore_records:
                raise _unwired("put back the tail's audit records")
            restored = _restore_records[0](self.path / AUDIT_CHAIN, records, self.durable)
        folded = self.fold()
        if stale:
            self.tail.clear()
        notes = []
        if folded:
            notes.append(f"folded {folded} commit(s) from the tail into the history")
        if restored:
            notes.append(f"put back {restored} audit record(s) from the tail")
        return "; ".join(notes) or None

    def _move_ref(self, commit: bytes, sync: Callable[[Path], None], *, then: str) -> None:
        """Replace the branch's ref by ``rename``; ``sync(temporary)`` before it.

        ``then`` says what a full disk leaves (see ``kernos.store.space``): the
        ref has not moved, and its lock file is gone, so git can move it later.
        """
        with self._branch:
            ref = self.git_dir / BRANCH
            temporary = ref.with_name(ref.name + ".lock")
            with reporting_full_disk(temporary, "the branch's ref", then=then):
                try:
                    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        write_all(fd, commit.hex().encode() + b"\n")
                    finally:
                        os.close(fd)
                    sync(temporary)
                except BaseException:
                    temporary.unlink(missing_ok=True)
                    raise
            _faults.point("ref.locked")
            os.replace(temporary, ref)
            if self.durable:
                fsync_dir(ref.parent)

    # -- reading history -------------------------------------------------------

    def read_commit(self, sha: bytes) -> CommitData:
        kind, data = self.read_object(sha)
        if kind != b"commit":
            raise WorkspaceCorrupt(str(self.path),
                                   f"{sha.hex()} is a {kind.decode()}, not a commit")
        return decode_commit(data)

    def read_object(self, sha: bytes) -> tuple[bytes, bytes]:
        try:
            return self.objects.read(sha)
        except (FileNotFoundError, ValueError, OSError) as error:
            raise WorkspaceCorrupt(str(self.path), f"object {sha.hex()} is unreadable ({error})"
                                   ) from None

    def read_blob_into(self, sha: bytes, out: memoryview) -> None:
        """Copy blob ``sha`` into ``out`` (exactly its size); corruption is reported as such."""
        try:
            self.objects.read_blob_into(sha, out)
        except (FileNotFoundError, ValueError, OSError, zlib.error) as error:
            raise WorkspaceCorrupt(str(self.path), f"object {sha.hex()} is unreadable ({error})"
                                   ) from None

    def history(self, start: bytes | None = None) -> Iterator[tuple[bytes, CommitData]]:
        """Commits from ``start`` (default: the head) back to the first, following first parents."""
        sha = self.head() if start is None else start
        while sha is not None:
            commit = self.read_commit(sha)
            yield sha, commit
            sha = commit.parents[0] if commit.parents else None

    def snapshot_of_op(self, op: int, *, exact: bool, ref: str | None = None) -> bytes:
        """Op ``op``'s snapshot; or, unless ``exact``, the newest one before it (for an op
        that wrote none because it changed nothing or rolled back, which only its caller,
        reading the audit log, can know: a prune deletes snapshots too)."""
        head = self.head()
        for sha, commit in self.history(head) if head is not None else ():
            number = op_of(commit)
            if number is not None and (number == op or (not exact and number < op)):
                return sha
        raise UnknownRef(ref or f"@{op}", str(self.path))

    def resolve(self, ref: str) -> bytes:
        """A commit id for ``HEAD``, ``HEAD~N``, ``@N`` (op N's snapshot), or a commit id or
        prefix."""
        text = ref.strip()
        if re.fullmatch(r"[0-9a-fA-F]{40}", text):
            with contextlib.suppress(KernosError):  # any snapshot in the store, by full id
                sha = bytes.fromhex(text)
                self.read_commit(sha)
                return sha
        head = self.head()
        if head is None:
            raise UnknownRef(ref, str(self.path))
        match = re.fullmatch(r"(?:HEAD|head)?(?:~(\d+))?", text)
        if match and (text.upper().startswith("HEAD") or text.startswith("~") or not text):
            steps = int(match.group(1) or 0)
            for index, (sha, _commit) in enumerate(self.history(head)):
                if index == steps:
                    return sha
            raise UnknownRef(ref, str(self.path))
        if re.fullmatch(r"@\d+", text):
            return self.snapshot_of_op(int(text[1:]), exact=True, ref=ref)
        if re.fullmatch(r"[0-9a-fA-F]{4,40}", text):
            prefix = text.lower()
            found = [sha for sha, _ in self.history(head) if sha.hex().startswith(prefix)]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise UnknownRef(f"{ref} (ambiguous: {len(found)} commits)", str(self.path))
        raise UnknownRef(ref, str(self.path))

    @property
    def repo(self) -> git.Repo:
        """A GitPython ``Repo`` for the history, for tools that want one.

        git reads only what it has: a writer folds the tail first.
        """
        if self.writable:
            self.fold()
        if self._repo is None:
            import git

            self._repo = git.Repo(str(self.git_dir))
        return self._repo

    def disk_usage(self) -> int:
        total = 0
        for directory, _dirs, files in os.walk(self.git_dir):
            for name in files:
                try:
                    total += os.lstat(os.path.join(directory, name)).st_size
                except FileNotFoundError:
                    continue
        return total


def op_of(commit: CommitData) -> int | None:
    """The op number recorded in a commit message's ``Kernos-Op:`` trailer."""
    match = re.search(r"^Kernos-Op: (\d+)$", commit.message, re.MULTILINE)
    return int(match.group(1)) if match else None
