"""What each example notebook must show, beyond running without an unexpected error.

``check(run)`` looks up the checks for ``run.notebook`` (every example must
have some) and asserts them on the cells' outputs, found by cell id.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

Run = Any
"""A ``notebook_run.NotebookRun`` (loaded by path, so not importable for typing)."""


def _line(text: str, prefix: str) -> str:
    found = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(found) == 1, f"expected one line starting {prefix!r} in:\n{text}"
    return found[0]


def researchers_day(run: Run) -> None:
    assert run.cell("readings").text.strip() == "12.13"
    wrong = run.cell("goes-wrong")
    assert wrong.kernos == "rolled back" and wrong.error["ename"] == "ValueError"
    assert run.cell("unchanged").text == (
        "{'mon': 12.1, 'tue': 12.4, 'wed': 11.9}\n"
        "['sensor A calibrated on monday']\n"
        "[Sample('north', 3.5), Sample('south', 7.0)]\n"), "the failed cell left a trace"
    before, after = run.cell("before-restart"), run.cell("after-restart")
    assert after.restarted and not before.restarted, "the runner did not restart where tagged"
    assert _line(before.text, "kernel pid") != _line(after.text, "kernel pid"), \
        "the kernel was not restarted (same process)"
    assert _line(before.text, "state") == _line(after.text, "state"), \
        "the state after the restart differs from the state before it"
    log = run.cell("log").text
    ops = [int(line.split()[0]) for line in log.splitlines()[1:]]
    # Op 3 failed and op 4 only printed: neither wrote a snapshot; op 5 imported os.
    assert ops == sorted(ops, reverse=True) and not {3, 4} & set(ops) and {1, 2, 5} <= set(ops), \
        f"the failed op 3 and the read-only op 4 must be the gaps in the history:\n{log}"
    diff = run.cell("diff").text
    assert re.search(r"\+\s+samples\s", diff) and re.search(r"\+\s+Sample\s", diff), diff
    assert "history is not rewritten" in run.cell("checkout").text
    assert run.cell("after-checkout").text.strip() == "['mean', 'notes', 'readings']"
    assert run.cell("back").text.strip() == "[Sample('north', 3.5), Sample('south', 7.0)]"
    widgets = [output for output in run.cell("inspect").outputs
               if "application/vnd.jupyter.widget-view+json" in output.get("data", {})]
    assert len(widgets) == 1, "kernos.inspect() did not display one widget"


def two_agents(run: Run) -> None:
    assert run.cell("builder-writes-tool").text == "builder sees 3 orders\n"
    assert re.search(r"summarize\s+1\s+pure\s+call:summarize\s+builder", run.cell("tools").text)
    assert run.cell("analyst-uses-tool").kernos == "committed"
    assert run.cell("analyst-uses-tool").text == "{'count': 3, 'total': 75} spent; left: 25\n"
    assert re.search(r"analyst\s+spend:USD\s+75/100", run.cell("grants").text)
    denied = run.cell("denied")
    assert denied.kernos == "rolled back" and denied.error["ename"] == "OpVetoed"
    assert "analyst was denied, and caught it" in denied.text, "the denial was not catchable"
    after = run.cell("after-denial").text
    assert "analyst's names: ['left', 'summary']" in after, "the vetoed op left `note` behind"
    assert "('analyst', 'read:orders')" in after
    assert run.cell("agents-run").text.strip() == "{'count': 2, 'total': 10}"
    who = {line.split()[4] for line in run.cell("log").text.splitlines()[1:]}
    assert who == {"human", "builder", "analyst"}, who


def events(run: Run) -> None:
    assert run.cell("emit").text.strip() == "{'c-1': 30}"
    assert run.cell("cancelled").kernos == "rolled back"
    assert run.cell("after-cancel").text.strip() == "{'c-1': 30}", \
        "the subscriber's change survived its op's rollback"
    vetoed = run.cell("vetoed")
    assert vetoed.kernos == "rolled back" and vetoed.error["ename"] == "OpVetoed"
    assert "caught:" in vetoed.text
    assert run.cell("after-veto").text.strip() == "{'c-1': 30}"
    assert run.cell("since").text.strip() == "[(1, 2, {'amount': 30, 'customer': 'c-1'})]", \
        "only the committed event may be in the log"
    outside = [json.loads(line) for line in run.cell("outside").text.splitlines() if line]
    assert [(e["seq"], e["payload"]) for e in outside] == [(1, {"amount": 30, "customer": "c-1"})]


def audit(run: Run) -> None:
    assert run.cell("failed").kernos == "rolled back"
    assert run.cell("denied").error["ename"] == "CapabilityDenied"
    log = run.cell("audit-log").text
    for status in ("genesis", "committed", "failed", "denied"):
        assert re.search(rf"\s{status}\s", log), f"no {status} record:\n{log}"
    assert "Ada Lovelace" not in log, "the audit log shows the personal value in the clear"
    assert run.cell("records").text.splitlines()[0].endswith("ValueError overdrawn")
    assert "write:balance" in run.cell("records").text
    assert run.cell("verify").text.startswith("ok: ")
    assert run.cell("customer").text.strip() == "personal(<hidden>, subject='c-1042')"
    assert run.cell("reveal").text.strip() == "'Ada Lovelace, 12 Marylebone Rd'"
    assert run.cell("erased").text.strip() == "personal(<erased>, subject='c-1042')"
    outside = run.cell("verify-outside").text
    assert outside.startswith("exit status 0\nok: "), outside
    assert run.cell("erasure-record").text.strip() == "'c-1042'"


def harness(run: Run) -> None:
    assert "('spend:USD', '60')" in run.cell("prepare").text
    transcript = run.cell("run").text
    assert "running low: ['apples', 'plums']" in transcript
    assert "cannot be persisted" not in "".join(cell.text for cell in run.cells), \
        "a live client was left in the notebook's image"
    assert run.cell("outcomes").text.strip() == "['committed', 'denied', 'committed']"
    again = run.cell("again").text
    assert "budget left: [{'apples': 10, 'plums': 5}, 40, Decimal('20')]" in again, again
    assert "budget: [('spend:USD', '40', '60')]" in again, again
    assert "denied ops: [(7, 'denied')]" in again, again
    assert re.search(r"\(6, 'buyer'\), \(8, 'buyer'\)", again), again
    assert run.cell("clean-up").text.strip() == "False", "the temporary workspace is still there"


def _value(cell: Any) -> Any:
    """The value a cell ended with (its ``execute_result``), a Python literal."""
    results = [output for output in cell.outputs if output["output_type"] == "execute_result"]
    assert len(results) == 1, f"cell {cell.id} shows no value:\n{cell.text}"
    return ast.literal_eval(results[0]["data"]["text/plain"])


def _loop(loops: list[dict[str, Any]], agent: str) -> dict[str, Any]:
    found = [loop for loop in loops if loop["agent"] == agent]
    assert len(found) == 1, f"expected one loop of {agent!r}: {loops}"
    return found[0]


TICKETS = [(0, "T-1", "billing"), (1, "T-2", "account"), (2, "T-3", "refund"),
           (3, "T-4", "billing"), (4, "T-5", "documents")]


def long_lived_agent(run: Run) -> None:
    # The trip: T-3 failed three times in a row; the loop did not advance past it.
    tripped = _loop(_value(run.cell("tripped")), "triage")
    assert (tripped["status"], tripped["iteration"], tripped["pending"]) == ("running", 2, 3), \
        f"the loop should be parked at T-3 (iteration 2, 3 pending): {tripped}"
    circuit = _value(run.cell("circuit"))
    assert circuit is not None, "the circuit of triage is not open"
    assert circuit["policy"] == "failures" and circuit["figures"]["in_a_row"] == 3, circuit
    tries = [line for line in run.cell("tries").text.splitlines()
             if " failed " in line and "'iteration': 2" in line and "'refund'" in line]
    assert len(tries) == 3, f"three failed tries of T-3 in the audit:\n{run.cell('tries').text}"
    assert run.cell("reset").kernos == "committed"
    # The kill: a new process, while the queue was still half done.
    after = run.cell("after-kill")
    assert after.restarted and after.killed is not None, "the runner did not kill -9 where tagged"
    before_pid = _line(run.cell("before-kill").text, "kernel pid")
    assert before_pid == f"kernel pid {after.killed}", (before_pid, after.killed)
    assert _line(after.text, "kernel pid") != before_pid, "the kernel was not replaced"
    at_kill = _loop(after.loops_at_kill, "triage")
    assert (at_kill["status"], at_kill["iteration"], at_kill["pending"]) == ("paused", 2, 3), \
        f"the kill should find the loop paused at T-3, the queue half done: {at_kill}"
    resumed = _loop(_value(after), "triage")
    assert resumed["status"] in ("running", "finished"), resumed
    # The queue done, each ticket once, in order, by the iteration that handled it.
    done = _loop(_value(run.cell("done")), "triage")
    assert (done["status"], done["iteration"], done["pending"], done["reason"]) == \
        ("finished", 5, 0, "the queue is done"), done
    findings = [line.split(" ", 3) for line in run.cell("findings").text.splitlines()]
    assert [(int(n), ticket, label) for n, ticket, label, _ in findings] == TICKETS, \
        run.cell("findings").text
    earlier = {ticket: ast.literal_eval(rest) for _, ticket, _, rest in findings}
    # The recall hit: at T-4, what was remembered about Acme at T-1; nothing for the others.
    assert earlier == {"T-1": [], "T-2": [], "T-3": [], "T-5": [],
                       "T-4": ["Acme T-1 billing: the March invoice was charged twice"]}, earlier
    # The audit: every iteration committed exactly once, across the kill.
    audit = run.cell("iterations").text
    committed = ast.literal_eval(_line(audit, "committed iterations:").split(":", 1)[1])
    assert committed == [0, 1, 2, 3, 4], f"each iteration must commit once:\n{audit}"
    others = ast.literal_eval(_line(audit, "tries that did not commit:").split(":", 1)[1])
    assert others.count((2, "failed")) == 3, audit
    recalled = run.cell("recall").text.splitlines()
    facts = [line for line in recalled if line.startswith("semantic ")]
    assert sorted(facts) == [
        "semantic Acme T-1 billing: the March invoice was charged twice",
        "semantic Acme T-4 billing: the March double charge, reported again"], \
        run.cell("recall").text


def files(run: Run) -> None:
    morning = "['figures/readings.png', 'results/readings.csv']"
    csv_before = "day,depth\nmon,12.1\ntue,12.4\nwed,11.9\n"
    assert run.cell("analysis").text.strip() == morning
    shown = run.cell("show-analysis").text
    assert "+ results/readings.csv" in shown and "+day,depth" in shown, shown
    assert re.search(r"\+ figures/readings\.png .*binary", shown), shown
    wrong = run.cell("goes-wrong")
    assert wrong.kernos == "rolled back" and wrong.error["ename"] == "ValueError"
    assert "results/draft.csv (removed)" in wrong.text, wrong.text
    assert run.cell("no-stray-file").text == morning + "\n" + csv_before, \
        "the failed cell left a file behind, or its change to the CSV"
    thursday = run.cell("show-thursday").text
    assert "~ results/readings.csv" in thursday and "+thu,12.0" in thursday, thursday
    assert run.cell("agent-writes").kernos == "committed"
    assert run.cell("agent-writes").text == "['reports/summary.md']\n"
    denied = run.cell("agent-denied")
    assert denied.kernos == "rolled back" and denied.error["ename"] == "OpVetoed", denied.text
    assert "'file:write:results/readings.csv'" in denied.text, denied.text
    after = run.cell("after-denial").text
    assert after.startswith("['figures/readings.png', 'reports/summary.md', "
                            "'results/readings.csv']\n"), "the vetoed op left reports/notes.md"
    assert "4 readings, mean 12.1 m" in after, after
    log = run.cell("log").text
    assert re.search(r"^9 .*reporter\s+files: \+1 ~0 -0", log, re.M), log
    assert re.search(r"^6 .*files: \+0 ~2 -0", log, re.M), log
    assert run.cell("after-checkout").text == morning + "\n" + csv_before, \
        "checking out the morning's snapshot did not bring back its files"
    assert run.cell("back").text == (
        "['figures/readings.png', 'reports/summary.md', 'results/readings.csv']\n"
        + csv_before + "thu,12.0\n")


def frameworks(run: Run) -> None:
    assert run.cell("setup").text == "True\n"
    langgraph = run.cell("langgraph").text
    assert "the first run stopped in 'check': the price feed timed out" in langgraph, langgraph
    # Resumed from the checkpoint after 'fetch': 'fetch' ran once, 'check' again.
    assert "nodes run: ['fetch', 'check', 'check', 'write']" in langgraph, langgraph
    assert "final state: {'steps': ['fetch', 'check', 'write: total 9'], 'total': 9}" \
        in langgraph, langgraph
    checkpoints, ops = re.search(r"checkpoints: (\d+) \| ops of 'graph': (\d+)",
                                 langgraph).groups()  # type: ignore[union-attr]
    # One op per checkpoint and one per task's writes: more ops than checkpoints.
    assert int(checkpoints) >= 4 and int(ops) > int(checkpoints), langgraph
    openai = run.cell("openai-agents").text
    first, second = openai.splitlines()[:2]
    assert first == "committed | 3.0", openai
    assert second.startswith("denied | ") and "'write:prices'" in second, openai
    assert "answer: The mean price is 3.0" in openai, openai
    assert "'mean' in the agent's namespace: 3.0" in openai, openai
    sandbox = run.cell("sandbox").text
    assert sandbox.startswith("text: 2 | stdout: ['ok\\n']\n"), sandbox
    assert "error: AgentCodeRejected |" in sandbox and "file: cheapest: 2" in sandbox, sandbox
    pydantic = run.cell("pydantic-ai").text
    assert pydantic.splitlines()[:2] == ["run_python | committed | ['apples', 'pears']",
                                         "discount | committed | 3.0"], pydantic
    saved = int(_line(pydantic, "messages kept in the image:").rsplit(" ", 1)[1])
    assert saved >= 6, pydantic  # the prompt, two calls, their returns and the answer
    smol = run.cell("smolagents").text
    assert smol.splitlines()[:3] == [
        "ok | total = sum(read('prices').values())", "error | write('prices', {})",
        "ok | final_answer(discount(price=total, percent=10))"], smol
    assert _line(smol, "answer:") == "answer: 8.1", smol
    for cell in ("openai-agents", "pydantic-ai", "smolagents", "sandbox"):
        assert "cannot be persisted" not in run.cell(cell).text, \
            f"{cell}: a framework object was left in the notebook's image"
    history = run.cell("history").text
    principals = ast.literal_eval(_line(history, "ops by principal:").split(":", 1)[1].strip())
    assert set(principals) == {"human", "analyst", "graph"}, history
    assert principals["graph"] == int(ops), "the log and the graph's ops disagree"
    # The two denied writes: the Agents SDK's tool call and smolagents' step.
    assert _line(history, "denied:") == "denied: [('analyst', 'denied'), ('analyst', 'denied')]"
    assert _line(history, "replay:") == "replay: ok", history
    equal, compared = re.search(r"snapshots equal to the original: (\d+) of (\d+)",
                                history).groups()  # type: ignore[union-attr]
    assert equal == compared and int(compared) >= sum(principals.values()), history
    assert run.cell("cleanup").text.strip() == "False"


CHECKS: dict[str, Callable[[Run], None]] = {
    "01-researchers-day.ipynb": researchers_day,
    "02-two-agents.ipynb": two_agents,
    "03-events.ipynb": events,
    "04-audit.ipynb": audit,
    "05-harness.ipynb": harness,
    "06-long-lived-agent.ipynb": long_lived_agent,
    "07-files.ipynb": files,
    "08-frameworks.ipynb": frameworks,
}


def check(run: Run) -> None:
    problems = run.problems()
    assert not problems, f"{run.notebook}:\n\n" + "\n\n".join(problems)
    assert run.notebook in CHECKS, f"{run.notebook} has no facts in tests/examples/facts.py"
    CHECKS[run.notebook](run)
