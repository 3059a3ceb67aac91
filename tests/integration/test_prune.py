"""``kernos prune``: retention for a long-lived workspace, from the command line.

One workspace is built once by a child process whose clock is set (twelve
ops, four a UTC day for three days) and tagged with git: ``v1`` (op 2) and an
annotated ``v2`` (op 6) match ``--keep-tag 'v*'``, ``old`` (op 3) and
``later`` (op 11) do not.  Each op stores a value only it holds (``secret``,
built at run time so that no op's code contains it).  Each test prunes a
copy with ``--keep-last 2 --keep-daily 2 --keep-tag 'v*'`` (unless it says
otherwise), which keeps ops 2, 6 (tags), 8, 12 (daily) and 11, 12 (last),
and checks it as a user would: git itself, ``kernos audit verify``, a byte
scan of the whole directory, a restore, and ``kill -9`` at each step.
"""

from __future__ import annotations

import calendar
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from audit_support import files_of, git, key_needles, scan, verify
from support import git_view_current

if TYPE_CHECKING:
    from conftest import Kernel

BUILD = textwrap.dedent("""
    import json, sys, types
    import kernos.determinism as determinism
    from kernos import Image, Workspace, personal
    from kernos.image import default_is_persistent
    path, cells, start = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    workspace = Workspace.open(path)
    module = types.ModuleType("__main__")
    ns = module.__dict__
    ns["personal"] = personal  # as a kernel has it: there, never persisted
    image = Image(workspace, ns, module=module,
                  is_persistent=lambda name: default_is_persistent(name) and name != "personal")
    report = image.restore()
    clock = [start * 10**9]
    determinism._original_time_ns = lambda: clock[0]  # what Kernos reads as the time
    for cell in cells:
        clock[0] += 6 * 3600 * 10**9
        op = image.begin(source=cell)
        exec(cell, ns)
        op.commit()
    print(json.dumps({"recovery": report.recovery,
                      "names": {k: repr(v) for k, v in ns.items()
                                if not k.startswith("__") and k != "personal"}}))
    workspace.close()
""")
START = calendar.timegm((2026, 3, 1, 0, 0, 0)) - 3 * 3600  # op 1 at 03:00 on March 1st
CELLS = [f"x{n} = 'value {n}'\nsecret = 'S' + 'ECRET-{n:02d}' + '-q' * 40" for n in range(1, 13)]
POLICY = ["--keep-last", "2", "--keep-daily", "2", "--keep-tag", "v*"]
KEPT = [2, 6, 8, 11, 12]
PRUNED = [1, 3, 4, 5, 7, 9, 10]
PRUNE_RECORD = 13


def needle(op: int) -> bytes:
    """The value only op ``op``'s snapshot holds."""
    return f"SECRET-{op:02d}".encode()


def kernos(*args: str, env: dict[str, str] | None = None,
           check: bool = False) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("KERNOS_WORKSPACE", "KERNOS_CRASH_AT")}
    done = subprocess.run([sys.executable, "-m", "kernos.cli", *args], capture_output=True,
                          text=True, env={**environment, **(env or {})}, timeout=300)
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def build(path: Path, cells: list[str], start: int = START) -> dict[str, Any]:
    """Run ``cells`` as ops (6 hours apart from ``start``); the namespace and recovery."""
    done = subprocess.run([sys.executable, "-c", BUILD, str(path), json.dumps(cells),
                           str(start)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def ops_on_branch(path: Path, ref: str = "main") -> dict[int, tuple[str, str]]:
    """Op -> (commit, tree) of each snapshot on the branch."""
    found = {}
    for line in git(path, "log", "--format=%H %T %s", ref).splitlines():
        commit, tree, _op, number = line.split()[:4]
        found[int(number)] = (commit, tree)
    return found


def fsck_clean(path: Path) -> None:
    git_view_current(path)
    done = subprocess.run(["git", f"--git-dir={path / 'history.git'}", "fsck", "--full",
                           "--strict", "--dangling", "--no-reflogs"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "dangling" not in done.stdout + done.stderr, done.stdout


def chain(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "audit" / "chain.jsonl").read_text()
            .splitlines()]


@dataclass(frozen=True)
class Pristine:
    path: Path
    ops: dict[int, tuple[str, str]]
    """Op -> (commit, tree) before any prune."""

    def copy(self, tmp_path: Path) -> Path:
        target = tmp_path / "workspace"
        shutil.copytree(self.path, target)
        return target


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    path = tmp_path_factory.mktemp("prune") / "workspace"
    build(path, CELLS)
    ops = ops_on_branch(path)
    assert sorted(ops) == list(range(1, 13))
    git(path, "tag", "v1", ops[2][0])
    git(path, "tag", "-a", "-m", "release two", "v2", ops[6][0])
    git(path, "tag", "old", ops[3][0])
    git(path, "tag", "later", ops[11][0])
    return Pristine(path, ops)


def test_prune_keeps_what_the_policy_says_and_the_rest_is_rewritten(
        pristine: Pristine, tmp_path: Path) -> None:
    path = pristine.copy(tmp_path)
    done = kernos("prune", "-w", str(path), *POLICY, "--json", check=True)
    report = json.loads(done.stdout)
    assert [kept["op"] for kept in report["kept"]] == KEPT
    assert {kept["op"]: kept["why"] for kept in report["kept"]} == {
        2: ["tag v1"], 6: ["tag v2"], 8: ["daily 2026-03-02"], 11: ["last"],
        12: ["HEAD", "last", "daily 2026-03-03"]}
    assert [pruned["op"] for pruned in report["pruned"]] == PRUNED
    assert report["record"] == PRUNE_RECORD and report["snapshots"] == 12
    assert report["after"]["bytes"] < report["before"]["bytes"]

    # The branch holds the kept snapshots, oldest first, with their trees unchanged.
    after = ops_on_branch(path)
    assert sorted(after) == KEPT
    assert {op: tree for op, (_commit, tree) in after.items()} == {
        op: pristine.ops[op][1] for op in KEPT}
    assert {kept["op"]: kept["new_commit"] for kept in report["kept"]} == {
        op: commit for op, (commit, _tree) in after.items()}
    assert report["head"] == {"from": pristine.ops[12][0], "to": after[12][0]}
    for op in KEPT:  # author, times and message are the original's
        assert git(path, "log", "-1", "--format=%an %at %ct%n%B", after[op][0]) == git(
            pristine.path, "log", "-1", "--format=%an %at %ct%n%B", pristine.ops[op][0])

    # Tags follow their snapshots (an annotated one keeps its message); on pruned ones they go.
    assert git(path, "rev-parse", "v1").strip() == after[2][0]
    assert git(path, "cat-file", "-t", "v2").strip() == "tag"
    assert git(path, "rev-parse", "v2^{commit}").strip() == after[6][0]
    assert "release two" in git(path, "cat-file", "-p", "v2")
    assert git(path, "rev-parse", "later").strip() == after[11][0]
    assert "old" not in git(path, "tag").split()
    assert report["tags"]["deleted"] == ["refs/tags/old"]
    fsck_clean(path)

    # The audit chain verifies, and says what was pruned.
    verdict = verify(path)
    assert verdict.ok, verdict.problems()
    assert verdict.report["pruned"] == [{
        "record": PRUNE_RECORD, "at": chain(path)[PRUNE_RECORD]["at"], "snapshots": 7,
        "rewritten": 5, "records": 7}]
    text = kernos("audit", "verify", "-w", str(path), check=True).stdout
    assert (f"pruned: record {PRUNE_RECORD}" in text
            and "7 records naming a deleted snapshot verify by the chain only" in text), text
    record = chain(path)[PRUNE_RECORD]
    assert record["type"] == "prune" and record["policy"] == {
        "keep_last": 2, "keep_daily": 2, "keep_tags": ["v*"]}
    assert record["pruned"] == [pristine.ops[op][0] for op in PRUNED]
    assert record["rewritten"] == [[pristine.ops[op][0], after[op][0]] for op in KEPT]

    # The history reads as before for what was kept, and a pruned snapshot is gone.
    assert "op 8 by human" in kernos("show", "-w", str(path), "@8", check=True).stdout
    assert "names no snapshot" in kernos("show", "-w", str(path), "@5").stderr
    # HEAD restores as it was, and an older kept snapshot checks out and restores too.
    assert build(path, [])["names"]["secret"] == repr("SECRET-12" + "-q" * 40)
    kernos("checkout", "-w", str(path), "@6", check=True)
    names = build(path, [])["names"]
    assert sorted(names) == sorted([f"x{n}" for n in range(1, 7)] + ["secret"])
    assert names["secret"] == repr("SECRET-06" + "-q" * 40)
    assert verify(path).ok  # the checkout's record comes after the prune's


def test_a_dry_run_changes_nothing_and_says_what_would_happen(
        pristine: Pristine, tmp_path: Path) -> None:
    path = pristine.copy(tmp_path)
    before = files_of(path)
    done = kernos("prune", "-w", str(path), *POLICY, "--dry-run", check=True)
    assert files_of(path) == before
    lines = done.stdout.splitlines()
    assert lines[1].startswith("12 snapshots on the branch: ops 1-12")
    assert lines[2].startswith("would keep 5: ops 2, 6, 8, 11-12 (HEAD: op 12; last: ops 11-12;")
    assert lines[3].startswith("would prune 7: ops 1, 3-5, 7, 9-10 (")
    assert "tag old: would be deleted" in done.stdout
    assert "nothing was changed (dry run)" in done.stdout
    report = json.loads(kernos("prune", "-w", str(path), *POLICY, "--dry-run", "--json",
                               check=True).stdout)
    assert files_of(path) == before
    assert report["dry_run"] and report["record"] is None and report["after"] is None
    assert report["freed"]["objects"] > 7 * 3 and report["freed"]["bytes"] > 0
    real = json.loads(kernos("prune", "-w", str(path), *POLICY, "--json", check=True).stdout)
    assert real["kept"] == report["kept"] and real["head"] == report["head"]


def test_the_pruned_bytes_are_gone_from_disk_and_every_pack(
        pristine: Pristine, tmp_path: Path) -> None:
    path = pristine.copy(tmp_path)
    needles = {f"op {op}": needle(op) for op in range(1, 13)}
    before = scan(path, needles)
    assert {hit.needle for hit in before if hit.channel == "packed"} == set(needles)
    blobs = {hit.where for hit in before if hit.needle in {f"op {op}" for op in PRUNED}}
    assert blobs
    kernos("prune", "-w", str(path), *POLICY, check=True)

    after = scan(path, needles)
    assert {hit.needle for hit in after} == {f"op {op}" for op in KEPT}, after
    assert {hit.channel for hit in after} == {"packed"}  # the scanner still sees into packs
    for sha in [*blobs, *(pristine.ops[op][0] for op in range(1, 13))]:
        present = subprocess.run(["git", f"--git-dir={path / 'history.git'}", "cat-file",
                                  "-e", sha], capture_output=True).returncode == 0
        assert not present, sha
    packed = set()
    for index in (path / "history.git" / "objects" / "pack").glob("*.idx"):
        with open(index, "rb") as stream:
            listed = subprocess.run(["git", "show-index"], stdin=stream, capture_output=True,
                                    text=True, check=True).stdout
        packed |= {line.split()[1] for line in listed.splitlines()}
    assert packed and not packed & blobs
    assert not list((path / "history.git" / "objects").glob("[0-9a-f][0-9a-f]/*"))
    assert not (path / "pruning").exists()


def test_other_refs_keep_everything_they_reach(pristine: Pristine, tmp_path: Path) -> None:
    path = pristine.copy(tmp_path)
    git(path, "update-ref", "refs/heads/backup", pristine.ops[4][0])
    report = json.loads(kernos("prune", "-w", str(path), "--keep-last", "1", "--json",
                               check=True).stdout)
    assert [kept["op"] for kept in report["kept"]] == [1, 2, 3, 4, 12]
    assert report["kept"][0]["why"] == ["needed by refs/heads/backup"]
    after = ops_on_branch(path)
    assert [after[op][0] for op in (1, 2, 3, 4)] == [pristine.ops[op][0] for op in (1, 2, 3, 4)]
    assert git(path, "rev-parse", "backup").strip() == pristine.ops[4][0]
    assert git(path, "rev-parse", "main^").strip() == pristine.ops[4][0]
    fsck_clean(path)
    assert verify(path).ok


def test_verify_still_fails_for_a_commit_deleted_without_a_prune_record(
        pristine: Pristine, tmp_path: Path) -> None:
    """After a prune, op 11's snapshot is dropped from the branch by hand and deleted."""
    path = pristine.copy(tmp_path)
    kernos("prune", "-w", str(path), *POLICY, check=True)
    after = ops_on_branch(path)
    head = git(path, "commit-tree", f"{after[12][0]}^{{tree}}", "-p", after[8][0],
               "-m", "op 12 by human: relinked").strip()
    git(path, "update-ref", "refs/heads/main", head)
    git(path, "tag", "-d", "later")
    git(path, "reflog", "expire", "--expire=now", "--all")
    git(path, "gc", "--prune=now", "--quiet")
    verdict = verify(path)
    assert not verdict.ok and verdict.first_bad == 11, verdict.problems()
    assert "is missing" in verdict.report["problems"][0]["what"]


@pytest.mark.kernel
def test_prune_refuses_while_a_kernel_holds_the_workspace(
        pristine: Pristine, tmp_path: Path, kernel_factory: Callable[..., Kernel]) -> None:
    path = pristine.copy(tmp_path)
    kernel = kernel_factory(path)
    assert kernel.value("x12") == "value 12"
    before = files_of(path / "history.git")
    records = chain(path)
    done = kernos("prune", "-w", str(path), *POLICY)
    assert done.returncode == 2 and done.stdout == "", done
    (line,) = done.stderr.splitlines()
    assert line.startswith("kernos prune: The workspace ") and "kernos kernel (pid " in line
    assert "stop that kernel" in line and "Nothing was changed" in line
    assert files_of(path / "history.git") == before and chain(path) == records
    dry = kernos("prune", "-w", str(path), *POLICY, "--dry-run")  # works beside the kernel
    assert dry.returncode == 0 and "would prune " in dry.stdout, dry.stderr
    assert kernel.value("x1") == "value 1"


BEFORE_THE_COMMIT_POINT = ["pack", "prune.written", "prune.intent", "prune.recorded"]
AFTER_THE_COMMIT_POINT = ["prune.published", "prune.tags", "prune.repacked"]


@pytest.mark.parametrize("point", BEFORE_THE_COMMIT_POINT + AFTER_THE_COMMIT_POINT)
def test_kill_at_each_step_leaves_the_old_history_or_the_new(
        pristine: Pristine, tmp_path: Path, point: str) -> None:
    path = pristine.copy(tmp_path)
    planned = json.loads(kernos("prune", "-w", str(path), *POLICY, "--dry-run", "--json",
                                check=True).stdout)
    tags = git(path, "show-ref", "--tags")
    crashed = kernos("prune", "-w", str(path), *POLICY, env={"KERNOS_CRASH_AT": point})
    assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)

    reopened = build(path, [])  # the next kernel's open: the store's and the audit's recovery
    assert not (path / "pruning").exists()
    assert not (path / "pending").exists() or (path / "pending").read_bytes() == b""
    fsck_clean(path)
    verdict = verify(path)
    assert verdict.ok, verdict.problems()
    records = chain(path)
    if point in BEFORE_THE_COMMIT_POINT:  # the old history, whole
        assert ops_on_branch(path) == pristine.ops
        assert git(path, "show-ref", "--tags") == tags
        assert verdict.report["pruned"] == []
        if point == "prune.recorded":
            assert records[PRUNE_RECORD]["type"] == "prune"
            assert records[-1] == {**records[-1], "type": "void", "voids": PRUNE_RECORD}
            assert "nothing was pruned" in reopened["recovery"]
        else:
            assert len(records) == PRUNE_RECORD
        assert scan(path, {"op 1": needle(1)}) != []
    else:  # the new one, finished
        assert git(path, "rev-parse", "main").strip() == planned["head"]["to"]
        assert sorted(ops_on_branch(path)) == KEPT
        assert git(path, "rev-parse", "v1").strip() == planned["kept"][0]["new_commit"]
        assert "old" not in git(path, "tag").split()
        assert [p["record"] for p in verdict.report["pruned"]] == [PRUNE_RECORD]
        assert scan(path, {f"op {op}": needle(op) for op in PRUNED}) == []
        assert "finished an interrupted prune" in reopened["recovery"]
    build(path, ["after = 1"])  # the workspace goes on
    assert verify(path).ok


PERSONAL = "Zebulon Quixotic-Marsh 4471"
PERSONAL_CELLS = ["a = 1", f"who = personal({PERSONAL!r}, subject='c-9')", "b = 2", "c = 3"]


@pytest.mark.parametrize("order", ["erase then prune", "prune then erase"])
def test_erasure_and_prune_compose(tmp_path: Path, order: str) -> None:
    path = tmp_path / "workspace"
    build(path, PERSONAL_CELLS)
    (key_file,) = (path / "keys").glob("*.key")
    key_hex = json.loads(key_file.read_text())["key"]
    needles = {"plaintext": PERSONAL.encode(), **key_needles(key_hex)}
    assert [hit.needle for hit in scan(path, needles)] == ["key hex"]  # only in its key file
    steps = {"erase": ["erase", "-w", str(path), "c-9"],
             "prune": ["prune", "-w", str(path), "--keep-last", "2"]}
    for step in order.split(" then "):
        kernos(*steps[step], check=True)
    assert scan(path, needles) == []
    fsck_clean(path)
    verdict = verify(path)
    assert verdict.ok, verdict.problems()
    types = [record["type"] for record in chain(path)]
    assert types[-2:] == (["erasure", "prune"] if order == "erase then prune"
                          else ["prune", "erasure"])
    assert build(path, [])["names"]["who"] == "personal(<erased>, subject='c-9')"


def test_replay_over_a_pruned_history_checks_the_kept_snapshots_only(
        pristine: Pristine, tmp_path: Path) -> None:
    path = pristine.copy(tmp_path)
    kernos("prune", "-w", str(path), *POLICY, check=True)
    done = kernos("replay", "-w", str(path), "--into", str(tmp_path / "replayed"), "--json")
    assert done.returncode == 0, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert report["ok"] and report["divergence"] is None
    steps = {step["op"]: step for step in report["steps"]}
    assert sorted(steps) == list(range(1, 13))  # every op re-runs, from its recorded code
    assert {op for op, step in steps.items() if step["pruned_by"] == PRUNE_RECORD} == set(PRUNED)
    for op in KEPT:  # compared with the snapshot at its new id
        assert steps[op]["pruned_by"] is None and steps[op]["original"] == steps[op]["digest"]
    text = kernos("replay", "-w", str(path), check=True).stdout
    assert "7 not checked: their snapshots were pruned" in text
