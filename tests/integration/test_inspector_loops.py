"""Loops, circuits and memory through a real kernel's ``kernos.inspector`` comm.

What the sidebar's and the widget's Agents tab rely on: the ``loops``,
``circuits`` and ``memory`` reads, and the human's controls ``set_loop`` and
``reset_circuit``, each an op by ``human`` whose notice refreshes the views.
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
    found = [entry for entry in panel.result("circuits")["circuits"] if entry["agent"] == agent]
    assert len(found) == 1, found
    return found[0]


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
    reset = panel.result("reset_circuit", agent="bob")
    assert reset["reset"] == {"agent": "bob", "was_open": "failures", "restored_from": None}
    notices = panel.of_type("committed")[before:]
    assert [(n["op"], n["principal"]) for n in notices] == [(reset["op"], "human")]
    assert _circuit(panel, "bob")["circuit"] is None
    assert feed.run("%%agent bob\nx = 1").committed
    audit = panel.result("audit", principal="human")["records"]
    assert any(record.get("op") == reset["op"] for record in audit)

    # Errors name what was wrong; an inspector still runs no code.
    unknown = panel.ask("reset_circuit", agent="nobody")
    assert unknown["error"]["kind"] == "unknown_principal", unknown
    for action, fields in (("op", {"principal": "human", "code": "x = 1"}),
                           ("grant", {"agent": "bob", "capability": "read:x"})):
        denied = panel.ask(action, **fields)
        assert denied["error"]["kind"] == "denied", denied
        assert "reset a circuit" in denied["error"]["message"]
    bad = panel.ask("set_loop", agent="bob", status="exploded")
    assert bad["error"]["kind"] == "malformed" and "running, paused, stopped" in \
        bad["error"]["message"]


def test_recall_from_the_panel_as_an_agent_returns_only_what_it_may_read(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "ws")
    feed = Feed(kernel)
    assert feed.run("agents.add('bob')\nnote = 'the zebra migrates at dawn'").committed
    assert feed.run("%%agent bob\nfinding = 'zebra stripes confuse flies'").committed
    panel = Inspector(feed)

    memory = panel.result("memory")
    assert memory["results"] is None and memory["principal"] == "human"
    assert memory["counts"]["working"] >= 1 and memory["counts"]["episodic"] >= 2

    def found(principal: str) -> set[tuple[str, str | None]]:
        results = panel.result("memory", query="zebra", principal=principal)["results"]
        for result in results:
            assert set(result) == {"kind", "title", "op", "principal", "name", "at",
                                   "status", "text"}
        return {(result["kind"], result["name"]) for result in results
                if result["kind"] == "working"} | {
            (result["kind"], result["principal"]) for result in results
            if result["kind"] == "episodic"}

    assert {("working", "note"), ("episodic", "human")} <= found("human")
    assert ("episodic", "bob") not in found("human")   # bob's ops are his own memory
    as_bob = found("bob")
    assert ("episodic", "bob") in as_bob
    assert ("working", "note") not in as_bob and ("episodic", "human") not in as_bob
    assert feed.run("agents.grant('bob', 'read:note')").committed
    assert ("working", "note") in found("bob")

    narrowed = panel.result("memory", query="zebra", principal="human", kinds=["working"])
    assert {result["kind"] for result in narrowed["results"]} == {"working"}
    unknown = panel.ask("memory", query="zebra", principal="nobody")
    assert unknown["error"]["kind"] == "unknown_principal"
    for fields in ({"kinds": ["secret"]}, {"k": 0}, {"query": ""}):
        bad = panel.ask("memory", **fields)
        assert bad["error"]["kind"] == "malformed", (fields, bad)
