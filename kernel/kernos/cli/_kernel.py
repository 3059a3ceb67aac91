"""Subcommands that talk to a kernel through ``kernos.client``: run, objects, grants, events.

A running kernel on the workspace (its ``kernel.json``) is always preferred:
it holds the live image and serializes every op.  When there is none, reads
that the head snapshot answers (``objects``, ``events``) come from disk
without starting one; anything else starts a kernel for the one command
and shuts it down after (``--no-start`` refuses instead, exit 4).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kernos import history
from kernos.cli._common import Exit, Fail, emit_json, name_info, plural, stderr_is_tty
from kernos.cli._progress import Progress
from kernos.errors import KernosError
from kernos.store.snapshots import read_snapshot
from kernos.store.workspace import Workspace

if TYPE_CHECKING:
    from kernos.client import KernosClient
    from kernos.harness.results import OpResult

__all__ = ["call", "connect_if_running", "events", "grants", "objects", "report_op", "run",
           "session"]

T = TypeVar("T")

# An op's status -> the exit status of the command that sent it.
_OP_EXIT = {"committed": Exit.OK, "conflict": Exit.CONFLICT}


def connect_if_running(path: Path, gateway: str | None = None) -> KernosClient | None:
    """A client of the kernel running on ``path``, or None if none runs there.

    Through a ``gateway`` the workspace is remote: the gateway's kernel serving the
    name if one runs, else a kernel started there for this command (closing the
    client shuts it down), since disk reads cannot reach it.
    """
    from kernos.client import KernosClient

    client = _running(path, gateway)
    if client is not None or gateway is None:
        return client
    return call(KernosClient.start, str(path), gateway=gateway)


@contextlib.contextmanager
def session(path: Path, *, start: bool, progress: Progress, gateway: str | None = None
            ) -> Iterator[tuple[KernosClient, bool]]:
    """The running kernel's client, or one started for this command and shut down after;
    and whether it was started here.  ``gateway``: through that Enterprise Gateway, on
    the workspace named ``path`` (the gateway's kernel serving it, or one started there)."""
    from kernos.client import KernosClient

    client = _running(path, gateway)
    if client is not None:
        with client:
            yield client, False
        return
    where = f" through the gateway {gateway}" if gateway else ""
    if not start:
        raise Fail(f"no kernel is running on {path}{where}; drop --no-start to start one for "
                   "this command, or start one (a notebook, or KernosClient.start)",
                   Exit.NO_KERNEL)
    if gateway is not None:
        progress.phase(f"starting a kernel on {path}{where}")
        with call(KernosClient.start, str(path), gateway=gateway) as started:
            yield started, True
        return
    _check_startable(path)
    progress.phase(f"starting a kernel on {path}{_restore_size(path)}")
    with call(KernosClient.start, str(path)) as started:
        yield started, True


def _check_startable(path: Path) -> None:
    """Refuse, before starting anything, a directory a kernel could not use as its workspace."""
    if path.exists() and not path.is_dir():
        raise Fail(f"{path} is a file, not a workspace directory; check the path (or "
                   "KERNOS_WORKSPACE)")
    if path.is_dir() and not (path / "workspace.json").exists() and any(path.iterdir()):
        raise Fail(f"{path} is not a Kernos workspace (it has no workspace.json) and is not "
                   "empty; check the path, or choose a new or empty directory")


def _restore_size(path: Path) -> str:
    """`` (restoring N names, X)`` for the head snapshot a starting kernel loads, or ``""``."""
    try:
        with Workspace.open(path, writable=False, create=False) as workspace:
            head = workspace.head()
            if head is None:
                return ""
            names = read_snapshot(workspace, head).manifest.get("names", {})
    except Exception:  # only a label: the kernel itself reports what is wrong
        return ""
    size = sum(int(meta.get("size", 0)) for meta in names.values())
    return f" (restoring {plural(len(names), 'name')}, {history.human_size(size)})"


def call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call the client, turning what it raises into a one-line :class:`Fail`."""
    from kernos.client.errors import (
        ClientError,
        GatewayError,
        KernelDied,
        NoKernelRunning,
        ProtocolMismatch,
        RequestError,
        RequestTimeout,
    )

    try:
        return function(*args, **kwargs)
    except NoKernelRunning:
        raise
    except GatewayError as error:
        raise Fail(str(error), Exit.NO_KERNEL, kind="gateway") from None
    except RequestError as error:
        raise Fail(error.message, _request_exit(error.kind, error.data),
                   kind=error.kind) from None
    except KernelDied as error:
        raise Fail(str(error), Exit.NO_KERNEL, kind="kernel_died") from None
    except (ProtocolMismatch, RequestTimeout) as error:
        raise Fail(str(error), Exit.NO_KERNEL) from None
    except ClientError as error:
        raise Fail(f"{error} (this is a bug in Kernos: please report it)",
                   Exit.INTERNAL) from None


def _request_exit(kind: str, data: dict[str, Any]) -> Exit:
    """The exit status for a request the kernel refused, by the protocol's error kind."""
    if kind == "denied":
        return Exit.FAILED
    if kind == "precondition" and data.get("missing"):
        return Exit.CONFLICT  # an --expect on a name that no longer exists
    if kind in ("workspace", "protocol"):
        return Exit.NO_KERNEL
    if kind == "internal":
        return Exit.INTERNAL
    return Exit.USAGE


def report_op(args: argparse.Namespace, result: OpResult, *, action: str) -> int:
    """Print an op's result (JSON, or output, value and a line on stderr); its exit status."""
    code = _OP_EXIT.get(result.status, Exit.FAILED)
    if args.json:
        emit_json(result.to_json())
    else:
        if result.output:
            sys.stdout.write(result.output if result.output.endswith("\n")
                             else result.output + "\n")
        if result.value is not None and result.value.repr != "None":  # as IPython shows it
            print(result.value.repr)
        if result.checkout:
            shown = result.checkout
            print(f"Checked out {shown.get('ref')} ({str(shown.get('commit'))[:12]}, op "
                  f"{shown.get('op')}): {shown.get('names')} names, "
                  f"{history.human_size(int(shown.get('bytes') or 0))}, as op {result.op} "
                  f"(commit {str(result.commit)[:12]}); the running kernel has it now.")
        sys.stdout.flush()
    if code is not Exit.OK:
        reason = result.error.message if result.error is not None else "no reason given"
        at = f" (op {result.op})" if result.op is not None else ""
        print(f"kernos {action}: {result.status}{at}: {_one_line(reason)}", file=sys.stderr)
    elif not args.json and (stderr_is_tty() if action != "run" else not args.quiet):
        # `run` always says which op it made (on stderr: stdout is the op's own output);
        # -q keeps it quiet.  A checkout's line on stdout says it already.
        print(f"kernos: {committed_line(result)}", file=sys.stderr)
    return code


def committed_line(result: OpResult) -> str:
    """``op 12 committed (+x ~y), commit 1a2b3c4d5e6f``, or what a duplicate or an op that
    changed nothing is."""
    if result.duplicate:
        return (f"op {result.op} had committed already with this --key (commit "
                f"{str(result.commit)[:12]}): a duplicate, nothing ran")
    changes = " ".join([f"+{name}" for name in result.added if not history.is_internal(name)]
                       + [f"~{name}" for name in result.changed
                          if not history.is_internal(name)]
                       + [f"-{name}" for name in result.deleted
                          if not history.is_internal(name)])
    if len(changes) > 60:
        changes = changes[:57] + "..."
    return (f"op {result.op} committed ({changes or 'no name changed'}), commit "
            f"{str(result.commit)[:12]}")


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


# -- run ---------------------------------------------------------------------------------


def _source(args: argparse.Namespace) -> str | None:
    """The code to run, from exactly one of CODE, -c, --file or - (stdin); None for --tool."""
    given = [name for name, value in (("CODE", args.code), ("-c", args.command_code),
                                      ("--file", args.file), ("--tool", args.tool))
             if value is not None]
    if len(given) != 1:
        raise Fail("give exactly one of CODE, -c CODE, --file FILE, - (read stdin) or "
                   f"--tool NAME{'; got ' + ', '.join(given) if given else ''}")
    if args.arguments is not None and args.tool is None:
        raise Fail("--args goes with --tool NAME (the tool's arguments as a JSON object)")
    if args.tool is not None:
        return None
    if args.file is not None:
        try:
            return Path(args.file).read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise Fail(f"cannot read --file {args.file}: {error}") from None
    code: str = args.code if args.code is not None else args.command_code
    return sys.stdin.read() if code == "-" else code


def _tool_arguments(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise Fail(f"--args is not JSON ({error}); give an object such as "
                   "'{\"amounts\": [1, 2]}'") from None
    if not isinstance(parsed, dict):
        raise Fail(f"--args must be a JSON object, not {type(parsed).__name__}")
    return parsed


def _expectations(pairs: list[str]) -> dict[str, int] | None:
    if not pairs:
        return None
    versions: dict[str, int] = {}
    for pair in pairs:
        name, sep, version = pair.rpartition("=")
        if not sep or not name or not version.isdigit():
            raise Fail(f"--expect {pair!r} is not NAME=VERSION (a version is an int >= 0; 0 "
                       "means the name must not exist yet); `kernos objects` shows versions")
        versions[name] = int(version)
    return versions


def _interrupt_in(client: KernosClient, key: str) -> str:
    """Interrupt the op sent under ``key`` in a running kernel; what became of it."""
    try:
        reply = client.interrupt(key=key, timeout=10)
    except (KernosError, OSError) as error:
        reply = {"interrupted": False, "reason": str(error)}
    if reply.get("interrupted"):
        return f"op {reply.get('op')} was interrupted in the running kernel and rolled back"
    return ("the op was not running when asked to stop (it was waiting its turn, or "
            "committing): it may still commit; `kernos log` shows whether it did")


def run(args: argparse.Namespace, path: Path, progress: Progress) -> int:
    code = _source(args)
    arguments = _tool_arguments(args.arguments)
    expect = _expectations(args.expect)
    # Ctrl-C interrupts this op in a shared kernel by its key (one is made if none is given).
    key = args.key if args.key is not None else f"cli-{uuid.uuid4().hex}"
    with session(path, start=not args.no_start, progress=progress,
                 gateway=args.gateway) as (client, owned):
        label = f"running the op as {args.principal}"
        progress.phase(label)
        try:
            result = call(client.op, code, principal=args.principal, tool=args.tool,
                          arguments=arguments, key=key, expect_versions=expect,
                          predicate=args.predicate, progress=progress.follow(label))
        except KeyboardInterrupt:
            raise Fail("interrupted; " + (
                "the kernel started for this op is stopped, so the op does not commit"
                if owned else _interrupt_in(client, key)) + (
                "" if args.key is None else "; resend with the same --key, and it runs at "
                "most once"), Exit.INTERRUPTED, kind="interrupted") from None
        progress.close()
    return report_op(args, result, action="run")


# -- objects and grants ------------------------------------------------------------------


def objects(args: argparse.Namespace, path: Path, progress: Progress) -> int:
    client = connect_if_running(path, args.gateway)
    source = "kernel"
    if client is not None:
        with client:
            found = [_object_json(info) for info in call(
                client.objects, principal=args.principal, prefix=args.prefix,
                limit=args.n, offset=args.offset)]
    elif args.principal not in (None, "human"):
        # What an agent may read depends on its grants, which only a kernel holds.
        with session(path, start=not args.no_start, progress=progress,
                     gateway=args.gateway) as (started, _):
            found = [_object_json(info) for info in call(
                started.objects, principal=args.principal, prefix=args.prefix,
                limit=args.n, offset=args.offset)]
            progress.close()
    else:
        found, source = _objects_on_disk(path, args.prefix or "", args.offset, args.n), "disk"
    if args.json:
        emit_json({"objects": found, "source": source})
        return Exit.OK
    hidden: list[str] = []
    if not getattr(args, "internal", False):
        hidden = [item["name"] for item in found if history.is_internal(item["name"])]
        found = [item for item in found if not history.is_internal(item["name"])]
    if not found:
        print("No objects." if not args.prefix else f"No objects named {args.prefix}*.")
    else:
        rows = [("name", "type", "size", "ver", "op", "who", "value")]
        rows += [(item["name"], item["type"], history.human_size(item["size"]),
                  str(item["version"]), str(item["op"]), item["principal"],
                  item["summary"]) for item in found]
        print(history.format_table(rows))
    if hidden:
        print(f"(not listed: {history.internal_note(hidden)}; --internal lists "
              f"{'it' if len(hidden) == 1 else 'them'})")
    return Exit.OK


def _object_json(info: Any) -> dict[str, Any]:
    return {key: getattr(info, key) for key in ("name", "type", "size", "version", "op",
                                                  "principal", "changed_at", "summary")}


def _objects_on_disk(path: Path, prefix: str, offset: int, limit: int | None
                     ) -> list[dict[str, Any]]:
    """The head snapshot's names, as the kernel's ``objects`` would list them for the human;
    a value the snapshot could not persist as what a restore makes of it, a placeholder
    (``kernos.Unpersisted``), not as the value it was."""
    from urllib.parse import unquote

    from kernos.store.snapshots import read_group

    with Workspace.open(path, writable=False, create=False) as workspace:
        head = workspace.head()
        snapshot = None if head is None else read_snapshot(workspace, head)
        names = {} if snapshot is None else snapshot.manifest.get("names", {})
        chosen = sorted(name for name in names if name.startswith(prefix))
        chosen = chosen[offset:] if limit is None else chosen[offset:offset + limit]
        groups = {names[name].get("group") for name in chosen}
        unpersisted: dict[str, list[dict[str, Any]]] = {}
        for key, tree in ({} if snapshot is None else snapshot.group_trees).items():
            if unquote(key) in groups:
                for info in read_group(workspace, key, tree).unpersisted:
                    unpersisted.setdefault(str(info.get("name")), []).append(info)
    return [_as_restored(name_info(name, names[name]), unpersisted.get(name, []))
            for name in chosen]


def _as_restored(info: dict[str, Any], unpersisted: list[dict[str, Any]]) -> dict[str, Any]:
    """``info`` with ``placeholders`` (where a restore puts one), if it has any (else it is
    the kernel's OBJECT as it is); a value that is one whole is typed and summarized as
    the placeholder it becomes."""
    if unpersisted:
        info["placeholders"] = [{key: item.get(key) for key in ("path", "type_name", "reason")}
                                for item in unpersisted]
    whole = next((item for item in unpersisted if item.get("path") == info["name"]), None)
    if whole is not None:
        kept = ("nothing left to keep" if whole.get("lossless") else
                "could not be persisted")
        info["type"] = "Unpersisted"
        info["summary"] = (f"placeholder for {whole.get('type_name')}: {kept} "
                           f"({whole.get('reason')})")
    elif unpersisted:
        paths = ", ".join(str(item.get("path")) for item in unpersisted[:3])
        info["summary"] = f"{info['summary']} (placeholders at {paths})"
    return info


def grants(args: argparse.Namespace, path: Path, progress: Progress) -> int:
    with session(path, start=not args.no_start, progress=progress,
                 gateway=args.gateway) as (client, _):
        found = call(client.grants, args.agent)
        progress.close()
    if args.json:
        emit_json({"grants": found})
        return Exit.OK
    if not found:
        print("No grants." if args.agent is None else f"{args.agent} holds no grants.")
        return Exit.OK
    rows = [("id", "principal", "capability", "used/limit", "from", "op", "state")]
    for grant in found:
        budget = "" if grant.get("limit") is None else f"{grant.get('used')}/{grant['limit']}"
        state = "active" if grant.get("active") else f"revoked (op {grant.get('revoked_op')})"
        granted = str(grant.get("granted_by")) + (f" ({grant['parent']})" if grant.get("parent")
                                                  else "")
        rows.append((str(grant.get("id")), str(grant.get("principal")),
                     str(grant.get("capability")), budget, granted, str(grant.get("op")),
                     state))
    print(history.format_table(rows))
    return Exit.OK


# -- events ------------------------------------------------------------------------------


def _print_event(event: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(event)
    else:
        print(f"{event['seq']:>6}  op {event['op']:<5} {event['principal']:<12} "
              f"{event['topic']}  {json.dumps(event['payload'], sort_keys=True)[:80]}",
              flush=True)


def events(args: argparse.Namespace, path: Path) -> int:
    gateway = getattr(args, "gateway", None)
    if not args.follow:
        found = _logged_events(args, path, gateway)
        for event in found:
            _print_event(event, args.json)
        if not found and not args.json:
            asked = [text for text, given in (
                (f"after seq {args.since}", args.since), (f"on {args.topic}", args.topic),
                (f"by {args.principal}", args.principal)) if given]
            print("No events" + (" " + ", ".join(asked) if asked else "")
                  + (": no committed op has emitted one yet." if not asked else "."))
        return Exit.OK
    if args.topic is not None:
        from kernos.audit.topics import compile_pattern

        compile_pattern(args.topic)  # a bad pattern is a usage error before connecting
    client = _running(path, gateway)
    if client is None:
        where = f" through the gateway {gateway}" if gateway else ""
        raise Fail(f"no kernel is running on {path}{where}, and --follow streams from a "
                   "running kernel; start one, or drop --follow to read the durable log",
                   Exit.NO_KERNEL)
    printed = 0
    last = args.since
    code = Exit.OK  # how the process ends if closing the connection stalls
    # Ctrl-C is how --follow ends.  It only sets a flag, which the loop reads between
    # short waits: an interrupt raised wherever the main thread happens to be (inside
    # the client's teardown, say) made the ending depend on timing.
    stopping = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _number, _frame: stopping.set())
    try:
        stream = call(client.subscribe, since=args.since, topic=args.topic)
        try:
            while (args.n is None or printed < args.n) and not stopping.is_set():
                try:
                    arrived = call(_next_event, stream)
                except StopIteration:
                    break
                if arrived is None:
                    continue
                last = arrived.get("seq", last)
                if args.principal is not None and arrived.get("principal") != args.principal:
                    continue
                _print_event(arrived, args.json)
                printed += 1
        except Fail as failure:
            code = failure.code
            raise Fail(f"{failure} (the last event seen was seq {last}; resume with "
                       f"--since {last})", failure.code, kind=failure.kind) from None
        finally:
            with contextlib.suppress(Exception):
                stream.close()
    except BaseException:
        code = Exit.INTERNAL if code == Exit.OK else code
        raise
    finally:
        _close_within(client, CLOSE_SECONDS, code)
        signal.signal(signal.SIGINT, previous)
    return Exit.OK


def _logged_events(args: argparse.Namespace, path: Path, gateway: str | None
                   ) -> list[dict[str, Any]]:
    """The durable log's events: from disk, or through a gateway (whose host has the disk)."""
    if gateway is not None:
        client = connect_if_running(path, gateway)
        assert client is not None  # through a gateway, one is started if none runs
        with client:
            found, _ = call(client.events, since=args.since, topic=args.topic,
                            principal=args.principal, limit=args.n)
        return found
    from kernos.audit import open_audit

    with Workspace.open(path, writable=False) as workspace:
        return open_audit(workspace).events_since(
            args.since, topic=args.topic, principal=args.principal, limit=args.n)


def _running(path: Path, gateway: str | None) -> KernosClient | None:
    """A client of the kernel running on ``path`` (through ``gateway``), never starting one."""
    from kernos.client import KernosClient
    from kernos.client.errors import NoKernelRunning

    try:
        return call(KernosClient.connect, str(path), gateway=gateway)
    except NoKernelRunning:
        return None


CLOSE_SECONDS = 15.0
FOLLOW_POLL_SECONDS = 0.2


def _next_event(stream: Any) -> dict[str, Any] | None:
    """The stream's next event; None if none came within :data:`FOLLOW_POLL_SECONDS`,
    ``StopIteration`` once the subscription ended."""
    from kernos.client.errors import ClientClosed

    try:
        event: dict[str, Any] = stream.get(FOLLOW_POLL_SECONDS)
    except TimeoutError:
        return None
    except ClientClosed:
        raise StopIteration from None
    return event


def _close_within(client: Any, seconds: float, code: int) -> None:
    """Close ``client``; if that takes over ``seconds``, say where it is stuck and exit.

    Closing only tears down this process's sockets (the kernel is not touched),
    so a teardown that stalls must not keep a finished ``--follow`` alive: the
    stuck thread's stack goes to stderr (for a bug report) and the process
    exits at once, its output flushed.
    """
    import os
    import threading
    import traceback

    closer = threading.Thread(target=client.close, name="kernos-close", daemon=True)
    closer.start()
    closer.join(seconds)
    if not closer.is_alive():
        return
    stacks = "".join(
        f"thread {thread.name}:\n" + "".join(traceback.format_stack(frame))
        for thread in threading.enumerate()
        if (frame := sys._current_frames().get(thread.ident or -1)) is not None
        and thread is not threading.current_thread())
    print(f"kernos: closing the connection took over {seconds:g} s; exiting without "
          f"waiting (this is a bug in Kernos: please report it with these stacks)\n{stacks}",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)
