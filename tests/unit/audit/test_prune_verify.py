"""verify() after ``kernos prune``, in-process: a prune verifies and says so; forgeries do not.

A workspace with six committed ops (records 1-6) is pruned to its last two
(the prune record is 7).  The records of ops 1-4 then verify by the chain
alone, ops 5 and 6 at their new ids.  Each forgery below is what someone
with write access could do to pass a rewrite off as a prune, and each must
fail.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from audit_support import reseal
from core_support import CoreEnv
from kernos import Workspace
from kernos.audit import open_audit, verify
from kernos.audit.canonical import canonical
from kernos.audit.pruning import record_body
from kernos.prune import Policy, prune
from kernos.store import retention
from kernos.store.maintenance import loosen
from kernos.store.objects import object_id

PRUNE = 7  # the prune record's index


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "audit" / "chain.jsonl").read_bytes()
            .splitlines()]


def write_records(path: Path, chain: list[dict[str, Any]]) -> None:
    """Write ``chain`` back, resealed from the first record that changed (a forger's tool)."""
    previous = "0" * 64
    lines = []
    for record in chain:
        record = reseal({**record, "prev": previous})
        previous = record["hash"]
        lines.append(canonical(record) + b"\n")
    (path / "audit" / "chain.jsonl").write_bytes(b"".join(lines))


def git(path: Path, *args: str, stdin: bytes | None = None) -> str:
    return subprocess.run(["git", f"--git-dir={path / 'history.git'}", *args], input=stdin,
                          capture_output=True, check=True).stdout.decode().strip()


@pytest.fixture
def built(tmp_path: Path) -> Iterator[Path]:
    """Six committed ops, closed: records 0 (genesis) to 6."""
    env = CoreEnv(tmp_path / "ws")
    for n in range(1, 7):
        env.run(f"x{n} = 'value {n}'")
    env.close()
    yield env.path


@pytest.fixture
def pruned(built: Path) -> Path:
    report = prune(built, Policy(keep_last=2))
    assert report.record == PRUNE and [k.snapshot.op for k in report.kept] == [5, 6]
    return built


def test_a_pruned_history_verifies_and_the_report_says_what_was_pruned(pruned: Path) -> None:
    report = verify(pruned)
    assert report.ok, report.summary()
    assert report.commits == 2  # ops 5 and 6, at their new ids
    (pruning,) = report.pruned
    assert (pruning.record, pruning.snapshots, pruning.rewritten, pruning.records) == (
        PRUNE, 4, 2, 4)
    assert "pruned: record 7" in report.summary()
    assert "4 records naming a deleted snapshot verify by the chain only" in report.summary()
    assert report.to_json()["pruned"][0]["records"] == 4


def test_ops_after_a_prune_and_a_second_prune_verify(pruned: Path) -> None:
    env = CoreEnv(pruned)
    env.run("later = 1")  # record 8: its parent is the prune's new head
    env.close()
    assert verify(pruned).ok
    prune(pruned, Policy(keep_last=1))  # record 9 renames nothing and deletes ops 5, 6
    report = verify(pruned)
    assert report.ok, report.summary()
    assert [(p.record, p.snapshots, p.records) for p in report.pruned] == [(7, 4, 4), (9, 2, 2)]


def test_an_anchor_taken_before_a_prune_still_verifies_after_it(built: Path) -> None:
    anchor = verify(built).head
    prune(built, Policy(keep_last=2))
    assert verify(built, anchor=anchor).ok
    since = verify(built, since=anchor)
    assert since.ok, since.summary()
    assert [p.record for p in since.pruned] == [PRUNE]


def test_events_stay_published_after_a_prune(pruned: Path) -> None:
    with Workspace.open(pruned, writable=False) as workspace:
        log = open_audit(workspace)
        assert log.published == len(log.entries) - 1


def test_a_commit_deleted_without_a_prune_record_still_fails(pruned: Path) -> None:
    """The prune record is removed: the snapshots it deleted are missing, and the branch
    no longer descends from what the records say."""
    write_records(pruned, records(pruned)[:PRUNE])
    report = verify(pruned)
    assert not report.ok and report.first_bad == 1
    assert "missing" in report.problems[0].what


def test_a_forged_void_of_the_prune_fails(pruned: Path) -> None:
    chain = records(pruned)
    write_records(pruned, [*chain, {"v": 1, "at": chain[-1]["at"], "type": "void",
                                    "voids": PRUNE, "index": len(chain)}])
    report = verify(pruned)
    assert not report.ok and report.first_bad == 1


def test_a_kept_snapshot_deleted_after_the_prune_fails(pruned: Path) -> None:
    loosen(pruned / "history.git")
    (_, new) = records(pruned)[PRUNE]["rewritten"][0]  # op 5's new commit
    (pruned / "history.git" / "objects" / new[:2] / new[2:]).unlink()
    report = verify(pruned)
    assert not report.ok and report.first_bad == 5
    assert f"({new[:12]} since the prune record {PRUNE}) is missing" in report.problems[0].what


def test_a_rewrite_passed_off_as_a_prune_fails(pruned: Path) -> None:
    """HEAD is replaced by a commit with the same tree and parent but another message, and
    the prune record is edited to name it: the old id cannot be recomputed from it."""
    chain = records(pruned)
    head = git(pruned, "rev-parse", "main")
    forged = git(pruned, "commit-tree", f"{head}^{{tree}}", "-p", f"{head}^",
                 "-m", "op 6 by human: nothing to see")
    git(pruned, "update-ref", "refs/heads/main", forged, head)
    record = chain[PRUNE]
    record["to"] = forged
    record["rewritten"] = [[old, forged if new == head else new]
                           for old, new in record["rewritten"]]
    write_records(pruned, chain)
    report = verify(pruned)
    assert not report.ok and report.first_bad == 6, report.summary()
    assert "not the same snapshot" in report.problems[0].what


def test_a_prune_record_that_skips_a_kept_snapshot_fails(pruned: Path) -> None:
    """HEAD is relinked past op 5's new commit (op 5 silently dropped from the branch)."""
    chain = records(pruned)
    old5, new5 = chain[PRUNE]["rewritten"][0]
    old6, new6 = chain[PRUNE]["rewritten"][1]
    with Workspace.open(pruned, writable=False) as workspace:
        _kind, raw = workspace.objects.read(bytes.fromhex(new6))
    relinked = retention.with_parent(raw, None)
    sha = git(pruned, "hash-object", "-w", "-t", "commit", "--stdin", stdin=relinked)
    assert sha == object_id(b"commit", relinked).hex()
    git(pruned, "update-ref", "refs/heads/main", sha)
    chain[PRUNE]["to"] = sha
    chain[PRUNE]["rewritten"] = [[old5, new5], [old6, sha]]
    write_records(pruned, chain)
    report = verify(pruned)
    assert not report.ok and report.first_bad == 6
    assert "the snapshot kept before it" in report.problems[0].what


def test_a_prune_whose_branch_never_moved_is_voided_on_the_next_open(built: Path) -> None:
    """The process died after the record was written, before the branch moved."""
    with Workspace.open(built) as workspace:
        log = open_audit(workspace)
        plan = retention.plan(workspace, Policy(keep_last=2))
        retention.write(workspace, plan)
        retention.intend(workspace, plan)
        log.append(record_body(plan, Policy(keep_last=2)))
        workspace.objects.close()  # as a kill leaves it: journal and intent in place
    head = git(built, "rev-parse", "main")
    with Workspace.open(built) as workspace:
        assert "nothing was pruned" in (workspace.recovery_note or "")
        log = open_audit(workspace)  # the audit's recovery voids the record
    assert not (built / retention.INTENT).exists()
    chain = records(built)
    assert chain[-1]["type"] == "void" and chain[-1]["voids"] == PRUNE
    assert git(built, "rev-parse", "main") == head
    done = subprocess.run(["git", f"--git-dir={built / 'history.git'}", "cat-file", "-e",
                           plan.new_head], capture_output=True)
    assert done.returncode != 0, "the new commits were deleted"
    report = verify(built)
    assert report.ok and report.pruned == () and report.commits == 6, report.summary()
