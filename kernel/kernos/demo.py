"""The headless demonstration: a real Kernos kernel, driven through jupyter_client.

It starts the kernel on a fresh demo workspace, builds state (with a class
and a function defined in cells), makes a cell fail halfway and shows that
nothing of it remains, lets two agents work under capability grants (one
writes a tool, the other is granted it and uses it; a denied action is
rolled back even though the agent caught the denial), reacts to events
with a subscriber that commits and rolls back with its op, kills the kernel
with SIGKILL, starts a new one and shows that everything is back, agents and
tools included, prints the history and the audit log, verifies the audit
chain from disk and erases a data subject.  Each step checks what it claims
and the demo exits non-zero if any check fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

KERNEL = "kernos"


class DemoFailure(Exception):
    pass


class Session:
    """A kernel and a client, with a helper that runs a cell and collects its output."""

    def __init__(self, workspace: Path) -> None:
        from jupyter_client.manager import KernelManager

        env = dict(os.environ, KERNOS_WORKSPACE=str(workspace))
        env.pop("JPY_SESSION_NAME", None)
        self._sockets = tempfile.mkdtemp(prefix="kernos-ipc-")
        self.manager = KernelManager(kernel_name=KERNEL, transport="ipc",
                                     ip=os.path.join(self._sockets, "kernel"))
        self.manager.start_kernel(env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    @property
    def pid(self) -> int:
        return int(self.manager.provisioner.process.pid)  # type: ignore[union-attr]

    def run(self, code: str, *, show: bool = True) -> tuple[str, dict[str, Any], str]:
        output: list[str] = []

        def collect(message: dict[str, Any]) -> None:
            kind = message["msg_type"]
            content = message["content"]
            if kind == "stream":
                output.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                output.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                output.append(f"{content['ename']}: {content['evalue']}\n")

        reply = self.client.execute_interactive(code, timeout=120, output_hook=collect)
        text = "".join(output)
        kernos = reply["metadata"].get("kernos", {})
        if show:
            print(textwrap.indent(code, "    In  | "))
            if text.strip():
                print(textwrap.indent(text.rstrip("\n"), "    Out | "))
            status = kernos.get("status", reply["content"]["status"])
            detail = f"op {kernos['op']}" if "op" in kernos else ""
            if kernos.get("commit"):
                detail += f", commit {kernos['commit'][:12]}"
            if kernos.get("changed") or kernos.get("added"):
                detail += f", changed {sorted(kernos.get('added', []) + kernos.get('changed', []))}"
            print(f"    ==> {status} ({detail})\n")
        return reply["content"]["status"], kernos, text

    def stop(self) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)
        shutil.rmtree(self._sockets, ignore_errors=True)


def _check(condition: bool, claim: str) -> None:
    if not condition:
        raise DemoFailure(claim)
    print(f"    [ok] {claim}\n")


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


def run_demo(workspace_dir: str | None = None) -> int:
    import importlib.util

    if importlib.util.find_spec("numpy") is None:
        print("kernos demo: the demonstration keeps a numpy array in the image, and numpy is "
              "not installed. Install it with: pip install 'kernos[demo]'", file=sys.stderr)
        return 2
    workspace = _demo_workspace(workspace_dir)
    _ensure_kernelspec()
    print(f"Kernos demo: a persistent, transactional kernel.\nWorkspace: {workspace}\n")
    session = None
    try:
        print("1. Start a Kernos kernel (jupyter_client, kernelspec 'kernos').\n")
        session = Session(workspace)
        print(f"    kernel pid {session.pid}\n")

        print("2. Build state: data, a class and a function defined in cells.\n")
        session.run(textwrap.dedent("""\
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
        session.run("accounts[0].deposit(50)\nledger['entries'].append(('deposit', 50))\n"
                    "total(accounts)")

        print("3. A cell that fails halfway: it mutates state in place, then raises.\n")
        status, report, _ = session.run(textwrap.dedent("""\
            accounts[1].deposit(1_000_000)
            ledger["entries"].append(("deposit", 1_000_000))
            prices[:] = 0.0
            raise RuntimeError("payment provider unreachable")"""))
        _check(status == "error" and report.get("status") == "rolled back",
               "the failed cell was rolled back")
        _, _, text = session.run("print(total(accounts), len(ledger['entries']), prices[0])")
        _check(text.split() == ["400", "2", "1.0"],
               "nothing of the failed cell remains (balances, ledger and array as before)")

        print("4. Two agents under capability grants.\n")
        session.run(textwrap.dedent("""\
            %kernos agent add alice
            %kernos agent add bob
            %kernos grant alice read:ledger
            %kernos grant bob spend:USD 100
            %kernos grant bob call:summarize"""))
        session.run(textwrap.dedent('''\
            %%agent alice
            # Agent code is restricted Python: alice reads the ledger through a
            # read-only view and writes a tool that persists in the image.
            print("alice sees", len(read("ledger")["entries"]), "ledger entries")
            define_tool("summarize", """
            def summarize(amounts):
                return {"count": len(amounts), "total": sum(amounts)}
            """, {"type": "object", "properties": {"amounts": {"type": "array"}},
                  "required": ["amounts"]}, "Count and total a list of amounts")'''))
        status, report, text = session.run(textwrap.dedent("""\
            %%agent bob
            summary = call("summarize", amounts=[40, 25, 10])
            left = spend(summary["total"], "USD")
            print("bob spent", summary["total"], "USD;", left, "left")"""))
        _check(status == "ok" and report.get("principal") == "bob" and "25 left" in text,
               "bob used alice's tool and spent within his budget")
        status, report, text = session.run(textwrap.dedent("""\
            %%agent bob
            note = "this assignment is rolled back with the op"
            try:
                read("ledger")          # bob was never granted read:ledger
            except CapabilityDenied:
                print("bob caught the denial")"""))
        _check(status == "error" and report.get("status") == "rolled back"
               and "OpVetoed" in text,
               "the denied op was rolled back even though bob caught the denial")
        _, _, text = session.run("print(sorted(agents.namespace('bob')))")
        _check(text.split() == ["['left',", "'summary']"],
               "nothing of the denied op remains in bob's namespace")

        print("5. Events: a subscriber runs inside the op that emits.\n")
        session.run(textwrap.dedent("""\
            @events.subscribe("payments.*")
            def record_payment(event):
                ledger["entries"].append(("payment", event.payload["amount"]))"""))
        session.run('events.emit("payments.received", {"amount": 30})')
        status, _, _ = session.run(textwrap.dedent("""\
            events.emit("payments.received", {"amount": 999})
            raise RuntimeError("the order was cancelled")"""))
        _, _, text = session.run(
            "print(ledger['entries'][-1], len(ledger['entries']))\n"
            "print([e['payload']['amount'] for e in events.since(0)])")
        _check(status == "error" and text.split() == ["('payment',", "30)", "3", "[30]"],
               "the subscriber's change committed with its op; the cancelled op left no "
               "entry and no event")

        print("6. kill -9 the kernel process.\n")
        pid = session.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 10
        while session.manager.is_alive() and time.time() < deadline:
            time.sleep(0.05)
        _check(not session.manager.is_alive(), f"kernel pid {pid} is dead")
        session.client.stop_channels()

        print("7. Start a new kernel on the same workspace.\n")
        session = Session(workspace)
        print(f"    kernel pid {session.pid}\n")
        _, _, text = session.run(
            "print(type(accounts[0]).__name__, accounts[0].owner, total(accounts), "
            "ledger['entries'][-1], prices[-1])\n"
            "print(isinstance(accounts[1], Account), accounts[1].deposit(0))")
        _check(text.split() == ["Account", "ada", "400", "('payment',", "30)", "2.0", "True",
                                "250"],
               "classes, functions, instances, containers and arrays are intact")
        status, _, text = session.run(textwrap.dedent("""\
            %%agent bob
            print(call("summarize", amounts=[5])["total"], spend(5, "USD"), summary["count"])"""))
        _check(status == "ok" and text.split() == ["5", "20", "3"],
               "agents, grants, budgets, bob's names and alice's tool are intact")

        print("8. The history (one snapshot per committed op).\n")
        _, _, text = session.run("%kernos log", show=False)
        print(textwrap.indent(text.rstrip(), "    "))
        print()
        _check(text.count("human") >= 4 and "alice" in text and "bob" in text,
               "the history lists every committed op, with its principal")

        print("9. The audit log: every op, committed or not, hash-chained.\n")
        _, _, text = session.run("%kernos audit 20", show=False)
        print(textwrap.indent(text.rstrip(), "    "))
        print()
        _check("failed" in text and "denied" in text and "committed" in text,
               "failed and denied ops are recorded next to committed ones")
        session.run('customer = personal("Ada Lovelace, 12 Marylebone Rd", subject="c-1042")')
        status, _, text = session.run("%kernos erase c-1042\nprint(customer)")
        _check(status == "ok" and "personal(<erased>, subject='c-1042')" in text,
               "erasing the data subject made its value unreadable")
        import subprocess

        verify = subprocess.run([sys.executable, "-m", "kernos.cli", "audit", "verify",
                                 "--workspace", str(workspace)],
                                capture_output=True, text=True, check=False)
        print(textwrap.indent(verify.stdout.rstrip(), "    "))
        print()
        _check(verify.returncode == 0 and verify.stdout.startswith("ok:"),
               "`kernos audit verify` (a separate process) checks the chain, every snapshot and "
               "the history")
        print(f"Done. Browse it yourself: kernos log --workspace {workspace}\n"
              f"                          kernos audit log --workspace {workspace}")
        return 0
    except DemoFailure as failure:
        print(f"\nDEMO FAILED: {failure}", file=sys.stderr)
        return 1
    finally:
        if session is not None:
            session.stop()
