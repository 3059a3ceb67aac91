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

The package, one concept a module: ``_stage`` (the kernel and client every scene
uses), ``_state_scenes`` (printed steps 1 to 4), ``_durability_scenes`` (5 to 9),
``_agent_scenes`` (10 to 12), ``_scripts`` (the agents' code and data) and
``_report`` (what is printed, and the checks).  This module joins the scenes
into :class:`Demo` and runs it: :func:`run_demo` (``kernos demo``, or
``python -m kernos.demo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kernos.demo._agent_scenes import AgentScenes
from kernos.demo._durability_scenes import DurabilityScenes
from kernos.demo._report import DemoFailure
from kernos.demo._stage import KERNEL
from kernos.demo._state_scenes import StateScenes
from kernos.errors import KernosError

__all__ = ["Demo", "DemoFailure", "run_demo"]


class Demo(StateScenes, DurabilityScenes, AgentScenes):
    """The demonstration's kernel, its harness client, and the steps, in order."""

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


def _demo_workspace(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    checkout = Path(__file__).resolve().parents[3]  # kernel/kernos/demo/__init__.py
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
