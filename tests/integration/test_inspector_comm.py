"""The ``kernos.inspector`` comm through a real kernel: what the JupyterLab panel relies on.

The panel opens the comm, asks harness reads (and checkout) as ``human``, and is
told after every op how it ended: ``committed`` (refresh), ``rolled_back``
(nothing changed), never mid-op; ``progress`` while a checkout loads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from events_support import Feed
from inspector_support import TARGET, Inspector

pytestmark = pytest.mark.kernel

def test_hello_reads_and_notices_after_committed_and_rolled_back_cells(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "ws")
    feed = Feed(kernel)
    assert feed.run("a = 1\nb = [1, 2]").committed
    panel = Inspector(feed)
    hello = panel.of_type("hello")
    assert len(hello) == 1 and hello[0]["hello"]["head"]["op"] >= 1
    assert panel.objects() == {"a": 1, "b": 1}

    cell = feed.run("a = 2\nc = 'new'")
    assert cell.committed
    committed = panel.of_type("committed")
    assert [(n["op"], n["principal"], n["added"], n["changed"]) for n in committed] == [
        (cell.kernos["op"], "human", ["c"], ["a"])]
    assert panel.objects() == {"a": 2, "b": 1, "c": 1}

    before = list(panel.messages)
    failed = feed.run("a = 999\nb.append(3)\nd = 4\n1 / 0")
    assert failed.rolled_back
    fresh = panel.messages[len(before):]
    assert [n["type"] for n in fresh] == ["rolled_back"], fresh
    assert fresh[0]["op"] == failed.kernos["op"] and "ZeroDivisionError" in fresh[0]["error"]
    assert panel.objects() == {"a": 2, "b": 1, "c": 1}
    assert feed.value("(a, b)") == (2, [1, 2])


def test_checkout_from_the_comm_changes_the_namespace_with_progress_and_a_notice(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "ws")
    feed = Feed(kernel)
    assert feed.run("import numpy\nbig = numpy.arange(2_000_000)\nx = 'first'").committed
    first = feed.run("x = 'second'\ny = 2")
    assert first.committed
    panel = Inspector(feed)
    snapshots = panel.result("log")["snapshots"]
    oldest = snapshots[-1]
    assert oldest["bytes"] >= 16_000_000 and snapshots[0]["bytes"] > oldest["bytes"]

    result = panel.result("checkout", ref=oldest["commit"])
    assert result["status"] == "committed" and result["checkout"]["commit"] == oldest["commit"]
    assert feed.value("x") == "first"
    assert feed.value("'y' in globals()") is False
    progress = panel.of_type("progress")
    assert progress and progress[-1]["what"] == "checkout"
    assert progress[-1]["done"] == progress[-1]["total"] >= 16_000_000
    mine = [n for n in panel.of_type("committed") if n["op"] == result["op"]]
    assert len(mine) == 1 and mine[0]["deleted"] == ["y"] and mine[0]["changed"] == ["x"]
    assert panel.objects()["x"] == 3


def test_a_harness_op_and_a_magic_checkout_notify_the_panel_too(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "ws")
    feed = Feed(kernel)
    assert feed.run("n = 1").committed
    panel = Inspector(feed)
    message = feed.client.session.msg("kernos_request", {
        "v": 1, "action": "op", "principal": "human", "code": "n = 2"})
    feed.client.shell_channel.send(message)
    feed._drain(message["header"]["msg_id"])
    reply = feed.client.get_shell_msg(timeout=60)
    assert reply["content"]["result"]["status"] == "committed", reply["content"]
    feed.pump(lambda: bool(panel.of_type("committed")))
    assert [n["changed"] for n in panel.of_type("committed")] == [["n"]]
    head = panel.result("log")["snapshots"][-1]["commit"]
    cell = feed.run(f"%kernos checkout {head}")
    assert cell.committed and feed.value("n") == 1
    assert cell.kernos["op"] in [n["op"] for n in panel.of_type("committed")]
    # The magic's progress reached the panel and IOPub (parent: the cell).
    assert any(p["what"] == "checkout" for p in panel.of_type("progress"))
    assert any(p["what"] == "checkout" for p in feed.progress)


def test_the_comm_refuses_changes_and_malformed_messages_clearly(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "ws")
    feed = Feed(kernel)
    assert feed.run("secret = 1").committed
    panel = Inspector(feed)
    for action, fields in (("op", {"principal": "human", "code": "secret = 2"}),
                           ("grant", {"agent": "a", "capability": "read:secret"}),
                           ("add_agent", {"agent": "a"})):
        reply = panel.ask(action, **fields)
        assert reply["status"] == "error" and reply["error"]["kind"] == "denied", reply
        assert "checkout" in reply["error"]["message"]
    assert feed.value("secret") == 1
    for bad in ("text", {"v": 1, "id": "1", "request": {}}, {"v": 2, "id": 1, "request": {}},
                {"v": 1, "id": 1, "request": {}, "extra": 1}, {"v": 1, "id": -1, "request": {}}):
        count = len(panel.of_type("error"))
        feed.send(panel.comm, bad)
        errors = panel.of_type("error")
        assert len(errors) == count + 1 and '"request"' in errors[-1]["error"], bad
    # A request that is not a valid harness request gets the harness's own error reply.
    reply = panel.ask("objects", sort="sideways")
    assert reply["error"]["kind"] == "malformed" and "descending" in reply["error"]["message"]
    # A bad open is refused and closed.
    refused = feed.open(target=TARGET, data={"v": 1, "since": 0})
    assert refused in feed.closed and "open" in feed.messages[refused][0]["error"]
    assert feed.value("secret") == 1


def test_after_a_restart_a_new_comm_sees_the_same_image(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    kernel = kernel_factory(workspace)
    feed = Feed(kernel)
    assert feed.run("kept = {'a': 1}\nlost = 0").committed
    assert feed.run("del lost").committed
    before = Inspector(feed).objects()
    kernel.kill9()
    kernel = kernel_factory(workspace)
    feed = Feed(kernel)
    panel = Inspector(feed)
    assert panel.objects() == before == {"kept": 1}
    assert panel.of_type("hello")[0]["hello"]["head"]["op"] == 2
