"""The headless demonstration: a real Kernos kernel, driven by a harness through kernos.client.

Everything goes through the harness client library (``KernosManager`` for
the process, ``AsyncKernosClient`` for the requests), never through notebook
magics.  In order:

1. agents build tools and state: the human defines a class and a function,
   alice writes a tool, bob is granted it, calls it and spends within his
   budget, and a denial bob catches still rolls his op back;
2. an op fails halfway and rolls back, leaving nothing;
3. an in-image event subscriber commits and rolls back with its op, and an
   external subscriber sees only the committed event;
4. two agents race on one budget from two separate clients: both read
   ``budget = 500`` and both try to spend 400 with a version precondition;
   exactly one commits, the other gets a conflict carrying the new version,
   and ``retry_on_conflict`` has it read again and settle for what fits;
5. the kernel is killed with SIGKILL halfway through an op: every client
   reports ``KernelDied``;
6. the manager restarts it and the harness finds the workspace exactly as it
   was (objects, versions, head, agents, grants, tools), then the history,
   the audit log, an erasure, and ``kernos audit verify`` in a separate
   process;
7. an agent loop: alice plans with a language model (recorded answers,
   litellm's ``mock_response``), calls tools, and makes one external
   payment, which runs once after her op commits;
8. ``kernos replay`` rebuilds that stretch of history in a fresh workspace,
   twice, in separate processes: every snapshot equal to the original, hash
   for hash, and no payment made again;
9. a loop that lives in the workspace (issue 20): bob works through a queue
   of invoices, one op per item, remembering each and recalling earlier ones,
   under a circuit-breaker policy; the item whose recall needs a grant he
   lacks fails twice and opens his circuit (``kernos.circuit.open`` reaches
   the subscriber), the human grants it and resets the circuit, the kernel
   is killed with ``kill -9`` while items are still pending, and the new
   kernel resumes the loop by itself: the audit shows each iteration
   committed exactly once, in order.

Each step checks what it claims: the demo exits 1 if a check fails, and 2 if
numpy (kept in the image) or litellm (the agent's model calls) is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernos.audit.human import format_records
from kernos.client import (
    AsyncKernosClient,
    KernelDied,
    KernosManager,
    ObjectInfo,
    OpResult,
    retry_on_conflict,
)
from kernos.errors import KernosError
from kernos.history import format_table

KERNEL = "kernos"
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


class DemoFailure(Exception):
    pass


def _check(condition: bool, claim: str, detail: object = None) -> None:
    if not condition:
        raise DemoFailure(claim + (f" ({detail})" if detail is not None else ""))
    print(f"    [ok] {claim}\n")


def _short(commit: str | None) -> str:
    return (commit or "-")[:12]


def _outcome(result: OpResult) -> str:
    """One line: how an op ended, and what it changed or why it did not commit."""
    if result.committed:
        return ", ".join([f"op {result.op}", f"commit {_short(result.commit)}"] + [
            f"{what} {names}" for what, names in (("added", result.added),
                                                  ("changed", result.changed),
                                                  ("deleted", result.deleted)) if names])
    reason = result.error.message if result.error is not None else ""
    return f"op {result.op}: {reason}"


def _show(code: str, principal: str, result: OpResult) -> None:
    print(_prefixed(code, f"{principal:<5} | "))
    if result.output.strip():
        print(_prefixed(result.output, "Out   | "))
    if result.value is not None and result.value.repr != "None":
        print(_prefixed(result.value.repr, "Value | "))
    print(f"    ==> {result.status} ({_outcome(result)})\n")


def _prefixed(text: str, label: str) -> str:
    """``text`` indented, ``label`` on its first line and a bar on the others."""
    lines = text.rstrip("\n").splitlines() or [""]
    blank = " " * (len(label) - 2) + "| "
    return "\n".join(("    " + (label if number == 0 else blank) + line).rstrip()
                     for number, line in enumerate(lines))


def _instant(at: str) -> datetime.datetime:
    """An audit record's ``at`` (ISO 8601, UTC, ``Z``) as an aware datetime."""
    return datetime.datetime.fromisoformat(at.replace("Z", "+00:00"))


def _request(call: str, answer: object = None) -> None:
    """Echo a harness request that is not an op of code (a grant, a read, ...)."""
    print(f"    client.{call}" + (f"  ->  {answer}" if answer is not None else ""))


class Demo:
    """The demonstration's kernel, its harness client, and the steps."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.manager = KernosManager(workspace, kernel_name=KERNEL)
        self._client: AsyncKernosClient | None = None
        self._bob: AsyncKernosClient | None = None
        """bob's own client from the race, kept open to see the kernel die."""
        self._loser = ""
        """The agent whose first spend conflicted in the race."""

    @property
    def client(self) -> AsyncKernosClient:
        assert self._client is not None, "the kernel is not started"
        return self._client

    async def op(self, code: str, principal: str = "human") -> OpResult:
        result = await self.client.op(code, principal=principal)
        _show(code, principal, result)
        return result

    async def value(self, code: str) -> Any:
        """The JSON value of a human expression (a read that runs as a committed op)."""
        result = await self.op(code)
        if not (result.committed and result.value is not None and result.value.has_json):
            raise DemoFailure(f"{code!r} did not give a JSON value: {_outcome(result)}")
        return result.value.json

    async def budget(self, principal: str = "human",
                     client: AsyncKernosClient | None = None) -> Any:
        """The racing agents' shared account, read without running an op."""
        account = await (client or self.client).object("account", principal=principal)
        assert account.preview is not None
        return account.preview.json["budget"] if account.preview.has_json else None

    # -- the steps ------------------------------------------------------------------

    async def start(self) -> None:
        print("0. Start a Kernos kernel: KernosManager (jupyter_client underneath), and a "
              "client.\n")
        await self.manager.start()
        self._client = await self.manager.client()
        hello = await self.client.hello()
        print(f"    kernel pid {self.manager.pid}, harness protocol v{hello['protocol']}, "
              f"Kernos {hello['kernos']}\n")

    async def build(self) -> None:
        print("1. Agents build tools and state.\n")
        await self.op(textwrap.dedent("""\
            import numpy as np

            class Account:
                def __init__(self, owner, balance):
                    self.owner, self.balance = owner, balance
                def deposit(self, amount):
                    self.balance += amount
                    return self.balance

            def total(accounts):
                return sum(a.balance for a in accounts)

            accounts = [Account("ada", 100), Account("grace", 250)]
            ledger = {"entries": [("open", 350)]}
            prices = np.linspace(1.0, 2.0, 1_000_000)"""))
        total = await self.value("accounts[0].deposit(50)\n"
                                 "ledger['entries'].append(('deposit', 50))\n"
                                 "total(accounts)")
        _check(total == 400, "human code: a class, a function and an array committed as state")
        await self.op('customer = personal("Ada Lovelace, 12 Marylebone Rd", subject="c-1042")'
                      "  # erased in step 9")

        for agent in ("alice", "bob"):
            _request(f"add_agent({agent!r})", await self.client.add_agent(agent))
        for agent, capability, limit in (("alice", "read:ledger", None),
                                         ("bob", "call:summarize", None),
                                         ("bob", "spend:USD", 100)):
            grant = await self.client.grant(agent, capability, limit)
            _request(f"grant({agent!r}, {capability!r}{f', {limit}' if limit else ''})",
                     f"grant {grant['grant']['id']}, op {grant['op']}")
        print()
        defined = await self.op(textwrap.dedent('''\
            # Restricted agent code: alice reads the ledger through a read-only view
            # and writes a tool that persists in the image.
            print("alice sees", len(read("ledger")["entries"]), "ledger entries")
            define_tool("summarize", """
            def summarize(amounts):
                return {"count": len(amounts), "total": sum(amounts)}
            """, {"type": "object", "properties": {"amounts": {"type": "array"}},
                  "required": ["amounts"]}, "Count and total a list of amounts")'''),
            principal="alice")
        called = await self.client.call("summarize", {"amounts": [40, 25, 10]}, principal="bob")
        _request("call('summarize', {'amounts': [40, 25, 10]}, principal='bob')",
                 f"{called.status}, {called.value.repr if called.value else None}")
        print()
        spent = await self.op(textwrap.dedent("""\
            summary = call("summarize", amounts=[40, 25, 10])
            left = spend(summary["total"], "USD")
            print("bob spent", summary["total"], "USD;", left, "left")
            left"""), principal="bob")
        _check(defined.committed and called.committed and called.value is not None
               and called.value.json == {"count": 3, "total": 75}
               and spent.committed and "25 left" in spent.output,
               "alice wrote a tool; bob called it (as a harness call and from his code) and "
               "spent within his budget")

        before = await self.client.status()
        namespace = await self.client.versions(["kernos:ns:bob"])
        denied = await self.op(textwrap.dedent("""\
            note = "this assignment is rolled back with the op"
            try:
                read("ledger")          # bob was never granted read:ledger
            except CapabilityDenied:
                print("bob caught the denial")"""), principal="bob")
        after = await self.client.status()
        _check(denied.status == "denied" and "caught the denial" in denied.output
               and after["head"] == before["head"]
               and await self.client.versions(["kernos:ns:bob"]) == namespace,
               "the denied op rolled back although bob caught the denial: same head, bob's "
               f"namespace still at version {namespace['kernos:ns:bob']}")

    async def fail(self) -> None:
        print("2. An op fails halfway: it mutates state in place, then raises.\n")
        names = ["accounts", "ledger", "prices"]
        versions, head = await self.client.versions(names), await self.client.status()
        failed = await self.op(textwrap.dedent("""\
            accounts[1].deposit(1_000_000)
            ledger["entries"].append(("deposit", 1_000_000))
            prices[:] = 0.0
            raise RuntimeError("payment provider unreachable")"""))
        _check(failed.status == "failed" and failed.commit is None
               and (await self.client.status())["head"] == head["head"]
               and await self.client.versions(names) == versions,
               "the failed op committed nothing: same head, same versions")
        seen = await self.value("total(accounts), len(ledger['entries']), float(prices[0])")
        _check(seen == [400, 2, 1.0],
               "nothing of it remains: balances, ledger and array as before")

    async def react(self) -> None:
        print("3. Events: an in-image subscriber runs inside the op that emits.\n")
        outside = await self.client.subscribe(topic="payments.*")
        await self.op(textwrap.dedent("""\
            @events.subscribe("payments.*")
            def record_payment(event):
                ledger["entries"].append(("payment", event.payload["amount"]))"""))
        await self.op('events.emit("payments.received", {"amount": 30})')
        cancelled = await self.op(textwrap.dedent("""\
            events.emit("payments.received", {"amount": 999})
            raise RuntimeError("the order was cancelled")"""))
        ledger = await self.client.object("ledger")
        logged, _ = await self.client.events(since=0)
        pushed = [await outside.get(timeout=10)]
        with contextlib.suppress(TimeoutError):
            pushed.append(await outside.get(timeout=0.5))
        await outside.close()
        _request("object('ledger').preview", ledger.preview.repr if ledger.preview else None)
        _request("events(since=0)", [event["payload"] for event in logged])
        print(f"    pushed to the external subscriber: {[e['payload'] for e in pushed]}\n")
        _check(cancelled.status == "failed" and ledger.preview is not None
               and ledger.preview.json["entries"][-1] == ["payment", 30]
               and len(ledger.preview.json["entries"]) == 3
               and [event["payload"] for event in logged] == [{"amount": 30}]
               and [event["payload"] for event in pushed] == [{"amount": 30}],
               "the subscriber's change committed with its op; the cancelled op left no entry, "
               "and no event in the log or on the comm")

    async def race(self) -> None:
        print(f"4. Two agents race for one budget, each from its own client: both read 500, "
              f"both want {FULL_RUN}.\n")
        await self.op('account = {"budget": 500}')
        for agent in ("alice", "bob"):
            for capability in ("read:account", "write:account"):
                await self.client.grant(agent, capability)
            _request(f"grant({agent!r}, 'read:account'); grant({agent!r}, 'write:account')")
        clients = {agent: await AsyncKernosClient.connect(self.workspace)
                   for agent in ("alice", "bob")}
        print(f"    alice and bob each connect a client: AsyncKernosClient.connect(workspace) "
              f"finds pid {clients['alice'].pid} through kernel.json\n")
        both_read = asyncio.Barrier(2)
        attempts: dict[str, list[OpResult]] = {"alice": [], "bob": []}

        async def spend(agent: str) -> OpResult:
            client = clients[agent]

            async def attempt() -> OpResult:
                # Read, decide outside any op, act with a precondition on what was read.
                seen = await client.versions(["account"], principal=agent)
                budget = await self.budget(agent, client)
                if not attempts[agent]:
                    await both_read.wait()  # only so that the race is certain every run
                amount = FULL_RUN if budget >= FULL_RUN else SAMPLE_RUN
                plan = (f"spends {amount}" if amount == FULL_RUN else
                        f"{FULL_RUN} no longer fits: settles for {amount}")
                print(f"    {agent:<5} read account v{seen['account']}: budget {budget}; {plan}")
                result = await client.op(
                    f"write('account', {{'budget': read('account')['budget'] - {amount}}})\n"
                    f"bought = {amount}", principal=agent, expect_versions=seen,
                    key=f"{agent}-purchase-{len(attempts[agent]) + 1}")
                attempts[agent].append(result)
                if result.conflict and result.error is not None:
                    reason = result.error.message.split("; nothing ran")[0]
                    print(f"    {agent:<5} ==> conflict, nothing ran ({reason}); versions "
                          f"now {result.versions}")
                else:
                    print(f"    {agent:<5} ==> {result.status} ({_outcome(result)})")
                return result

            return await retry_on_conflict(attempt, backoff=0.05)

        print(textwrap.indent(textwrap.dedent(f"""\
            The harness of each agent, on its own client:
                async def attempt():
                    seen = await client.versions(["account"], principal=agent)  # read
                    account = await client.object("account", principal=agent)
                    budget = account.preview.json["budget"]
                    amount = {FULL_RUN} if budget >= {FULL_RUN} else {SAMPLE_RUN}  # decide
                    return await client.op(spend(amount), principal=agent,  # act, if
                                           expect_versions=seen)  # the read holds
                result = await retry_on_conflict(attempt)
            """), "    "))
        final = await asyncio.gather(spend("alice"), spend("bob"))
        await clients["alice"].close()
        self._bob = clients["bob"]  # kept open: it too sees the kernel die
        print()
        firsts = [attempts[agent][0] for agent in ("alice", "bob")]
        loser = next((agent for agent in ("alice", "bob") if attempts[agent][0].conflict), None)
        _check(sorted(result.status for result in firsts) == ["committed", "conflict"],
               "both acted on the same read: exactly one commit, and one conflict where "
               "nothing ran")
        assert loser is not None
        self._loser = loser
        conflict = attempts[loser][0]
        winner_version = next(r for r in firsts if r.committed).versions.get("account")
        _check(conflict.versions == {"account": winner_version} and winner_version is not None,
               f"the conflict carries the new version (account v{winner_version})")
        left = await self.budget()
        _check(all(result.committed for result in final) and len(attempts[loser]) == 2
               and left == 500 - FULL_RUN - SAMPLE_RUN,
               f"{loser} read again, saw {500 - FULL_RUN} left and settled for {SAMPLE_RUN}: "
               f"budget {left}, never overspent")

    async def crash(self) -> dict[str, Any]:
        print("5. kill -9 the kernel halfway through an op.\n")
        before = await self._workspace_state()
        running = Path(tempfile.mkdtemp(prefix="kernos-demo-")) / "running"
        code = textwrap.dedent(f"""\
            ledger["entries"].append(("never committed", 1))
            import pathlib, time
            pathlib.Path({str(running)!r}).touch()
            time.sleep(60)""")
        print(_prefixed(code, "human | "))
        in_flight = asyncio.ensure_future(self.client.op(code))
        deadline = time.monotonic() + 30
        while not running.exists() and time.monotonic() < deadline and not in_flight.done():
            await asyncio.sleep(0.02)
        shutil.rmtree(running.parent, ignore_errors=True)
        pid = self.manager.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        print(f"    kill -9 {pid} while the op sleeps\n")
        died: list[str] = []
        try:
            await asyncio.wait_for(in_flight, 10)
        except KernelDied as death:
            died.append(f"op request: KernelDied after {time.monotonic() - killed:.1f} s: "
                        f"{str(death).split('. ')[0]}")
        assert self._bob is not None
        try:
            await self._bob.versions(["account"], principal="bob")
        except KernelDied as death:
            died.append(f"bob's client: KernelDied ({str(death).split(':')[0]})")
        finally:
            await self._bob.close()
        for line in died:
            print(f"    {line}")
        print()
        _check(len(died) == 2 and not await self.manager.is_alive(),
               f"kernel pid {pid} is dead; the waiting op and the other client report KernelDied")
        return before

    async def restore(self, before: dict[str, Any]) -> None:
        print("6. Restart it (the manager), reconnect, and compare with what was there "
              "before the kill.\n")
        await self._restart()
        print(f"    kernel pid {self.manager.pid}\n")
        after = await self._workspace_state()
        rows = [("name", "type", "version", "summary")] + [
            (name, kind, str(version), summary[:48])
            for name, kind, version, summary, *_ in after["objects"]]
        print(textwrap.indent(format_table(rows), "    ") + "\n")
        _check(after["head"] == before["head"],
               f"the head is the last committed op (op {before['head']['op']}, commit "
               f"{_short(before['head']['commit'])}): the killed op left nothing",
               f"head now {after['head']}")
        differ = [what for what in ("objects", "agents", "grants", "tools")
                  if after[what] != before[what]]
        _check(not differ, "objects (names, types, versions, summaries, last op), agents, "
               "grants and tools are exactly as before the kill", f"{differ} differ")
        seen = await self.value(textwrap.dedent("""\
            (type(accounts[0]).__name__, accounts[0].owner, total(accounts),
             isinstance(accounts[1], Account), ledger["entries"][-1], float(prices[-1]),
             account["budget"])"""))
        _check(seen == ["Account", "ada", 400, True, ["payment", 30], 2.0, 20],
               "classes, functions, instances, containers and arrays work as before")
        used = await self.op('[call("summarize", amounts=[5])["total"], spend(5, "USD"), '
                             'summary["count"], bought]', principal="bob")
        bought = SAMPLE_RUN if self._loser == "bob" else FULL_RUN
        _check(used.committed and used.value is not None
               and used.value.repr == f"[5, Decimal('20'), 3, {bought}]",
               "bob's tool grant, budget (25 - 5 = 20 USD left) and names work as before")

    async def audit(self) -> None:
        print("7. The history: one snapshot per committed op.\n")
        snapshots = await self.client.log()
        rows = [("op", "commit", "principal", "what")] + [
            (str(entry["op"]), _short(entry["commit"]), str(entry["principal"]),
             " ".join(str(entry["message"]).split())[:60]) for entry in reversed(snapshots)]
        print(textwrap.indent(format_table(rows), "    ") + "\n")
        principals = {entry["principal"] for entry in snapshots}
        _check({"human", "alice", "bob"} <= principals,
               "the history lists every committed op, with its principal")

        print("8. The audit log: every op, committed or not, hash-chained.\n")
        records = await self.client.audit(limit=200)
        print(textwrap.indent(format_records(records), "    ") + "\n")
        statuses = {record.get("status") for record in records} | {
            record.get("type") for record in records}
        _check({"committed", "failed", "denied", "conflict", "died"} <= statuses,
               "failed, denied and conflicting ops, and the op killed with its kernel, are "
               "recorded next to committed ones")

        print("9. Erase a data subject (crypto-shredding), then verify from another process.\n")
        erased = await self.value("str(audit.erase('c-1042'))")
        customer = await self.client.object("customer")
        _check("c-1042" in str(erased) and customer.preview is not None
               and customer.preview.repr == "personal(<erased>, subject='c-1042')",
               "the subject's value is unreadable now")
        verify = subprocess.run([sys.executable, "-m", "kernos.cli", "audit", "verify",
                                 "--workspace", str(self.workspace)],
                                capture_output=True, text=True, check=False)
        print(textwrap.indent(f"$ kernos audit verify --workspace {self.workspace}\n"
                              + verify.stdout.rstrip(), "    ") + "\n")
        _check(verify.returncode == 0 and verify.stdout.startswith("ok:"),
               "`kernos audit verify` (a separate process) checks the chain, every snapshot and "
               "the history, erasure included")

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

    async def _loop_state(self, until: Callable[[dict[str, Any]], bool] | None = None
                          ) -> dict[str, Any]:
        """bob's loop as the harness sees it; with ``until``, once that holds of it."""
        deadline = time.monotonic() + WAIT
        while True:
            state: dict[str, Any] = (await self.client.request(
                "loop", do="status", agent="bob"))["loops"][0]
            if until is None or until(state) or time.monotonic() > deadline:
                return state
            await asyncio.sleep(0.02)

    async def _restart(self) -> None:
        await self.client.close()
        await self.manager.restart()
        self._client = await self.manager.client()

    @property
    def payments(self) -> Path:
        return self.workspace.with_name(self.workspace.name + "-payments.jsonl")

    async def _workspace_state(self) -> dict[str, Any]:
        """What the harness can see of the workspace, for comparing across the kill."""
        status = await self.client.status()

        def row(info: ObjectInfo) -> tuple[Any, ...]:
            return (info.name, info.type, info.version, info.summary, info.op, info.principal)

        return {"objects": [row(info) for info in await self.client.objects()],
                "head": status["head"], "agents": await self.client.agents(),
                "grants": await self.client.grants(), "tools": await self.client.tools()}

    async def run(self) -> None:
        await self.start()
        await self.build()
        await self.fail()
        await self.react()
        await self.race()
        before = await self.crash()
        await self.restore(before)
        await self.audit()
        await self.replay(await self.agent_loop())
        await self.supervised_loop()

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.manager.shutdown()


def _demo_workspace(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "snapshots" / "README.md").exists():
        workspace = checkout / "snapshots" / "demo"
    else:
        workspace = Path(tempfile.gettempdir()) / f"kernos-demo-{os.getuid()}"
    shutil.rmtree(workspace, ignore_errors=True)  # the demo always starts from nothing
    return workspace


def _ensure_kernelspec() -> None:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        from kernos.kernel.install import install

        where = install(prefix=sys.prefix)
        print(f"Installed the kernos kernelspec in {where}")


async def _main(workspace: Path) -> None:
    demo = Demo(workspace)
    try:
        await demo.run()
    finally:
        await demo.stop()


def run_demo(workspace_dir: str | None = None) -> int:
    for module, why in (("numpy", "keeps a numpy array in the image"),
                        ("litellm", "has an agent plan through litellm")):
        if importlib.util.find_spec(module) is None:
            print(f"kernos demo: the demonstration {why}, and {module} is not installed. "
                  "Install it with: pip install 'kernos[demo]'", file=sys.stderr)
            return 2
    workspace = _demo_workspace(workspace_dir)
    _ensure_kernelspec()
    print(f"Kernos demo: a persistent, transactional kernel, driven by a harness "
          f"(kernos.client).\nWorkspace: {workspace}\n")
    started = time.monotonic()
    try:
        asyncio.run(_main(workspace))
    except DemoFailure as failure:
        print(f"\nDEMO FAILED: {failure}", file=sys.stderr)
        return 1
    except KernosError as error:
        print(f"\nDEMO FAILED: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    kernos = _command()
    print(f"Done in {time.monotonic() - started:.0f} s. Browse it yourself:\n"
          f"    {kernos} log --workspace {workspace}\n"
          f"    {kernos} audit log --workspace {workspace}\n"
          f"    {kernos} objects --workspace {workspace}")
    if kernos != "kernos":
        print(f"({kernos} is this install's command; `source {Path(kernos).parent}/activate` "
              "puts `kernos` on your PATH.)")
    return 0


def _command() -> str:
    """How the reader runs this ``kernos``: its name when it is on the PATH, else its path."""
    running = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    found = shutil.which("kernos")
    if running is None or running.name != "kernos" or (
            found is not None and Path(found).resolve() == running):
        return "kernos"
    with contextlib.suppress(ValueError):
        return os.path.relpath(running)
    return str(running)
