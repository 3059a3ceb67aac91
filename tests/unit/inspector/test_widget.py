"""The inspector widget in-process: a ServiceBackend over a HarnessService, recording comms.

What must hold: after a committed op the visible data is read again; after a
rolled-back op nothing is read and nothing but the status line is sent; a
checkout happens only after it is confirmed; objects are filtered, sorted and
paged by the harness (a page at a time); every hostile string is escaped; the
widget keeps no reference to an object of the image, and a closed, collected
widget is no longer told about ops.
"""

from __future__ import annotations

import gc
import json
import re
import time
import weakref
from typing import Any

import ipywidgets
import pytest

from kernos.errors import UsageError
from kernos.inspector.widget import EVENTS_SHOWN, PAGE_SIZE, Inspector

HOSTILE = "<script>alert(1)</script>"


class CountingBackend:
    """A backend that remembers the actions it was asked for."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.actions: list[str] = []

    def request(self, content: dict[str, Any]) -> dict[str, Any]:
        self.actions.append(content["action"])
        reply: dict[str, Any] = self.inner.request(content)
        return reply

    def watch(self, callback: Any) -> Any:
        return self.inner.watch(callback)


def descendants(widget: Any) -> list[Any]:
    found = [widget]
    for child in getattr(widget, "children", ()):
        found.extend(descendants(child))
    return found


def html_values(inspector: Inspector) -> list[str]:
    return [widget.value for widget in descendants(inspector)
            if isinstance(widget, ipywidgets.HTML)]


def table_rows(html: str) -> list[list[str]]:
    """The cells of an HTML table made by the widget (header row left out)."""
    rows = re.findall(r"<tr>(.*?)</tr>", html)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows[1:]]


def names_shown(inspector: Inspector) -> list[str]:
    return [row[0] for row in table_rows(inspector.objects.table.value)]


def show_tab(inspector: Inspector, title: str) -> None:
    inspector.tabs.selected_index = list(inspector.tabs.titles).index(title)


# -- objects ------------------------------------------------------------------------------

def test_committed_ops_refresh_the_objects_table(env: Any, comms: Any) -> None:
    inspector = Inspector(env.backend)
    assert "No objects yet." in inspector.objects.table.value
    assert inspector.objects.pages.value.startswith("page 1 of 1")

    env.op("x = 1\nitems = [1, 2, 3]")
    assert names_shown(inspector) == ["items", "x"]
    assert "op 1 committed by human: 2 added" in inspector.status.value
    assert "2 objects" in inspector.objects.pages.value
    # The new table reached the frontend as a state update of the table's model.
    table_id = inspector.objects.table.model_id
    updates = [data["state"]["value"] for comm_id, data in comms.log
               if comm_id == table_id and data.get("method") == "update"
               and "value" in data.get("state", {})]
    assert "items" in updates[-1]

    env.op("del x\nitems.append(4)")
    assert names_shown(inspector) == ["items"]
    row = table_rows(inspector.objects.table.value)[0]
    assert row[1:5] == ["list", row[2], "2", "2"]  # type, size, version 2, last op 2
    assert "1 changed, 1 deleted" in inspector.status.value


def test_rolled_back_ops_read_nothing_and_send_only_a_status_line(env: Any, comms: Any) -> None:
    counting = CountingBackend(env.backend)
    env.op("x = 1")
    inspector = Inspector(counting)
    inspector.objects.chosen.value = "x"
    for title in ("Events", "Capabilities", "History", "Plot", "Objects"):
        show_tab(inspector, title)
    before_state = {id(w): w.get_state() for w in descendants(inspector)
                    if w is not inspector.status}
    counting.actions.clear()
    sent_before = len(comms.log)

    result = env.op("x = 2\ny = 3\nraise ValueError('no')")
    assert result["status"] == "failed"  # rolled back: a notice of type rolled_back
    env.send(action="op", principal="human", code="1 / 0")

    assert counting.actions == []
    assert {id(w): w.get_state() for w in descendants(inspector)
            if w is not inspector.status} == before_state
    assert {comm_id for comm_id, _ in comms.log[sent_before:]} == {inspector.status.model_id}
    assert "rolled back" in inspector.status.value and "ZeroDivisionError" in \
        inspector.status.value
    # The next commit reads again.
    env.op("z = 1")
    assert "objects" in counting.actions
    assert names_shown(inspector) == ["x", "z"]


def test_filter_sort_and_pages_over_120_objects(env: Any, comms: Any) -> None:
    env.op("for i in range(120):\n"
           "    globals()[f'obj_{i:03d}'] = 'v' * (i * 10) if i % 2 else list(range(i))\n"
           "del i")
    counting = CountingBackend(env.backend)
    inspector = Inspector(counting)
    objects = inspector.objects
    assert objects.pages.value == "page 1 of 3 &middot; 120 objects"
    assert names_shown(inspector) == [f"obj_{i:03d}" for i in range(PAGE_SIZE)]
    assert objects.previous.disabled and not objects.next.disabled

    objects.next.click()
    assert objects.pages.value.startswith("page 2 of 3")
    assert names_shown(inspector)[0] == "obj_050"
    objects.next.click()
    assert names_shown(inspector) == [f"obj_{i:03d}" for i in range(100, 120)]
    assert objects.next.disabled
    objects.next.click()  # past the last page: nothing happens
    assert objects.pages.value.startswith("page 3 of 3")
    objects.previous.click()
    assert objects.pages.value.startswith("page 2 of 3")

    objects.query.value = "OBJ_01"  # case-insensitive, back to the first page
    assert objects.pages.value == "page 1 of 1 &middot; 10 objects"
    assert names_shown(inspector) == [f"obj_{i:03d}" for i in range(10, 20)]
    objects.query.value = "str"  # the type matches too
    assert objects.pages.value == "page 1 of 2 &middot; 60 objects"
    objects.query.value = "no such thing"
    assert "No objects match" in objects.table.value

    objects.query.value = ""
    objects.descending.value = True
    assert names_shown(inspector)[:2] == ["obj_119", "obj_118"]
    objects.sort.value = "size"
    sizes = [row[2] for row in table_rows(objects.table.value)]
    assert names_shown(inspector)[0] == "obj_119"  # the longest string is the largest
    assert len(sizes) == PAGE_SIZE
    objects.descending.value = False
    assert names_shown(inspector)[0] in ("obj_000", "obj_001")

    assert set(counting.actions) <= {"objects", "object"}


def test_only_a_page_is_requested(env: Any, comms: Any) -> None:
    seen: list[dict[str, Any]] = []

    class Recording(CountingBackend):
        def request(self, content: dict[str, Any]) -> dict[str, Any]:
            seen.append(content)
            return super().request(content)

    env.op("a = 1")
    Inspector(Recording(env.backend))
    objects = [content for content in seen if content["action"] == "objects"]
    assert objects and all(content["limit"] == PAGE_SIZE for content in objects)


def test_preview_of_the_chosen_object_is_bounded_and_follows_commits(env: Any,
                                                                   comms: Any) -> None:
    env.op("big = 'x' * 100_000\nsmall = {'k': 1}")
    inspector = Inspector(env.backend)
    assert "Choose an object" in inspector.objects.preview.value
    inspector.objects.chosen.value = "big"
    assert "<b>big</b>: str" in inspector.objects.preview.value
    assert len(inspector.objects.preview.value) < 5_000
    inspector.objects.chosen.value = "small"
    assert "{&#x27;k&#x27;: 1}" in inspector.objects.preview.value
    env.op("small['k'] = 2")
    assert inspector.objects.chosen.value == "small"
    assert "{&#x27;k&#x27;: 2}" in inspector.objects.preview.value
    env.op("del small")
    assert inspector.objects.chosen.value is None


# -- hostile strings -----------------------------------------------------------------------

def test_hostile_names_reprs_and_payloads_are_escaped(env: Any, comms: Any) -> None:
    env.op(f"globals()[{HOSTILE!r}] = 1\n"
           "class Hostile:\n"
           f"    def __repr__(self):\n        return {HOSTILE!r}\n"
           "h = Hostile()\n"
           f"events.emit('page.shown', {{'html': {HOSTILE!r}}})")
    env.op(f"h.note = {HOSTILE!r}\nglobals()[{HOSTILE!r}] = 2")
    inspector = Inspector(env.backend)
    inspector.objects.chosen.value = "h"
    for title in ("Events", "Capabilities", "Plot", "History"):
        show_tab(inspector, title)
    history = inspector.history
    history.a.value = history.snapshots[-1]["commit"]
    history.b.value = history.snapshots[0]["commit"]
    history.diff_button.click()
    env.op(f"x = 1  # {HOSTILE}")  # a hostile status line and message
    values = html_values(inspector)
    joined = "".join(values)
    assert "<script" not in joined.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in inspector.objects.table.value
    assert "&lt;script&gt;" in inspector.objects.preview.value
    assert "&lt;script&gt;" in inspector.events.log.value
    assert "&lt;script&gt;" in history.diff.value
    # Nor anything sent to the frontend as HTML.
    html_ids = {widget.model_id for widget in descendants(inspector)
                if isinstance(widget, ipywidgets.HTML)}
    for comm_id, data in comms.log:
        if comm_id in html_ids:
            assert "<script" not in json.dumps(data).lower()


# -- events, capabilities, history, plot -------------------------------------------------------

def test_events_are_a_bounded_filtered_live_log(env: Any, comms: Any) -> None:
    env.send(action="add_agent", agent="bot")
    inspector = Inspector(env.backend)
    show_tab(inspector, "Events")
    log = inspector.events.log
    assert "No events yet." in log.value
    env.op("events.emit('orders.created', {'n': 1})\n"
           "events.emit('stock.low', {'sku': 'a'}, principal='bot')")
    rows = table_rows(log.value)
    assert [(row[1], row[2], row[3]) for row in rows] == [
        ("op 2", "human", "orders.created"), ("op 2", "bot", "stock.low")]
    env.op("events.emit('orders.paid', {'n': 1})")
    assert [row[3] for row in table_rows(log.value)] == ["orders.created", "stock.low",
                                                          "orders.paid"]
    inspector.events.topic.value = "orders.*"
    assert [row[3] for row in table_rows(log.value)] == ["orders.created", "orders.paid"]
    inspector.events.principal.value = "bot"
    assert "No events match" in log.value
    inspector.events.topic.value = ""
    assert [row[3] for row in table_rows(log.value)] == ["stock.low"]
    inspector.events.principal.value = ""

    env.op("for n in range(600):\n    events.emit('bulk.item', {'n': n})")
    rows = table_rows(log.value)
    assert len(rows) == EVENTS_SHOWN
    assert rows[-1][4] == "{&quot;n&quot;: 599}"  # newest last
    assert f"newest {EVENTS_SHOWN}" in log.value


def test_a_bad_topic_pattern_is_an_error_line_not_an_exception(env: Any, comms: Any) -> None:
    inspector = Inspector(env.backend)
    show_tab(inspector, "Events")
    inspector.events.topic.value = "orders..x"
    assert "events failed" in inspector.status.value
    inspector.events.topic.value = "orders.*"
    assert inspector.status.value == ""
    assert "No events" in inspector.events.log.value


def test_capabilities_show_grants_use_and_revocation(env: Any, comms: Any) -> None:
    inspector = Inspector(env.backend)
    show_tab(inspector, "Capabilities")
    table = inspector.capabilities.table
    assert "No agents yet." in table.value
    env.send(action="add_agent", agent="bot")
    env.send(action="add_agent", agent="idle")
    env.send(action="grant", agent="bot", capability="spend:usd", limit=50)
    env.send(action="grant", agent="bot", capability="read:x")
    rows = table_rows(table.value)
    assert [row[:6] for row in rows] == [
        ["bot", "spend:usd", "50", "0", "50", "active"],
        ["bot", "read:x", "", "", "", "active"],
        ["idle", "(no grants)", "", "", "", ""]]
    env.send(action="revoke", agent="bot", capability="read:x")
    assert table_rows(table.value)[1][5].startswith("revoked at op ")


def test_history_diff_between_two_snapshots(env: Any, comms: Any) -> None:
    env.op("a = 1\nb = 2")
    env.op("a = 10\ndel b\nc = 3")
    inspector = Inspector(env.backend)
    show_tab(inspector, "History")
    history = inspector.history
    assert [row[0] for row in table_rows(history.table.value)] == ["2", "1"]
    assert all(row[5].endswith("B") for row in table_rows(history.table.value))
    assert (history.a.value, history.b.value) == (history.snapshots[1]["commit"],
                                                  history.snapshots[0]["commit"])
    history.diff_button.click()
    diff = history.diff.value
    assert re.search(r"added</div>.*c</td>", diff)
    assert re.search(r"changed</div>.*a</td>", diff)
    assert re.search(r"deleted</div>.*b</td>", diff)
    history.b.value = history.a.value
    history.diff_button.click()
    assert "the same names and values" in history.diff.value


def test_checkout_only_after_confirmation_with_progress(env: Any, comms: Any) -> None:
    env.op("x = 1")
    env.op("x = 2\ny = 'new'")
    inspector = Inspector(env.backend)
    show_tab(inspector, "History")
    history = inspector.history
    first = history.snapshots[-1]["commit"]
    history.target.value = first

    history.checkout_button.click()
    assert history.confirmation.layout.display is None  # the question is shown
    assert "op 1" in history.question.value
    assert env.ns["x"] == 2  # nothing happened yet
    history.cancel.click()
    assert history.confirmation.layout.display == "none"
    assert env.ns["x"] == 2

    history.checkout_button.click()
    history.confirm.click()
    assert env.ns["x"] == 1 and "y" not in env.ns
    assert history.confirmation.layout.display == "none"
    assert "Checked out op 1" in inspector.status.value
    assert history.progress.value == 1.0
    assert "checkout:" in history.progress_text.value
    assert [row[0] for row in table_rows(history.table.value)] == ["3", "2", "1"]
    show_tab(inspector, "Objects")
    assert names_shown(inspector) == ["x"]


def test_a_failed_checkout_is_shown_not_raised(env: Any, comms: Any) -> None:
    env.op("x = 1")
    inspector = Inspector(env.backend)
    show_tab(inspector, "History")
    history = inspector.history
    history.target.options = [("nowhere", "0" * 40)]
    history.target.value = "0" * 40
    history.checkout_button.click()
    history.confirm.click()
    assert "checkout failed" in inspector.status.value
    assert env.ns["x"] == 1


def test_plot_of_sizes_and_latency(env: Any, comms: Any) -> None:
    inspector = Inspector(env.backend)
    show_tab(inspector, "Plot")
    assert "No ops yet." in inspector.plot.chart.value
    env.op("x = 'a' * 1000")
    chart = inspector.plot.chart.value
    assert chart.count("<svg") == 3
    assert "Image size" in chart and "History size on disk" in chart and "Op latency" in chart
    assert "1 op shown" in chart
    env.send(action="op", principal="human", code="1 / 0")
    assert inspector.plot.chart.value == chart  # a rolled-back op is read at the next commit
    env.op("y = 'b' * 5000")
    chart = inspector.plot.chart.value
    assert "3 ops shown (1 did not commit)" in chart
    assert chart.count("<polyline") == 3


# -- references, collection, errors ------------------------------------------------------------

def test_the_widget_keeps_no_reference_to_image_objects(env: Any, comms: Any) -> None:
    env.op("class Thing:\n    pass\nthing = Thing()\nthings = [thing]")
    inspector = Inspector(env.backend)
    inspector.objects.chosen.value = "thing"
    for title in ("Events", "Capabilities", "History", "Plot", "Objects"):
        show_tab(inspector, title)
    inspector.history.diff_button.click()
    alive = weakref.ref(env.ns["thing"])
    env.op("del thing\ndel things")
    gc.collect()
    assert alive() is None
    assert names_shown(inspector) == ["Thing"]


def test_a_closed_collected_widget_is_no_longer_notified(env: Any, comms: Any) -> None:
    inspector = Inspector(env.backend)
    assert len(env.backend.watchers) == 1
    collected = weakref.ref(inspector)
    inspector.close()
    del inspector
    gc.collect()
    assert collected() is None
    assert len(env.backend.watchers) == 0
    sent = len(comms.log)
    env.op("x = 1")  # no watcher left to call
    assert comms.log[sent:] == []


def test_a_collected_widget_is_not_notified_even_unclosed(env: Any, comms: Any) -> None:
    # Its models closed one by one (not through Inspector.close, which unwatches): the
    # backend holds the widget weakly, so once collected it is simply no longer called.
    inspector = Inspector(env.backend)
    collected = weakref.ref(inspector)
    for widget in descendants(inspector):
        ipywidgets.Widget.close(widget)
    del inspector, widget
    gc.collect()
    assert collected() is None
    sent = len(comms.log)
    env.op("x = 1")
    assert comms.log[sent:] == []
    assert len(env.backend.watchers) == 0


def test_errors_in_replies_go_to_the_status_line(env: Any, comms: Any) -> None:
    class Broken:
        def request(self, content: dict[str, Any]) -> dict[str, Any]:
            if content["action"] == "log":
                raise RuntimeError("the backend broke")
            return {"v": 1, "status": "error", "action": content["action"],
                    "error": {"kind": "denied", "message": f"no {HOSTILE}", "data": {}}}

        def watch(self, callback: Any) -> Any:
            return lambda: None

    inspector = Inspector(Broken())
    assert "objects failed (denied): no &lt;script&gt;" in inspector.status.value
    show_tab(inspector, "History")
    assert "log: RuntimeError: the backend broke" in inspector.status.value


def test_inspect_outside_a_kernos_kernel_says_what_to_do() -> None:
    import kernos

    with pytest.raises(UsageError, match="running Kernos kernel"):
        kernos.inspect()


@pytest.mark.slow
def test_refresh_with_10k_objects_reads_one_page(env: Any, comms: Any) -> None:
    env.op("for i in range(10_000):\n    globals()[f'v{i:05d}'] = i\ndel i")
    inspector = Inspector(env.backend)

    def median_ms(action: Any) -> float:
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            action()
            timings.append(time.perf_counter() - started)
        return sorted(timings)[2] * 1000

    figures = {"objects": median_ms(inspector.refresh)}
    inspector.objects.sort.value = "size"
    started = time.perf_counter()
    inspector.objects.query.value = "v09"
    figures["filter"] = (time.perf_counter() - started) * 1000
    for title in ("Events", "Capabilities", "History", "Plot"):
        show_tab(inspector, title)
        figures[title.lower()] = median_ms(inspector.refresh)
    print("refresh with 10k objects, median ms: "
          + ", ".join(f"{name} {value:.1f}" for name, value in figures.items()))
    assert figures["objects"] < 500
    assert all(value < 2_000 for value in figures.values()), figures
    assert inspector.objects.pages.value == "page 1 of 20 &middot; 1,000 objects"


def test_progress_moves_only_the_progress_bar(env: Any, comms: Any) -> None:
    counting = CountingBackend(env.backend)
    inspector = Inspector(counting)
    counting.actions.clear()
    sent = len(comms.log)
    env.backend.notify({"type": "progress", "what": "checkout", "done": 250, "total": 1000})
    assert counting.actions == []
    assert inspector.history.progress.value == 0.25
    assert "250 B of 1.0 kB" in inspector.history.progress_text.value
    assert {comm_id for comm_id, _ in comms.log[sent:]} == {
        inspector.history.progress.model_id, inspector.history.progress_text.model_id}
