"""A real kernel whose workspace fills up (issue 18), on a tmpfs and on a loop-mounted ext4.

A harness sends ops with idempotency keys while a filler file leaves a seeded
random amount of free space, so that writes fail at varying points: the
op's audit record, its commit-tail frame or pack, the fold of the tail into
git that the kernel runs when idle, and the effect journal of the external
effects the ops queue.  Every op that finds the disk full comes back rolled
back with an error that says the disk is full, where, and what to do; the
same kernel then commits it once the filler is gone (re-sent with its key).
At the end every acknowledged op is in the image after a restart, each effect
was executed exactly once, ``kernos audit verify`` and ``git fsck --full
--strict`` are clean.  Mounting needs root; without it the test is skipped.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from disk_support import KINDS, Filler, mounted
from kernos.client import KernosClient

pytestmark = pytest.mark.kernel

SIZE = 24 << 20
OPS = 24
SETUP = '''
import hashlib, json, os
LEDGER = {ledger!r}
FILLER = {filler!r}
def pay(amount, to, idempotency_key, fill=False):
    with open(LEDGER, "a") as f:
        f.write(json.dumps({{"key": idempotency_key, "amount": amount}}) + "\\n")
    if fill:  # the disk fills up while the effect runs: its "done" record finds no room
        with open(FILLER, "wb", buffering=0) as f:
            for piece in (1 << 20, 4096, 1):
                try:
                    while f.write(b"x" * piece):
                        pass
                except OSError:
                    pass
    return {{"receipt": idempotency_key[-8:], "pad": "p" * 6000}}
def find_payment(idempotency_key):
    for line in open(LEDGER) if os.path.exists(LEDGER) else ():
        if json.loads(line)["key"] == idempotency_key:
            return True, {{"receipt": idempotency_key[-8:], "pad": "p" * 6000}}
    return False, None
agents.register_tool("pay", pay, description="pays", effect="external", resolve=find_payment,
                     schema={{"type": "object", "properties": {{"amount": {{"type": "integer"}},
                              "to": {{"type": "string"}}, "fill": {{"type": "boolean"}}}},
                              "required": ["amount", "to"]}})
'''


def ledger_keys(ledger: Path) -> list[str]:
    if not ledger.exists():
        return []
    return [json.loads(line)["key"] for line in ledger.read_text().splitlines()]


def where_full(message: str, mount: Path) -> str:
    """What the disk-full error says could not be written, after checking it says what to do."""
    assert "the disk is full" in message and "rolled back" in message, message
    assert f"Free space on {mount}" in message and "then retry" in message, message
    found = re.search(r"writing (.+?) \(/", message)
    assert found is not None, message
    return found.group(1)


def run_op(client: Any, code: str, key: str | None = None) -> Any:
    """One op; a hang (a reply never sent) fails the test instead of stalling it."""
    result = client.op(code, key=key, timeout=60)
    assert result.status in ("committed", "rolled back", "failed"), result
    return result


@pytest.mark.parametrize("kind", KINDS)
def test_a_kernel_on_a_full_disk_rolls_back_goes_on_and_loses_nothing(
        tmp_path: Path, kind: str) -> None:
    ledger = tmp_path / "ledger.jsonl"
    with mounted(kind, tmp_path / "disk", SIZE) as root:
        workspace = root / "ws"
        filler = Filler(root)
        rng = random.Random(18)
        acknowledged: dict[str, tuple[str, str]] = {}
        """key -> (name, the digest its op returned)"""
        seen: Counter[str] = Counter()
        with KernosClient.start(workspace) as client:
            setup = run_op(client, SETUP.format(ledger=str(ledger), filler=str(filler.path)))
            assert setup.status == "committed", setup.error
            sources = {}
            for number in range(OPS):
                name, key = f"v{number}", f"op-{number}"
                size = rng.choice([300, 20_000, 150_000, 1_100_000])
                code = f"{name} = os.urandom({size})\n"
                if rng.random() < 0.4:
                    code += f"agents.call('pay', amount={number}, to='bob')\n"
                leave = rng.choice([0, 4096, 12288, 40_000, 150_000, 400_000])
                if rng.random() < 0.3:  # an audit record bigger than a page, on a full disk
                    code += "#" + "c" * max(0, 3900 - len(code)) + "\n"
                    leave = rng.choice([0, 0, 4096])
                code += f"hashlib.sha256({name}).hexdigest()"
                sources[key] = code
                filler.fill(leave)
                result = run_op(client, code, key)
                if result.status == "committed":
                    acknowledged[key] = (name, result.value.json)
                else:
                    assert result.error is not None
                    seen[where_full(result.error.message, root)] += 1
                time.sleep(0.12)  # the kernel folds its tail when idle: into a full disk
                if (workspace / "tail").stat().st_size:
                    seen["a fold (the tail stays)"] += 1
                filler.empty()
                if result.status != "committed":
                    absent = run_op(client, f"{name!r} in dir()")
                    assert absent.status == "committed" and absent.value.json is False
                    again = run_op(client, code, key)  # the same kernel, the same key
                    assert again.status == "committed", again.error
                    acknowledged[key] = (name, again.value.json)
            # The effect journal: the disk fills while an effect runs, so its "done" record
            # finds no room; the next drain asks the resolver instead of paying twice.
            paying = run_op(client, "agents.call('pay', amount=99, to='carol', fill=True)\n"
                               "filled = 'the disk'", key="fill")
            assert paying.status == "committed", paying.error
            assert filler.path.exists()
            filler.empty()
            for extra in range(2):  # each committed op drains the effects left queued
                assert run_op(client, f"after_{extra} = {extra}").status == "committed"
            effects = run_op(client, "[[e['key'], e['status']] for e in agents.effects()]"
                             ).value.json
            assert effects and all(status == "done" for _key, status in effects), effects
            chain = (workspace / "audit" / "chain.jsonl").read_text().splitlines()
            resolved = [json.loads(line) for line in chain if '"resolved"' in line]
            assert resolved, "the effect whose done record found no room was not resolved"
            seen["the effect journal"] += 1
            # The last op finds the disk full, and the kernel dies before space is freed, so
            # no later fold can write down what a commit only kept in memory.
            filler.fill(64 << 10)
            last = run_op(client, "last = os.urandom(200_000)\nhashlib.sha256(last).hexdigest()",
                          "last")
            if last.status == "committed":
                acknowledged["last"] = ("last", last.value.json)
                sources["last"] = "last = os.urandom(200_000)\nhashlib.sha256(last).hexdigest()"
            else:
                seen[where_full(last.error.message, root)] += 1
            client.manager.kill()  # a restart: everything acknowledged is there
            filler.empty()
            client.manager.restart()
            for key, (name, digest) in acknowledged.items():
                again = run_op(client, f"hashlib.sha256({name}).hexdigest()")
                assert again.status == "committed", (f"acknowledged {key} is lost", again.error)
                assert again.value.json == digest, key
                assert run_op(client, sources[key], key).duplicate, key
        keys = ledger_keys(ledger)
        assert sorted(keys) == sorted(key for key, _status in effects)  # each exactly once
        expected = {"the commit tail", "a pack of the op's objects", "a fold (the tail stays)",
                    "the effect journal"}
        if kind == "tmpfs":  # ext4 may find a preallocated block for the record's append
            expected.add("the audit log")
        assert expected <= set(seen), seen
        print(f"{kind}: {dict(seen)}", file=sys.stderr)
        fsck = subprocess.run(["git", "-C", str(workspace / "history.git"), "fsck", "--full",
                               "--strict"], capture_output=True, text=True, check=False)
        assert fsck.returncode == 0, fsck.stdout + fsck.stderr
        verified = subprocess.run([sys.executable, "-m", "kernos.cli", "audit", "verify",
                                   "--workspace", str(workspace)], capture_output=True, text=True,
                                  check=False)
        assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_cell_on_a_full_disk_says_so_and_the_next_commits(
        kernel_factory: Any, tmp_path: Path, kind: str) -> None:
    """The notebook's view: a cell whose commit finds the disk full, and a cell that raises
    where even the record of its rollback finds no room, both end in an error that says
    the disk is full; after space is freed the same kernel runs the cell again."""
    with mounted(kind, tmp_path / "disk", SIZE) as root:
        filler = Filler(root)
        kernel = kernel_factory(root / "ws")
        try:
            assert kernel.run("import os\nkept = 1").status == "ok"
            filler.fill(64 << 10)
            cell = "big = os.urandom(300_000)"
            failed = kernel.run(cell)
            assert failed.status == "error" and failed.kernos["status"] == "rolled back"
            [error] = failed.errors
            assert error["ename"] == "CommitFailed", error
            assert where_full(error["evalue"], root) == "the commit tail"
            filler.fill(0)
            raising = kernel.run("kept = 2\n#" + "x" * 3900 + "\nraise ValueError('no')")
            assert raising.status == "error"
            shown = [e["ename"] for e in raising.errors]
            assert shown[0] == "ValueError", shown
            if kind == "tmpfs":  # no room for the rollback's audit record: said, not hidden
                assert shown == ["ValueError", "DiskFull"], raising.errors
                assert "the disk is full" in raising.errors[1]["evalue"]
            filler.empty()
            assert kernel.value("kept") == 1 and kernel.value("'big' in dir()") is False
            again = kernel.run(cell)
            assert again.status == "ok" and again.kernos["status"] == "committed", again.errors
        finally:
            kernel.stop()


def test_a_kernel_restarted_on_a_full_disk_says_so_and_attaches_once_space_is_freed(
        tmp_path: Path) -> None:
    """A kernel dies with a commit in its tail and the disk full: the next one cannot fold
    it into git, refuses requests with the disk-full error, and opens the workspace (the
    commit there) as soon as space is freed, without another restart."""
    with mounted("tmpfs", tmp_path / "disk", SIZE) as root:
        filler = Filler(root)
        with KernosClient.start(root / "ws") as client:
            assert run_op(client, "import os\na = os.urandom(100_000)").status == "committed"
            filler.fill(0)
            client.manager.kill()
            client.manager.restart()
            with pytest.raises(Exception, match="the disk is full") as refused:
                client.op("'a' in dir()", timeout=60)
            assert f"Free space on {root}" in str(refused.value)
            filler.empty()
            assert run_op(client, "'a' in dir()").value.json is True
