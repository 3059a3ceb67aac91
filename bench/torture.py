"""Random kill -9 torture: real kernels killed at instants nobody chose, checked after each.

    python bench/torture.py [--kills 500] [--clients 3] [--seed N] [--keep DIR]

A workspace is driven by several harness clients at once, each sending ops
with idempotency keys (``kernos.client``: every op appends its key to
``journal``, records its position in ``by_key`` and adds one to ``count``;
three names, so an op half there shows).  The kernel is killed with SIGKILL:

* at a random instant, uniform over the first ``--window`` seconds of its
  life (after its restore), or
* (one kill in three) at a commit window: the kernel is started with
  ``KERNOS_CRASH_AT=<point>@<n>`` for a random crash point of the write path
  (``kernos._faults``: a frame written, the commit published, a fold's pack
  or ref) and a random ``n``, so it kills itself right there.

After each kill, on the dead kernel's workspace:

* ``kernos.audit.verify`` is clean (from the head it reported after the last kill:
  ``since``) and ``git fsck --full --strict`` passes (I6), once a background
  repack the dead kernel started has finished;

then a new kernel starts (its restore is timed), every op that was in flight
at the kill is sent again under its key (it must run at most once), and:

* every op acknowledged as committed is in ``journal`` (I2), once;
* ``count == len(journal) == len(by_key)``: no op is half there (I1, I2);
* nothing is in ``journal`` that was never sent.

Printed: kills, ops acknowledged, ops resent after a kill, violations (each
named), and the time from launch to a restored kernel answering (median and
max).  The target is zero violations.  ``tests/integration/test_torture.py``
runs a small seeded version (30 kills) in the suite.

Not yet in the workload (issue 18 lists them): agent ops under grants and
budgets, tool calls, external effects, recorded LLM calls, events,
checkouts, a background repack, and replay (I7) after each kill.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))

if TYPE_CHECKING:
    from kernos.client import KernosManager

SETUP = "journal = []\nby_key = {}\ncount = 0"
OP = "journal.append({key!r})\nby_key[{key!r}] = len(journal)\ncount += 1"
CHECK = ("[len(journal), len(by_key), count, sorted(set(journal)) == sorted(by_key), "
         "[key for key in {keys!r} if key not in by_key]]")
CRASH_POINTS = ("frame", "published", "sealed", "fold.packed", "fold.published")


@dataclass
class Tally:
    kills: int = 0
    crash_points: int = 0
    acknowledged: int = 0
    resent: int = 0
    sent: int = 0
    violations: list[str] = field(default_factory=list)
    restores: list[float] = field(default_factory=list)
    checks: list[float] = field(default_factory=list)
    """Seconds verify and git fsck took after each kill."""
    anchor: str | None = None
    """The head verify reported last (``INDEX:HASH``): the next one starts there."""

    def violation(self, kill: int, what: str) -> None:
        self.violations.append(f"kill {kill}: {what}")


async def _drive(workspace: Path, clients: int, window: float, rng: random.Random,
                 tally: Tally, kill: int, env: dict[str, str],
                 pending: dict[str, str], unchecked: list[str]) -> None:
    """Start a kernel, resend what the last kill left in flight, send ops until it dies."""
    from kernos.client import AsyncKernosClient, KernosManager
    from kernos.client.errors import ClientError

    manager = KernosManager(workspace, env=env)
    started = time.monotonic()
    try:
        await manager.start(timeout=300)
    except ClientError:  # it reached its crash point while starting (a fold at open)
        tally.crash_points += 1
        await manager.shutdown()
        return
    tally.restores.append(time.monotonic() - started)
    pid = manager.pid
    assert pid is not None
    try:
        await _resend_and_check(manager, tally, kill, pending, unchecked)
    except ClientError:  # it reached its crash point already
        tally.crash_points += 1
        await manager.shutdown()
        return
    connected = [await AsyncKernosClient.connect(workspace) for _ in range(clients)]
    stop = asyncio.Event()

    async def work(index: int, client: AsyncKernosClient) -> None:
        number = 0
        while not stop.is_set():
            name = f"c{index}"
            key = f"k{kill}-{name}-{number}"
            number += 1
            pending[name] = key
            tally.sent += 1
            try:
                result = await client.op(OP.format(key=key), key=key)
            except ClientError:
                return  # the kernel died with the op in flight: it stays pending
            if result.committed:
                tally.acknowledged += 1
                unchecked.append(key)
            else:
                tally.violation(kill, f"op {key} did not commit: {result.status} "
                                      f"{result.error}")
            del pending[name]

    workers = [asyncio.ensure_future(work(index, client))
               for index, client in enumerate(connected)]
    try:
        deadline = time.monotonic() + rng.uniform(0.02, window)
        while time.monotonic() < deadline and await manager.is_alive():
            await asyncio.sleep(0.005)
        if await manager.is_alive():
            os.kill(pid, signal.SIGKILL)
        else:
            tally.crash_points += 1  # it killed itself at its crash point
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers, return_exceptions=True), 120)
    finally:
        for client in connected:
            await client.close()
        await manager.shutdown()


async def _resend_and_check(manager: KernosManager, tally: Tally, kill: int,
                            pending: dict[str, str], unchecked: list[str]) -> None:
    owner = await manager.client()
    try:
        for name, key in sorted(pending.items()):  # in flight at the last kill: once at most
            result = await owner.op(OP.format(key=key), key=key)
            tally.resent += 1
            if not result.committed:
                tally.violation(kill, f"resending {key} did not commit: {result.status}")
                continue
            unchecked.append(key)
            del pending[name]
        value = (await owner.op(CHECK.format(keys=unchecked))).value
        if value is None or not value.has_json:
            tally.violation(kill, f"the check gave no value: {value}")
        else:
            journal, keys, count, same, missing = value.json
            if not (journal == keys == count) or not same:
                tally.violation(kill, f"an op is half there: len(journal) {journal}, "
                                      f"len(by_key) {keys}, count {count}")
            if missing:
                tally.violation(kill, f"acknowledged ops are missing: {missing[:5]}")
            if journal > tally.sent:
                tally.violation(kill, f"{journal} ops in the journal, {tally.sent} sent")
            unchecked.clear()
    finally:
        await owner.close()


def _check_dead(workspace: Path, tally: Tally, kill: int) -> None:
    """verify and git fsck on the workspace of a killed kernel.

    verify reads only what came after the head it reported last time (``since``, the
    anchor): the chain still holds that record with that hash, and every record and
    snapshot after it is checked, so the cost stays flat as the history grows.
    """
    from kernos.audit.verify import verify

    started = time.monotonic()
    report = verify(workspace, since=tally.anchor)
    if not report.ok:
        tally.violation(kill, f"audit verify: {report.problems[0]}")
    else:
        tally.anchor = report.head
    _wait_for_repacks(workspace / "history.git")
    fsck = subprocess.run(["git", f"--git-dir={workspace / 'history.git'}", "fsck", "--full",
                           "--strict", "--no-progress"], capture_output=True, text=True)
    if fsck.returncode != 0:
        tally.violation(kill, f"git fsck: {(fsck.stderr or fsck.stdout).strip()[:300]}")
    tally.checks.append(time.monotonic() - started)


def _wait_for_repacks(git_dir: Path, seconds: float = 120) -> None:
    """Wait until no ``git repack`` runs on ``git_dir``.

    The kernel's background repack is a child process that outlives a killed
    kernel and finishes its work (git's repack is safe to interrupt or to let
    run).  ``git fsck`` run beside it reports the packs it is replacing as
    unreadable, which says nothing about the workspace.
    """
    marker = f"--git-dir={git_dir}".encode()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        running = False
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                arguments = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in arguments and b"repack" in arguments:
                running = True
                break
        if not running:
            return
        time.sleep(0.05)


async def torture(workspace: Path, *, kills: int, clients: int, seed: int,
                  window: float = 0.6, progress: bool = True) -> Tally:
    from kernos.client import run_kernel

    rng = random.Random(seed)
    tally = Tally()
    async with run_kernel(workspace) as (_manager, owner):
        assert (await owner.op(SETUP)).committed
    pending: dict[str, str] = {}
    unchecked: list[str] = []
    for kill in range(1, kills + 1):
        env = {}
        if rng.random() < 1 / 3:
            env["KERNOS_CRASH_AT"] = f"{rng.choice(CRASH_POINTS)}@{rng.randint(2, 40)}"
        await _drive(workspace, clients, window, rng, tally, kill, env, pending, unchecked)
        tally.kills += 1
        _check_dead(workspace, tally, kill)
        if progress and kill % 10 == 0:
            print(f"  {kill} kills, {tally.acknowledged} ops acknowledged, "
                  f"{len(tally.violations)} violations", flush=True)
    # A last kernel checks what the last kill left.
    await _drive(workspace, 0, 0.02, rng, tally, kills + 1, {}, pending, unchecked)
    _check_dead(workspace, tally, kills + 1)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=500, help="kernels to kill (500)")
    parser.add_argument("--clients", type=int, default=3, help="clients at once (3)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (1)")
    parser.add_argument("--window", type=float, default=0.6,
                        help="kill uniformly within this many seconds of a start (0.6)")
    parser.add_argument("--keep", type=Path, help="keep the workspace in this directory")
    args = parser.parse_args()
    print(f"torture: {args.kills} kills, {args.clients} clients, seed {args.seed}, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kernos-torture-") as scratch:
        workspace = args.keep or Path(scratch) / "workspace"
        began = time.monotonic()
        tally = asyncio.run(torture(workspace, kills=args.kills, clients=args.clients,
                                    seed=args.seed, window=args.window))
        elapsed = time.monotonic() - began
    restores = tally.restores[1:]  # the first start restored nothing a kill left
    print(f"\nkills               {tally.kills} ({tally.crash_points} at a crash point of "
          "the write path, the rest by SIGKILL at a random instant)")
    print(f"ops acknowledged    {tally.acknowledged} (of {tally.sent} sent; "
          f"{tally.resent} resent under their key after a kill)")
    if restores:
        print(f"restore after kill  median {statistics.median(restores) * 1000:.0f} ms, "
              f"max {max(restores) * 1000:.0f} ms (launch to a restored kernel answering)")
    if tally.checks:
        print(f"verify + git fsck   median {statistics.median(tally.checks) * 1000:.0f} ms, "
              f"max {max(tally.checks) * 1000:.0f} ms per kill")
    print(f"violations          {len(tally.violations)}")
    for violation in tally.violations[:20]:
        print(f"  {violation}")
    print(f"wall time           {elapsed:.0f} s")
    return 1 if tally.violations else 0


if __name__ == "__main__":
    sys.exit(main())
