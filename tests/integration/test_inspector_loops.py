"""Loops, circuits and memory through a real kernel's ``kernos.inspector`` comm.

What the sidebar's and the widget's Agents tab rely on: the ``loop``
(``status``), ``circuit``, ``policy``, ``recall`` and ``memory`` (``stats``) reads, and
the human's controls ``loop`` (``pause``, ``resume``, ``stop``) and
``reset``, each an op by ``human`` whose notice refreshes the views (``policy``
and ``circuit`` read the breakers).
An inspector still runs no code, and recall through it as an agent returns
only what that agent may read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from events_support import Feed
from inspector_support import Inspector

pytestmark = pytest.mark.kernel


def _circuit(panel: Inspector, agent: str) -> dict[str, Any]:
    """What the Agents tab shows of ``agent``'s breaker: its policy and its circuit."""
    circuits = panel.result("circuit")["circuits"]
    assert agent in circuits, circuits
    return {"policy": panel.result("policy", agent=agent)["policy"],
            "circuit": circuits[agent]}


def test_a_tripped_circuit_is_shown_and_the_human_resets_it_from_the_panel(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "ws")
    feed = Feed(kernel)
    assert feed.run("agents.add('bob')\nagents.policy('bob', failures=2)").committed
    panel = Inspector(feed)
    bob = _circuit(panel, "bob")
    assert bob["policy"] == {"failures": 2} and bob["circuit"] is None

    assert feed.run("%%agent bob\n1 / 0").rolled_back
    assert feed.run("%%agent bob\n1 / 0").rolled_back
    refused = feed.run("%%agent bob\nx = 1")
    assert refused.rolled_back
    trip = _circuit(panel, "bob")["circuit"]
    assert trip is not None and trip["policy"] == "failures" and trip["limit"] == 2
    assert "2 op(s) of 'bob' in a row did not commit" in trip["message"]
    assert trip["figures"]["in_a_row"] == 2

    before = len(panel.of_type("committed"))
    reset = panel.result("reset", agent="bob")
    assert (reset["agent"], reset["was_open"], reset["restored_from"]) == ("bob", "failures",
                                                                           None)
    notices = panel.of_type("committed")[before:]
    assert [(n["op"], n["principal"]) for n in notices] == [(reset["op"], "human")]
    assert _circuit(panel, "bob")["circuit"] is None
    assert feed.run("%%agent bob\nx = 1").committed
    audit = panel.result("audit", principal="human")["records"]
    assert any(record.get("op") == reset["op"] for record in audit)

    # Errors name what was wrong; an inspector still runs no code.
    unknown = panel.ask("reset", agent="nobody")
    assert unknown["error"]["kind"] == "unknown_principal", unknown
    for action, fields in (("op", {"principal": "human", "code": "x = 1"}),
                           ("grant", {"agent": "bob", "capability": "read:x"}),
                           ("policy", {"agent": "bob", "set": {"failures": 1000}})):
        denied = panel.ask(action, **fields)
        assert denied["error"]["kind"] == "denied", denied
        assert "reset a circuit" in denied["error"]["message"] or \
            "agents.policy(NAME" in denied["error"]["message"]
    assert _circuit(panel, "bob")["policy"] == {"failures": 2}


def test_recall_from_the_panel_as_an_agent_returns_only_what_it_may_read(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "ws")
    feed = Feed(kernel)
    assert feed.run("agents.add('bob')\nnote = 'the zebra migrates at dawn'").committed
    assert feed.run("%%agent bob\nfinding = 'zebra stripes confuse flies'").committed
    panel = Inspector(feed)

    assert panel.result("memory", command="stats")["entries"]["episodic"] >= 2

    def found(principal: str) -> set[tuple[str, str | None]]:
        memories = panel.result("recall", query="zebra", principal=principal)["memories"]
        return {(memory["kind"], memory["name"]) for memory in memories
                if memory["kind"] == "working"} | {
            (memory["kind"], memory["principal"]) for memory in memories
            if memory["kind"] == "episodic"}

    assert {("working", "note"), ("episodic", "human")} <= found("human")
    assert ("episodic", "bob") not in found("human")   # bob's ops are his own memory
    assert panel.result("memory", command="stats")["entries"]["working"] >= 1
    refused = panel.ask("recall", query="zebra", principal="bob")
    assert refused["error"]["kind"] == "denied" and "memory:read" in \
        refused["error"]["message"], refused
    assert feed.run("agents.grant('bob', 'memory:read')").committed
    as_bob = found("bob")
    assert ("episodic", "bob") in as_bob
    assert ("working", "note") not in as_bob and ("episodic", "human") not in as_bob
    assert feed.run("agents.grant('bob', 'read:note')").committed
    assert ("working", "note") in found("bob")

    # Reads only: no rebuild, and nothing remembered as anyone.
    for action, fields in (("memory", {"command": "rebuild"}),
                           ("remember", {"fact": "zebras are horses", "principal": "bob"})):
        denied = panel.ask(action, **fields)
        assert denied["error"]["kind"] == "denied", (action, denied)
    assert feed.value("agents.recall('horses', as_='bob')") == []


def _loop(panel: Inspector, agent: str) -> dict[str, Any]:
    found = [entry for entry in panel.result("loop", do="status")["loops"]
             if entry["agent"] == agent]
    assert len(found) == 1, found
    return found[0]


def test_the_panel_shows_a_loop_pauses_resumes_and_stops_it_and_sees_it_tripped(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "ws")
    feed = Feed(kernel)
    # A long pause between iterations: the test reads statuses, not a moving counter.
    assert feed.run("agents.add('carol')\nagents.policy('carol', failures=1)\n"
                    "agents.loop('carol', 'n = 1', every_ms=3_600_000, "
                    "pending=['a', 'b'])").committed
    panel = Inspector(feed)
    carol = _loop(panel, "carol")
    assert (carol["status"], carol["pending"]) == ("running", 2)
    assert _circuit(panel, "carol")["circuit"] is None

    before = len(panel.of_type("committed"))
    paused = panel.result("loop", do="pause", agent="carol")
    assert paused["loop"]["status"] == "paused"
    notices = panel.of_type("committed")[before:]
    assert [(n["op"], n["principal"]) for n in notices] == [(paused["op"], "human")]
    assert _loop(panel, "carol")["status"] == "paused"
    assert feed.value("agents.loops()[0]['status']") == "paused"   # in the image, not the UI

    # The agent's circuit opens: its loop is tripped (its status stays the human's).
    assert feed.run("%%agent carol\n1 / 0").rolled_back
    assert feed.run("%%agent carol\nx = 1").rolled_back
    assert _loop(panel, "carol")["status"] == "paused"
    assert _circuit(panel, "carol")["circuit"]["policy"] == "failures"
    assert panel.result("reset", agent="carol")["was_open"] == "failures"
    assert _circuit(panel, "carol")["circuit"] is None

    assert panel.result("loop", do="resume", agent="carol")["loop"]["status"] == "running"
    stopped = panel.result("loop", do="stop", agent="carol", reason="enough <b>")
    assert stopped["loop"]["status"] == "stopped" and stopped["loop"]["reason"] == "enough <b>"
    head = panel.result("status")["head"]
    final = panel.ask("loop", do="pause", agent="carol")
    assert final["error"]["kind"] == "invalid" and "final" in final["error"]["message"], final
    assert panel.result("status")["head"] == head          # nothing committed
    assert _loop(panel, "carol")["status"] == "stopped"

    # From inside a cell (itself an op) the backend refuses the loop action, clearly.
    assert feed.run("from kernos.inspector.widget import kernel_backend").committed
    inside = feed.value(
        "[kernel_backend().request({'v': 1, 'action': 'loop', 'do': do, 'agent': 'carol'})"
        " for do in ('status', 'resume')]")
    assert [reply["error"]["kind"] for reply in inside] == ["invalid", "invalid"], inside
    assert "cannot run from inside a cell" in inside[1]["error"]["message"]
    assert _loop(panel, "carol")["status"] == "stopped"

    # An inspector starts no loop: that would run code.
    started = panel.ask("loop", do="start", agent="carol", step="n = 2")
    assert started["error"]["kind"] == "denied", started
    assert "agents.loop(NAME, STEP)" in started["error"]["message"]
    assert _loop(panel, "carol")["status"] == "stopped"


def test_the_widget_s_buttons_pause_a_loop_and_reset_its_circuit_in_a_real_kernel(
        kernel: Any) -> None:
    from integration.test_fork_widget import _described
    from integration.test_inspector_widget import Frontend, committed, kernel_value

    frontend = Frontend(kernel)
    committed(frontend.run("agents.add('carol')\nagents.policy('carol', failures=1)\n"
                           "agents.loop('carol', 'n = 1', every_ms=3_600_000)"))
    committed(frontend.run("import kernos\nkernos.inspect()"))
    status, tabs = frontend.children(frontend.views[0])
    frontend.set(tabs, selected_index=5)
    assert frontend.models[tabs]["titles"][5] == "Agents"
    [loops] = frontend.find("HTMLModel", ">pending<")
    assert ">carol<" in frontend.models[loops]["value"]

    frontend.click(_described(frontend, "ButtonModel", "Pause"))
    assert "carol&#x27;s loop is paused" in frontend.models[status]["value"]
    assert kernel_value(frontend, "agents.loops()[0]['status']") == "paused"
    assert ">paused<" in frontend.models[loops]["value"]

    frontend.run("%%agent carol\n1 / 0")
    frontend.run("%%agent carol\nx = 1")   # refused: the circuit is open
    assert ">paused (tripped: failures)<" in frontend.models[loops]["value"]
    reset = _described(frontend, "ButtonModel", "Reset")
    assert frontend.models[reset]["disabled"] is False
    frontend.click(reset)
    assert "carol&#x27;s circuit is closed" in frontend.models[status]["value"]
    assert kernel_value(frontend, "agents.circuit('carol')") is None
    assert frontend.models[reset]["disabled"] is True


def test_a_resume_from_the_panel_wakes_the_driver_and_the_panel_shows_what_it_printed(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    # The driver's idle poll is made huge: the resumed loop turns only if the comm wakes it.
    kernel = kernel_factory(tmp_path / "ws", {"KERNOS_LOOP_IDLE_POLL": "1000000"})
    feed = Feed(kernel)
    step = "print('<b>item</b>', loop_state()['iteration'])"
    assert feed.run(f"agents.add('dave')\nagents.loop('dave', {step!r}, max_iterations=1)\n"
                    "agents.pause('dave')").committed
    panel = Inspector(feed)
    assert _loop(panel, "dave")["output"] is None
    resumed = panel.result("loop", do="resume", agent="dave")
    assert resumed["loop"]["status"] == "running"

    def daves() -> list[dict[str, Any]]:
        return [notice for notice in panel.of_type("committed")
                if notice["principal"] == "dave"]

    feed.pump(lambda: bool(daves()))   # no cell, no request: only the wake turns it
    [iteration] = daves()
    dave = _loop(panel, "dave")
    assert (dave["status"], dave["iteration"], dave["last_op"]) == ("finished", 1,
                                                                    iteration["op"])
    assert dave["output"] == {"op": iteration["op"], "iteration": 0,
                              "text": "<b>item</b> 0\n", "cut": 0}
