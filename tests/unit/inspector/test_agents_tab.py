"""The inspector widget's Agents tab, in process: loops, circuits and memory, with the
human's buttons, live after every op, and every string from agent code escaped."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kernos.agents import loop
from kernos.inspector.backend import notice_of
from kernos.inspector.widget import Inspector

from .test_widget import show_tab


def table_rows(html: str) -> list[list[str]]:
    """The cells of a table the tab made (header row left out); cells may hold newlines."""
    rows = re.findall(r"<tr>(.*?)</tr>", html, re.S)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows[1:]]


def human(env: Any, change: Callable[[], object]) -> None:
    """``change`` in an op by the human, its notice given to the watchers (as the kernel does)."""
    op = env.image.begin(source="test setup", principal="human")
    try:
        change()
    except BaseException:
        op.abort()
        raise
    report = op.commit()
    env.backend.notify({"type": "committed", "op": report.op, "commit": report.commit,
                        "principal": "human", "added": [], "changed": [], "deleted": [],
                        "events": 0})


def agent_op(env: Any, agent: str, code: str) -> str:
    reply = env.service.handle({"v": 1, "action": "op", "principal": agent, "code": code}).reply
    notice = notice_of(reply)
    if notice is not None:
        env.backend.notify(notice)
    return str(reply["result"]["status"])


def test_a_loop_paused_by_its_button_and_a_tripped_circuit_reset_by_its_button(
        env: Any, comms: Any) -> None:
    inspector = Inspector(env.backend)
    show_tab(inspector, "Agents")
    tab = inspector.agents.tab
    assert "No loops" in tab.loops_table.value and "No agents yet." in tab.circuits_table.value
    env.send(action="add_agent", agent="bob")
    human(env, lambda: (env.runtime.breakers.set_policy("bob", failures=1),
                        loop.start(env.runtime, "bob", "n = 1", pending=["<i>a</i>", 2])))
    assert table_rows(tab.loops_table.value) == [["bob", "running", "0", "2", "", "", ""]]
    assert list(tab.loop_chosen.options) == ["bob"]

    tab.pause.click()
    assert "paused" in inspector.status.value, inspector.status.value
    assert table_rows(tab.loops_table.value)[0][1] == "paused"
    assert "bob&#x27;s loop is paused (op" in inspector.status.value
    assert loop.state_of(env.image, "bob").status == "paused"  # type: ignore[union-attr]

    # Failures count outside the image: a rolled-back op refreshes the tab.
    assert agent_op(env, "bob", "1 / 0") == "failed"
    assert agent_op(env, "bob", "x = '<script>alert(1)</script>'") == "refused"
    loops = table_rows(tab.loops_table.value)
    assert loops[0][1] == "paused (tripped: failures)"
    assert "1 op(s) of &#x27;bob&#x27; in a row did not commit" in loops[0][5]
    circuits = table_rows(tab.circuits_table.value)
    assert circuits[0][:3] == ["bob", "failures=1", "open: failures"]
    assert list(tab.circuit_chosen.options) == ["bob"] and not tab.reset.disabled

    tab.reset.click()
    assert table_rows(tab.circuits_table.value)[0][2] == "closed"
    assert tab.reset.disabled and "bob&#x27;s circuit is closed" in inspector.status.value
    assert env.runtime.breakers.circuit("bob") is None

    tab.stop.click()
    assert table_rows(tab.loops_table.value)[0][1] == "stopped"
    assert tab.stop.disabled  # a stopped loop is final: nothing left to act on


def test_a_loop_s_last_output_is_shown_escaped_and_restore_is_offered_only_with_a_safe_point(
        env: Any, comms: Any) -> None:
    inspector = Inspector(env.backend)
    show_tab(inspector, "Agents")
    tab = inspector.agents.tab
    env.send(action="add_agent", agent="bob")
    step = ("print('<script>alert(1)</script> item', loop_state()['iteration'])\n"
            "print('x' * 3000)\n")
    human(env, lambda: (env.runtime.breakers.set_policy("bob", failures=1),
                        loop.start(env.runtime, "bob", step)))
    turn = loop.run_once(env.runtime, "bob")
    assert turn.committed and turn.report is not None
    env.backend.notify({"type": "committed", "op": turn.op, "commit": turn.report.commit,
                        "principal": "bob", "added": [], "changed": [], "deleted": [],
                        "events": 1})
    shown = table_rows(tab.loops_table.value)[0][6]
    assert shown.startswith("&lt;script&gt;alert(1)&lt;/script&gt; item 0\n" + "x" * 100)
    assert "<script>" not in tab.loops_table.value
    # 2,000 characters kept of the 3,034 printed: the cell says how many were cut
    assert shown.endswith(" [cut: 1034 more characters]"), shown[-80:]

    # No checkpoint tagged safe: the box cannot be ticked, and a reset restores nothing.
    assert agent_op(env, "bob", "1 / 0") == "failed"
    assert tab.circuit_chosen.value == "bob" and not tab.reset.disabled
    assert tab.restore.disabled and not tab.restore.value
    assert "no safe checkpoint" in tab.restore.description
    tab.restore.value = True  # a frontend that ticks it anyway sends restore=False
    tab.reset.click()
    assert env.runtime.breakers.circuit("bob") is None
    assert "back to op" not in inspector.status.value

    human(env, lambda: env.runtime.breakers.checkpoint("bob"))
    point = env.runtime.breakers.safe_point("bob")
    assert type(point) is int
    assert agent_op(env, "bob", "1 / 0") == "failed"
    assert not tab.restore.disabled and f"(op {point})" in tab.restore.description
    tab.restore.value = True
    tab.reset.click()
    assert f"its namespace is back to op {point}" in inspector.status.value


def test_memory_search_as_an_agent_escapes_what_agents_wrote(env: Any, comms: Any) -> None:
    inspector = Inspector(env.backend)
    show_tab(inspector, "Agents")
    tab = inspector.agents.tab
    env.send(action="add_agent", agent="bob")
    env.op("note = 'the zebra migrates'")
    assert agent_op(env, "bob", "seen = '<img src=x onerror=alert(1)> zebra'") == "committed"
    assert "episodic 3" in tab.counts.value
    assert list(tab.principal.options) == ["human", "bob"]

    tab.principal.value = "bob"
    tab.query.value = "zebra"
    tab.search.click()
    assert tab.results.value == "" and "memory:read" in inspector.status.value
    env.send(action="grant", agent="bob", capability="memory:read")
    tab.search.click()
    rows = table_rows(tab.results.value)
    assert rows, (tab.results.value, inspector.status.value)
    assert {row[3] for row in rows} == {"bob"}   # bob may not read the human's note
    assert "<img" not in tab.results.value and "&lt;img src=x" in tab.results.value

    tab.principal.value = "human"
    tab.search.click()
    assert ["working", "note: str", "", "human"] in [row[:4] for row in
                                                    table_rows(tab.results.value)]
