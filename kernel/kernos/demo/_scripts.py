"""What the demonstration's agents run: the race's amounts, alice's agent loop, bob's queue.

Plain data and the source of the agents' code, shown to the reader and sent to the
kernel as they are; the scenes (``_state_scenes``, ``_agent_scenes``) check what they
did.  Changing one changes what the demo's checks expect.
"""

from __future__ import annotations

import textwrap
from typing import Any

FULL_RUN, SAMPLE_RUN = 400, 80
"""What each racing agent wants to spend, and what it settles for if that no longer fits."""


AGENT_LOOP = textwrap.dedent("""\
    # What the model answers, turn by turn: recorded answers (offline, litellm's
    # mock_response); with a real provider, drop the mock_ parameters.
    turns = [
        {"tool_calls": [{"id": "t1", "type": "function", "function": {
            "name": "summarize", "arguments": '{"amounts": [120, 80, 45]}'}}]},
        {"tool_calls": [{"id": "t2", "type": "function", "function": {
            "name": "pay", "arguments": '{"amount": 245, "to": "acme"}'}}]},
        {"content": "Paid 245 to acme for 3 invoices."},
    ]
    messages = [{"role": "user", "content":
                 "Three invoices from acme: 120, 80 and 45. Total them and pay acme."}]
    steps = []
    for turn in turns:
        recorded = {"mock_response": turn.get("content", "")}
        if "tool_calls" in turn:
            recorded["mock_tool_calls"] = turn["tool_calls"]
        answer = llm("gpt-4o-mini", messages, tools=["summarize", "pay"], max_tokens=60,
                     **recorded)
        if not answer["tool_calls"]:
            steps.append(answer["content"])
            break
        for wanted in answer["tool_calls"]:
            result = call(wanted["name"], **wanted["arguments"])
            steps.append(wanted["name"])
            messages.append({"role": "user", "content":
                             wanted["name"] + " returned " + json.dumps(result)})
    steps""")


QUEUE: list[dict[str, Any]] = [
    {"invoice": "A-1", "supplier": "acme", "amount": 120},
    {"invoice": "G-7", "supplier": "globex", "amount": 80},
    {"check": "acme"},
    {"invoice": "A-2", "supplier": "acme", "amount": 45},
    {"invoice": "I-3", "supplier": "initech", "amount": 300},
    {"invoice": "G-8", "supplier": "globex", "amount": 15}]
"""bob's loop's work: invoices to remember, and a check that recalls the earlier ones."""
CHECKED = 2
"""The item of QUEUE that recalls, so needs ``memory:read``."""
QUEUE_STEP = textwrap.dedent("""\
    # One invoice per iteration (each iteration is one op, run as bob).
    state = loop_state()
    item = state["pending"][0]
    if state["iteration"] == 0:
        handled = []
    if "check" in item:
        found = recall(item["check"], kinds=["semantic"])  # needs memory:read
        remember(item["check"] + ": " + str(len(found)) + " earlier invoices", tags=["check"])
        handled.append("check " + item["check"] + ": " + str(len(found)) + " found")
    else:
        remember("invoice " + item["invoice"] + " from " + item["supplier"] + ": "
                 + str(item["amount"]) + " USD", tags=["invoice"])
        handled.append(item["invoice"])
    loop_update(pending=state["pending"][1:])
    if len(state["pending"]) == 1:
        loop_finish("queue empty")""")
QUEUE_EVERY_MS = 700
"""The pause between two of bob's iterations: the kill lands while items are pending (at
least two pauses after the demo sees item 4 commit, on a loaded machine too)."""
WAIT = 120.0
"""A safety bound on waiting for the loop or the circuit (not a speed claim): a stuck loop
fails the demo instead of hanging it."""
