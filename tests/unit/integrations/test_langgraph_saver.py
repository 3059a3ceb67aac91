"""KernosSaver over an in-process harness service (``kernos.harness.checkpoint_requests``).

The requests travel as JSON through a KernosClient double that hands them to a
``HarnessService`` on a temp workspace, so LangGraph's conformance suite, the
op per change, the rollback of a failed change and the cost of a put run in
milliseconds here; ``tests/integration/test_langgraph*.py`` do the same against a
real kernel process.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)

from harness_support import Harness, LocalClient
from kernos.client import RequestError
from kernos.errors import UsageError
from kernos.harness import checkpoint_requests
from kernos.harness.checkpoint_requests import page_name
from kernos.integrations.langgraph import LIST_PAGE, KernosSaver, task_key

VERSIONS = itertools.count(1)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    opened = Harness(tmp_path / "ws")
    opened.service.max_request_bytes = 4 * 1024 * 1024
    yield opened
    opened.env.close()


@pytest.fixture
def saver(harness: Harness) -> KernosSaver:
    made = KernosSaver(LocalClient(harness), principal="graph")
    made.setup()
    return made


def test_the_conformance_suite_reports_full(saver: KernosSaver) -> None:
    @checkpointer_test(name="KernosSaver (in-process)")
    async def factory() -> Any:
        yield saver

    report = asyncio.run(validate(factory))
    failures = {name: result.failures for name, result in report.results.items()
                if result.failures}
    assert report.conformance_level() == "FULL", failures
    assert all(result.detected for result in report.results.values()), report.to_dict()


def _put(saver: KernosSaver, thread: str, parent: RunnableConfig | None = None,
         values: dict[str, Any] | None = None, **metadata: Any) -> RunnableConfig:
    config = generate_config(thread)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    checkpoint = generate_checkpoint(channel_values=values or {})
    versions: ChannelVersions = {name: f"{next(VERSIONS):032}.0" for name in values or {}}
    checkpoint["channel_versions"] = versions
    return saver.put(config, checkpoint, generate_metadata(**metadata), versions)


def test_each_change_is_one_op_of_the_principal_and_reads_run_none(
        harness: Harness, saver: KernosSaver) -> None:
    before = len(harness.records())
    first = _put(saver, "t-1", values={"messages": ["hi"]}, step=0)
    saver.put_writes(first, [("messages", "there")], "task-1")
    ops = harness.records()[before:]
    assert [(op["principal"], op["status"]) for op in ops] == [("graph", "committed")] * 2
    assert ops[0]["changes"]["added"] == [page_name("graph", "t-1", 0)]
    assert "checkpoint_writes" in ops[1]["code"]["text"]
    assert "there" not in json.dumps(ops[1])  # ids and sizes, never the values
    reads = len(harness.records())
    assert saver.get_tuple(generate_config("t-1")) is not None
    assert len(list(saver.list(None))) == 1
    assert len(harness.records()) == reads
    stored = harness.env.image.lookup(page_name("graph", "t-1", 0))
    assert isinstance(stored, dict) and ("c", "", first["configurable"]["checkpoint_id"]) in stored
    log = harness.ok(action="log", limit=2)["snapshots"]
    assert [entry["principal"] for entry in log] == ["graph", "graph"]
    assert "langgraph put t-1 step 0" in log[1]["message"], log


def test_another_principal_does_not_see_the_threads(harness: Harness,
                                                      saver: KernosSaver) -> None:
    _put(saver, "t-1", values={"x": 1})
    other = KernosSaver(LocalClient(harness), principal="other")
    other.setup()
    assert other.get_tuple(generate_config("t-1")) is None
    assert list(other.list(None)) == []
    other.delete_thread("t-1")
    assert saver.get_tuple(generate_config("t-1")) is not None
    agent = harness.op("x = 1", principal="graph")
    assert agent["status"] == "committed"
    denied = harness.op(f"y = read({page_name('graph', 't-1', 0)!r})", principal="graph")
    assert denied["status"] != "committed"


def test_a_change_that_fails_rolls_back_whole(harness: Harness, saver: KernosSaver,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    first = _put(saver, "t-1", values={"a": "one"}, step=0)
    name = page_name("graph", "t-1", 0)
    stored = dict(harness.env.image.lookup(name))

    # The put stores its blobs, then dies before the checkpoint itself: nothing is kept.
    original = checkpoint_requests.CheckpointRequests._append

    def half(self: Any, principal: str, thread: str, added: Any) -> None:
        original(self, principal, thread, {key: value for key, value in added.items()
                                           if key[0] == "b"})
        raise RuntimeError("died in the middle of a put")

    monkeypatch.setattr(checkpoint_requests.CheckpointRequests, "_append", half)
    with pytest.raises(RequestError) as failed:
        _put(saver, "t-1", first, values={"a": "two"}, step=1)
    assert failed.value.kind == "internal"
    monkeypatch.undo()
    assert harness.env.image.lookup(name) == stored
    assert harness.records()[-1]["status"] == "failed"
    latest = saver.get_tuple(generate_config("t-1"))
    assert latest is not None and latest.checkpoint["channel_values"] == {"a": "one"}


def test_bad_input_is_refused_before_an_op_with_a_clear_message(harness: Harness,
                                                                saver: KernosSaver) -> None:
    error = harness.error(action="checkpoint_put", principal="graph", thread="t",
                          checkpoint={"id": "1", "type": "json", "data": "not base64!",
                                      "metadata": {}, "versions": {}})
    assert error["kind"] == "malformed" and "base64" in error["message"]
    assert harness.records()[-1]["status"] == "rejected"
    error = harness.error(action="checkpoint_prune", principal="graph", threads=["t"],
                          strategy="keep_some")
    assert error["kind"] == "malformed" and "keep_latest" in error["message"]
    error = harness.error(action="checkpoint_get", principal="nobody", thread="t")
    assert error["kind"] == "unknown_principal"
    with pytest.raises(UsageError, match="JSON data"):
        _put(saver, "t", values={"a": 1}, step=0, when=object())
    with pytest.raises(UsageError, match="thread id"):
        saver.get_tuple({"configurable": {"thread_id": ""}})
    with pytest.raises(UsageError, match="running LangGraph task"):
        task_key({"configurable": {"thread_id": "t"}})


def test_task_key_names_the_thread_and_task() -> None:
    config = {"configurable": {"thread_id": "t-1", "checkpoint_ns": "",
                               "__pregel_task_id": "abc"}}
    assert task_key(config) == "langgraph:t-1::abc"  # type: ignore[arg-type]
    assert task_key(config, "mail") == "langgraph:t-1::abc:mail"  # type: ignore[arg-type]
    config["configurable"]["thread_id"] = "x" * 300
    assert len(task_key(config)) <= 200  # type: ignore[arg-type]


def _step(saver: KernosSaver, thread: str, parent: RunnableConfig | None,
          step: int) -> RunnableConfig:
    """One step of a graph: a put (a checkpoint with one changed channel) and its writes."""
    stored = _put(saver, thread, parent, values={"messages": [f"message {step}"] * 4},
                  step=step)
    saver.put_writes(stored, [("messages", f"write {step}")], f"task-{step}")
    return stored


def test_a_put_costs_about_the_same_at_1000_checkpoints_as_at_10(
        harness: Harness, saver: KernosSaver, record_property: Any) -> None:
    long = None
    for step in range(990):
        long = _step(saver, "long", long, step)
    short = None
    timings: dict[str, list[float]] = {"short": [], "long": []}
    for step in range(10):  # interleaved, so that the machine's load weighs on both alike
        started = time.perf_counter()
        short = _step(saver, "short", short, step)
        middle = time.perf_counter()
        long = _step(saver, "long", long, 990 + step)
        timings["short"].append(middle - started)
        timings["long"].append(time.perf_counter() - middle)
    small, large = (sorted(timings[thread])[5] * 1000 for thread in ("short", "long"))
    pages = [name for name in harness.env.image.system if name.startswith("kernos:langgraph")]
    record_property("summary:langgraph put (in-process)",
                    f"put + put_writes, median: thread of 1-10 checkpoints {small:.2f} ms, "
                    f"of 991-1,000 {large:.2f} ms ({len(pages)} pages in all)")
    assert large < 3 * small, (small, large)  # one page re-stored, not the thread
    assert len(pages) < 20


def test_the_principal_s_circuit_breaker_bounds_the_graph(harness: Harness,
                                                          saver: KernosSaver) -> None:
    harness.ok(action="policy", agent="graph", set={"iterations": 3})
    parent = None
    for step in range(3):
        parent = _put(saver, "t-1", parent, values={"n": step}, step=step)
    with pytest.raises(RequestError) as refused:
        _put(saver, "t-1", parent, values={"n": 3}, step=3)
    assert refused.value.kind == "denied" and "iterations" in refused.value.message
    latest = saver.get_tuple(generate_config("t-1"))
    assert latest is not None and latest.checkpoint["channel_values"] == {"n": 2}


def test_a_write_sent_again_keeps_the_first_and_stores_nothing(harness: Harness,
                                                               saver: KernosSaver) -> None:
    stored = _put(saver, "t-1", values={"a": 1}, step=0)
    saver.put_writes(stored, [("ch", "first")], "task-1")
    head = harness.ok(action="log", limit=1)["snapshots"][0]["commit"]
    saver.put_writes(stored, [("ch", "second")], "task-1")
    assert harness.records()[-1]["status"] == "committed"
    assert harness.ok(action="log", limit=1)["snapshots"][0]["commit"] == head  # no snapshot
    found = saver.get_tuple(stored)
    assert found is not None and found.pending_writes == [("task-1", "ch", "first")]


def test_prune_keeps_the_latest_checkpoint_and_only_what_it_reads(harness: Harness,
                                                                  saver: KernosSaver) -> None:
    parent = None
    for step in range(5):
        parent = _put(saver, "t-1", parent, values={"n": step}, step=step)
    assert parent is not None
    saver.put_writes(parent, [("ch", "kept")], "task-1")
    result = harness.ok(action="checkpoint_prune", principal="graph", threads=["t-1"])
    assert result["removed"] == 4
    page = harness.env.image.lookup(page_name("graph", "t-1", 0))
    assert isinstance(page, dict) and sorted(key[0] for key in page) == ["b", "c", "w"]
    latest = saver.get_tuple(generate_config("t-1"))
    assert latest is not None and latest.checkpoint["channel_values"] == {"n": 4}
    assert latest.pending_writes == [("task-1", "ch", "kept")]


def test_without_langgraph_the_import_names_the_extra_to_install() -> None:
    code = ("import sys\n"
            "sys.modules['langgraph'] = None\n"  # as if LangGraph were not installed
            "try:\n"
            "    import kernos.integrations.langgraph\n"
            "except ImportError as error:\n"
            "    print(error)\n")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, check=True).stdout
    assert "pip install 'kernos[langgraph]'" in shown, shown


def test_a_long_history_is_listed_in_pages_as_the_caller_iterates(
        harness: Harness, saver: KernosSaver) -> None:
    assert isinstance(saver.client, LocalClient)
    sent = saver.client.sent
    parent, ids = None, []
    for step in range(LIST_PAGE * 2 + 50):
        parent = _put(saver, "t-1", parent, step=step)
        ids.append(parent["configurable"]["checkpoint_id"])
    sent.clear()
    listed = [found.checkpoint["id"] for found in saver.list(generate_config("t-1"))]
    assert listed == ids[::-1] and sent.count("checkpoint_list") == 3
    sent.clear()
    assert len(list(saver.list(generate_config("t-1"), limit=LIST_PAGE + 1))) == LIST_PAGE + 1
    assert sent.count("checkpoint_list") == 2
    sent.clear()
    first = next(iter(saver.list(generate_config("t-1"))))
    assert first.checkpoint["id"] == ids[-1] and sent.count("checkpoint_list") == 1
    before = generate_config("t-1", checkpoint_id=ids[10])
    assert [found.checkpoint["id"] for found in saver.list(
        generate_config("t-1"), before=before)] == ids[:10][::-1]
