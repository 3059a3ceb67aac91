"""``kernos agent loop|pause|resume|stop|loops``: agents' loops, through a kernel.

The harness action ``loop`` (``kernos.harness.protocol``) does the work; a
loop turns only while a kernel runs on the workspace.  A kernel started for
one command (none was running) is shut down after it, so the loop waits for
the next kernel, which resumes it, unless ``--follow`` keeps that kernel (and
this command) alive until the loop ends.

What a step prints is agent text: before it reaches the terminal, every
control character but newline and tab is shown as ``\\xNN`` (so it cannot
move the cursor, retitle the window or hide a line).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernos.cli._argtypes import count
from kernos.cli._common import Exit, Fail, emit_json
from kernos.cli._kernel import call, session
from kernos.cli._progress import Progress

__all__ = ["COMMANDS", "add_arguments", "dispatch"]

COMMANDS = ("loop", "pause", "resume", "stop", "loops")


def add_arguments(commands: Any, parents: Mapping[str, argparse.ArgumentParser],
                  epilog: str) -> None:
    """The loop's subcommands of ``kernos agent``."""
    def add(name: str, help_text: str, description: str) -> argparse.ArgumentParser:
        return commands.add_parser(  # type: ignore[no-any-return]
            name, help=help_text, description=description, epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[parents[use] for use in ("workspace", "json", "progress", "start")])

    start = add("loop", "start an agent's loop (or show it, without a step)",
                "Start NAME's loop: STEP (agent code) runs as NAME once per op, in the "
                "kernel, between cells and requests, until --max iterations committed or the "
                "step calls loop_finish(). Without --step or -c, show NAME's loop. A kernel "
                "started for this command (none was running) is shut down after it, and the "
                "loop waits for the next kernel, unless --follow keeps it running.")
    start.add_argument("agent", metavar="NAME", help="the agent (kernos run or agents.add)")
    source = start.add_mutually_exclusive_group()
    source.add_argument("--step", metavar="FILE", help="the step's agent code, from FILE "
                                                       "(- reads stdin)")
    source.add_argument("-c", dest="code", metavar="CODE", help="the step's agent code")
    start.add_argument("--every", type=count, default=0, metavar="MS",
                       help="milliseconds between two iterations (default 0)")
    start.add_argument("--max", type=_positive, metavar="N",
                       help="finish once N iterations committed (default: no end)")
    start.add_argument("--follow", action="store_true",
                       help="print each committed iteration until the loop finishes or "
                            "stops (Ctrl-C ends the command, not the loop)")
    for name, verb in (("pause", "pause"), ("resume", "resume"), ("stop", "stop for good")):
        command = add(name, f"{verb} an agent's loop",
                      f"{verb[0].upper()}{verb[1:]} NAME's loop (an op by the human).")
        command.add_argument("agent", metavar="NAME")
        if name == "stop":
            command.add_argument("--reason", help="why (kept with the loop)")
    add("loops", "every agent's loop: status, iteration, plan, pending work",
        "Every agent's loop, from the running kernel (one is started if none runs).")


def _positive(text: str) -> int:
    value = count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("give 1 or more")
    return value


def dispatch(args: argparse.Namespace, path: Path, progress: Progress) -> int:
    command = args.agent_command
    step = _step(args) if command == "loop" else None
    follow = bool(getattr(args, "follow", False))
    with session(path, start=not args.no_start, progress=progress,
                 gateway=args.gateway) as (client, started):
        if command == "loops":
            found = call(client.request, "loop", do="status")["loops"]
            progress.close()
            _print_loops(args, found)
            return Exit.OK
        if command == "loop" and step is None:
            found = call(client.request, "loop", do="status", agent=args.agent)["loops"]
            progress.close()
            if not found:
                raise Fail(f"{args.agent!r} has no loop; start one with kernos agent loop "
                           f"{args.agent} -c CODE (or --step FILE)")
            if not follow:
                _print_loops(args, found)
                return Exit.OK
            # From its last iteration on: one that commits meanwhile is not missed.
            since = found[0]["last_op"] if found[0]["last_op"] is not None else \
                found[0]["started_op"]
            return _follow(args, client, found[0], since_op=since)
        if command == "loop":
            result = call(client.request, "loop", do="start", agent=args.agent, step=step,
                          every_ms=args.every, max_iterations=args.max)
        else:
            do = command
            result = call(client.request, "loop", do=do, agent=args.agent,
                          reason=getattr(args, "reason", None))
        progress.close()
        described = result["loop"]
        if args.json:  # with --follow, the first line of the stream
            emit_json(result)
        elif not args.json:
            print(f"{described['agent']}'s loop is {described['status']} at iteration "
                  f"{described['iteration']} (op {result['op']}).")
            if command == "loop" and started and not follow:
                print("kernos: no kernel was running, so the loop waits for the next one "
                      "(a notebook, or kernos agent loop NAME --follow)", file=sys.stderr)
        if command == "loop" and follow:
            return _follow(args, client, described, since_op=int(result["op"]))
    return Exit.OK


def _step(args: argparse.Namespace) -> str | None:
    if args.code is not None:
        return str(args.code)
    if args.step is None:
        return None
    if args.step == "-":
        return sys.stdin.read()
    try:
        return Path(args.step).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise Fail(f"cannot read --step {args.step}: {error}") from None


def _print_loops(args: argparse.Namespace, found: list[dict[str, Any]]) -> None:
    if args.json:
        emit_json({"loops": found})
        return
    if not found:
        print("No loops.")
        return
    from kernos.history import format_table

    rows = [("agent", "status", "iteration", "max", "every_ms", "pending", "last op",
             "reason", "last output")]
    rows += [(str(loop["agent"]), str(loop["status"]), str(loop["iteration"]),
              "" if loop["max_iterations"] is None else str(loop["max_iterations"]),
              str(loop["every_ms"]), str(loop["pending"]),
              "" if loop["last_op"] is None else str(loop["last_op"]),
              str(loop["reason"] or ""), last_line(loop.get("output"))) for loop in found]
    print(format_table(rows))


LAST_LINE_CHARS = 60
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """Agent text made safe for a terminal: control characters (but newline, tab) as \\xNN."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def last_line(output: object) -> str:
    """The last non-blank line an iteration printed (bounded), for a table cell."""
    if not isinstance(output, dict) or not isinstance(output.get("text"), str):
        return ""
    lines = [line for line in output["text"].splitlines() if line.strip()]
    line = shown(lines[-1].replace("\t", " ")) if lines else ""
    return line if len(line) <= LAST_LINE_CHARS else line[:LAST_LINE_CHARS - 3] + "..."


FINAL = ("finished", "stopped")


def _follow(args: argparse.Namespace, client: Any, described: dict[str, Any], *,
            since_op: int | None) -> int:
    """Print the loop's committed iterations until it ends (or Ctrl-C)."""
    from kernos.cli._kernel import _next_event

    agent = args.agent
    if described["status"] in FINAL:
        _say(args, {"agent": agent, "status": described["status"],
                    "iteration": described["iteration"], "reason": described["reason"]})
        return Exit.OK
    stopping = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _number, _frame: stopping.set())
    try:
        stream = call(client.subscribe, op=since_op, topic=None)
        try:
            while not stopping.is_set():
                try:
                    event = call(_next_event, stream)
                except StopIteration:
                    raise Fail("the kernel went away while following the loop; it resumes "
                               "the loop when it starts again", Exit.NO_KERNEL) from None
                if event is None:
                    continue
                payload = event.get("payload")
                if not isinstance(payload, dict) or payload.get("agent") != agent:
                    continue
                topic = event.get("topic")
                if topic == "kernos.loop.iteration":
                    _say(args, {"agent": agent, "iteration": payload.get("iteration"),
                                "op": payload.get("op"), "status": payload.get("status"),
                                "output": _output_of(client, agent, payload.get("op"))})
                    if payload.get("status") in FINAL:
                        return Exit.OK
                elif topic == "kernos.loop.status":
                    _say(args, {"agent": agent, "status": payload.get("status"),
                                "iteration": payload.get("iteration"),
                                "reason": payload.get("reason")})
                    if payload.get("status") in FINAL:
                        return Exit.OK
                elif topic == "kernos.circuit.open":
                    _say(args, {"agent": agent, "circuit": "open",
                                "message": payload.get("message")})
        finally:
            with contextlib.suppress(Exception):
                stream.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    return Exit.OK


def _output_of(client: Any, agent: str, op: object) -> dict[str, Any] | None:
    """What the iteration committed as ``op`` printed, while the kernel still holds it
    (``{"text": None}`` once it does not: later iterations replaced it)."""
    if type(op) is not int:
        return None
    found = call(client.request, "loop", do="status", agent=agent, since_op=op - 1)["loops"]
    held = [entry for entry in (found[0].get("outputs") or []) if entry.get("op") == op] \
        if found else []
    if not held:
        return {"text": None, "cut": 0}
    return {"text": held[0]["text"], "cut": held[0]["cut"]}


def _say(args: argparse.Namespace, line: dict[str, Any]) -> None:
    if args.json:
        emit_json(line)
        return
    if "circuit" in line:
        print(f"{line['agent']}: circuit open: {shown(str(line['message']))}", flush=True)
    elif "op" in line:
        print(f"{line['agent']}: iteration {line['iteration']} committed (op {line['op']})"
              + (f"; the loop is {line['status']}" if line["status"] != "running" else ""),
              flush=True)
        _print_output(line.get("output"))
    else:
        reason = f" ({shown(str(line['reason']))})" if line.get("reason") else ""
        print(f"{line['agent']}: the loop is {line['status']} at iteration "
              f"{line['iteration']}{reason}", flush=True)


def _print_output(output: dict[str, Any] | None) -> None:
    """An iteration's printed output, indented under its line."""
    if output is None:
        return
    if output["text"] is None:
        print("  (its output is no longer held: later iterations replaced it)", flush=True)
        return
    for text in output["text"].splitlines():
        print("  | " + shown(text), flush=True)
    if output["cut"]:
        print(f"  (cut: {output['cut']} more characters not shown)", flush=True)
