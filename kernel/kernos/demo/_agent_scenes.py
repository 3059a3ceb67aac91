"""Scenes 10 to 12 of the demonstration: agents at work, replayed, and a loop that lives on.

alice plans with a language model (recorded answers) and pays once after her
op commits; ``kernos replay`` rebuilds that stretch in fresh workspaces with no
payment made again; bob's loop works through a queue under a circuit breaker,
survives ``kill -9``, and the audit shows each iteration committed once.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from kernos.demo._report import _check, _prefixed, _request
from kernos.demo._scripts import AGENT_LOOP, CHECKED, QUEUE, QUEUE_EVERY_MS, QUEUE_STEP, WAIT
from kernos.demo._stage import Stage


def _instant(at: str) -> datetime.datetime:
    """An audit record's ``at`` (ISO 8601, UTC, ``Z``) as an aware datetime."""
    return datetime.datetime.fromisoformat(at.replace("Z", "+00:00"))



class AgentScenes(Stage):
    """Steps 10 to 12: an agent loop, its replay, and a supervised loop across a kill."""

    async def agent_loop(self) -> int:
        """An agent plans with an LLM, calls tools and pays once; the op before it, for replay."""
        print("10. An agent loop: alice plans with a language model (recorded answers; offline "
              "here,\n    litellm's mock_response), calls tools, and pays a supplier once, "
              "after her op commits.\n")
        ledger = self.payments
        ledger.unlink(missing_ok=True)
        setup = await self.op(textwrap.dedent(f"""\
            import json
            PAYMENTS = {str(ledger)!r}
            def pay(amount, to, idempotency_key):
                # The bank: one line per payment it really made (a file outside the kernel).
                with open(PAYMENTS, "a") as bank:
                    bank.write(json.dumps({{"key": idempotency_key, "amount": amount,
                                            "to": to}}) + "\\n")
                return {{"paid": amount, "to": to, "reference": idempotency_key[-8:]}}
            agents.register_tool("pay", pay, effect="external", description="Pay a supplier",
                                 schema={{"type": "object", "required": ["amount", "to"],
                                          "properties": {{"amount": {{"type": "integer"}},
                                                         "to": {{"type": "string"}}}}}})
            agents.grant("alice", "call:pay")
            agents.grant("alice", "llm:gpt-4o-mini", 5000)"""))
        _check(setup.committed, "the human registers an external `pay` tool and grants alice "
               "it and 5,000 tokens of gpt-4o-mini")
        loop = await self.op(AGENT_LOOP, principal="alice")
        _check(loop.committed and loop.value is not None and loop.value.json == [
            "summarize", "pay", "Paid 245 to acme for 3 invoices."],
               "alice's loop: the model asks for summarize, then pay, then answers; each tool "
               "call is checked against alice's grants")
        payments = [json.loads(line) for line in ledger.read_text().splitlines()]
        effects = await self.value("[(e['tool'], e['status'], e['result']) for e in "
                                   "agents.effects()]")
        _check(len(payments) == 1 and payments[0]["amount"] == 245
               and effects == [["pay", "done", {"paid": 245, "reference":
                                                payments[0]["key"][-8:], "to": "acme"}]],
               "the payment ran once, after the op committed, with its idempotency key; its "
               "result is recorded in the image")
        used = [grant for grant in await self.client.grants("alice")
                if grant["capability"] == "llm:gpt-4o-mini"]
        _check(bool(used) and int(str(used[0]["used"])) > 0,
               f"the model's tokens are charged to alice's grant ({used[0]['used']} of 5000 "
               "used)" if used else "the llm grant is listed")
        assert setup.op is not None
        return setup.op - 1

    async def replay(self, before: int) -> None:
        print("11. Replay the agent loop in a fresh workspace, from a separate process: the "
              "same ops,\n    the recorded model answers and payment result, and no payment "
              "made again.\n")
        into = Path(tempfile.mkdtemp(prefix="kernos-demo-replay-")) / "workspace"
        paid = self.payments.read_text()
        command = [sys.executable, "-m", "kernos.cli", "replay", "--workspace",
                   str(self.workspace), "--from", f"@{before}", "--into", str(into)]
        shown = ["kernos", *command[3:]]
        replayed = subprocess.run(command, capture_output=True, text=True, check=False)
        print(textwrap.indent("$ " + " ".join(shown) + "\n" + replayed.stdout.rstrip(), "    ")
              + "\n")
        as_json = subprocess.run([*command[:-1], str(into) + "-again", "--json"],
                                 capture_output=True, text=True, check=False)
        steps = json.loads(as_json.stdout)["steps"] if as_json.returncode == 0 else []
        _check(replayed.returncode == 0 and bool(steps)
               and all(step["digest"] == step["original"] for step in steps
                       if step["status"] == "committed"),
               f"every replayed snapshot equals the original, hash for hash ({len(steps)} ops, "
               "twice, in fresh processes)", replayed.stderr.strip()[-500:])
        _check(self.payments.read_text() == paid,
               "the replay executed no effect: the bank still has one payment")
        shutil.rmtree(into.parent, ignore_errors=True)

    async def supervised_loop(self) -> None:
        print("12. A loop that lives in the workspace: bob works through a queue, one op per "
              "item, under a\n    circuit breaker; the human fixes what trips it, and kill -9 "
              "does not stop the loop.\n")
        grant = await self.client.grant("bob", "memory:write")
        _request("grant('bob', 'memory:write')", f"grant {grant['grant']['id']}, op {grant['op']}")
        policy = await self.client.request("policy", agent="bob", set={"failures": 2})
        _request("request('policy', agent='bob', set={'failures': 2})",
                 f"policy {policy['policy']}, op {policy['op']}")
        trips = await self.client.subscribe(topic="kernos.circuit.*")
        started = await self.client.request("loop", do="start", agent="bob", step=QUEUE_STEP,
                                            every_ms=QUEUE_EVERY_MS, pending=QUEUE)
        _request(f"request('loop', do='start', agent='bob', every_ms={QUEUE_EVERY_MS}, "
                 f"pending=[{len(QUEUE)} items], step=...)",
                 f"{started['loop']['status']}, op {started['op']}")
        print(_prefixed(QUEUE_STEP, "bob   | ") + "\n")
        try:
            opened = await trips.get(timeout=WAIT)
        finally:
            await trips.close()
        print(f"    pushed to the subscriber: {opened['topic']} "
              f"{ {k: opened['payload'].get(k) for k in ('agent', 'policy', 'limit')} }")
        circuit = (await self.client.request("circuit", agent="bob"))["circuits"]["bob"]
        _request("request('circuit', agent='bob')", None if circuit is None else
                 f"{circuit['policy']} (limit {circuit['limit']}): {circuit['message']}")
        stuck = await self._loop_state()
        print(f"    bob's loop: {stuck['status']}, {stuck['iteration']} iterations committed, "
              f"{stuck['pending']} pending\n")
        _check(opened["topic"] == "kernos.circuit.open" and opened["payload"]["agent"] == "bob"
               and circuit is not None and circuit["policy"] == "failures"
               and circuit["limit"] == 2 and stuck["iteration"] == CHECKED
               and stuck["status"] == "running",
               f"item {CHECKED + 1} needs memory:read: its iteration was denied twice in a row, "
               "the circuit opened (its event reached the subscriber), and the loop waits",
               (opened, circuit, stuck))

        grant = await self.client.grant("bob", "memory:read")
        _request("grant('bob', 'memory:read')",
                 f"grant {grant['grant']['id']}, op {grant['op']}")
        reset = await self.client.request("reset", agent="bob")
        _request("request('reset', agent='bob')",
                 f"was open: {reset['was_open']}, op {reset['op']}")
        resumed = await self._loop_state(lambda state: state["iteration"] > CHECKED)
        after_reset = (await self.client.request("circuit", agent="bob"))["circuits"]["bob"]
        pid = self.manager.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + WAIT
        while await self.manager.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        dead = not await self.manager.is_alive()
        dead_at = datetime.datetime.now(datetime.UTC)
        print(f"    bob's loop: {resumed['status']}, {resumed['iteration']} iterations "
              f"committed, {resumed['pending']} pending: kill -9 {pid}\n")
        _check(after_reset is None and resumed["status"] == "running"
               and 0 < resumed["pending"] < len(QUEUE) and dead,
               "the reset closed the circuit and the loop went on by itself; the kernel was "
               "killed with work still pending", (after_reset, resumed, dead))

        await self._restart()
        print(f"    kernel pid {self.manager.pid}; nothing asks it to resume the loop\n")
        done = await self._loop_state(lambda state: state["status"] != "running")
        print(f"    bob's loop: {done['status']} ({done['reason']}), {done['iteration']} "
              f"iterations committed, {done['pending']} pending")
        records = await self.client.audit(principal="bob")
        voided = {record.get("voids") for record in await self.client.audit()
                  if record.get("type") == "void"}
        mine = [record for record in records if record.get("type") == "op"
                and "loop" in record and record.get("index") not in voided
                and record["op"] > started["op"]]
        committed = [record for record in mine if record["status"] == "committed"]
        iterations = [record["loop"]["iteration"] for record in committed]
        ops = [record["op"] for record in committed]
        after_kill = [record["loop"]["iteration"] for record in committed
                      if _instant(record["at"]) > dead_at]
        others = [record for record in mine if record["status"] != "committed"]
        print(f"    audit: iterations {iterations} committed, in ops {ops}")
        print("    audit: not committed: " + (", ".join(
            f"iteration {record['loop']['iteration']} {record['status']} (op {record['op']})"
            for record in others) or "none"))
        print(f"    audit: iterations {after_kill} committed by the new kernel\n")
        _check(done["status"] == "finished" and done["iteration"] == len(QUEUE)
               and done["pending"] == 0,
               f"the new kernel resumed the loop by itself, and it finished its {len(QUEUE)} "
               "items", done)
        _check(iterations == list(range(len(QUEUE))) and ops == sorted(ops)
               and 0 < len(after_kill) < len(QUEUE),
               "each iteration committed exactly once, in order, across the kill",
               (iterations, ops, after_kill))
        _check([(record["loop"]["iteration"], record["status"]) for record in others
                if record["op"] < reset["op"]] == [(CHECKED, "denied")] * 2,
               "before the reset only the two denied tries ran: no op of bob while his circuit "
               "was open", others)
        handled = await self.value("agents.namespace('bob')['handled']")
        expected = [f"check {item['check']}: 1 found" if "check" in item else item["invoice"]
                    for item in QUEUE]
        recalled = await self.client.recall("acme", principal="bob", kinds=["semantic"])
        _request("recall('acme', principal='bob', kinds=['semantic'])",
                 [memory["text"] for memory in recalled])
        print()
        _check(handled == expected
               and any("acme: 1 earlier invoices" in memory["text"] for memory in recalled),
               "bob handled every item once, in order; his check recalled the acme invoice "
               "before it, and remembered that", (handled, [m["text"] for m in recalled]))
