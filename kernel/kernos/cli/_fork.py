"""``kernos fork SRC[@REF] DST``: a new workspace from any snapshot of another (``kernos.fork``)."""

from __future__ import annotations

import argparse

from kernos.cli._common import Exit, emit_json

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
                    "it. Open the fork with KERNOS_WORKSPACE=DST.")
    fork_parser.add_argument("source", metavar="SRC[@REF]",
                             help="the source workspace, with @REF a commit (or prefix), "
                                  "HEAD, HEAD~N or @N for op N (e.g. ws@@3, ws@HEAD~2)")
    fork_parser.add_argument("dest", metavar="DST", help="the new workspace's directory "
                                                          "(new, or empty)")


def fork(args: argparse.Namespace) -> int:
    from kernos.fork import fork as make_fork
    from kernos.fork import split_source

    source, ref = split_source(args.source)
    made = make_fork(source, args.dest, ref)
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
              f"open it with: KERNOS_WORKSPACE={made.dest} jupyter lab (or any kernel)\n"
              "keys were copied: erasing a subject in one workspace leaves it in the other")
    return Exit.OK
