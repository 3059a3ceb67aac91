"""The inspector widget's history shows tracked files (issue 36): a column counting each
op's files, and the files that differ in a diff (kernos.inspector.tabs)."""

from __future__ import annotations

import re
from typing import Any

from kernos.inspector.widget import Inspector
from unit.inspector.test_widget import show_tab, table_rows


def test_history_counts_files_and_the_diff_lists_them(env: Any, comms: Any) -> None:
    env.op("import kernos.files\nkernos.files.path('out.csv').write_text('a\\n')")
    env.op("kernos.files.path('out.csv').write_text('a\\nb\\n')\n"
           "kernos.files.path('chart.svg').write_bytes(b'\\0svg')")
    env.op("x = 1")
    inspector = Inspector(env.backend)
    show_tab(inspector, "History")
    history = inspector.history
    assert [row[-1] for row in table_rows(history.table.value)] == [
        "", "+1 ~1 -0", "+1 ~0 -0"]
    history.a.value = history.snapshots[2]["commit"]
    history.b.value = history.snapshots[1]["commit"]
    history.diff_button.click()
    diff = history.diff.value
    files = table_rows(diff.split("tracked files</div>")[1])
    assert files == [["+", "chart.svg", "4 B", "binary: no text diff"],
                     ["~", "out.csv", "2 B -&gt; 4 B", ""]], diff
    history.a.value = history.b.value
    history.diff_button.click()
    assert re.search("the same names and values, and the\\s+same files", history.diff.value)


def test_an_agents_log_names_no_file(env: Any) -> None:
    env.op("import kernos.files\nx = 1\nkernos.files.path('secret.txt').write_text('s')")
    env.send(action="add_agent", agent="bot")
    env.send(action="grant", agent="bot", capability="read:x")
    human = env.send(action="log")["result"]["snapshots"]
    agent = env.send(action="log", principal="bot")["result"]["snapshots"]
    wrote = [entry for entry in human if entry["files"]]
    assert [entry["files"] for entry in wrote] == [{"added": ["secret.txt"]}]
    seen = [entry for entry in agent if entry["op"] == wrote[0]["op"]]
    assert seen and seen[0]["changes"]["added"] == ["x"], agent  # it sees the op...
    assert seen[0]["files"] == {}  # ...but not the paths of the files it wrote
