"""The ``kernos`` CLI as a harness tool: run, objects, grants, events --follow, checkout.

Each command runs as a separate process against a real workspace: through
the kernel running on it (found by its ``kernel.json``), or with none, when
the CLI reads the disk or starts a kernel for the one command.  ``--json``
output is parsed and checked field by field, and every exit status of the
documented table is asserted: 0 committed, 1 not committed, 2 usage or
input, 3 conflict, 4 no kernel or a dead one.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

TOOL_CELL = """\
@agents.tool(schema={"type": "object", "properties": {"n": {"type": "integer"}},
                     "required": ["n"]}, description="Double a number")
def double(n):
    return 2 * n
"""


def kernos_command() -> list[str]:
    script = Path(sys.executable).with_name("kernos")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kernos.cli"]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KERNOS_WORKSPACE", None)
    return env


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kernos_command(), *args], capture_output=True, text=True,
                          input=stdin, env=environment(), timeout=180)


def as_json(result: subprocess.CompletedProcess[str], status: int) -> Any:
    """The one JSON document on stdout, once the exit status is the expected one."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def failure(result: subprocess.CompletedProcess[str], status: int, command: str) -> str:
    """The one line on stderr of a command that exited with ``status``."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kernos {command}: "), result.stderr
    return lines[0]


def test_run_sends_ops_to_the_running_kernel_and_exits_by_status(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    for cell in ("%kernos agent add alice", "x = 0", "%kernos grant alice read:x", TOOL_CELL):
        assert kernel.run(cell).committed, cell
    ws = ["-w", str(kernel.workspace)]

    done = as_json(cli("run", *ws, "--json", "x = 41\nprint('hi')\nx + 1"), 0)
    assert done["status"] == "committed" and done["value"] == {"repr": "42", "json": 42}
    assert done["output"] == "hi\n" and done["changed"] == ["x"]
    assert done["versions"] == {"x": 2} and isinstance(done["op"], int)
    assert kernel.value("x") == 41, "the op must run in the live kernel"
    plain = cli("run", *ws, "-", stdin="print('out')\nx")
    assert (plain.returncode, plain.stdout) == (0, "out\n41\n")
    # Which op it made, on stderr (stdout is the op's own); -q says nothing more.
    assert re.fullmatch(r"kernos: op \d+ committed \(no name changed\), commit [0-9a-f]{12}\n",
                        plain.stderr), plain.stderr
    quiet = cli("run", *ws, "-q", "-", stdin="print('out')\nx")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "out\n41\n", "")

    failed = cli("run", *ws, "--json", "x = -1\n1 / 0")
    result = as_json(failed, 1)
    assert result["status"] == "failed" and "ZeroDivisionError" in result["error"]["message"]
    assert failed.stderr.startswith(f"kernos run: failed (op {result['op']}): ")
    denied = as_json(cli("run", *ws, "--json", "--principal", "alice", "write('x', 0)"), 1)
    assert denied["status"] in ("denied", "vetoed") and denied["principal"] == "alice"
    assert kernel.value("x") == 41

    stale = as_json(cli("run", *ws, "--json", "--expect", "x=1", "x = 7"), 3)
    assert stale["status"] == "conflict" and stale["versions"] == {"x": 2}
    gone = cli("run", *ws, "--json", "--expect", "nothing=3", "x = 7")
    assert as_json(gone, 3)["error"]["kind"] == "precondition"
    false = cli("run", *ws, "--predicate", "x > 100", "x = 7")
    assert "predicate" in failure(false, 3, "run")
    assert kernel.value("x") == 41
    assert as_json(cli("run", *ws, "--json", "--expect", "x=2", "x = 8"), 0)["versions"] == {
        "x": 3}

    first = as_json(cli("run", *ws, "--json", "--key", "once", "n = 1"), 0)
    again = as_json(cli("run", *ws, "--json", "--key", "once", "n = 2"), 0)
    assert not first["duplicate"] and again["duplicate"] and again["op"] == first["op"]
    assert kernel.value("n") == 1
    tool = cli("run", *ws, "--json", "--tool", "double", "--args", '{"n": 21}')
    assert as_json(tool, 0)["value"]["json"] == 42
    agent = cli("run", *ws, "--principal", "alice", "mine = 5\nwhoami()")
    assert (agent.returncode, agent.stdout) == (0, "'alice'\n"), agent.stderr

    unknown = as_json(cli("run", *ws, "--json", "--principal", "mallory", "1"), 2)
    assert unknown["error"]["kind"] == "unknown_principal"
    assert "mallory" in unknown["error"]["message"] and unknown["error"]["exit"] == 2
    for bad in (["run"], ["run", "-c", "1", "2"], ["run", "--expect", "x=new", "1"],
                ["run", "--tool", "double", "--args", "[21]"], ["run", "--args", "{}", "1"]):
        assert "Traceback" not in failure(cli(*bad, *ws), 2, "run")


def test_run_starts_a_kernel_when_none_runs_and_stops_it(tmp_path: Path) -> None:
    workspace = tmp_path / "fresh"
    ws = ["-w", str(workspace)]
    started = cli("run", *ws, "--json", "--progress", "items = [1, 2]\nlen(items)")
    assert as_json(started, 0)["value"]["json"] == 2
    assert "kernos: starting a kernel on " in started.stderr
    assert not (workspace / "kernel.json").exists(), "the kernel started for the op must stop"
    # The op was committed: the next kernel restores it, and the disk shows it.
    again = cli("run", *ws, "--json", "items.append(3)\nitems")
    assert as_json(again, 0)["value"]["json"] == [1, 2, 3]
    assert again.stderr == "", "no progress unless stderr is a terminal or --progress"
    listed = as_json(cli("objects", *ws, "--json"), 0)
    assert listed["source"] == "disk"
    assert [(o["name"], o["version"], o["summary"]) for o in listed["objects"]] == [
        ("items", 2, "[1, 2, 3]")]

    line = failure(cli("run", *ws, "--no-start", "1"), 4, "run")
    assert "no kernel is running" in line and "--no-start" in line
    assert failure(cli("grants", *ws, "--no-start"), 4, "grants")
    busy = tmp_path / "project"
    busy.mkdir()
    (busy / "notes.txt").write_text("not a workspace")
    assert "not a Kernos workspace" in failure(cli("run", "-w", str(busy), "1"), 2, "run")
    assert [path.name for path in busy.iterdir()] == ["notes.txt"]


def test_objects_and_grants_agree_with_and_without_a_kernel(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    for cell in ("%kernos agent add alice", "ledger = {'entries': [40, 25]}\nbudget = 100",
                 "%kernos grant alice read:ledger", "%kernos grant alice spend:USD 50"):
        assert kernel.run(cell).committed, cell
    ws = ["-w", str(kernel.workspace)]

    live = as_json(cli("objects", *ws, "--json"), 0)
    assert live["source"] == "kernel"
    names = [item["name"] for item in live["objects"]]
    assert names == sorted(names) and {"budget", "ledger", "kernos:agents"} <= set(names)
    budget = next(item for item in live["objects"] if item["name"] == "budget")
    assert (budget["type"], budget["version"], budget["summary"]) == ("int", 1, "100")
    mine = as_json(cli("objects", *ws, "--json", "--principal", "alice"), 0)["objects"]
    assert [item["name"] for item in mine] == ["kernos:ns:alice", "ledger"]
    table = cli("objects", *ws, "--prefix", "b")
    assert table.returncode == 0 and table.stdout.splitlines()[1].split()[:4] == [
        "budget", "int", "16", "B"], table.stdout
    held = as_json(cli("grants", *ws, "--json", "alice"), 0)["grants"]
    assert [(g["principal"], g["capability"], g["limit"]) for g in held] == [
        ("alice", "read:ledger", None), ("alice", "spend:USD", "50")]
    unknown = cli("grants", *ws, "--json", "bob")
    assert as_json(unknown, 2)["error"]["kind"] == "unknown_principal"

    kernel.stop()  # killed: its kernel.json stays behind, naming a dead process
    offline = as_json(cli("objects", *ws, "--json"), 0)
    assert offline["source"] == "disk" and offline["objects"] == live["objects"]
    assert as_json(cli("objects", *ws, "--json", "--offset", "1", "-n", "1"), 0)[
        "objects"] == live["objects"][1:2]
    # Grants need the registry, which only a kernel reads: one is started, then stopped.
    assert as_json(cli("grants", *ws, "--json", "alice"), 0)["grants"] == held
    assert not (kernel.workspace / "kernel.json").exists()


class Lines:
    """A child's stdout read by a thread, so a test waits for a line with a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self._lines.put(line) for line in stream],
                         daemon=True).start()

    def next(self, seconds: float = 60) -> str:
        try:
            return self._lines.get(timeout=seconds)
        except queue.Empty:
            raise AssertionError(f"no line within {seconds} s") from None


def test_events_follow_streams_committed_events_until_ctrl_c(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    assert kernel.run("events.emit('orders.created', {'id': 1})").committed
    ws = ["-w", str(kernel.workspace)]
    # PYTHONFAULTHANDLER: if it hangs, SIGABRT makes it print every thread's stack.
    follow = subprocess.Popen([*kernos_command(), "events", *ws, "--follow", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**environment(), "PYTHONFAULTHANDLER": "1"})
    try:
        assert follow.stdout is not None
        lines = Lines(follow.stdout)
        backlog = json.loads(lines.next())
        assert (backlog["seq"], backlog["topic"], backlog["payload"]) == (
            1, "orders.created", {"id": 1})
        assert kernel.run("events.emit('orders.created', {'id': 2})\n1/0").rolled_back
        assert kernel.run("events.emit('ledger.debit', {'usd': 5})").committed
        live = json.loads(lines.next())
        assert (live["seq"], live["topic"], live["payload"]) == (2, "ledger.debit", {"usd": 5})
        follow.send_signal(signal.SIGINT)
        try:
            follow.wait(timeout=60)
        except subprocess.TimeoutExpired:
            follow.send_signal(signal.SIGABRT)
            follow.wait(timeout=30)
            assert follow.stderr is not None
            raise AssertionError("`kernos events --follow` did not end within 60 s of "
                                 f"SIGINT; its threads:\n{follow.stderr.read()}") from None
        assert follow.stderr is not None
        errors = follow.stderr.read()
        assert (follow.returncode, errors) == (0, "")
        with pytest.raises(AssertionError):
            lines.next(seconds=0.5)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()

    # Ctrl-C at any instant, once or twice, ends it cleanly (it only sets a flag).
    for delay, twice in ((0.0, False), (0.05, True), (0.13, False), (0.21, True), (0.4, False)):
        again = subprocess.Popen([*kernos_command(), "events", *ws, "--follow", "--json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=environment())
        try:
            assert again.stdout is not None
            assert json.loads(Lines(again.stdout).next())["seq"] == 1
            time.sleep(delay)
            again.send_signal(signal.SIGINT)
            if twice:
                again.send_signal(signal.SIGINT)
            assert again.wait(timeout=60) == 0, (delay, twice, again.communicate())
        finally:
            if again.poll() is None:
                again.kill()
                again.wait()

    # -n ends the stream by itself; --topic and --since filter it like the durable log.
    counted = cli("events", *ws, "--follow", "--json", "--topic", "ledger.*", "-n", "1")
    assert [json.loads(line)["seq"] for line in counted.stdout.splitlines()] == [2]
    assert counted.returncode == 0, counted.stderr
    bad = cli("events", *ws, "--follow", "--topic", "a..b")
    assert "is not a topic pattern" in failure(bad, 2, "events")

    # A kernel that dies under --follow ends it with status 4, saying where to resume.
    orphan = subprocess.Popen([*kernos_command(), "events", *ws, "--follow", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=environment())
    try:
        assert orphan.stdout is not None
        lines = Lines(orphan.stdout)
        assert [json.loads(lines.next())["seq"] for _ in range(2)] == [1, 2]
        kernel.kill9()
        assert orphan.wait(timeout=60) == 4
        assert orphan.stderr is not None
        stderr = orphan.stderr.read()
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
    assert json.loads(lines.next())["error"]["kind"] == "kernel_died"
    assert stderr.count("\n") == 1 and "resume with --since 2" in stderr, stderr

    kernel.stop()
    line = failure(cli("events", *ws, "--follow"), 4, "events")
    assert "no kernel is running" in line and "drop --follow" in line
    offline = cli("events", *ws, "--json")
    assert [json.loads(line)["seq"] for line in offline.stdout.splitlines()] == [1, 2]


def test_checkout_goes_through_the_running_kernel(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    for cell in ("x = 1", "x = 2\ny = 'later'"):
        assert kernel.run(cell).committed
    ws = ["-w", str(kernel.workspace)]
    result = as_json(cli("checkout", *ws, "--json", "--progress", "@1"), 0)
    assert result["status"] == "committed" and result["checkout"]["ref"] == "@1"
    assert result["changed"] == ["x"] and result["deleted"] == ["y"]
    shown = as_json(cli("show", *ws, "--json"), 0)
    assert shown["commit"] == result["commit"] and shown["op"] == result["op"]
    assert kernel.value("(x, 'y' in globals())") == (1, False), "the live image changed"
    unknown = cli("checkout", *ws, "--json", "@99")
    assert as_json(unknown, 2)["error"]["kind"] == "unknown_ref"
    assert kernel.value("x") == 1


def test_a_kernel_that_dies_under_an_op_exits_4(kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    assert kernel.run("x = 1").committed
    marker = kernel.workspace.parent / "started"
    running = subprocess.Popen(
        [*kernos_command(), "run", "-w", str(kernel.workspace),
         f"import time\nopen({str(marker)!r}, 'w').close()\ntime.sleep(120)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment())
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline and running.poll() is None, "the op never ran"
            time.sleep(0.05)
        kernel.kill9()
        stdout, stderr = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()
    assert running.returncode == 4, (stdout, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernos run: ") and "died" in lines[0]


def test_kernos_mcp_serves_the_running_kernel_over_stdio(
        kernel_factory: Callable[..., Kernel]) -> None:
    import asyncio

    from mcp import ClientSession, StdioServerParameters, stdio_client

    kernel = kernel_factory()
    assert kernel.run("budget = 500").committed
    command = kernos_command()
    parameters = StdioServerParameters(
        command=command[0], args=[*command[1:], "mcp", "-w", str(kernel.workspace)],
        env=environment())

    async def scenario() -> tuple[set[str], str]:
        async with stdio_client(parameters) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            tools = {tool.name for tool in (await session.list_tools()).tools}
            listed = await session.call_tool("kernos-objects", {})
            return tools, json.dumps(listed.structured_content)

    tools, listed = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert {"kernos-op", "kernos-objects", "kernos-log"} <= tools
    assert '"budget"' in listed
    assert kernel.value("budget") == 500, "the server used the running kernel"
    # Its own usage errors keep the CLI's form and status.
    assert "--port" in failure(cli("mcp", "-w", str(kernel.workspace), "--port", "80"), 2,
                               "mcp")
