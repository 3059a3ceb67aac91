"""``kernos remote|push|pull|clone``: a workspace through git remotes (``kernos.remote.transfer``).

A refused push or pull (another writer moved the remote, or holds its lease)
exits 3, a conflict, with the writer named.  A pull or clone that refuses what
the remote holds (tampered, unsigned, signed by a key not trusted, planted
paths, oversized or malformed data) exits 2, naming the record, commit or path,
with nothing changed.  ``kernos remote trust`` lists and adds the writer keys a
workspace accepts (``kernos.store.trust``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernos.cli._common import Exit, Fail, emit_json, stderr_is_tty
from kernos.errors import RemoteDiverged, RemoteLeaseHeld, RemoteRefused

if TYPE_CHECKING:
    from kernos.cli._argtypes import _Add

__all__ = ["add_arguments", "dispatch"]


def add_arguments(add: _Add) -> None:
    """The subcommands' parsers (called by ``kernos.cli._parser``)."""
    remote = add("remote", "the workspace's git remotes: add, list, remove, release",
                 description="The git remotes a workspace is pushed to and pulled from "
                             "(recorded in <workspace>/remotes.json).")
    sub = remote.add_subparsers(dest="remote_command", required=True, metavar="SUBCOMMAND",
                                parser_class=type(remote))
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--workspace", "-w", metavar="NAME|PATH",
                        help="the workspace: a name (`kernos workspaces` lists them) or a path "
                             "with a '/' (default: $KERNOS_WORKSPACE, else the default one)")
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
    trusted = sub.add_parser("trust", parents=[shared],
                             help="list the writer keys this workspace accepts records from "
                                  "(its own first), or trust more")
    trusted.add_argument("keys", nargs="*", metavar="KEY",
                         help="a writer's key id (ed25519:...), as `kernos remote trust` "
                              "prints it in that writer's own workspace")
    trusted.add_argument("--accept-unsigned", action="store_true",
                         help="accept the records from before signing that a clone brought")
    untrusted = sub.add_parser("untrust", parents=[shared],
                               help="stop trusting a writer key (records it signed already "
                                    "stay; new ones are refused)")
    untrusted.add_argument("key", metavar="KEY")
    pushed = add("push", "push the history, audit chain and LLM recordings to a remote "
                 "(fast-forward only, or over a `kernos prune` the audit chain records; works "
                 "beside a running kernel)", "workspace", "json")
    pushed.add_argument("name", nargs="?", default="origin", help="the remote (default origin)")
    pulled = add("pull", "fast-forward the workspace to a remote, or follow the remote's "
                 "`kernos prune` when this copy has no op it lacks (the kernel must be stopped)",
                 "workspace", "json")
    pulled.add_argument("name", nargs="?", default="origin", help="the remote (default origin)")
    pulled.add_argument("--accept-unsigned", action="store_true",
                        help="take the remote's unsigned records (written by a Kernos from "
                             "before signing) this once")
    cloned = add("clone", "a new workspace from a remote: history, audit chain, LLM "
                 "recordings; nothing in it is restored until its writers are trusted",
                 "json")
    cloned.add_argument("url")
    cloned.add_argument("directory", metavar="DIR")
    cloned.add_argument("--trust", action="append", default=[], metavar="KEY",
                        help="trust this writer key (repeat for several); a clone whose "
                             "writers are all trusted can be opened at once (on a terminal, "
                             "the clone asks instead)")
    cloned.add_argument("--accept-unsigned", action="store_true",
                        help="accept records from before signing (an older Kernos wrote them)")


def dispatch(args: argparse.Namespace, path: Path) -> int:
    try:
        return _dispatch(args, path)
    except (RemoteDiverged, RemoteLeaseHeld) as error:
        raise Fail(str(error), Exit.CONFLICT,
                   kind="remote_diverged" if isinstance(error, RemoteDiverged)
                   else "remote_leased") from None
    except RemoteRefused as error:
        raise Fail(str(error), Exit.USAGE, kind="remote_refused") from None


def _dispatch(args: argparse.Namespace, path: Path) -> int:
    from kernos.remote import transfer as remote

    if args.command == "push":
        result = remote.push(path, args.name)
        _report(args, result.to_json(), f"Pushed to {args.name}: head {_short(result.head)}"
                + (f" (was {_short(result.before)})" if result.before != result.head else
                   " (already there)") + f", {result.records} audit records."
                + (f" The remote's main moved over the prune (audit record "
                   f"{_indices(result.prunes)}) by compare-and-swap." if result.prunes else ""))
        return Exit.OK
    if args.command == "pull":
        pulled = remote.pull(path, args.name, accept_unsigned=args.accept_unsigned)
        _report(args, pulled.to_json(), f"Pulled from {args.name}: head {_short(pulled.head)}"
                + (f" (was {_short(pulled.before)})" if pulled.before != pulled.head else
                   " (up to date)") + f", {pulled.records} audit records added"
                + (f" (signed by {_signers(pulled.signers)})" if pulled.signers else "") + "."
                + (f" Accepted {pulled.unsigned} unsigned records." if pulled.unsigned else "")
                + (f" Followed the remote's prune (audit record {_indices(pulled.prunes)}): "
                   f"{pulled.dropped} pruned snapshots deleted here." if pulled.prunes else ""))
        return Exit.OK
    if args.command == "clone":
        confirm = _ask if (not args.json and sys.stdin.isatty() and stderr_is_tty()) else None
        cloned = remote.clone(args.url, args.directory, trust=args.trust,
                              accept_unsigned=args.accept_unsigned, confirm=confirm)
        where = str(Path(args.directory).absolute())
        text = (f"Cloned {args.url} into {args.directory}: head {_short(cloned.head)}, "
                f"{cloned.records} audit records"
                + (f", signed by {_signers(cloned.signers)}" if cloned.signers else "") + ".")
        if cloned.untrusted or cloned.unsigned_pending:
            steps = [f"kernos remote trust {key} -w {shlex.quote(where)}"
                     for key in cloned.untrusted]
            if cloned.unsigned_pending:
                steps.append(f"kernos remote trust --accept-unsigned -w {shlex.quote(where)}")
            text += (" Not trusted yet: nothing in it is restored or run until you trust its "
                     "writers. Compare each key with the one `kernos remote trust` prints in "
                     "the writer's own workspace, then: " + "; ".join(steps))
        _report(args, {**cloned.to_json(), "workspace": where}, text)
        return Exit.OK
    return _remote(args, path)


def _remote(args: argparse.Namespace, path: Path) -> int:
    from kernos.remote.lease import release_lease
    from kernos.remote.transfer import RemoteConfig

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
    elif command in ("trust", "untrust"):
        return _trust(args, path)
    else:
        holder = release_lease(path, args.name, force=args.force)
        _report(args, {"name": args.name, "released": holder.to_json() if holder else None},
                f"Released the lease on {args.name} held by {holder.describe()}." if holder
                else f"The remote {args.name} had no lease.")
    return Exit.OK


def _trust(args: argparse.Namespace, path: Path) -> int:
    from kernos.store.identity import load_identity
    from kernos.store.trust import Trust, check_key_id

    identity = load_identity(path)
    trust = Trust.load(path, own=identity.own)
    changed = []
    if args.remote_command == "untrust":
        key = check_key_id(args.key)
        if key in identity.own:
            raise Fail(f"{key} is this workspace's own key: its records are its own; nothing "
                       "was changed")
        if trust.keys.pop(key, None) is None:
            raise Fail(f"{key} is not among the keys this workspace trusts (see `kernos remote "
                       "trust`); nothing was changed")
        changed.append(key)
    else:
        for key in args.keys:
            if trust.add(key, how="human"):
                changed.append(check_key_id(key))
        if args.accept_unsigned and trust.accept_unsigned():
            changed.append("unsigned")
    if changed:
        trust.save()
    keys = [{"key": key, "how": "own", "current": key == identity.key_id}
            for key in identity.own]
    keys += [{"key": key, "how": "env"} for key in trust.pinned if key not in identity.own]
    keys += [{"key": key, **entry} for key, entry in sorted(trust.keys.items())]
    awaiting = trust.untrusted
    if args.json:
        emit_json({"writer": identity.id, "key": identity.key_id, "trusted": keys,
                   "changed": changed, "untrusted": awaiting})
        return Exit.OK
    if changed:
        print(("Stopped trusting " if args.remote_command == "untrust" else "Trusted ")
              + ", ".join(changed) + ".")
    print(f"This workspace signs as {identity.key_id} (writer {identity.id}).")
    print("Trusted writer keys:")
    for entry in keys:
        how = "this workspace's own" + ("" if entry.get("current") else " (before a copy)") \
            if entry["how"] == "own" else str(entry["how"]) + \
            (f": {entry['note']}" if entry.get("note") else "")
        print(f"  {entry['key']}  ({how})")
    if awaiting:
        print(f"Not trusted yet (cloned from {awaiting.get('url')}; nothing is restored until "
              "they are):")
        for key in awaiting.get("signers") or []:
            print(f"  {key}")
        if awaiting.get("unsigned"):
            print(f"  {awaiting['unsigned']} unsigned records (--accept-unsigned)")
    return Exit.OK


def _ask(signers: Sequence[str], unsigned: int) -> bool:
    """On a terminal: show the clone's writers and ask whether to trust them."""
    print("The remote's audit records are signed by:", file=sys.stderr)
    for key in signers:
        print(f"  {key}", file=sys.stderr)
    if unsigned:
        print(f"  and {unsigned} records are unsigned (from a Kernos before signing)",
              file=sys.stderr)
    print("Restoring a snapshot runs code. Trust only keys you have compared with the one "
          "`kernos remote trust` prints in the writer's own workspace.", file=sys.stderr)
    try:
        answer = input("Trust them? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _signers(signers: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{key} ({count})" for key, count in signers)


def _indices(prunes: tuple[int, ...]) -> str:
    return ", ".join(str(index) for index in prunes)


def _report(args: argparse.Namespace, document: dict[str, object], text: str) -> None:
    if args.json:
        emit_json(document)
    else:
        print(text)


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "(empty)"
