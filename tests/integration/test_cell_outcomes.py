"""What a notebook's cell badges and stale markers read, through a real kernel.

The execute_reply's ``metadata["kernos"]`` names the op, how it ended and the
global names the cell reached (``names``; None for any name); the inspector
comm's notices say which op was a cell's (``request``: its execute_request's
msg_id) and which op checked out what (``checkout``).  The JupyterLab
extension (``extension/src/cells.ts``) builds on exactly these.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from events_support import Feed
from inspector_support import Inspector

pytestmark = pytest.mark.kernel


def run(feed: Feed, code: str) -> tuple[str, dict[str, Any]]:
    """Run a cell; its execute_request's msg_id and its reply's ``metadata["kernos"]``."""
    msg_id = feed.client.execute(code)
    feed._drain(msg_id)
    while True:
        reply = feed.client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return msg_id, reply["metadata"]["kernos"]


def test_replies_name_the_op_its_outcome_and_the_names_the_cell_reached(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    feed = Feed(kernel_factory(tmp_path / "ws"))
    _, made = run(feed, "x = 1\nitems = [x, 2]")
    assert made["status"] == "committed" and not made["unchanged"]
    assert {"x", "items"} <= set(made["names"])
    _, read = run(feed, "print(len(items))")
    assert read["status"] == "committed" and read["unchanged"] is True
    assert read["op"] == made["op"] + 1 and read["commit"] == made["commit"]
    assert "items" in read["names"] and "x" not in read["names"]
    _, failed = run(feed, "x = 2\n1 / 0")
    assert (failed["status"], failed["outcome"]) == ("rolled back", "failed")
    _, anything = run(feed, "exec('y = 3')")
    assert anything["status"] == "committed" and anything["names"] is None
    run(feed, "%kernos agent add bob")
    _, denied = run(feed, "%%agent bob\nread('x')")
    assert (denied["status"], denied["outcome"]) == ("rolled back", "denied")


def test_notices_tell_a_cells_op_from_others_and_say_what_was_checked_out(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    feed = Feed(kernel_factory(tmp_path / "ws"))
    _, first = run(feed, "plan = 'A'")
    panel = Inspector(feed)
    request, second = run(feed, "plan = 'B'\nextra = 1")
    mine = [n for n in panel.of_type("committed") if n["op"] == second["op"]]
    assert len(mine) == 1 and mine[0]["request"] == request and "checkout" not in mine[0]
    request, failed = run(feed, "plan = 'C'\n1 / 0")
    rolled = [n for n in panel.of_type("rolled_back") if n["op"] == failed["op"]]
    assert len(rolled) == 1 and rolled[0]["request"] == request

    # A checkout from the panel: no request (not a cell), and what it checked out.
    result = panel.result("checkout", ref=first["commit"])
    [notice] = [n for n in panel.of_type("committed") if n["op"] == result["op"]]
    assert "request" not in notice
    assert notice["checkout"] == {"ref": first["commit"], "op": first["op"],
                                  "commit": first["commit"]}
    assert (notice["changed"], notice["deleted"]) == (["plan"], ["extra"])

    # `%kernos checkout` in a cell: the cell's request, and what it checked out.
    request, magic = run(feed, f"%kernos checkout {second['commit']}")
    assert magic["status"] == "committed"
    [notice] = [n for n in panel.of_type("committed") if n["op"] == magic["op"]]
    assert notice["request"] == request
    assert notice["checkout"]["op"] == second["op"]
    assert notice["checkout"]["commit"] == second["commit"]
    assert sorted(notice["added"] + notice["changed"]) == ["extra", "plan"]
