"""``kernos remote|push|pull|clone``: a workspace through git remotes (``kernos.store.remote``).

A refused push or pull (another writer moved the remote, or holds its lease)
exits 3, a conflict, with the writer named; everything else follows the
other subcommands.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kernos.cli._common import Exit, Fail, emit_json
from kernos.errors import RemoteDiverged, RemoteLeaseHeld

if TYPE_CHECKING:
    from kernos.cli._parser import _Add

__all__ = ["add_arguments", "dispatch"]


def add_arguments(add: _Add) -> None:
    """The subcommands' parsers (called by ``kernos.cli._parser``)."""
    remote = add("remote", "the workspace's git remotes: add, list, remove, release",
                 description="The git remotes a workspace is pushed to and pulled from "
                             "(recorded in <workspace>/remotes.json).")
    sub = remote.add_subparsers(dest="remote_command", required=True, metavar="SUBCOMMAND",
                                parser_class=type(remote))
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--workspace", "-w", metavar="DIR",
                        help="the workspace directory (default: $KERNOS_WORKSPACE, else the "
                             "default one)")
    shared.add_argument("--json", action="store_true", help="print JSON on stdout, for machines")
    added = sub.add_parser("add", parents=[shared], help="record a remote (a bare repository "
                           "path, ssh:// or https:// URL)")
    added.add_argument("name")
    added.add_argument("url")
    added.add_argument("--lease", action="store_true",
                       help="a kernel started with KERNOS_REMOTE=NAME takes the remote's "
                            "writer lease (one writer across machines)")
    sub.add_parser("list", parents=[shared], help="the recorded remotes")
    removed = sub.add_parser("remove", parents=[shared], help="forget a remote (the remote "
                             "itself is untouched)")
    removed.add_argument("name")
    release = sub.add_parser("release", parents=[shared],
                             help="give back this workspace's writer lease on the remote")
    release.add_argument("name")
    release.add_argument("--force", action="store_true",
                         help="delete the lease whoever holds it (only when that writer is "
                              "known to be gone)")
    pushed = add("push", "push the history, audit chain and LLM recordings to a remote "
                 "(fast-forward only, or over a `kernos prune` the audit chain records; works "
                 "beside a running kernel)", "workspace", "json")
    pushed.add_argument("name", nargs="?", default="origin", help="the remote (default origin)")
    pulled = add("pull", "fast-forward the workspace to a remote, or follow the remote's "
                 "`kernos prune` when this copy has no op it lacks (the kernel must be stopped)",
                 "workspace", "json")
    pulled.add_argument("name", nargs="?", default="origin", help="the remote (default origin)")
    cloned = add("clone", "a new workspace from a remote: history, audit chain, LLM "
                 "recordings", "json")
    cloned.add_argument("url")
    cloned.add_argument("directory", metavar="DIR")


def dispatch(args: argparse.Namespace, path: Path) -> int:
    try:
        return _dispatch(args, path)
    except (RemoteDiverged, RemoteLeaseHeld) as error:
        raise Fail(str(error), Exit.CONFLICT,
                   kind="remote_diverged" if isinstance(error, RemoteDiverged)
                   else "remote_leased") from None


def _dispatch(args: argparse.Namespace, path: Path) -> int:
    from kernos.store import remote

    if args.command == "push":
        result = remote.push(path, args.name)
        _report(args, result.to_json(), f"Pushed to {args.name}: head {_short(result.head)}"
                + (f" (was {_short(result.before)})" if result.before != result.head else
                   " (already there)") + f", {result.records} audit records."
                + (f" The remote's main moved over the prune (audit record "
                   f"{_indices(result.prunes)}) by compare-and-swap." if result.prunes else ""))
        return Exit.OK
    if args.command == "pull":
        pulled = remote.pull(path, args.name)
        _report(args, pulled.to_json(), f"Pulled from {args.name}: head {_short(pulled.head)}"
                + (f" (was {_short(pulled.before)})" if pulled.before != pulled.head else
                   " (up to date)") + f", {pulled.records} audit records added."
                + (f" Followed the remote's prune (audit record {_indices(pulled.prunes)}): "
                   f"{pulled.dropped} pruned snapshots deleted here." if pulled.prunes else ""))
        return Exit.OK
    if args.command == "clone":
        cloned = remote.clone(args.url, args.directory)
        _report(args, {**cloned.to_json(), "workspace": str(Path(args.directory).absolute())},
                f"Cloned {args.url} into {args.directory}: head {_short(cloned.head)}, "
                f"{cloned.records} audit records.")
        return Exit.OK
    return _remote(args, path)


def _remote(args: argparse.Namespace, path: Path) -> int:
    from kernos.store.remote import RemoteConfig
    from kernos.store.remote_lease import release_lease

    if not (path / "workspace.json").exists():
        raise Fail(f"{path} is not a Kernos workspace (no workspace.json); check --workspace")
    config = RemoteConfig.load(path)
    command = args.remote_command
    if command == "add":
        config.add(args.name, args.url, lease=args.lease)
        _report(args, {"name": args.name, **config.remotes[args.name]},
                f"Added the remote {args.name}: {config.url(args.name)}")
    elif command == "list":
        remotes = [{"name": name, **entry} for name, entry in sorted(config.remotes.items())]
        if args.json:
            emit_json({"id": config.id, "remotes": remotes})
        else:
            for entry in remotes:
                print(f"{entry['name']}\t{entry['url']}" + ("\t(lease)" if entry["lease"] else ""))
    elif command == "remove":
        config.remove(args.name)
        _report(args, {"name": args.name}, f"Removed the remote {args.name}.")
    else:
        holder = release_lease(path, args.name, force=args.force)
        _report(args, {"name": args.name, "released": holder.to_json() if holder else None},
                f"Released the lease on {args.name} held by {holder.describe()}." if holder
                else f"The remote {args.name} had no lease.")
    return Exit.OK


def _indices(prunes: tuple[int, ...]) -> str:
    return ", ".join(str(index) for index in prunes)


def _report(args: argparse.Namespace, document: dict[str, object], text: str) -> None:
    if args.json:
        emit_json(document)
    else:
        print(text)


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "(empty)"
