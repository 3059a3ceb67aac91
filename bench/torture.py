"""Random kill -9 torture: real kernels killed at instants nobody chose, checked after each.

    python bench/torture.py [--kills 500] [--clients 3] [--seed N] [--keep DIR]

A workspace is driven by several harness clients at once (``kernos.client``),
each sending ops with idempotency keys, drawn at random from a mixed workload:

* **human ops**: append the key to ``journal``, record its position in
  ``by_key``, add one to ``count`` (three names, so an op half there shows)
  and emit an event ``torture.op`` naming the key;
* **agent ops** by ``bot``, under grants and budgets: ``spend(1, "USD")``
  (a ``spend:USD`` budget), a recorded LLM call (``llm:gpt-4o-mini`` with a
  token budget, answered offline by litellm's ``mock_response``), a call of
  the pure tool ``double``, and a call of the external tool ``touch``, whose
  effect appends its idempotency key to a file outside the workspace (the
  world) once the op has committed; each records its key in a list of
  ``bot``'s namespace;
* **checkouts** of ``HEAD`` (a whole restore and a commit, under the others'
  ops); the kernel's own background repacks and folds run as they fall due.

The budgets are sized so they run out during a long run: an op refused for
its budget is an expected outcome, not a violation.  The kernel is killed
with SIGKILL:

* at a random instant, uniform over the first ``--window`` seconds of its
  life (after its restore), or
* (one kill in three) in a commit or effect window: the kernel is started
  with ``KERNOS_CRASH_AT=<point>@<n>`` for a random crash point
  (``kernos._faults``: of a commit's write path, a fold's pack or ref, the
  events' notification, an effect's journal or its follow-up op) and a
  random ``n``, so it kills itself right there (given up to ``CRASH_WAIT``
  seconds to get there, then killed with SIGKILL).

After each kill, on the dead kernel's workspace:

* ``kernos.audit.verify`` is clean (from the head it reported after the last
  kill: ``since``) and ``git fsck --full --strict`` passes (I6), once a
  background repack the dead kernel started has finished;
* ``kernos replay`` of the history since the last kill's check reproduces
  every snapshot (I7), LLM answers from their recordings and effects from
  their journal;

then a new kernel starts (its restore is timed), every op that was in flight
at the kill is sent again under its key (it must run at most once), and:

* every op acknowledged as committed is there, once, in its list (I2); no
  human op is half there (``count == len(journal) == len(by_key)``, I1) and
  nothing is there that was never sent;
* every committed human op's event is in the event log once, and no event
  is there from an op that did not commit;
* every effect ran at most once in the world, every effect that is ``done``
  ran exactly once, nothing ran for an op that rolled back, and after the
  restart every effect is ``done`` or ``in-doubt`` (never lost silently);
* no budget is overspent (I4): ``spend:USD``'s ``used`` equals the committed
  spends, and the LLM grant's ``used`` (from the ledger outside the image) is
  at most its limit (plus what the call that crossed it used beyond its
  reservation: the provider's answer stays charged and that op is vetoed,
  ``kernos.llm``; litellm's mock reports 30 tokens whatever ``max_tokens``
  says) and at least the tokens of the committed calls.

Printed: kills, ops acknowledged (by kind), ops resent after a kill,
violations (each named), and the time from launch to a restored kernel
answering (median and max).  The target is zero violations.
``tests/integration/test_torture.py`` runs a small seeded version (30 kills)
in the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
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
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))

if TYPE_CHECKING:
    from kernos.client import AsyncKernosClient, KernosManager
    from kernos.harness.results import ErrorInfo

SETUP = '''
journal = []
by_key = {}
count = 0
WORLD = WORLD_PATH

def touch(tag, idempotency_key):
    """The outside world: a line per run of the effect, never deduplicated."""
    with open(WORLD, "a") as world:
        world.write(idempotency_key + " " + tag + "\\n")
    return {"tag": tag}

def touched(key):
    """Whether an effect cut short by a kill reached the world (``resolve``)."""
    try:
        with open(WORLD) as world:
            for line in world:
                if line.split()[0] == key:
                    return True, {"tag": line.split()[1]}
    except FileNotFoundError:
        pass
    return False, None

def double(x):
    return 2 * x

_tag = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
agents.register_tool("touch", touch, effect="external", resolve=touched, schema=_tag,
                     description="append a line to the world file")
agents.register_tool("double", double, description="twice x", schema={
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})
agents.add("bot")
agents.grant("bot", "spend:USD", SPEND_LIMIT)
agents.grant("bot", "llm:gpt-4o-mini", LLM_LIMIT)
agents.grant("bot", "call:touch")
agents.grant("bot", "call:double")
del _tag
'''
BOT_SETUP = "spent = []\nasked = []\ntickets = []\ndoubled = []"

OPS = {
    "human": ("human", "journal.append({key!r})\nby_key[{key!r}] = len(journal)\ncount += 1\n"
                       "events.emit('torture.op', {{'key': {key!r}}})"),
    "spend": ("bot", "spend(1, 'USD')\nspent.append({key!r})"),
    "llm": ("bot", "answer = llm('gpt-4o-mini', [{{'role': 'user', 'content': {key!r}}}], "
                   "mock_response='seen ' + {key!r}, max_tokens=8)\n"
                   "asked.append([{key!r}, answer['usage']['total_tokens']])\ndel answer"),
    "tool": ("bot", "doubled.append([{key!r}, call('double', x=len(doubled))])"),
    "effect": ("bot", "tickets.append([{key!r}, call('touch', tag={key!r})['effect']])"),
}
WEIGHTS = {"human": 6, "spend": 1, "llm": 1, "tool": 1, "effect": 1, "checkout": 0.25}
LISTS = {"spend": "spent", "llm": "asked", "tool": "doubled", "effect": "tickets"}
BUDGET_ERRORS = ("budget", "exceed", "remaining", "left")
"""Words of the refusal an op gets once its budget is spent (expected late in a run)."""

SUMMARY = ("[len(journal), len(by_key), count, len(set(journal)) == len(journal) == len(by_key) "
           "and set(journal) == set(by_key), "
           "{name: len(agents.namespace('bot')[name]) for name in LIST_NAMES}, "
           "[[g['capability'], g['limit'], g['used']] for g in agents.grants('bot')], "
           "len(agents.effects()), sum(item[1] for item in agents.namespace('bot')['asked'])]")
"""The state in one small value; the lists themselves are read in pages (``PAGES``)."""
PAGES = {
    "journal": "journal[{start}:{end}]",
    **{name: f"[item if isinstance(item, str) else item[0] "
             f"for item in agents.namespace('bot')[{name!r}][{{start}}:{{end}}]]"
       for name in LISTS.values()},
    "effects": "[[e['key'], e['status']] for e in agents.effects()[{start}:{end}]]",
}
PAGE = 40
CRASH_POINTS = {
    # the write path of a commit and of a fold: reached by every op
    **dict.fromkeys(("serialize", "objects", "sealed", "frame", "published", "notify",
                     "fold.packed", "fold.published"), 40),
    # an effect's journal and its follow-up op: reached by one op in ten
    **dict.fromkeys(("effect.before", "effect.started", "effect.executed",
                     "effect.journaled", "effect.record"), 4),
}
"""Crash points (``kernos._faults``) and the largest pass to crash at."""
CRASH_WAIT = 15.0
"""How long a kernel started with a crash point may take to reach it before
it is killed at that instant instead (a fold falls due only now and then)."""
SETTLED = ("done", "in-doubt")
SETTLE_SECONDS = 20.0
"""How long the effects a restart found may take to be run or resolved."""


@dataclass
class Tally:
    kills: int = 0
    crash_points: int = 0
    acknowledged: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: int = 0
    """Ops refused because their budget was spent (an expected outcome)."""
    checkouts: int = 0
    resent: int = 0
    sent: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    restores: list[float] = field(default_factory=list)
    checks: list[float] = field(default_factory=list)
    """Seconds verify and git fsck took after each kill."""
    replays: list[float] = field(default_factory=list)
    """Seconds each replay of the ops since the last check took."""
    replayed: int = 0
    anchor: str | None = None
    """The head verify reported last (``INDEX:HASH``): the next one starts there."""
    replay_from: str | None = None
    """The snapshot the next replay starts from (``@OP``, the head at the last check)."""
    events_cursor: int = 0
    events_seen: set[str] = field(default_factory=set)
    seen: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))
    """The keys read so far from each list (``journal``, ``spent`` ...)."""
    effects: dict[str, str] = field(default_factory=dict)
    """Each effect read so far, by key: its status."""

    def violation(self, kill: int, what: str) -> None:
        self.violations.append(f"kill {kill}: {what}")


@dataclass
class Pending:
    """Keyed ops sent and not yet answered, by client; and acknowledged ops not yet checked."""

    in_flight: dict[str, tuple[str, str]] = field(default_factory=dict)
    """client -> (kind, key)."""
    unchecked: list[tuple[str, str]] = field(default_factory=list)
    """(kind, key) acknowledged since the last check."""


def _code(kind: str, key: str) -> tuple[str, str]:
    principal, template = OPS[kind]
    return principal, template.format(key=key)


def _refused_for_budget(kind: str, error: ErrorInfo | None) -> bool:
    message = "" if error is None else error.message.lower()
    return kind in ("spend", "llm") and any(word in message for word in BUDGET_ERRORS)


async def _send(client: AsyncKernosClient, kind: str, key: str, tally: Tally, kill: int,
                pending: Pending) -> bool:
    """Send one keyed op; False when the budget refused it (it stays unacknowledged)."""
    principal, code = _code(kind, key)
    result = await client.op(code, principal=principal, key=key)
    if result.committed:
        tally.acknowledged[kind] += 1
        pending.unchecked.append((kind, key))
        return True
    if _refused_for_budget(kind, result.error):
        tally.refused += 1
        return False
    tally.violation(kill, f"{kind} op {key} did not commit: {result.status} "
                          f"{result.error and result.error.message}")
    return False


async def _drive(workspace: Path, clients: int, window: float, rng: random.Random,
                 tally: Tally, kill: int, env: dict[str, str], pending: Pending) -> None:
    """Start a kernel, resend what the last kill left in flight, send ops until it dies."""
    from kernos.client import AsyncKernosClient, KernosManager
    from kernos.client.errors import ClientError, RequestError

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
        await _resend_and_check(manager, workspace, tally, kill, pending)
    except ClientError:  # it reached its crash point already
        tally.crash_points += 1
        await manager.shutdown()
        return
    connected = [await AsyncKernosClient.connect(workspace) for _ in range(clients)]
    stop = asyncio.Event()
    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())

    async def work(index: int, client: AsyncKernosClient) -> None:
        name = f"c{index}"
        number = 0
        while not stop.is_set():
            kind = rng.choices(kinds, weights)[0]
            try:
                if kind == "checkout":
                    result = await client.checkout("HEAD")
                    if not result.committed:
                        tally.violation(kill, f"checkout HEAD: {result.status} {result.error}")
                    tally.checkouts += 1
                    continue
                key = f"k{kill}-{name}-{number}"
                number += 1
                pending.in_flight[name] = (kind, key)
                tally.sent.add(key)
                await _send(client, kind, key, tally, kill, pending)
            except RequestError as error:  # refused: a kernel that died does not answer
                tally.violation(kill, f"{kind}: the kernel refused it: {error}")
                return
            except ClientError:
                return  # the kernel died with the op in flight: it stays pending
            pending.in_flight.pop(name, None)

    workers = [asyncio.ensure_future(work(index, client))
               for index, client in enumerate(connected)]
    try:
        # A kernel with a crash point runs until it reaches it: under load a
        # random instant within the window may come before its n-th pass.
        span = CRASH_WAIT if "KERNOS_CRASH_AT" in env else rng.uniform(0.02, window)
        deadline = time.monotonic() + span
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


async def _resend_and_check(manager: KernosManager, workspace: Path, tally: Tally,
                            kill: int, pending: Pending) -> None:
    owner = await manager.client()
    try:
        for name, (kind, key) in sorted(pending.in_flight.items()):  # once at most
            await _send(owner, kind, key, tally, kill, pending)
            tally.resent += 1
            del pending.in_flight[name]
        world = workspace.parent / f"{workspace.name}-world"
        await _check_state(owner, tally, kill, pending, world, _overshoot(workspace))
        await _check_events(owner, tally, kill, pending)
        tally.replay_from = f"@{(await owner.status())['head']['op']}"
        pending.unchecked.clear()
    finally:
        await owner.close()


async def _value(owner: AsyncKernosClient, expression: str) -> Any:
    value = (await owner.op(expression)).value
    if value is None or not value.has_json:
        raise AssertionError(f"the check {expression[:60]!r} gave no value: {value}")
    return value.json


async def _read_new(owner: AsyncKernosClient, tally: Tally, name: str, length: int) -> list[Any]:
    """The items of list ``name`` past those read at earlier checks (the lists only grow)."""
    items: list[Any] = []
    for start in range(len(tally.seen[name]) if name != "effects" else len(tally.effects),
                       length, PAGE):
        page = PAGES[name].format(start=start, end=min(start + PAGE, length))
        items.extend(await _value(owner, page))
    return items


def _overshoot(workspace: Path) -> int:
    """The most tokens an LLM call of the ledger used beyond its reservation."""
    reserved: dict[int, int] = {}
    most = 0
    path = workspace / "llm" / "calls.jsonl"
    for line in path.read_bytes().splitlines() if path.exists() else []:
        entry = json.loads(line)
        if entry["type"] == "reserve":
            reserved[entry["call"]] = entry["tokens"]
        elif entry["call"] in reserved:
            most = max(most, entry["tokens"] - reserved[entry["call"]])
    return most


async def _check_state(owner: AsyncKernosClient, tally: Tally, kill: int, pending: Pending,
                       world: Path, overshoot: int = 0) -> None:
    summary = SUMMARY.replace("LIST_NAMES", repr(sorted(LISTS.values())))
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:  # the effects the restart found are run or resolved after the first op
        journal, keys, count, same, lengths, grants, effects, asked_tokens = await _value(
            owner, summary)
        unsettled = [key for key, status in await _read_new(owner, tally, "effects", effects)
                     if status not in SETTLED]
        if not unsettled or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    if not (journal == keys == count) or not same:
        tally.violation(kill, f"a human op is half there: len(journal) {journal}, "
                              f"len(by_key) {keys}, count {count}")
    for name, length in [("journal", journal), *[(name, lengths[name])
                                                  for name in LISTS.values()]]:
        for key in await _read_new(owner, tally, name, length):
            if key in tally.seen[name]:
                tally.violation(kill, f"op {key} ran twice: {name} holds it twice")
            if key not in tally.sent:
                tally.violation(kill, f"{name} holds {key}, never sent")
            tally.seen[name].add(key)
    missing = [key for kind, key in pending.unchecked
               if key not in tally.seen["journal" if kind == "human" else LISTS[kind]]]
    if missing:
        tally.violation(kill, f"acknowledged ops are missing: {missing[:5]}")
    # Budgets (I4).
    for capability, limit, used in grants:
        if capability == "spend:USD" and int(used) != len(tally.seen["spent"]):
            tally.violation(kill, f"spend:USD used {used}, but {len(tally.seen['spent'])} "
                                  "spends committed")
        over = overshoot if capability.startswith("llm:") else 0  # the call that crossed
        if limit is not None and used is not None and int(used) > int(limit) + over:
            tally.violation(kill, f"{capability} overspent: used {used} of {limit}")
        if capability.startswith("llm:") and int(used) < asked_tokens:
            tally.violation(kill, f"{capability} used {used}, less than the {asked_tokens} "
                                  "tokens of the committed calls")
    # Effects: at most once, never for a rolled-back op, never lost.
    new = await _read_new(owner, tally, "effects", effects)
    runs = collections.Counter(line.split()[0] for line in
                               (world.read_text().splitlines() if world.exists() else []))
    for key, status in new:
        if status not in SETTLED:
            tally.violation(kill, f"effect {key} is {status!r} {SETTLE_SECONDS:.0f} s after "
                                  "a restart, not done or in doubt")
        elif status == "done" and runs[key] != 1:
            tally.violation(kill, f"effect {key} is done, but ran {runs[key]} times")
        tally.effects[key] = status
    for key, times in runs.items():
        if times > 1:
            tally.violation(kill, f"effect {key} ran {times} times")
        if key not in tally.effects:
            tally.violation(kill, f"effect {key} ran, but no committed op queued it")
    if len(tally.effects) != len(tally.seen["tickets"]):
        tally.violation(kill, f"{len(tally.effects)} effects for {len(tally.seen['tickets'])} "
                              "committed effect ops")


async def _check_events(owner: AsyncKernosClient, tally: Tally, kill: int,
                        pending: Pending) -> None:
    while True:
        events, cursor = await owner.events(since=tally.events_cursor, topic="torture.op",
                                            limit=1000)
        for event in events:
            key = event["payload"]["key"]
            if key in tally.events_seen:
                tally.violation(kill, f"the event of op {key} is in the log twice")
            if key not in tally.sent:
                tally.violation(kill, f"an event from op {key}, never sent")
            tally.events_seen.add(key)
        tally.events_cursor = cursor
        if not events:
            break
    missing = [key for kind, key in pending.unchecked
               if kind == "human" and key not in tally.events_seen]
    if missing:
        tally.violation(kill, f"committed ops' events are missing: {missing[:5]}")


def _check_dead(workspace: Path, tally: Tally, kill: int, *, replay: bool) -> None:
    """verify, git fsck and replay on the workspace of a killed kernel.

    verify reads only what came after the head it reported last time (``since``, the
    anchor): the chain still holds that record with that hash, and every record and
    snapshot after it is checked, so the cost stays flat as the history grows.  The
    replay, likewise, re-runs the ops since the head of the last check.
    """
    from kernos.audit.verify import verify
    from kernos.replay import replay as replay_history

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
    if replay and tally.replay_from is not None:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="kernos-torture-replay-") as scratch:
            result = replay_history(workspace, start=tally.replay_from,
                                    into=Path(scratch) / "replay")
        tally.replays.append(time.monotonic() - started)
        tally.replayed += len(result.steps)
        if not result.ok:
            tally.violation(kill, f"replay from {tally.replay_from}: {result.divergence}")


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
                  window: float = 0.6, replay: bool = True, progress: bool = True) -> Tally:
    from kernos.client import run_kernel

    rng = random.Random(seed)
    tally = Tally()
    world = workspace.parent / f"{workspace.name}-world"
    setup = (SETUP.replace("WORLD_PATH", repr(str(world)))
             .replace("SPEND_LIMIT", str(max(20, kills)))
             .replace("LLM_LIMIT", str(max(600, 20 * kills))))
    async with run_kernel(workspace) as (_manager, owner):
        for code, principal in ((setup, "human"), (BOT_SETUP, "bot")):
            result = await owner.op(code, principal=principal)
            assert result.committed, (result.status, result.error)
        tally.replay_from = f"@{(await owner.status())['head']['op']}"
    pending = Pending()
    for kill in range(1, kills + 1):
        env = {}
        if rng.random() < 1 / 3:
            point = rng.choice(sorted(CRASH_POINTS))
            env["KERNOS_CRASH_AT"] = f"{point}@{rng.randint(1, CRASH_POINTS[point])}"
        await _drive(workspace, clients, window, rng, tally, kill, env, pending)
        tally.kills += 1
        _check_dead(workspace, tally, kill, replay=replay)
        if progress and kill % 10 == 0:
            print(f"  {kill} kills, {sum(tally.acknowledged.values())} ops acknowledged, "
                  f"{len(tally.violations)} violations", flush=True)
    # A last kernel checks what the last kill left.
    await _drive(workspace, 0, 0.02, rng, tally, kills + 1, {}, pending)
    _check_dead(workspace, tally, kills + 1, replay=replay)
    return tally


def _ms(values: list[float]) -> str:
    return (f"median {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"
            if values else "none")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=500, help="kernels to kill (500)")
    parser.add_argument("--clients", type=int, default=3, help="clients at once (3)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (1)")
    parser.add_argument("--window", type=float, default=0.6,
                        help="kill uniformly within this many seconds of a start (0.6)")
    parser.add_argument("--no-replay", action="store_true",
                        help="skip the replay after each kill (I7)")
    parser.add_argument("--keep", type=Path, help="keep the workspace in this directory")
    args = parser.parse_args()
    print(f"torture: {args.kills} kills, {args.clients} clients, seed {args.seed}, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kernos-torture-") as scratch:
        workspace = args.keep or Path(scratch) / "workspace"
        began = time.monotonic()
        tally = asyncio.run(torture(workspace, kills=args.kills, clients=args.clients,
                                    seed=args.seed, window=args.window,
                                    replay=not args.no_replay))
        elapsed = time.monotonic() - began
    acknowledged = ", ".join(f"{kind} {number}" for kind, number in
                             sorted(tally.acknowledged.items()))
    print(f"\nkills               {tally.kills} ({tally.crash_points} at a crash point of "
          "the write path, the rest by SIGKILL at a random instant)")
    print(f"ops acknowledged    {sum(tally.acknowledged.values())} ({acknowledged}) of "
          f"{len(tally.sent)} keyed ops sent; {tally.resent} resent under their key after "
          f"a kill; {tally.refused} refused for a spent budget; {tally.checkouts} checkouts")
    print(f"restore after kill  {_ms(tally.restores[1:])} (launch to a restored kernel "
          "answering)")
    print(f"verify + git fsck   {_ms(tally.checks)} per kill")
    print(f"replay              {_ms(tally.replays)} per kill ({tally.replayed} ops "
          "re-run in all)")
    print(f"violations          {len(tally.violations)}")
    for violation in tally.violations[:20]:
        print(f"  {violation}")
    print(f"wall time           {elapsed:.0f} s")
    return 1 if tally.violations else 0


if __name__ == "__main__":
    sys.exit(main())
