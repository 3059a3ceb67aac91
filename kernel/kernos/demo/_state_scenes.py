"""Scenes 1 to 4 of the demonstration: state, a failure, events, and a race.

Agents build tools and state; an op that fails halfway leaves nothing; an
in-image subscriber commits and rolls back with its op while an external one
sees only what committed; two agents on two clients race for one budget, and
the loser retries on the conflict.  The race keeps bob's client open
(``_bob``) for the crash that follows (``_durability_scenes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import textwrap

from kernos.client import AsyncKernosClient, OpResult, retry_on_conflict
from kernos.demo._report import _check, _outcome, _request
from kernos.demo._scripts import FULL_RUN, SAMPLE_RUN
from kernos.demo._stage import Stage


class StateScenes(Stage):
    """Steps 1 to 4: build, fail, react, race."""

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
