"""Agent-written tools through a real kernel: durability, grants and versions in flight.

A tool an agent defines is part of the image: it survives kill -9, is called
by other agents only with a ``call:TOOL`` grant, and acts with the *caller's*
grants.  Versions are pinned per op: an op calls the versions committed before
it started, even if a new version is defined while it runs (in the op itself,
or by a second client whose request waits for the op), and ``%kernos show``
records which version each op ran.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from jupyter_client.session import Session

from agents_support import agent, committed, define_tool, denials, fails

pytestmark = pytest.mark.kernel

REPLY_TIMEOUT = 60


def tool_row(table: str, name: str) -> list[str]:
    """The ``%kernos tools`` row of ``name``, split into its columns."""
    for line in table.splitlines()[1:]:
        columns = re.split(r"\s{2,}", line.strip())
        if columns[0] == name:
            return columns
    raise AssertionError(f"no tool {name!r} in:\n{table}")


def tools_line(kernel: Any, op: int) -> str | None:
    """The ``tools:`` line of ``%kernos show @op``, if the op called any tool."""
    shown = committed(kernel, f"%kernos show @{op}").stdout
    assert f"op {op} by " in shown, shown
    found = [line for line in shown.splitlines() if line.startswith("tools:")]
    return found[0] if found else None


# -- durability and grants ------------------------------------------------------------------

def test_an_agent_tool_survives_kill9_and_serves_a_granted_agent(kernel_factory: Any) -> None:
    kernel = kernel_factory()
    committed(kernel, "data = {'k': 100}\n%kernos agent add alice\n%kernos agent add bob\n"
                      "%kernos agent add eve\n%kernos grant alice read:data")
    defined = committed(kernel, define_tool("alice", "wordy", "x * 2 + 1",
                                            description="doubles and adds one"))
    assert defined.stdout == "version 1\n"
    define_op = defined.kernos["op"]
    # A tool that reads a human name: it acts with its caller's grants, not alice's.
    committed(kernel, define_tool("alice", "peek", "read('data')['k'] + x",
                                  description="adds data['k']"))
    committed(kernel, "%kernos grant bob call:wordy\n%kernos grant bob call:peek")
    assert committed(kernel, agent("alice", "print(call('peek', x=1))")).stdout == "101\n"

    kernel.kill9()
    kernel = kernel_factory(kernel.workspace)

    assert committed(kernel, agent("bob", "print(call('wordy', x=20))")).stdout == "41\n"
    assert committed(kernel, "print(agents.call('wordy', x=1))").stdout == "3\n"
    row = tool_row(committed(kernel, "%kernos tools").stdout, "wordy")
    assert row == ["wordy", "1", "pure", "call:wordy", "alice", str(define_op),
                   "doubles and adds one"]
    # An agent without the grant is denied, and the denial is logged durably.
    denied = fails(kernel, agent("eve", "print(call('wordy', x=20))"),
                   "CapabilityDenied", "'eve'", "'call:wordy'")
    assert denied.stdout == ""
    assert denials(kernel.workspace)[-1]["principal"] == "eve"
    assert denials(kernel.workspace)[-1]["capability"] == "call:wordy"
    # bob holds call:peek but not read:data: the tool cannot lend him alice's grant.
    fails(kernel, agent("bob", "print(call('peek', x=1))"), "CapabilityDenied",
          "'bob'", "'read:data'")
    committed(kernel, "%kernos grant bob read:data")
    assert committed(kernel, agent("bob", "print(call('peek', x=1))")).stdout == "101\n"
    # Nor can bob replace alice's tool with a version of his own.
    fails(kernel, define_tool("bob", "wordy", "0"), "CapabilityDenied", "it belongs to alice")
    assert committed(kernel, agent("bob", "print(call('wordy', x=2))")).stdout == "5\n"


# -- hot reload: versions are pinned per op ---------------------------------------------------

def test_a_redefinition_in_an_op_takes_effect_from_the_next_op(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice")
    first = committed(kernel, define_tool("alice", "scale", "x * 2", description="v1"))
    assert first.stdout == "version 1\n"

    source = "def scale(x):\n    return x * 3\n"
    result = committed(kernel, agent("alice", "\n".join([
        "a = call('scale', x=5)",
        f"print('version', define_tool('scale', {source!r}, "
        "{'type': 'object', 'properties': {'x': {'type': 'integer'}}}, 'v2'))",
        "b = call('scale', x=5)",
        "print(a, b)",
    ])))
    assert result.stdout == "version 2\n10 10\n"
    redefine_op = result.kernos["op"]

    after = committed(kernel, agent("alice", "print(call('scale', x=5))"))
    assert after.stdout == "15\n"
    human = committed(kernel, "print(agents.call('scale', x=5))")
    assert human.stdout == "15\n"

    assert tools_line(kernel, first.kernos["op"]) is None  # defined, never called
    assert tools_line(kernel, redefine_op) == "tools: scale v1"
    assert tools_line(kernel, after.kernos["op"]) == "tools: scale v2"
    assert tools_line(kernel, human.kernos["op"]) == "tools: scale v2"
    row = tool_row(committed(kernel, "%kernos tools").stdout, "scale")
    assert row[:6] == ["scale", "2", "pure", "call:scale", "alice", str(redefine_op)]


def _second_client(kernel: Any) -> Any:
    """Another client of the same kernel, with a session (and socket identity) of its own."""
    session = Session(key=kernel.manager.session.key,
                      signature_scheme=kernel.manager.session.signature_scheme)
    client = kernel.manager.client(session=session)
    client.start_channels()
    client.wait_for_ready(timeout=REPLY_TIMEOUT)
    return client


def _reply(client: Any, msg_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + REPLY_TIMEOUT
    while True:
        message = client.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        if message["parent_header"].get("msg_id") == msg_id:
            return message


def _wait_for_output(client: Any, msg_id: str, text: str) -> None:
    deadline = time.monotonic() + REPLY_TIMEOUT
    while True:
        message = client.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
        if (message["parent_header"].get("msg_id") == msg_id
                and message["msg_type"] == "stream" and text in message["content"]["text"]):
            return


IN_FLIGHT = """\
import asyncio
first = agents.call('scale', x=5)
print('first', first, flush=True)
await asyncio.sleep(1)
latest = max(tool['version'] for tool in agents.tools() if tool['name'] == 'scale')
second = agents.call('scale', x=5)
print('second', second, 'latest', latest)
"""


def test_a_redefinition_sent_while_an_op_is_in_flight_waits_for_it(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice")
    committed(kernel, define_tool("alice", "scale", "x * 2", description="v1"))
    other = _second_client(kernel)
    try:
        in_flight = kernel.client.execute(IN_FLIGHT)
        _wait_for_output(kernel.client, in_flight, "first 10")
        # The op has called v1 and is now awaiting: a second client redefines the tool.
        redefinition = other.execute(define_tool("alice", "scale", "x * 3", description="v2"))
        in_flight_reply = _reply(kernel.client, in_flight)
        redefinition_reply = _reply(other, redefinition)
    finally:
        other.stop_channels()

    assert in_flight_reply["content"]["status"] == "ok", in_flight_reply["content"]
    assert redefinition_reply["content"]["status"] == "ok", redefinition_reply["content"]
    in_flight_op = in_flight_reply["metadata"]["kernos"]
    redefinition_op = redefinition_reply["metadata"]["kernos"]
    assert in_flight_op["status"] == redefinition_op["status"] == "committed"
    # Serialized: the redefinition ran after the op in flight had finished.
    assert redefinition_op["op"] == in_flight_op["op"] + 1
    assert redefinition_reply["header"]["date"] >= in_flight_reply["header"]["date"]
    # Both calls of the op in flight used v1; even after its sleep v2 did not exist yet.
    assert kernel.value("(first, second, latest)") == (10, 10, 1)
    assert tools_line(kernel, in_flight_op["op"]) == "tools: scale v1"
    shown = committed(kernel, f"%kernos show @{redefinition_op['op']}").stdout
    assert f"op {redefinition_op['op']} by alice (agent)" in shown
    assert "return x * 3" in shown and "tools:" not in shown
    # The op after the redefinition gets the new version.
    after = committed(kernel, agent("alice", "print(call('scale', x=5))"))
    assert after.stdout == "15\n"
    assert tools_line(kernel, after.kernos["op"]) == "tools: scale v2"
