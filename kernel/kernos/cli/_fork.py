"""``kernos fork SRC[@REF] DST``: a new workspace from any snapshot of another (``kernos.fork``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernos.cli._common import Exit, emit_json
from kernos.errors import KernosError

__all__ = ["add_fork", "fork"]


def add_fork(add: object) -> None:
    """The ``fork`` subcommand (``add`` is the parser's ``add``)."""
    fork_parser = add(  # type: ignore[operator]
        "fork", "make a new workspace from a snapshot of another, sharing its objects",
        "json",
        description="Make the workspace DST from snapshot REF of SRC (default HEAD). DST "
                    "shares SRC's objects by hard links (SRC's gc, prune or deletion never "
                    "takes them from DST), gets its own audit chain whose first record names "
                    "SRC, REF and SRC's audit head, and the LLM recordings, the ledger up to "
                    "REF, the keys and the settings. SRC is only read: a kernel may run on "
                    "it. DST is a name, made beside SRC (as the inspector's Fork does), or "
                    "a path with a '/' (./DST for the current directory). Open the fork "
                    "with KERNOS_WORKSPACE=DST, or `kernos ... -w DST`.")
    fork_parser.add_argument("source", metavar="SRC[@REF]",
                             help="the source workspace (a name, as `kernos workspaces` lists "
                                  "them, or a path), with @REF a commit (or prefix), HEAD, "
                                  "HEAD~N or @N for op N (e.g. ws@@3, ws@HEAD~2)")
    fork_parser.add_argument("dest", metavar="DST",
                             help="the new workspace (new, or an empty directory): a name is "
                                  "made beside SRC, a path with a '/' where it says")


def fork(args: argparse.Namespace) -> int:
    from kernos.fork import fork as make_fork
    from kernos.fork import split_source
    from kernos.store.catalog import find_workspace

    source, ref = split_source(args.source)
    made = make_fork(find_workspace(source), args.dest, ref)
    if args.json:
        emit_json(made.to_json())
    else:
        shared = f"{made.linked} object files shared by hard link"
        if made.copied:
            shared += f", {made.copied} copied (another filesystem)"
        print(f"kernos fork: {made.dest} starts at {made.commit[:12]} (op {made.op}) of "
              f"{made.source}; {shared}\n"
              f"audit genesis {made.genesis[:16]} names the source's record "
              f"{made.forked_from['audit']['index']}\n"
              f"open it with: KERNOS_WORKSPACE={made.dest} jupyter lab (or any kernel); "
              f"the CLI reads it with -w {_name_or_path(made.dest)}\n"
              "keys were copied: erasing a subject in one workspace leaves it in the other")
    return Exit.OK


def _name_or_path(dest: str) -> str:
    """How ``-w`` names the fork: its name when that finds it, else its path."""
    from kernos.store.catalog import find_workspace

    name = Path(dest).name
    try:
        return name if find_workspace(name).absolute() == Path(dest) else dest
    except KernosError:
        return dest
