"""A checkout without a kernel: an op that the CLI runs on a workspace directory alone.

:func:`checkout_offline` records a new snapshot equal to an older one, as
``%kernos checkout`` does in a kernel, and writes its audit record first, so
it has an op's crash semantics: the record, then the commit point (the
branch moving).  It reuses the snapshot writer and copies the older
snapshot's trees (its tracked files' too: the next kernel's restore at open
puts them on disk); no value is unpickled.
"""

from __future__ import annotations

from kernos._time import utc_now
from kernos.audit import open_audit
from kernos.errors import UsageError
from kernos.store.snapshots import ChunkCache, SnapshotWriter, commit_message, read_snapshot
from kernos.store.workspace import Workspace

__all__ = ["checkout_offline"]


def checkout_offline(workspace: Workspace, ref: str, *, principal: str = "human") -> str:
    """Record a new snapshot equal to ``ref``, without a kernel.  Returns the commit id."""
    if not workspace.writable:
        raise UsageError("checkout needs the workspace opened writable (it takes the lock)")
    log = open_audit(workspace)
    target = workspace.resolve(ref)
    head = workspace.head()
    assert head is not None
    current = read_snapshot(workspace, head)
    snapshot = read_snapshot(workspace, target)
    op = max(int(current.manifest.get("op", 0)), log.last_op) + 1
    started = utc_now()
    old_names = current.manifest.get("names", {})
    names = {}
    changed = []
    for name, meta in snapshot.manifest.get("names", {}).items():
        previous = old_names.get(name)
        if previous is not None and previous["hash"] == meta["hash"]:
            names[name] = {**previous, "group": meta["group"]}
            continue
        changed.append(name)
        version = previous["version"] + 1 if previous else 1
        names[name] = {**meta, "version": version, "op": op, "principal": principal}
    deleted = sorted(old_names.keys() - names.keys())
    manifest = {
        "format": 1, "op": op, "principal": principal, "kind": "checkout",
        "note": f"checkout {target.hex()[:12]}", "committed_at": utc_now(),
        "changes": {"added": sorted(n for n in changed if n not in old_names),
                    "changed": sorted(n for n in changed if n in old_names),
                    "deleted": deleted},
        "names": names,
        "facts": {"audit": log.binding()},
    }
    with SnapshotWriter(workspace, ChunkCache()) as writer:  # discards what it wrote on error
        commit = writer.commit(
            namespace_tree=snapshot.namespace_tree, manifest=manifest, source=None, parent=head,
            # Its tracked files too: the next kernel to open puts them on disk.
            files_tree=snapshot.files_tree,
            message=commit_message(op=op, principal=principal, kind="checkout",
                                   headline=f"checkout {target.hex()[:12]}"),
            author=f"{principal} <{principal}@kernos.invalid>",
        )
        # As for every op: the record first, then the commit point.
        log.append({"type": "op", "op": op, "kind": "checkout", "principal": principal,
                    "status": "committed", "error": None, "code": None,
                    "grants": {"used": [], "denied": []}, "changes": manifest["changes"],
                    "events": [], "attempted_events": 0, "effects": [],
                    "commit": commit.hex(), "started_at": started, "finished_at": utc_now(),
                    "note": f"offline checkout of {target.hex()[:12]}"})
        writer.publish(commit)
    return commit.hex()
