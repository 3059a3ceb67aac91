"""``kernos agent policy|circuit|reset``: the circuit breakers, from the command line.

Each one goes through the kernel (the policies live in its image, the
circuits in its supervisor): the one running on the workspace, or one started
for the command (``--no-start`` refuses instead).  ``policy`` with figures and
``reset`` are ops by the human (see ``kernos.agents.supervisor``)::

    kernos agent policy alice --failures 3 --repeats 5    # set (merge); prints the effective one
    kernos agent policy alice --repeats none              # lift one figure
    kernos agent policy alice                             # show
    kernos agent circuit [alice]                          # why it is open, or "closed"
    kernos agent reset alice [--restore]                  # close it (back to the safe checkpoint)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kernos import history
from kernos.cli._common import Exit, emit_json
from kernos.cli._kernel import call, session
from kernos.cli._progress import Progress

__all__ = ["COMMANDS", "add_arguments", "dispatch"]

COMMANDS = ("policy", "circuit", "reset")
FIGURES = ("failures", "repeats", "iterations", "wall_seconds", "tokens_per_minute",
           "micro_usd_per_minute")


def _figure(text: str) -> int | None:
    """A positive int, or ``none`` (no limit)."""
    if text.lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (or 'none' to lift "
                                         "the limit)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive; give 1 or more, or 'none'")
    return value


def add_arguments(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``policy``, ``circuit`` and ``reset`` to the ``agent`` group's subparsers."""
    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(
            name, help=help_text, parents=parents,
            description=help_text[0].upper() + help_text[1:] + ", through the kernel (one is "
            "started for the command if none runs on the workspace).")
        return parser

    policy = add("policy", "show or set an agent's circuit-breaker policy")
    policy.add_argument("agent", metavar="NAME", help="the agent")
    for figure in FIGURES:
        policy.add_argument(f"--{figure.replace('_', '-')}", dest=figure, type=_figure,
                            default=argparse.SUPPRESS, metavar="N",
                            help=f"{figure} (a positive int, or 'none' to lift it)")
    safe = policy.add_mutually_exclusive_group()
    safe.add_argument("--restore-safe", dest="restore_safe", action="store_true",
                      default=argparse.SUPPRESS,
                      help="a reset puts the namespace back to its safe checkpoint")
    safe.add_argument("--no-restore-safe", dest="restore_safe", action="store_false",
                      default=argparse.SUPPRESS, help="a reset keeps the namespace")

    circuit = add("circuit", "show why an agent's circuit is open (every agent's, without NAME)")
    circuit.add_argument("agent", metavar="NAME", nargs="?", help="the agent (default: all)")

    reset = add("reset", "close an agent's circuit (the human only)")
    reset.add_argument("agent", metavar="NAME", help="the agent")
    reset.add_argument("--restore", action="store_true", default=None,
                       help="also put its namespace back to its checkpoint tagged safe")


def dispatch(args: argparse.Namespace, path: Path, progress: Progress) -> int:
    with session(path, start=not args.no_start, progress=progress,
                 gateway=args.gateway) as (client, _):
        if args.agent_command == "policy":
            figures = {name: getattr(args, name) for name in (*FIGURES, "restore_safe")
                       if hasattr(args, name)}
            result = call(client.request, "policy", agent=args.agent, set=figures or None)
        elif args.agent_command == "circuit":
            result = call(client.request, "circuit", agent=args.agent)
        else:
            result = call(client.request, "reset", agent=args.agent, restore=args.restore)
        progress.close()
    if args.json:
        emit_json(result)
    elif args.agent_command == "policy":
        _print_policy(result)
    elif args.agent_command == "circuit":
        _print_circuits(result["circuits"], result.get("safe") or {})
    else:
        was = result.get("was_open")
        restored = result.get("restored_from")
        print(f"{result['agent']}: circuit closed"
              + (f" (it was open: {was})" if was else " (it was not open)")
              + (f"; namespace restored from op {restored}" if restored is not None else "")
              + f"; op {result.get('op')}.")
    return Exit.OK


def _print_policy(result: dict[str, Any]) -> None:
    policy = result.get("policy") or {}
    own = result.get("own") or {}
    if not policy:
        print(f"{result['agent']} has no circuit-breaker policy (it is not supervised).")
        return
    rows = [("figure", "effective", "own")]
    rows += [(name, str(value), str(own.get(name, "-"))) for name, value in policy.items()]
    print(history.format_table(rows))
    if "op" in result:
        print(f"Set in op {result['op']}.")


def _print_circuits(circuits: dict[str, Any], safe: dict[str, Any]) -> None:
    if not circuits:
        print("No agents.")
        return
    for agent, trip in circuits.items():
        point = safe.get(agent)
        restore = (f"; safe checkpoint: op {point} (reset --restore goes back to it)"
                   if point is not None else "; no safe checkpoint")
        if trip is None:
            print(f"{agent}: closed{restore}")
        else:
            print(f"{agent}: OPEN since op {trip['op']} ({trip['policy']}): "
                  f"{trip['message']}{restore}")
