"""``kernos memory recall|rebuild|stats``: the workspace's searchable memory, through a kernel.

The kernel owns the memory index (``kernos.memory``), so every subcommand goes
through the running kernel (or one started for the command, as ``grants``
does; ``--no-start`` refuses instead, exit 4).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernos.cli._common import Exit, emit_json
from kernos.cli._progress import Progress

__all__ = ["add_memory", "memory"]


def add_memory(add: Any, parents: Mapping[str, argparse.ArgumentParser]) -> None:
    """The ``memory`` subcommand and its three commands (``add`` is build_parser's)."""
    from kernos.cli._argtypes import exit_statuses

    memory = add("memory", "search the agents' memory, or rebuild or describe its index",
                 description="Search the memory (past ops, stored facts, names) as the human "
                             "or as an agent (what its grants let it recall), or rebuild or "
                             "describe the index, through the running kernel (one is started "
                             "for this command if none runs).")
    commands = memory.add_subparsers(dest="memory_command", required=True,
                                     metavar="SUBCOMMAND", parser_class=type(memory))
    uses = [parents[use] for use in ("workspace", "json", "progress", "start")]

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        made: argparse.ArgumentParser = commands.add_parser(
            name, help=help_text, parents=uses, epilog=exit_statuses("memory"),
            description=help_text[0].upper() + help_text[1:] + ".",
            formatter_class=argparse.RawDescriptionHelpFormatter)
        return made

    recall = command("recall", "the memories best matching QUERY, best first")
    recall.add_argument("query", metavar="QUERY", help="words to look for")
    recall.add_argument("--as", dest="as_", metavar="NAME",
                        help="as this agent: only what it may recall (default: the human)")
    recall.add_argument("--kinds", metavar="KINDS",
                        help="comma-separated layers: working, episodic, semantic")
    recall.add_argument("-k", type=int, default=5, metavar="N", help="at most N (default 5)")
    command("rebuild", "rebuild the index from the audit chain and the image")
    command("stats", "the index: entries per kind, the chain head indexed, its file")


def memory(args: argparse.Namespace, path: Path, progress: Progress) -> int:
    from kernos.cli._kernel import call, session

    with session(path, start=not args.no_start, progress=progress,
                 gateway=args.gateway) as (client, _):
        if args.memory_command == "recall":
            kinds = None if args.kinds is None else [
                kind.strip() for kind in args.kinds.split(",") if kind.strip()]
            found: Any = call(client.recall, args.query, principal=args.as_, k=args.k,
                              kinds=kinds)
        else:
            found = call(client.request, "memory", command=args.memory_command)
        progress.close()
    if args.json:
        emit_json({"memories": found} if args.memory_command == "recall" else found)
        return Exit.OK
    if args.memory_command == "recall":
        if not found:
            print("Nothing recalled.")
        for memory in found:
            text = " ".join(str(memory.get("text", "")).split())
            print(f"[{memory.get('kind')}] {memory.get('title')} ({memory.get('principal')})"
                  f": {text[:200]}")
        return Exit.OK
    entries = found.get("entries") or {}
    what = ", ".join(f"{int(entries.get(kind, 0))} {kind}"
                     for kind in ("working", "episodic", "semantic"))
    built = found.get("built_to") or {}
    done = "Rebuilt" if args.memory_command == "rebuild" else "Index"
    print(f"{done} {found.get('path')}: entries {what}; built to audit record {built.get('index')} "
          f"({int(found.get('bytes') or 0):,} bytes)")
    return Exit.OK
