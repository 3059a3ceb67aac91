"""Ways to make one commit's new git objects durable, measured side by side.

    .venv/bin/python bench/pack_writers.py [--commits N] [--no-durable] [--only NAME[,NAME]]

Every candidate gets a fresh ``git init`` repository under ``$TMPDIR`` and
writes the same N commits, each with the object mix of a small op: the
manifest (``kernos.json``, ~1.5 KB, with a counter), the changed group's
``index.json`` (~300 B) and its 2 KB pickle stream, the group's tree, the
``ns`` tree, the root tree and a commit chained to the previous one (7 new
objects; the first commit also holds three groups that never change).  A
commit's time runs from handing over its objects to the branch ref naming it
durably (temporary file, rename, fsync of the file and of ``refs/heads``).
The candidates take turns commit by commit, so a burst of load on the shared
machine hits all of them alike.

Candidates:

* ``loose``: the project's writer, ``kernos.store.loose.LooseObjects``
  (begin, a write per object, seal, ref, finish): one zlib file per object
  and one ``syncfs`` per commit.
* ``fast-import``: one ``git fast-import`` per repository, kept running, fed
  each commit's files and its commit, then ``checkpoint`` (a pack, its index
  and the ref) and ``progress``; the time runs until the progress line comes
  back.  ``core.fsync=objects,derived-metadata,reference`` with
  ``core.fsyncMethod=fsync``.  ``fastimport.unpackLimit=0`` keeps its packs:
  under the default limit (100 objects) git explodes every small checkpoint
  into loose objects, which ``fast-import-default`` shows.
* ``dulwich``: dulwich's ``write_pack_objects`` and ``write_pack_index``,
  one pack and index per commit, both fsynced, renamed, then the directory.
* ``pygit2-loose``: libgit2's loose-object writer (``Odb.write``) with
  libgit2's fsync option on.
* ``pygit2-pack``: libgit2's ``PackBuilder``, which packs only objects its
  object database can read: the commit's objects are held in an in-memory
  backend (what libgit2's mempack does; pygit2 does not expose mempack), and
  ``PackBuilder.write`` writes and fsyncs the pack and index.
* ``kernos-store``: the store's own writer, ``kernos.store.object_store.ObjectStore``
  (one pack v2 of whole objects and its index per commit, to temporary
  names, renamed, one ``syncfs`` for the batch).  It started in this file as
  the "minimal-pack" candidate, the fastest of the first runs, and moved
  into the store (``kernos.store.packs``).

Per candidate it prints the median and p90 ms per commit, commits/s, the
files under ``.git/objects`` after the last commit (the writer still open),
and the median's ratio to ``loose`` in the same run.  Then it checks each
repository (``git fsck --full --strict``, ``git log --oneline`` has N lines,
the branch names the expected commit) and reads back every object the last
100 commits wrote: through ``LooseObjects.read`` for loose repositories, the
store's memory-mapped pack reader (``kernos.store.packs.PackSet``) for
packs, and dulwich's and pygit2's own
readers for theirs; the median per object, and whether four threads reading at
once get the right bytes.

dulwich and pygit2 are bench-only dependencies (the ``bench`` extra); a
candidate whose library is missing prints a skip line.  ``--no-durable``
drops every fsync and syncfs, to separate CPU from sync costs.  The machines
are shared: run it twice and compare ratios, not single figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))

from kernos._durable import fsync_dir, replace_file, sync_filesystem
from kernos.store.loose import LooseObjects
from kernos.store.object_store import ObjectStore
from kernos.store.objects import (
    BLOB_MODE,
    TREE_MODE,
    CommitData,
    TreeEntry,
    encode_commit,
    encode_tree,
    object_id,
)
from kernos.store.packs import PackSet

TYPE_NUMBERS = {b"commit": 1, b"tree": 2, b"blob": 3}
KINDS = {number: kind for kind, number in TYPE_NUMBERS.items()}
BRANCH = "refs/heads/main"
AUTHOR = "Kernos bench <bench@kernos.invalid>"
EPOCH = 1_700_000_000
READ_BACK = 100
READ_THREADS = 4
FSYNC_CONFIG = ["-c", "core.fsync=objects,derived-metadata,reference",
                "-c", "core.fsyncMethod=fsync"]
NO_FSYNC_CONFIG = ["-c", "core.fsync=none"]


# -- the workload ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GitObject:
    kind: bytes
    data: bytes
    sha: bytes


@dataclass(frozen=True, slots=True)
class Batch:
    """One commit: the objects it adds, and the files that changed (for fast-import)."""

    number: int
    objects: tuple[GitObject, ...]
    """New objects only, the commit last."""
    files: tuple[tuple[str, bytes], ...]
    commit: GitObject
    timestamp: int
    message: str


def _object(kind: bytes, data: bytes) -> GitObject:
    return GitObject(kind, data, object_id(kind, data))


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _group(key: str, names: list[str], op: int, seed: int) -> dict[str, GitObject]:
    stream = pickle.dumps({"counter": seed, "history": [(seed + i) / 7 for i in range(200)]},
                          protocol=5)
    index = _json({"names": names, "stream": [len(stream)], "buffers": [], "code_refs": [],
                   "unpersisted": [{"name": "handle", "type": "socket", "op": op}]})
    return {f"ns/{key}/index.json": _object(b"blob", index),
            f"ns/{key}/s.000000": _object(b"blob", stream)}


def _manifest(op: int) -> bytes:
    groups = ("counter", "config", "memory", "table")
    names = {f"name_{i:02d}": {"group": groups[min(i, 1 + i % 3)], "type": "builtins.dict",
                               "size": 2048 + i, "op": op - i % 5}
             for i in range(12)}
    return _json({"format": 1, "op": {"id": op, "status": "committed", "principal": "human",
                                      "timings_ms": {"analyze": 0.4, "serialize": 0.6}},
                  "counter": op, "names": names})


def build_workload(commits: int) -> list[Batch]:
    """The N commits every candidate writes, each object's id computed once, up front."""
    static: dict[str, GitObject] = {}
    for number, key in enumerate(("config", "memory", "table")):
        static.update(_group(key, [key], 0, 1000 + number))
    stored: set[bytes] = set()
    parent: bytes | None = None
    batches = []
    for number in range(commits):
        files = {**static, "kernos.json": _object(b"blob", _manifest(number)),
                 **_group("counter", ["counter"], number, number)}
        new: list[GitObject] = []

        def tree(prefix: str, new: list[GitObject] = new,
                 files: dict[str, GitObject] = files) -> bytes:
            entries = []
            children = {path[len(prefix):].split("/")[0] for path in files
                        if path.startswith(prefix)}
            for name in children:
                path = prefix + name
                if path in files:
                    entries.append(TreeEntry(BLOB_MODE, name, files[path].sha))
                else:
                    entries.append(TreeEntry(TREE_MODE, name, tree(path + "/")))
            made = _object(b"tree", encode_tree(entries))
            new.append(made)
            return made.sha

        root = tree("")
        message = f"op {number}\n"
        commit = _object(b"commit", encode_commit(CommitData(
            tree=root, parents=(parent,) if parent else (), author=AUTHOR,
            timestamp=EPOCH + number, message=message)))
        objects = [*files.values(), *new, commit]
        fresh = tuple(obj for obj in objects if obj.sha not in stored)
        stored.update(obj.sha for obj in fresh)
        changed = tuple((path, obj.data) for path, obj in files.items()
                        if obj in fresh or number == 0)
        batches.append(Batch(number=number, objects=fresh, files=changed, commit=commit,
                             timestamp=EPOCH + number, message=message))
        parent = commit.sha
    return batches


# -- durability helpers --------------------------------------------------------


def publish_ref(git_dir: Path, commit: bytes, *, durable: bool) -> None:
    """Point the branch at ``commit``: temporary file, rename, fsync file and directory."""
    replace_file(git_dir / BRANCH, commit.hex().encode() + b"\n", durable=durable)


# -- candidates ------------------------------------------------------------


class Candidate:
    """One write path on its own repository."""

    name = ""

    def __init__(self, git_dir: Path, durable: bool) -> None:
        self.git_dir = git_dir
        self.durable = durable

    def commit(self, batch: Batch) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop whatever the candidate keeps running."""

    def readers(self) -> list[tuple[str, Callable[[], Reader]]]:
        return [("mmap packs", lambda: pack_reader(self.git_dir))]


class Loose(Candidate):
    name = "loose"
    store: type[LooseObjects] = LooseObjects

    def __init__(self, git_dir: Path, durable: bool) -> None:
        super().__init__(git_dir, durable)
        self.objects = self.store(git_dir, journal=git_dir / "kernos-journal",
                                  scratch=git_dir / "kernos-scratch", durable=durable)

    def commit(self, batch: Batch) -> None:
        self.objects.begin()
        for obj in batch.objects:
            self.objects.write(obj.kind, obj.data, obj.sha)
        self.objects.seal(batch.commit.sha)
        publish_ref(self.git_dir, batch.commit.sha, durable=self.durable)
        self.objects.finish()

    def readers(self) -> list[tuple[str, Callable[[], Reader]]]:
        return [("LooseObjects.read", lambda: loose_reader(self.git_dir))]


def loose_reader(git_dir: Path) -> Reader:
    return LooseObjects(git_dir, journal=git_dir / "kernos-journal",
                        scratch=git_dir / "kernos-scratch", durable=False).read


class FastImport(Candidate):
    name = "fast-import"
    unpack_limit: int | None = 0

    def __init__(self, git_dir: Path, durable: bool) -> None:
        super().__init__(git_dir, durable)
        config = list(FSYNC_CONFIG if durable else NO_FSYNC_CONFIG)
        if self.unpack_limit is not None:
            config += ["-c", f"fastimport.unpackLimit={self.unpack_limit}"]
        self.process = subprocess.Popen(
            ["git", "--git-dir", str(git_dir), *config, "fast-import", "--quiet", "--done"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def commit(self, batch: Batch) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        parts = [b"commit %s\ncommitter %s %d +0000\ndata %d\n%s" % (
            BRANCH.encode(), AUTHOR.encode(), batch.timestamp, len(batch.message),
            batch.message.encode())]
        for path, data in batch.files:
            parts.append(b"M 100644 inline %s\ndata %d\n%s\n" % (path.encode(), len(data), data))
        token = b"commit %d" % batch.number
        parts.append(b"\ncheckpoint\nprogress %s\n" % token)
        self.process.stdin.write(b"".join(parts))
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if line.rstrip(b"\n") != b"progress " + token:
            raise RuntimeError(f"git fast-import answered {line!r} (exit {self.process.poll()})")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"done\n")
        self.process.stdin.close()
        if self.process.wait(timeout=60) != 0:
            raise RuntimeError(f"git fast-import exited with {self.process.returncode}")


class FastImportDefault(FastImport):
    name = "fast-import-default"
    unpack_limit = None

    def readers(self) -> list[tuple[str, Callable[[], Reader]]]:
        # its checkpoints end up as loose objects
        return [("LooseObjects.read", lambda: loose_reader(self.git_dir))]


class Store(Loose):
    name = "kernos-store"
    store = ObjectStore

    def close(self) -> None:
        assert isinstance(self.objects, ObjectStore)
        self.objects.wait_for_maintenance()
        self.objects.close()

    def readers(self) -> list[tuple[str, Callable[[], Reader]]]:
        return Candidate.readers(self)  # its objects are packed


class Dulwich(Candidate):
    name = "dulwich"

    def __init__(self, git_dir: Path, durable: bool) -> None:
        super().__init__(git_dir, durable)
        from dulwich.object_format import SHA1
        from dulwich.objects import ShaFile
        from dulwich.pack import write_pack_index, write_pack_objects

        self._format = SHA1
        self._from_raw = ShaFile.from_raw_string
        self._write_pack = write_pack_objects
        self._write_index = write_pack_index

    def commit(self, batch: Batch) -> None:
        objects = [self._from_raw(TYPE_NUMBERS[obj.kind], obj.data) for obj in batch.objects]
        pack_file = io.BytesIO()
        entries, checksum = self._write_pack(pack_file, objects, self._format,
                                             deltify=False)
        index_file = io.BytesIO()
        self._write_index(index_file, sorted((sha, offset, crc)
                                             for sha, (offset, crc) in entries.items()),
                          checksum, version=2)
        pack_dir = self.git_dir / "objects" / "pack"
        write_pack_pair(pack_dir, pack_dir / f"pack-{checksum.hex()}", pack_file.getvalue(),
                        index_file.getvalue(), durable=self.durable, use_syncfs=False)
        publish_ref(self.git_dir, batch.commit.sha, durable=self.durable)

    def readers(self) -> list[tuple[str, Callable[[], Reader]]]:
        def dulwich_reader() -> Reader:
            from dulwich.objects import RawObjectID
            from dulwich.repo import Repo

            store = Repo(str(self.git_dir)).object_store

            def read(sha: bytes) -> tuple[bytes, bytes]:
                number, data = store.get_raw(RawObjectID(sha))
                return KINDS[number], bytes(data)

            return read

        return [("dulwich get_raw", dulwich_reader), *super().readers()]


class Pygit2Loose(Candidate):
    name = "pygit2-loose"

    def __init__(self, git_dir: Path, durable: bool) -> None:
        super().__init__(git_dir, durable)
        import pygit2

        pygit2.settings.enable_fsync_gitdir(durable)
        self.repo = pygit2.Repository(str(git_dir))

    def commit(self, batch: Batch) -> None:
        odb = self.repo.odb
        for obj in batch.objects:
            odb.write(TYPE_NUMBERS[obj.kind], obj.data)
        publish_ref(self.git_dir, batch.commit.sha, durable=self.durable)

    def readers(self) -> list[tuple[str, Callable[[], Reader]]]:
        return [("pygit2 Odb.read", lambda: pygit2_reader(self.git_dir))]


class Pygit2Pack(Pygit2Loose):
    name = "pygit2-pack"

    def __init__(self, git_dir: Path, durable: bool) -> None:
        super().__init__(git_dir, durable)
        import pygit2

        self._pending: dict[bytes, GitObject] = {}
        pending = self._pending

        class Pending(pygit2.OdbBackend):
            """The commit's objects in memory, so that PackBuilder can read them."""

            def read_cb(self, oid: Any) -> tuple[int, bytes]:
                obj = pending[oid.raw]
                return TYPE_NUMBERS[obj.kind], obj.data

            def read_prefix_cb(self, oid: Any) -> tuple[int, bytes, Any]:
                obj = pending[bytes.fromhex(str(oid))]
                return TYPE_NUMBERS[obj.kind], obj.data, oid

            def read_header_cb(self, oid: Any) -> tuple[int, int]:
                obj = pending[oid.raw]
                return TYPE_NUMBERS[obj.kind], len(obj.data)

            def exists_cb(self, oid: Any) -> bool:
                return oid.raw in pending

        self._backend = Pending()
        self.repo.odb.add_backend(self._backend, 1000)
        self._oid = pygit2.Oid
        self._builder = pygit2.PackBuilder

    def commit(self, batch: Batch) -> None:
        self._pending.update((obj.sha, obj) for obj in batch.objects)
        builder = self._builder(self.repo)
        builder.set_threads(1)
        for obj in batch.objects:
            builder.add(self._oid(raw=obj.sha))
        builder.write(str(self.git_dir / "objects" / "pack"))
        self._pending.clear()
        publish_ref(self.git_dir, batch.commit.sha, durable=self.durable)

    def readers(self) -> list[tuple[str, Callable[[], Reader]]]:
        return [*super().readers(), *Candidate.readers(self)]


def pygit2_reader(git_dir: Path) -> Reader:
    import pygit2

    odb = pygit2.Repository(str(git_dir)).odb

    def read(sha: bytes) -> tuple[bytes, bytes]:
        number, data = odb.read(pygit2.Oid(raw=sha))
        return KINDS[int(number)], data

    return read


CANDIDATES: tuple[type[Candidate], ...] = (
    Loose, FastImport, FastImportDefault, Dulwich, Pygit2Loose, Pygit2Pack, Store)
NEEDS = {"dulwich": "dulwich", "pygit2-loose": "pygit2", "pygit2-pack": "pygit2"}


# -- writing a pack pair (dulwich's) --------------------------------------------


def _write_new(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_pack_pair(pack_dir: Path, stem: Path, pack: bytes, index: bytes, *,
                    durable: bool, use_syncfs: bool) -> None:
    """Both files under temporary names, durable, then renamed: the pack before its index,
    because a pack becomes visible to git when its ``.idx`` appears."""
    temporary_pack = pack_dir / f"tmp_pack_{stem.name[5:17]}"
    temporary_index = pack_dir / f"tmp_idx_{stem.name[5:17]}"
    _write_new(temporary_pack, pack, sync=durable and not use_syncfs)
    _write_new(temporary_index, index, sync=durable and not use_syncfs)
    if durable and use_syncfs:
        sync_filesystem(pack_dir)
    os.replace(temporary_pack, stem.with_suffix(".pack"))
    os.replace(temporary_index, stem.with_suffix(".idx"))
    if durable:
        fsync_dir(pack_dir)


# -- reading packs back --------------------------------------------------------

Reader = Callable[[bytes], tuple[bytes, bytes]]


def pack_reader(git_dir: Path) -> Reader:
    packs = PackSet(git_dir / "objects" / "pack")

    def read(sha: bytes) -> tuple[bytes, bytes]:
        found = packs.read(sha)
        if found is None:
            raise KeyError(sha.hex())
        return found

    return read


@dataclass
class Outcome:
    name: str
    samples: list[float] = field(default_factory=list)
    wall: float = 0.0
    files: int = 0
    size: int = 0
    checks: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)


def footprint(root: Path) -> tuple[int, int]:
    files = size = 0
    for directory, _, names in os.walk(root):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(directory, name)).st_size
    return files, size


def git(git_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True,
                          text=True, check=False)


def verify(git_dir: Path, batches: Sequence[Batch], outcome: Outcome) -> None:
    fsck = git(git_dir, "fsck", "--full", "--strict", "--no-progress")
    problems = (fsck.stdout + fsck.stderr).strip()
    if fsck.returncode != 0 or problems:
        outcome.failures.append(f"fsck exit {fsck.returncode}: {problems[:300]}")
    else:
        outcome.checks.append("fsck ok")
    log = git(git_dir, "log", "--oneline", "main")
    lines = len(log.stdout.splitlines())
    (outcome.checks if lines == len(batches) else outcome.failures).append(
        f"log {lines}/{len(batches)} commits")
    head = git(git_dir, "rev-parse", "main").stdout.strip()
    if head != batches[-1].commit.sha.hex():
        expected = batches[-1].commit.sha.hex()
        outcome.failures.append(f"main is {head[:12]}, expected {expected[:12]}")


def measure_reads(name: str, make_reader: Callable[[], Reader], batches: Sequence[Batch],
                  outcome: Outcome) -> None:
    wanted = [obj for batch in batches[-READ_BACK:] for obj in batch.objects]
    try:
        began = time.perf_counter()
        read = make_reader()
        opened = time.perf_counter() - began
        samples = []
        wrong = 0
        for obj in wanted:
            began = time.perf_counter()
            kind, data = read(obj.sha)
            samples.append(time.perf_counter() - began)
            wrong += (kind, data) != (obj.kind, obj.data)
        threaded = _threaded_reads(read, wanted)
    except Exception as error:
        outcome.failures.append(f"{name}: {type(error).__name__}: {error}")
        return
    if wrong:
        outcome.failures.append(f"{name}: {wrong} of {len(wanted)} objects read back wrong")
    if threaded:
        outcome.failures.append(f"{name}, {READ_THREADS} threads: {threaded}")
    outcome.reads.append(
        f"{name:<18} {len(wanted)} objects: median {statistics.median(samples) * 1e6:6.1f} us, "
        f"p90 {_p90(samples) * 1e6:6.1f} us, all {sum(samples) * 1000:6.1f} ms, "
        f"open {opened * 1000:5.1f} ms, {READ_THREADS} threads "
        f"{'ok' if not threaded else 'FAILED'}")


def _threaded_reads(read: Reader, wanted: Sequence[GitObject]) -> str:
    """Threads read the same objects at once, each from its own place; what went wrong, or ''."""
    problems: list[str] = []
    lock = threading.Lock()

    def worker(offset: int) -> None:
        for _ in range(3):
            for obj in [*wanted[offset:], *wanted[:offset]]:
                try:
                    if read(obj.sha) != (obj.kind, obj.data):
                        with lock:
                            problems.append(f"wrong bytes for {obj.sha.hex()[:12]}")
                except Exception as error:
                    with lock:
                        problems.append(f"{type(error).__name__}: {error}"[:120])

    with ThreadPoolExecutor(READ_THREADS) as pool:
        list(pool.map(worker, (len(wanted) * n // READ_THREADS for n in range(READ_THREADS))))
    if not problems:
        return ""
    return f"{len(problems)} bad reads, first: {problems[0]}"


def _p90(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def run(chosen: Sequence[type[Candidate]], batches: Sequence[Batch], durable: bool,
        scratch: Path) -> list[Outcome]:
    live: list[tuple[Candidate, Outcome]] = []
    for kind in chosen:
        git_dir = scratch / kind.name / ".git"
        subprocess.run(["git", "init", "-q", "-b", "main", str(git_dir.parent)], check=True)
        live.append((kind(git_dir, durable), Outcome(kind.name)))
    for batch in batches:
        turn = batch.number % len(live)  # rotate who goes first
        for candidate, outcome in live[turn:] + live[:turn]:
            if outcome.failures:
                continue
            began = time.perf_counter()
            try:
                candidate.commit(batch)
            except Exception as error:
                outcome.failures.append(f"commit {batch.number}: {type(error).__name__}: "
                                        f"{error}")
                continue
            elapsed = time.perf_counter() - began
            outcome.samples.append(elapsed)
            outcome.wall += elapsed
    for candidate, outcome in live:
        outcome.files, outcome.size = footprint(candidate.git_dir / "objects")
        try:
            candidate.close()
        except Exception as error:
            outcome.failures.append(f"close: {type(error).__name__}: {error}")
        if len(outcome.samples) == len(batches):
            verify(candidate.git_dir, batches, outcome)
            for name, make_reader in candidate.readers():
                measure_reads(name, make_reader, batches, outcome)
    return [outcome for _, outcome in live]


def report(outcomes: Sequence[Outcome], commits: int) -> None:
    baseline = next((statistics.median(o.samples) for o in outcomes
                     if o.name == "loose" and o.samples), None)
    print(f"\n  {'candidate':<20} {'median':>9} {'p90':>9} {'commits/s':>10} {'files':>7} "
          f"{'bytes':>9} {'vs loose':>9}  checks")
    for outcome in outcomes:
        if not outcome.samples:
            print(f"  {outcome.name:<20} {'-':>9} {'-':>9} {'-':>10} {'-':>7} {'-':>9} "
                  f"{'-':>9}  FAILED")
            continue
        middle = statistics.median(outcome.samples)
        ratio = f"{middle / baseline:.2f}x" if baseline else "-"
        verdict = "pass" if not outcome.failures else "FAILED"
        print(f"  {outcome.name:<20} {middle * 1000:6.2f} ms {_p90(outcome.samples) * 1000:6.2f} ms"
              f" {len(outcome.samples) / outcome.wall:10.0f} {outcome.files:7d} "
              f"{outcome.size / 1e6:6.2f} MB {ratio:>9}  {verdict} "
              f"({', '.join(outcome.checks)})")
    print(f"\nRead back: every object the last {min(READ_BACK, commits)} commits wrote, "
          f"one at a time, then {READ_THREADS} threads at once (3 rounds each)")
    for outcome in outcomes:
        for line in outcome.reads:
            print(f"  {outcome.name:<20} {line}")
    failed = [outcome for outcome in outcomes if outcome.failures]
    for outcome in failed:
        for failure in outcome.failures:
            print(f"  FAILED {outcome.name}: {failure}")


def available(kind: type[Candidate]) -> str | None:
    """Why the candidate cannot run here, or None."""
    module = NEEDS.get(kind.name)
    if module is None:
        return None
    try:
        __import__(module)
    except ImportError:
        return (f"{module} is not installed (a bench-only dependency: "
                f".venv/bin/pip install -e '.[bench]' or .venv/bin/pip install {module})")
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--no-durable", action="store_true",
                        help="skip every fsync and syncfs (CPU cost only)")
    parser.add_argument("--only", default="",
                        help="comma-separated names; a name that is no candidate's selects "
                             "the candidates it prefixes, e.g. pygit2 "
                             f"({', '.join(kind.name for kind in CANDIDATES)})")
    args = parser.parse_args()
    if args.commits < 1:
        parser.error("--commits must be at least 1")
    if shutil.which("git") is None:
        print("git is not on PATH", file=sys.stderr)
        return 2
    wanted = [name for name in args.only.split(",") if name]
    names = {kind.name for kind in CANDIDATES}
    chosen = [kind for kind in CANDIDATES if not wanted or any(
        kind.name == name or (name not in names and kind.name.startswith(name))
        for name in wanted)]
    if not chosen:
        parser.error(f"--only {args.only} names no candidate")
    durable = not args.no_durable
    git_version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout
    versions = [git_version.strip()]
    for module in ("dulwich", "pygit2"):
        with contextlib.suppress(ImportError):
            version = __import__(module).__version__
            if isinstance(version, tuple):
                version = ".".join(map(str, version))
            versions.append(f"{module} {version}")
    print(f"Kernos pack writers: {args.commits} commits per candidate, "
          f"{'durable (fsync)' if durable else 'NOT durable (--no-durable)'}, "
          f"{', '.join(versions)}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} "
          f"({time.strftime('%Y-%m-%d %H:%M:%S')})", flush=True)
    runnable = []
    for kind in chosen:
        reason = available(kind)
        if reason:
            print(f"  {kind.name}: skipped, {reason}")
        else:
            runnable.append(kind)
    batches = build_workload(args.commits)
    per_commit = statistics.median(len(batch.objects) for batch in batches)
    print(f"  {per_commit:.0f} new objects per commit "
          f"({sum(len(obj.data) for obj in batches[-1].objects):,} bytes), "
          f"{len(batches[0].objects)} in the first", flush=True)
    with tempfile.TemporaryDirectory(prefix="kernos-pack-writers-") as scratch:
        started = time.perf_counter()
        outcomes = run(runnable, batches, durable, Path(scratch))
        report(outcomes, args.commits)
    print(f"\nWall time {time.perf_counter() - started:.0f} s, "
          f"load {os.getloadavg()[0]:.2f}.")
    return 1 if any(outcome.failures for outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
