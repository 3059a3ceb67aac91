"""Agents through a real kernel: bad input gets clear errors, and resources are bounded.

Unknown agents and tools, malformed tool schemas, capabilities a granter does
not hold, oversized or too deeply nested code: each fails with an error that
names the problem, nothing of the cell is kept, and the kernel goes on
serving.  Runaway loops and recursion are stopped and rolled back, printed
output is bounded, and code stuck in C is killed by the watchdog (a new kernel
restores the last committed state).
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from agents_support import agent, committed, define_tool, error_text, fails, names_of

pytestmark = pytest.mark.kernel

SCHEMA = "{'type': 'object', 'properties': {'x': {'type': 'integer'}}, 'required': ['x']}"
BAD_SCHEMAS = [
    ("{'type': 'array'}", "its 'type' must be 'object'"),
    ("[1]", "it is a list, not a dict"),
    ("'a schema'", "it is a str, not a dict"),
    ("{'type': 'object', 'properties': {'x': {'type': 'weird'}}}",
     "property 'x' needs a 'type' among"),
    ("{'type': 'object', 'properties': {'x': 5}}", "property 'x' needs a 'type'"),
    ("{'type': 'object', 'properties': {'_x': {'type': 'string'}}}",
     "property '_x' is not a plain identifier"),
    ("{'type': 'object', 'properties': {'x': {'type': 'string'}}, 'required': ['y']}",
     "'required' must list names from 'properties'"),
    ("{'type': 'object', 'extra': 1}", "unsupported keys ['extra']"),
]


def test_unknown_agents_and_tools_are_named(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice\n%kernos agent add bob")
    fails(kernel, agent("nobody", "print('ran')\nx = 1"), "UnknownAgent",
          "There is no agent 'nobody' (agents: alice, bob)", "%kernos agent add nobody")
    fails(kernel, "%kernos grant nobody read:x", "UnknownAgent", "There is no agent 'nobody'")
    fails(kernel, "%%agent\nx = 1", "UsageError", "`%%agent NAME` needs the agent's name")
    fails(kernel, agent("alice", "print(call('nothere', a=1))"), "UnknownTool",
          "There is no tool 'nothere' (tools: none yet)")
    fails(kernel, "agents.call('nothere')", "UnknownTool", "There is no tool 'nothere'")
    # A tool defined in an op is callable from the next op, and the error says so.
    fails(kernel, define_tool("alice", "fresh", "x") + "\ncall('fresh', x=1)", "UnknownTool",
          "There is no tool 'fresh' yet: it was defined in this op and can be called from "
          "the next op")
    committed(kernel, define_tool("alice", "double", "x * 2"))
    fails(kernel, agent("alice", "call('double', x='a')"), "TypeError",
          "tool 'double': x must be a integer, not str")
    fails(kernel, agent("alice", "call('double')"), "TypeError", "tool 'double' needs x")
    fails(kernel, agent("alice", "call('double', x=1, y=2)"), "TypeError",
          "tool 'double' takes no argument 'y'")
    fails(kernel, "%kernos grant alice fly:away", "InvalidGrant",
          "'fly:away' is not a capability; write KIND:TARGET")
    fails(kernel, "%kernos grant alice read:a/b", "InvalidGrant", "'read:a/b' has a bad target")
    fails(kernel, "%kernos grant alice agents:rule", "InvalidGrant",
          "the only 'agents' capability is 'agents:spawn'")
    fails(kernel, "%kernos frobnicate", "UsageError", "unknown command 'frobnicate'")
    assert names_of(kernel, "alice") == {} and names_of(kernel, "bob") == {}
    assert kernel.value("agents.grants()") == []
    assert committed(kernel, agent("alice", "print(call('double', x=21))")).stdout == "42\n"


def test_malformed_tool_schemas_are_refused(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice")
    for schema, problem in BAD_SCHEMAS:
        fails(kernel, f"agents.register_tool('t1', lambda x: x, schema={schema}, "
                      "description='d')", "InvalidGrant",
              "the schema of tool 't1' is malformed: " + problem)
        fails(kernel, agent("alice", f"define_tool('t2', 'def t2(x):\\n    return x', "
                                     f"{schema}, 'd')"), "InvalidGrant",
              "the schema of tool 't2' is malformed: " + problem)
    fails(kernel, f"agents.register_tool('T1', lambda x: x, schema={SCHEMA}, description='d')",
          "UsageError", "'T1' is not a valid tool name")
    fails(kernel, f"agents.register_tool('t1', 5, schema={SCHEMA}, description='d')",
          "UsageError", "tool 't1': 5 is not callable")
    fails(kernel, f"agents.register_tool('t1', len, schema={SCHEMA}, description='d', "
                  "effect='magic')", "InvalidGrant", "the effect of tool 't1' must be one of")
    fails(kernel, agent("alice", f"define_tool('t2', 'def other(x):\\n    return x', "
                                 f"{SCHEMA}, 'd')"), "UsageError",
          "the source of tool 't2' must define a function t2()")
    fails(kernel, agent("alice", f"define_tool('t2', 'import os', {SCHEMA}, 'd')"),
          "AgentCodeRejected", "imports are not available to agents")
    assert committed(kernel, "%kernos tools").stdout.strip() == "No tools yet."
    assert kernel.value("agents.tools()") == []


def test_delegating_what_the_granter_lacks_is_denied(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice\n%kernos agent add bob\n"
                      "%kernos grant alice agents:spawn\n%kernos grant bob spend:USD 5")
    committed(kernel, agent("alice", "helper = spawn('helper')"))
    for grant_id in ("'g99'", "'g2'", "5", "None"):  # unknown, bob's, not even a str
        result = fails(kernel, agent("alice", f"delegate({grant_id}, helper)"),
                       "CapabilityDenied", "'alice'", "no such active grant is held by this "
                       "principal")
        assert result.stdout == ""
    fails(kernel, agent("bob", "spawn('minion')"), "CapabilityDenied", "'agents:spawn'")
    fails(kernel, agent("alice", "spawn('Bad Name')"), "UsageError", "is not a valid agent name")
    assert sorted(kernel.value("[g['id'] for g in agents.grants()]")) == ["g1", "g2"]


def test_a_denied_delegation_says_what_was_wrong_once(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice\n%kernos grant alice agents:spawn")
    result = fails(kernel, agent("alice", "delegate('g99', spawn('helper'))"),
                   "CapabilityDenied", "g99", "no such active grant")
    message = result.errors[-1]["evalue"]
    assert message.count("no such active grant") == 1, message
    assert message.count("does not hold") == 1, message
    assert "%kernos grant alice grant g99" not in message, message


# -- oversized and too deeply nested code -------------------------------------------------------

DEEP = {
    "nested lists": "x = " + "[" * 100 + "]" * 100,
    "unary minus": "x = " + "-" * 100 + "1",
    "a 1000-term chain": "x = " + "+".join(["1"] * 1000),
    "nested calls": "x = " + "abs(" * 100 + "1" + ")" * 100,
}


def test_oversized_and_too_deep_code_is_rejected_before_it_runs(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice\n%kernos agent add tiny source_bytes=400")
    too_big = "print('ran')\n" + "x = 1\n" * 12000
    size = len(too_big.encode())
    fails(kernel, agent("alice", too_big), "AgentCodeRejected",
          f"the code is {size:,} bytes, over the limit of 65,536")
    small_but_too_big = "print('ran')\n" + "x = 1\n" * 100
    fails(kernel, agent("tiny", small_but_too_big), "AgentCodeRejected",
          f"the code is {len(small_but_too_big):,} bytes, over the limit of 400")
    # A tool's source is agent code too, bounded the same way.
    fails(kernel, agent("tiny", "source = 'def t(x):\\n    return x\\n' + '#' * 1000\n"
                                f"define_tool('t', source, {SCHEMA}, 'd')"),
          "AgentCodeRejected", "over the limit of 400")
    for what, code in DEEP.items():
        result = fails(kernel, agent("alice", "print('ran')\n" + code), "AgentCodeRejected",
                       "The code for agent 'alice' was refused before it ran",
                       "over the limit of 60")
        assert result.stdout == "", what
    fails(kernel, agent("alice", "x = " + "(" * 201 + "1" + ")" * 201), "AgentCodeRejected",
          "too many nested parentheses")
    fails(kernel, agent("alice", "x = " + "+".join(["1"] * 30000)), "AgentCodeRejected",
          "refused before it ran")
    assert names_of(kernel, "alice") == {} and names_of(kernel, "tiny") == {}
    assert kernel.value("agents.tools()") == []
    # The kernel keeps serving, agent code included.
    committed(kernel, agent("alice", "y = 2"))
    assert names_of(kernel, "alice") == {"y": 2}


def test_redundant_parentheses_are_not_nesting_but_the_parser_bounds_them(kernel: Any) -> None:
    # Redundant parentheses leave no syntax-tree node, so they do not count
    # towards ast_depth; the parser's own limit (200) bounds them cleanly.
    committed(kernel, "%kernos agent add alice")
    committed(kernel, agent("alice", "x = " + "(" * 199 + "1" + ")" * 199))
    fails(kernel, agent("alice", "y = " + "(" * 201 + "1" + ")" * 201), "AgentCodeRejected",
          "parentheses")
    assert names_of(kernel, "alice") == {"x": 1}


# -- resource bounds ---------------------------------------------------------------------------

def test_a_runaway_loop_is_stopped_at_its_deadline(kernel: Any) -> None:
    committed(kernel, "%kernos agent add spinner seconds=1")
    committed(kernel, agent("spinner", "counter = 0"))
    for code in ("counter = 1\nwhile True:\n    pass",
                 "counter = 2\ntry:\n    while True:\n        pass\nexcept Exception:\n"
                 "    print('caught')\nprint('after')"):
        started = time.monotonic()
        result = fails(kernel, agent("spinner", code), "OpVetoed",
                       "op", "(spinner) ran over its 1 s deadline", "Nothing it did was kept")
        assert time.monotonic() - started < 6
        assert "caught" not in result.stdout and "after" not in result.stdout
        assert names_of(kernel, "spinner") == {"counter": 0}
    assert committed(kernel, "print('serving')").stdout == "serving\n"
    assert committed(kernel, agent("spinner", "counter += 1\nprint(counter)")).stdout == "1\n"


def test_a_recursion_bomb_is_rolled_back(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice")
    committed(kernel, agent("alice", "depth = 0"))
    bomb = ("depth = 1\ndef f(n):\n    return f(n + 1)\ntry:\n    f(0)\n"
            "except Exception as error:\n    print('caught', error)\nprint('after')")
    result = fails(kernel, agent("alice", bomb), "OpVetoed", "(alice) nested calls over 100 deep")
    assert "caught" not in result.stdout and "after" not in result.stdout
    assert kernel.value("sorted(agents.namespace('alice'))") == ["depth"]
    assert names_of(kernel, "alice") == {"depth": 0}
    assert committed(kernel, agent("alice", "print(depth)")).stdout == "0\n"


def test_a_recursion_error_inside_a_capability_check_does_not_commit(kernel: Any) -> None:
    setup = kernel.run("secret = 1\n%kernos agent add dave recursion=100000")
    # A limit the interpreter cannot honour is refused up front.
    assert setup.status == "error" and "recursion limit is at most" in error_text(setup)
    setup = kernel.run("%kernos agent add dave recursion=300")
    assert setup.status == "ok", error_text(setup)
    probe = ("results = []\ndef g(n):\n    try:\n        return g(n + 1)\n"
             "    except RuntimeError:\n        try:\n            read('secret')\n"
             "        except RuntimeError:\n            results.append('recursion')\n"
             "        except CapabilityDenied:\n            results.append('denied')\n"
             "    return 'done'\nprint(g(0), results)")
    result = kernel.run(agent("dave", probe))
    assert result.status == "error" and result.rolled_back, (result.stdout, result.kernos)
    assert names_of(kernel, "dave") == {}


def bounded(output: str, kept: str, limit: int, dropped: int) -> None:
    """``output`` is ``kept`` (at most ``limit`` long), then a note of how much was dropped."""
    assert len(kept) <= limit
    match = NOTE.fullmatch(output[len(kept):])
    assert output.startswith(kept) and match is not None, output[limit - 20:]
    assert int(match.group(1).replace(",", "")) == dropped


NOTE = re.compile(r"\n\.\.\. \(([\d,]+) more (?:characters|bytes) not shown\)\n")


def test_printed_output_is_bounded(kernel: Any) -> None:
    committed(kernel, "%kernos agent add alice\n%kernos agent add small output_bytes=1000")
    result = committed(kernel, agent("alice", "print('x' * 10_000_000)"))
    bounded(result.stdout, "x" * 65536, 65536, 10_000_001 - 65536)
    result = committed(kernel, agent("alice", "for i in range(1000):\n    print('y' * 10000)"))
    assert len(result.stdout) < 65536 + 100
    assert NOTE.search(result.stdout) and result.stdout.startswith("y" * 10000 + "\n")
    assert int(NOTE.search(result.stdout).group(1).replace(",", "")) > 9_900_000
    result = committed(kernel, agent("small", "print('z' * 5000)"))
    bounded(result.stdout, "z" * 1000, 1000, 5001 - 1000)
    # Bounded when the op fails too; the error still comes through.
    result = fails(kernel, agent("small", "print('w' * 100000)\nraise ValueError('boom')"),
                   "ValueError", "boom")
    bounded(result.stdout, "w" * 1000, 1000, 100_001 - 1000)
    assert committed(kernel, "print('serving')").stdout == "serving\n"


@pytest.mark.slow
def test_code_stuck_in_c_is_killed_by_the_watchdog(kernel_factory: Any) -> None:
    kernel = kernel_factory()
    committed(kernel, "kept = 1\n%kernos agent add stuck seconds=1 hard_seconds=2")
    committed(kernel, agent("stuck", "before = 1"))
    started = time.monotonic()
    kernel.client.execute(agent("stuck", "before = 2\nx = sum(range(10**13))"))
    while kernel.manager.is_alive() and time.monotonic() - started < 20:
        time.sleep(0.1)
    assert not kernel.manager.is_alive(), "the watchdog did not kill the kernel within 20 s"
    kernel.client.stop_channels()
    survivor = kernel_factory(kernel.workspace)
    assert survivor.value("kept") == 1
    assert names_of(survivor, "stuck") == {"before": 1}
    assert committed(survivor, agent("stuck", "print(before)")).stdout == "1\n"
