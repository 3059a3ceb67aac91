"""The inspector widget in a real kernel, seen as a frontend sees it: widget comms on IOPub.

``kernos.inspect()`` runs in a cell; the test keeps every ``jupyter.widget``
model from its ``comm_open`` and ``comm_msg`` updates, as a frontend's widget
manager would, and sends what a frontend sends (a tab chosen, a button
clicked).  What must hold: a committed cell updates the widget; a rolled-back
cell updates nothing but the status line; a checkout runs only once it is
confirmed, with its progress shown, and the widget then shows the image as
checked out.
"""

from __future__ import annotations

import queue
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.kernel]

TIMEOUT = 120.0
VIEW = "application/vnd.jupyter.widget-view+json"


class Frontend:
    """The widget models of one kernel client, kept from IOPub; cells and comm messages."""

    def __init__(self, kernel: Any) -> None:
        self.client = kernel.client
        self.models: dict[str, dict[str, Any]] = {}
        self.updates: list[tuple[str, dict[str, Any]]] = []
        """Every state update the kernel sent, in order: (model id, the changed state)."""
        self.views: list[str] = []
        self.results: list[dict[str, Any]] = []

    def _absorb(self, message: dict[str, Any]) -> None:
        kind, content = message["msg_type"], message["content"]
        if kind == "comm_open" and content.get("target_name") == "jupyter.widget":
            self.models[content["comm_id"]] = dict(content["data"]["state"])
        elif kind == "comm_msg" and content["comm_id"] in self.models:
            data = content["data"]
            if data.get("method") in ("update", "echo_update"):
                self.models[content["comm_id"]].update(data["state"])
                self.updates.append((content["comm_id"], data["state"]))
        elif kind == "display_data" and VIEW in content["data"]:
            self.views.append(content["data"][VIEW]["model_id"])
        elif kind == "execute_result":
            self.results.append(content)

    def _until_idle(self, msg_id: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                message = self.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            self._absorb(message)
            if (message["msg_type"] == "status"
                    and message["parent_header"].get("msg_id") == msg_id
                    and message["content"]["execution_state"] == "idle"):
                return
        raise AssertionError(f"no idle for {msg_id} within {TIMEOUT} s")

    def run(self, code: str) -> dict[str, Any]:
        """Run a cell; the reply (its ``metadata["kernos"]`` says how the op ended)."""
        msg_id = self.client.execute(code)
        self._until_idle(msg_id)
        while True:
            reply: dict[str, Any] = self.client.get_shell_msg(timeout=TIMEOUT)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply

    def send(self, model_id: str, data: dict[str, Any]) -> None:
        """A comm message from the frontend to a widget, handled before this returns."""
        message = self.client.session.msg("comm_msg", {"comm_id": model_id, "data": data})
        self.client.shell_channel.send(message)
        self._until_idle(message["header"]["msg_id"])

    def set(self, model_id: str, **state: Any) -> None:
        self.send(model_id, {"method": "update", "state": state, "buffer_paths": []})

    def click(self, model_id: str) -> None:
        self.send(model_id, {"method": "custom", "content": {"event": "click"}})

    def children(self, model_id: str) -> list[str]:
        return [ref.removeprefix("IPY_MODEL_") for ref in self.models[model_id]["children"]]

    def find(self, model_name: str, contains: str = "", **state: Any) -> list[str]:
        """Ids of the models of a kind whose ``value`` contains ``contains``."""
        return [model_id for model_id, model in self.models.items()
                if model.get("_model_name") == model_name
                and contains in str(model.get("value", ""))
                and all(model.get(key) == value for key, value in state.items())]


def committed(reply: dict[str, Any]) -> None:
    assert reply["metadata"].get("kernos", {}).get("status") == "committed", reply


def test_the_widget_follows_commits_not_rollbacks_and_checks_out_on_confirmation(
        kernel: Any) -> None:
    frontend = Frontend(kernel)
    first = frontend.run("before = {'n': 1}")
    committed(first)
    first_op = first["metadata"]["kernos"]["op"]
    reply = frontend.run("import kernos\nkernos.inspect()")
    committed(reply)
    assert frontend.results == []  # inspect() returns None: nothing in Out or _
    assert len(frontend.views) == 1
    root = frontend.views[0]
    status, tabs = frontend.children(root)
    assert frontend.models[tabs]["titles"] == ["Objects", "Events", "Capabilities", "History",
                                               "Plot", "Agents"]
    [table] = frontend.find("HTMLModel", "changed at")
    assert ">before<" in frontend.models[table]["value"]

    # A committed cell: the table is sent again, with the new name.
    sent = len(frontend.updates)
    committed(frontend.run("after = [1, 2, 3]"))
    updated = {model_id for model_id, _ in frontend.updates[sent:]}
    assert table in updated and status in updated
    assert ">after<" in frontend.models[table]["value"]
    assert "committed by human" in frontend.models[status]["value"]

    # The plot tab, chosen as a frontend does: it reads the stats then.
    frontend.set(tabs, selected_index=4)
    [chart] = frontend.find("HTMLModel", "<svg")
    assert "Op latency" in frontend.models[chart]["value"]
    chart_before = frontend.models[chart]["value"]

    # A failing cell: only the status line changes, though the plot would have a new op.
    sent = len(frontend.updates)
    reply = frontend.run("after.append(4)\nbroken = True\nraise ValueError('no')")
    assert reply["metadata"]["kernos"]["status"] == "rolled back"
    assert {model_id for model_id, _ in frontend.updates[sent:]} == {status}
    assert "rolled back" in frontend.models[status]["value"]
    assert "ValueError" in frontend.models[status]["value"]
    assert frontend.models[chart]["value"] == chart_before

    # The next commit reads again: the plot now counts the rolled-back op too.
    committed(frontend.run("later = 1"))
    assert frontend.models[chart]["value"] != chart_before

    # Checkout of the snapshot where only `before` existed, from the History tab.
    frontend.set(tabs, selected_index=3)
    [target] = [model_id for model_id in frontend.find("DropdownModel")
                if frontend.models[model_id].get("description") == "Snapshot"]
    labels = frontend.models[target]["_options_labels"]
    frontend.set(target, index=next(index for index, label in enumerate(labels)
                                    if label.startswith(f"op {first_op}:")))
    [ask] = [model_id for model_id in frontend.find("ButtonModel")
             if frontend.models[model_id].get("description") == "Check out..."]
    [confirm] = [model_id for model_id in frontend.find("ButtonModel")
                 if frontend.models[model_id].get("description") == "Check out"]
    frontend.click(ask)
    assert kernel_value(frontend, "sorted(n for n in ('before', 'after', 'later') "
                                  "if n in globals())") == ['after', 'before', 'later']
    frontend.click(confirm)
    [progress] = frontend.find("FloatProgressModel")
    assert frontend.models[progress]["value"] == 1.0
    assert f"Checked out op {first_op}" in frontend.models[status]["value"]
    assert kernel_value(frontend, "sorted(n for n in ('before', 'after', 'later') "
                                  "if n in globals())") == ['before']
    frontend.set(tabs, selected_index=0)
    assert ">after<" not in frontend.models[table]["value"]
    assert ">before<" in frontend.models[table]["value"]


def kernel_value(frontend: Frontend, expression: str) -> Any:
    import ast

    outputs: list[str] = []
    reply = frontend.client.execute_interactive(
        f"print(repr({expression}))", timeout=TIMEOUT,
        output_hook=lambda message: outputs.append(message["content"].get("text", ""))
        if message["msg_type"] == "stream" else frontend._absorb(message))
    assert reply["content"]["status"] == "ok", reply
    return ast.literal_eval("".join(outputs).strip())


def test_the_magic_displays_one_and_help_lists_it(kernel: Any) -> None:
    frontend = Frontend(kernel)
    committed(frontend.run("x = 1"))
    reply = frontend.run("%kernos inspect")
    assert reply["content"]["status"] == "ok", reply
    assert frontend.results == [] and len(frontend.views) == 1
    assert frontend.find("HTMLModel", ">x<")
    assert "%kernos inspect" in kernel_output(frontend, "%kernos help")


def kernel_output(frontend: Frontend, code: str) -> str:
    outputs: list[str] = []
    frontend.client.execute_interactive(
        code, timeout=TIMEOUT,
        output_hook=lambda message: outputs.append(message["content"].get("text", ""))
        if message["msg_type"] == "stream" else None)
    return "".join(outputs)
