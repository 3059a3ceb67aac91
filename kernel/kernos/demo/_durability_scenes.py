"""Scenes 5 to 9 of the demonstration: the kill, the restore, the history and the audit.

The kernel is killed with SIGKILL halfway through an op (every client reports
``KernelDied``), restarted by its manager, and found exactly as it was; then
the history, the audit log, an erasure, and ``kernos audit verify`` in a
separate process.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from kernos.audit.human import format_records
from kernos.client import KernelDied
from kernos.demo._report import _check, _prefixed, _short
from kernos.demo._scripts import FULL_RUN, SAMPLE_RUN
from kernos.demo._stage import Stage
from kernos.history import format_table


class DurabilityScenes(Stage):
    """Steps 5 to 9: crash, restore, audit (the history, the audit log, an erasure)."""

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
