"""A workspace is a git remote: push, pull and clone its history, audit chain and LLM store.

The contract
------------
* :func:`push` sends everything a workspace needs to live elsewhere, and
  nothing secret; it is fast-forward only, or over a prune.  A push whose
  history does not continue the remote's (the remote's ``main`` is not an
  ancestor of ours) is refused with :class:`~kernos.errors.RemoteDiverged`,
  which names the writer, unless the audit chain proves the rewrite was a
  ``kernos prune`` and nothing else (:mod:`kernos.remote.prune`): our
  chain extends the remote's, and the prune records the remote lacks (not
  voided) map its ``main`` to our head or an ancestor of it.  Then ``main``
  moves by compare-and-swap on the value read (a writer that moved it
  meanwhile still gets ``RemoteDiverged``), and the remote's tags that those
  records moved or deleted follow them, the same way.  A push whose audit
  chain or LLM ledger is not an extension of the remote's is refused too: on
  the remote too they are append-only.
* :func:`pull` is fast-forward only as well, or over the remote's prunes
  (its chain extends ours, and its prune records map our head into its
  history: this copy has no op the remote lacks); then it deletes here what
  only the pruned commits reached, as a prune does.  It treats the remote as
  hostile input (:mod:`kernos.remote.pull`): everything is fetched
  aside and checked (paths, sizes, every new record's hash, link and
  signature by a key this workspace trusts, every new commit named by
  exactly one record, prunes consistent with the history they rewrite) before
  anything lands, in one step a ``kill -9`` cannot leave half done
  (:mod:`kernos.remote.land`); a refusal changes nothing here.  It needs
  the workspace to itself (a kernel holding it makes it fail with
  ``WorkspaceLocked``): it moves the history's ref, so it takes the workspace
  lock.
* :func:`clone` builds a whole workspace from a remote, checked the same way;
  ``kernos audit verify`` passes on it.  Its writers' keys must be trusted
  (``trust=``, a prompt on a terminal, ``$KERNOS_TRUST``, or this machine's
  own key) before a kernel restores anything from it
  (:mod:`kernos.store.trust`): restoring runs pickle.
* :func:`materialize` clones only when the directory is not a workspace yet
  (a kernel starting on a fresh machine).

A push works beside a running kernel.  It never writes to ``history.git``: it
opens the workspace read-only (as ``kernos log`` does, tail included), copies
the objects of the commits still in the commit tail into the staging
repository (``kernos.remote.git``), and pushes from there.  So every op
committed when the push starts is carried, folded or not.

Layout on the remote (an ordinary git repository)::

    refs/heads/main       the snapshot history, exactly the workspace's (same commit ids)
    refs/kernos/audit     a commit (parent: the previous push's) whose tree holds
                            chain/00000/00000000.jsonl ...   the audit chain, cut in segments
                                              of SEGMENT_LINES records, SEGMENT_GROUP segments
                                              a directory: a push adds the last segment's
                                              new blob and two small trees, however long
                                              the chain
                            payloads/ab/ab12...       the audit payloads, by name, in
                                                      directories of their first two hex digits
    refs/kernos/llm       the same for the LLM store (``kernos.llm``)
                            objects/ab/ab12....json  recordings/ab/ab12...
                            calls/00000/00000000.jsonl ...   the ledger, in segments
    refs/kernos/meta      workspace.json and settings.json; its commit message names the
                          pusher (host, workspace id, pid, time): the writer a refused
                          push names when the remote has no lease
    refs/kernos/lease     the writer lease, when one is held (``kernos.remote.lease``)

What travels is an allowlist (:data:`ALLOWED`, each file of the exact shape
``kernos.remote.pull.SHAPES`` names, which is all a pull accepts);
everything else stays: the writer's signing key (``identity.json``), the
trusted keys (``trust.json``), the per-subject keys (``keys/``, so personal
values are unreadable on the remote, as after an erasure), the lock,
``kernel.json`` (connection info with its HMAC key), the commit tail file
(its commits travel as git objects), buffers, ``tmp/``, ``pending``,
``audit/inflight.json``, ``llm/tmp``.

Records of the remotes: ``<workspace>/remotes.json`` (never pushed)::

    {"id": "<the writer it was written for>", "key": "ed25519:...",
     "remotes": {"origin": {"url": "...", "lease": false}}}

The writer id (``kernos.store.identity``: a clone or a copy made by hand gets
its own) names this copy of the workspace in the lease and in the pusher
trailers.  ``lease: true`` makes a kernel started with
``KERNOS_REMOTE=<name>`` take the remote's writer lease (see
:func:`kernos.remote.start.start_remote`).

Limits: after a ``kernos prune`` the remote (a bare repository) keeps the
pruned snapshots' objects, unreachable, until its own ``git gc`` deletes
them; Kernos does not run it there (``git gc --prune=now`` in the remote
does).  The first push after a prune may send the kept snapshots' objects
again: git learns what the remote has only from commits both sides know,
and the kept ones have new ids.  The remote's tags that no prune record
names are left as they are (a push carries no tags).  An erasure deletes
audit payloads locally; the remote keeps the sealed copies in its earlier
audit commits, unreadable without the key that never left the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kernos.errors import (
    RemoteDiverged,
    RemoteError,
    RemoteRefused,
    UsageError,
    WorkspaceFormatError,
)
from kernos.remote.config import RemoteConfig, absolute_url, ensure_bare, local_path
from kernos.remote.git import (
    Staging,
    describe_pusher,
    ls_remote,
    push_refs,
    pusher_trailers,
)
from kernos.remote.land import land, stage
from kernos.remote.lease import LEASE_REF, check_lease
from kernos.remote.prune import PrunedSince, follow_tags, pushed_over_prune
from kernos.remote.pull import (
    AUDIT_REF,
    LLM_REF,
    META_REF,
    SEGMENT_GROUP,
    SEGMENT_LINES,
    Quarantine,
    shape_of,
    take,
    whole_bytes,
)
from kernos.store.identity import load_identity
from kernos.store.trust import Trust, check_key_id
from kernos.store.workspace import BRANCH, Workspace

__all__ = [
    "ALLOWED",
    "AUDIT_REF",
    "LLM_REF",
    "META_REF",
    "SEGMENT_LINES",
    "PullResult",
    "PushResult",
    "RemoteConfig",
    "clone",
    "materialize",
    "pull",
    "push",
]

ALLOWED: dict[str, tuple[str, str]] = {
    "workspace.json": ("meta", "workspace.json"),
    "settings.json": ("meta", "settings.json"),
    "audit/chain.jsonl": ("audit", "chain/"),
    "audit/payloads/*": ("audit", "payloads/"),
    "llm/calls.jsonl": ("llm", "calls/"),
    "llm/objects/*": ("llm", "objects/"),
    "llm/recordings/*": ("llm", "recordings/"),
}
"""Every workspace file a push carries (``*``: each file directly in that directory), and
where it goes: (which ref, path in its tree; ``.jsonl`` files are cut into segments)."""


# -- reading what travels -----------------------------------------------------------------


def _whole_lines(path: Path) -> list[bytes]:
    """The whole lines of an append-only file (a writer may be mid-append)."""
    return whole_bytes(path).splitlines(keepends=True)


def _segments(lines: list[bytes]) -> list[bytes]:
    return [b"".join(lines[start:start + SEGMENT_LINES])
            for start in range(0, len(lines), SEGMENT_LINES)]


def _segment_name(index: int) -> str:
    return f"{index // SEGMENT_GROUP:05d}/{index:08d}.jsonl"


def _directory_files(directory: Path, ref: str, where: str) -> dict[str, Path]:
    """The files directly in ``directory``, by the path they get in ``ref``'s tree, that
    have a shape a pull accepts (``kernos.remote.pull.SHAPES``: no temporary or hidden names)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    return {f"{where}{name[:2]}/{name}": directory / name for name in names
            if shape_of(ref, f"{where}{name[:2]}/{name}") and (directory / name).is_file()}


@dataclass(kw_only=True)
class _Snapshot:
    """What one push reads from the workspace, in this order: head, then the rest."""

    head: bytes | None
    chain: list[bytes]
    ledger: list[bytes]
    files: dict[str, dict[str, Path]]
    """ref -> path in its tree -> the workspace file."""


def _read_workspace(root: Path, stage: Staging) -> _Snapshot:
    with Workspace.open(root, writable=False) as view:
        head = view.head()
        # Commits still in the tail: their objects go to the staging repository.
        for frame in list(view.tail.frames):
            for sha in frame.objects:
                kind, data = view.read_object(sha)
                stage.write(kind, data)
    chain = _published_chain(_whole_lines(root / "audit" / "chain.jsonl"), head, stage)
    files: dict[str, dict[str, Path]] = {"meta": {}, "audit": {}, "llm": {}}
    for pattern, (ref, where) in ALLOWED.items():
        if pattern.endswith("/*"):
            files[ref].update(_directory_files(root / pattern[:-2], ref, where))
        elif not pattern.endswith(".jsonl") and (root / pattern).is_file():
            files[ref][where] = root / pattern
    return _Snapshot(head=head, chain=chain, ledger=_whole_lines(root / "llm" / "calls.jsonl"),
                     files=files)


def _published_chain(lines: list[bytes], head: bytes | None, stage: Staging) -> list[bytes]:
    """The chain without the committed op records at its end whose snapshot ``head`` does
    not reach: their op was still committing (its record is written before its commit
    point); the next push carries them."""
    while lines:
        record = json.loads(lines[-1])
        commit = record.get("commit")
        if (record.get("type") != "op" or record.get("status") != "committed"
                or not isinstance(commit, str) or record.get("unchanged")):
            break
        sha = bytes.fromhex(commit)
        if head is not None and stage.has(sha) and stage.is_ancestor(sha, head):
            break
        lines = lines[:-1]
    return lines


# -- push -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PushResult:
    """What one push did."""

    remote: str
    """The remote's name."""
    head: str | None
    """The snapshot the remote's ``main`` names now."""
    before: str | None
    """The one it named before."""
    records: int
    """Audit records on the remote now."""
    updated: tuple[str, ...]
    """The refs this push moved."""
    prunes: tuple[int, ...] = ()
    """The prune records that let ``main`` move although ``before`` is not an ancestor of
    ``head`` (empty: a fast-forward)."""

    def to_json(self) -> dict[str, object]:
        return {"remote": self.remote, "head": self.head, "before": self.before,
                "records": self.records, "updated": list(self.updated),
                "prunes": list(self.prunes)}


def push(workspace: str | os.PathLike[str], name: str = "origin") -> PushResult:
    """Push the workspace to its remote ``name``: fast-forward, or over a prune (see the
    module doc)."""
    root = Path(workspace).expanduser().absolute()
    config = RemoteConfig.load(root)
    url = config.url(name)
    if not (root / "workspace.json").exists():
        raise WorkspaceFormatError(f"{root} is not a Kernos workspace; nothing to push",
                                   path=str(root))
    ensure_bare(url)
    stage = Staging(root)
    with stage.locked():
        ours = _read_workspace(root, stage)
        stage.forget_pruned()
        # The remote's main is read, not fetched: after a prune it names history this
        # workspace deleted, which a fetch would bring back (fetched below if not that).
        theirs = stage.fetch(url, name, [AUDIT_REF, LLM_REF, META_REF, LEASE_REF],
                             advertised_only=[BRANCH])
        check_lease(stage, config, name, theirs.get(LEASE_REF))
        before = theirs.get(BRANCH)
        writer = describe_pusher(stage, theirs.get(META_REF))
        updates: dict[str, bytes | None] = {}
        leases: dict[str, bytes] = {}
        since: PrunedSince | None = None
        if before is not None and not (ours.head is not None and stage.has(before)
                                       and stage.is_ancestor(before, ours.head)):
            shared = None if ours.head is None else _shared_records(stage, ours.chain,
                                                                     theirs.get(AUDIT_REF))
            if shared is None or ours.head is None:  # another writer, not a prune
                if not stage.has(before):
                    before = stage.fetch(url, name, [BRANCH]).get(BRANCH, before)
                behind = ours.head is None or (stage.has(before)
                                               and stage.is_ancestor(ours.head, before))
                raise RemoteDiverged(_diverged_message(name, writer, behind=behind),
                                     remote=name, writer=writer)
            since = pushed_over_prune(stage, name, before, ours.head, ours.chain, shared,
                                      writer)
            leases[BRANCH] = before  # moved by compare-and-swap: not a fast-forward
            follow_tags(stage, url, since, updates, leases)
        if ours.head is not None and ours.head != before:
            updates[BRANCH] = ours.head
        when = int(time.time())
        audit = _append_only(stage, name, "audit chain", "chain/", ours.chain,
                             theirs.get(AUDIT_REF), ours.files["audit"], writer)
        llm = _append_only(stage, name, "LLM ledger", "calls/", ours.ledger,
                           theirs.get(LLM_REF), ours.files["llm"], writer)
        meta_files = {path: stage.write(b"blob", file.read_bytes())
                      for path, file in ours.files["meta"].items()}
        message = f"kernos push\n\n{pusher_trailers(config)}"
        for ref, files in ((AUDIT_REF, audit), (LLM_REF, llm)):
            parent, tree = theirs.get(ref), stage.tree(files)
            if parent is None or stage.tree_of(parent) != tree:
                updates[ref] = stage.commit(tree, parent, message, when)
        parent, tree = theirs.get(META_REF), stage.tree(meta_files)
        if updates or parent is None or stage.tree_of(parent) != tree:
            # Moved with every push: its message names the last writer.
            updates[META_REF] = stage.commit(tree, parent, message, when)
        if updates:
            push_refs(stage, url, name, updates, leases, seen=theirs.get(META_REF),
                      meta_ref=META_REF)
            stage.tidy()
        return PushResult(remote=name, head=(ours.head or before or b"").hex() or None,
                          before=before.hex() if before else None,
                          records=len(ours.chain), updated=tuple(sorted(updates)),
                          prunes=tuple(p.index for p in since.prunes.prunings) if since else ())


def _diverged_message(name: str, writer: str, *, behind: bool) -> str:
    if behind:
        return (f"The remote {name} has snapshots this workspace lacks (pushed by {writer}), "
                f"and this workspace has none it lacks: run `kernos pull {name}` (with the "
                "kernel stopped), then push.")
    return (f"Refused: pushing would fork the history. The remote {name} was extended by "
            f"{writer}, and this workspace has committed other ops since their common "
            "snapshot (the remote's audit chain is not a prefix of this workspace's): both "
            "moved, and one workspace has one writer. Keep one side: `kernos clone` the "
            "remote into a new workspace and work there (`kernos fork` this one first to keep "
            "its ops as a workspace of their own), or push this one to a new remote.")


def _shared_records(stage: Staging, lines: list[bytes], remote: bytes | None) -> int | None:
    """How many records the remote's audit chain holds, if it is a prefix of ``lines``
    (None: it is not)."""
    if remote is None:
        return 0
    count, differs = _remote_prefix(stage, "chain/", lines,
                                    stage.tree_files(stage.tree_of(remote)))
    return None if differs is not None else count


def _remote_prefix(stage: Staging, prefix: str, lines: list[bytes],
                   theirs: Mapping[str, bytes]) -> tuple[int, int | None]:
    """(the lines the remote's store holds, the first of its segments that is not ours:
    None when the remote's lines are a prefix of ``lines``)."""
    ours = _segments(lines)
    their_segments = sorted(path for path in theirs if path.startswith(prefix))
    count = 0
    for index, path in enumerate(their_segments):
        last = index == len(their_segments) - 1
        if index < len(ours) and stage.write(b"blob", ours[index]) == theirs[path]:
            count += ours[index].count(b"\n")
            continue
        if last and index < len(ours):
            data = stage.cat(theirs[path])
            if ours[index].startswith(data):
                count += data.count(b"\n")
                continue
        return count, index
    return count, None


def _append_only(stage: Staging, name: str, what: str, prefix: str, lines: list[bytes],
                 remote: bytes | None, files: Mapping[str, Path], writer: str
                 ) -> dict[str, bytes]:
    """The tree files of one append-only store; refused unless it extends the remote's."""
    segments = [stage.write(b"blob", data) for data in _segments(lines)]
    tree = {prefix + _segment_name(index): sha for index, sha in enumerate(segments)}
    if remote is not None:
        theirs = stage.tree_files(stage.tree_of(remote))
        _count, differs = _remote_prefix(stage, prefix, lines, theirs)
        if differs is not None:
            raise RemoteDiverged(
                f"Refused: the {what} on the remote {name} is not a prefix of this "
                f"workspace's (segment {differs} differs): {writer} appended to it, or "
                "this workspace's was rewritten (a fork has a chain of its own). The "
                "remote's stays append-only; keep one side: `kernos clone` the remote "
                "into a new workspace, or push this one to a new remote.",
                remote=name, writer=writer)
        for path, sha in theirs.items():  # payloads only ever accumulate on the remote
            if not path.startswith(prefix):
                tree.setdefault(path, sha)
    for path, file in files.items():
        if path not in tree:
            tree[path] = stage.write(b"blob", file.read_bytes())
    return tree


# -- pull and clone -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PullResult:
    """What one pull (or clone) did."""

    remote: str
    head: str | None
    """The workspace's head now."""
    before: str | None
    """Its head before."""
    records: int
    """Audit records appended."""
    files: int
    """Payload and LLM files written."""
    prunes: tuple[int, ...] = ()
    """The remote's prune records that let the head move from ``before``, which the remote's
    main does not contain (empty: a fast-forward)."""
    dropped: int = 0
    """The commits deleted here (with what only they reach): those the prunes deleted, and
    the old ids of those they renamed."""
    signers: tuple[tuple[str, int], ...] = ()
    """(key id, records it signed) of the records appended."""
    unsigned: int = 0
    """Records appended without a signature (accepted by the human)."""
    untrusted: tuple[str, ...] = ()
    """A clone: the signers it does not trust yet (nothing in it is restored until it does:
    ``kernos remote trust``)."""
    unsigned_pending: int = 0
    """A clone: unsigned records not accepted yet (the same)."""

    def to_json(self) -> dict[str, object]:
        return {"remote": self.remote, "head": self.head, "before": self.before,
                "records": self.records, "files": self.files, "prunes": list(self.prunes),
                "dropped": self.dropped,
                "signers": [{"key": key, "records": count} for key, count in self.signers],
                "unsigned": self.unsigned, "untrusted": list(self.untrusted),
                "unsigned_pending": self.unsigned_pending}


def pull(workspace: str | os.PathLike[str], name: str = "origin", *,
         accept_unsigned: bool = False) -> PullResult:
    """Bring the workspace up to its remote ``name``: a fast-forward, or over the remote's
    prunes, all or nothing (:mod:`kernos.remote.pull`).  The workspace lock is taken:
    a running kernel makes this fail with ``WorkspaceLocked``.  ``accept_unsigned``: take
    the remote's unsigned records (from a Kernos before signing) this once."""
    root = Path(workspace).expanduser().absolute()
    config = RemoteConfig.load(root)
    url = config.url(name)
    with Workspace.open(root, create=False, purpose="kernos pull") as local:
        trust = Trust.load(root, own=load_identity(root).own)
        if trust.untrusted is not None:
            raise RemoteRefused(
                f"Refused: this workspace is a clone whose writers are not trusted yet (see "
                f"`kernos remote trust -w {root}`); trust them before pulling more of their "
                "records. Nothing was changed here.", remote=name)
        return _take(local, name, url, trust=trust, accept_unsigned=accept_unsigned)


def _take(local: Workspace, name: str, url: str, *, trust: Trust, accept_unsigned: bool,
          clone: bool = False,
          confirm: Callable[[Sequence[str], int], bool] | None = None) -> PullResult:
    """Fetch, check and land (see :mod:`kernos.remote.pull`)."""
    root = local.path
    quarantine = Quarantine(root)
    quarantine.create()
    head = local.head()
    try:
        incoming = take(root, quarantine, url=url, name=name, head=head, trust=trust,
                        accept_unsigned=accept_unsigned or clone, clone=clone,
                        awaiting=(lambda signers: [key for key in signers
                                                   if not trust.trusts(key)])
                        if clone else None)
        quarantine.close()
        pending = list((trust.untrusted or {}).get("signers") or [])
        unsigned = 0 if accept_unsigned else incoming.unsigned
        if clone and (pending or unsigned):
            if confirm is not None and confirm(pending, unsigned):
                for key in pending:
                    trust.add(key, how="clone", note=f"trusted at the first clone of {url}")
            else:
                trust.mark_untrusted(url=url, signers=pending, unsigned=unsigned)
        if not clone and not incoming.changes:
            quarantine.discard()
            return PullResult(remote=name, head=_hex(head), before=_hex(head), records=0,
                              files=0)
        stage(local, incoming, trust=trust.document() if clone else None,
              remote=(name, url) if clone else None)
    except BaseException:
        quarantine.discard()
        raise
    landed = land(local)
    untrusted = (trust.untrusted or {}) if clone else {}
    return PullResult(remote=name, head=_hex(incoming.new_head), before=_hex(head),
                      records=incoming.records, files=len(incoming.files),
                      prunes=tuple(p.index for p in incoming.prunes.prunes.prunings)
                      if incoming.prunes else (), dropped=landed.dropped,
                      signers=tuple(sorted(incoming.signers.items())),
                      unsigned=incoming.unsigned if not untrusted.get("unsigned") else 0,
                      untrusted=tuple(untrusted.get("signers") or ()),
                      unsigned_pending=int(untrusted.get("unsigned") or 0))


def _hex(sha: bytes | None) -> str | None:
    return None if sha is None else sha.hex()


def clone(url: str, destination: str | os.PathLike[str], *, name: str = "origin",
          trust: Sequence[str] = (), accept_unsigned: bool = False,
          confirm: Callable[[Sequence[str], int], bool] | None = None) -> PullResult:
    """A new workspace at ``destination`` (absent or empty) from the remote at ``url``.

    Everything is checked as a pull checks it.  Its records' signers are trusted when
    ``trust`` names them (or they are this machine's own, or ``$KERNOS_TRUST`` names
    them), or when ``confirm(signers, unsigned)`` says so (the CLI asks the human on a
    terminal); otherwise the clone is left untrusted: nothing in it is restored until
    ``kernos remote trust`` (:mod:`kernos.store.trust`).
    """
    root = Path(destination).expanduser().absolute()
    url = absolute_url(url)
    keys = [check_key_id(key) for key in trust]
    if root.exists() and any(root.iterdir()):
        raise UsageError(f"{root} exists and is not empty; clone into a new directory")
    remote = ls_remote(url, [BRANCH, META_REF])
    if META_REF not in remote:
        raise RemoteError(f"{url} holds no Kernos workspace (it has no {META_REF}); push one "
                          "to it first with `kernos push`", remote=name)
    created = not root.exists()
    try:
        with Workspace.open(root, create=True, purpose="kernos clone") as local:
            trusted = Trust.load(root, own=load_identity(root).own)
            for key in keys:
                trusted.add(key, how="clone", note=f"--trust at the clone of {url}")
            return _take(local, name, url, trust=trusted, accept_unsigned=accept_unsigned,
                         clone=True, confirm=confirm)
    except BaseException:
        if created:
            shutil.rmtree(root, ignore_errors=True)
        else:
            for child in root.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def materialize(workspace: str | os.PathLike[str], url: str, *, name: str = "origin"
                ) -> PullResult | None:
    """Clone ``url`` into ``workspace`` unless it is a workspace already, or the remote holds
    none yet (a new workspace's first kernel: it pushes there); None when nothing was done.

    For a kernel starting on a fresh machine; call it before the kernel opens the workspace.
    """
    root = Path(workspace).expanduser().absolute()
    if (root / "workspace.json").exists():
        return None
    local = local_path(absolute_url(url))
    if (local is not None and not local.exists()) or META_REF not in ls_remote(url, [META_REF]):
        return None
    return clone(url, root, name=name)
