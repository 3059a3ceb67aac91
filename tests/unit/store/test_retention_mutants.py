"""``kernos prune``'s store side on a real workspace: the plan, the rewrite, the deletion.

These close gaps mutation testing (scripts/mutation store.retention) found: the
unit tests of ``tests/unit/store`` checked only the pure policy and
``with_parent``, so nothing there proved what :func:`plan` does with the refs
(tags moved, deleted or rewritten, what other refs need), what :func:`measure`
counts, the intent file, the order of the crash points, what :func:`finish`
deletes and checks, and what :func:`finish_interrupted` says and does at the next
open.  The history is built with git itself (``commit-tree``), one UTC day per
snapshot unless said otherwise, each snapshot holding one blob only it reaches.
"""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernos.errors import KernosError, UsageError, WorkspaceCorrupt
from kernos.store import retention
from kernos.store.objects import object_id
from kernos.store.retention import (
    INTENT,
    Freed,
    Intent,
    Policy,
    Selection,
    Snapshot,
    finish,
    finish_interrupted,
    intend,
    measure,
    plan,
    publish,
    select,
    with_parent,
    write,
)
from kernos.store.workspace import Workspace


def at(day: str, clock: str = "12:00:00") -> int:
    return calendar.timegm(time.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S"))


def git(workspace: Workspace, *args: str, input: str | None = None,
        env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["git", f"--git-dir={workspace.git_dir}", *args], input=input,
                          capture_output=True, text=True,
                          env={**os.environ, **IDENTITY, **(env or {})})
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout.strip()


IDENTITY = {"GIT_AUTHOR_NAME": "human", "GIT_AUTHOR_EMAIL": "human@kernos.invalid",
            "GIT_COMMITTER_NAME": "human", "GIT_COMMITTER_EMAIL": "human@kernos.invalid"}


def present(workspace: Workspace, sha: str) -> bool:
    return subprocess.run(["git", f"--git-dir={workspace.git_dir}", "cat-file", "-e", sha],
                          capture_output=True).returncode == 0


def blob(workspace: Workspace, text: str) -> str:
    return git(workspace, "hash-object", "-w", "--stdin", input=text)


def tree(workspace: Workspace, **files: str) -> str:
    return git(workspace, "mktree", input="".join(f"100644 blob {sha}\t{name}\n"
                                                 for name, sha in sorted(files.items())))


def commit(workspace: Workspace, op: int, when: int, *parents: str,
           files: dict[str, str] | None = None) -> str:
    """A snapshot of op ``op`` at ``when``: its tree holds a blob only it has, and one that
    every snapshot shares."""
    contents = files if files is not None else {f"x{op}": blob(workspace, f"value {op}\n"),
                                                "base": blob(workspace, "shared\n")}
    stamp = {"GIT_AUTHOR_DATE": f"{when} +0000", "GIT_COMMITTER_DATE": f"{when} +0000"}
    arguments = [argument for parent in parents for argument in ("-p", parent)]
    return git(workspace, "commit-tree", tree(workspace, **contents), *arguments,
               "-m", f"op {op} by human\n\nKernos-Op: {op}", env=stamp)


def linear(workspace: Workspace, count: int) -> list[str]:
    """``count`` snapshots (ops 1..count), one a day from 2026-03-01; the branch names the last."""
    commits: list[str] = []
    for op in range(1, count + 1):
        commits.append(commit(workspace, op, at(f"2026-03-{op:02d}"), *commits[-1:]))
    git(workspace, "update-ref", "refs/heads/main", commits[-1])
    return commits


def raw(workspace: Workspace, sha: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={workspace.git_dir}", "cat-file",
                           commit_or_tag(workspace, sha), sha], capture_output=True,
                          check=True).stdout


def commit_or_tag(workspace: Workspace, sha: str) -> str:
    return git(workspace, "cat-file", "-t", sha)


@pytest.fixture
def durable(tmp_path: Path) -> Iterator[Workspace]:
    with Workspace.open(tmp_path / "workspace", durable=True) as opened:
        yield opened


class History:
    """Six snapshots c1..c6 and the refs around them (see :func:`history`)."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        ws = workspace
        self.c = ["", *linear(ws, 6)]  # c[1] .. c[6]
        self.blobs = {op: git(ws, "rev-parse", f"{self.c[op]}:x{op}") for op in range(1, 7)}
        self.base = git(ws, "rev-parse", f"{self.c[1]}:base")
        self.trees = {op: git(ws, "rev-parse", f"{self.c[op]}^{{tree}}") for op in range(1, 7)}
        git(ws, "update-ref", "refs/heads/backup", self.c[1])
        git(ws, "update-ref", "refs/kernos/source", self.c[1])
        self.attic = blob(ws, "on no snapshot\n")
        git(ws, "update-ref", "refs/attic/blob", self.attic)  # reaches no commit
        git(ws, "tag", "old", self.c[2])
        git(ws, "tag", "-a", "-m", "release three", "v3", self.c[3])
        git(ws, "tag", "v5", self.c[5])
        # A commit off the branch that holds c2's blob: that blob is not freed.
        self.side = commit(ws, 99, at("2026-02-01"), files={"copy": self.blobs[2]})
        git(ws, "tag", "side", self.side)
        self.v3 = git(ws, "rev-parse", "refs/tags/v3")


@pytest.fixture
def history(durable: Workspace) -> History:
    """c1 (needed by refs/heads/backup and refs/kernos/source), c2 (tag ``old``: pruned),
    c3 (annotated tag ``v3``), c4 (pruned), c5 (tag ``v5``, last), c6 (HEAD)."""
    return History(durable)


POLICY = Policy(keep_last=2, keep_tags=("v*",))


def test_plan_rewrites_what_follows_the_first_pruned_commit_and_moves_its_tags(
        history: History) -> None:
    ws, c = history.workspace, history.c
    planned = plan(ws, POLICY)
    assert planned.head == c[6]
    assert [s.commit for s in planned.chain] == c[1:]
    assert [s.op for s in planned.chain] == [1, 2, 3, 4, 5, 6]
    assert planned.chain[2].time == at("2026-03-03")
    assert planned.selection.kept == {
        c[1]: ("needed by refs/heads/backup",), c[3]: ("tag v3",), c[5]: ("last", "tag v5"),
        c[6]: ("HEAD", "last")}
    assert planned.pruned == (c[2], c[4])
    # c1 keeps its id; c3, c5 and c6 are the same bytes with the new parent.
    new3 = object_id(b"commit", with_parent(raw(ws, c[3]), c[1])).hex()
    new5 = object_id(b"commit", with_parent(raw(ws, c[5]), new3)).hex()
    new6 = object_id(b"commit", with_parent(raw(ws, c[6]), new5)).hex()
    assert planned.rewritten == {c[3]: new3, c[5]: new5, c[6]: new6}
    assert planned.new_head == new6
    old_tag = raw(ws, history.v3)
    new_tag = b"object " + new3.encode() + b"\n" + old_tag.partition(b"\n")[2]
    tag_id = object_id(b"tag", new_tag)
    assert planned.objects == (
        (b"commit", with_parent(raw(ws, c[3]), c[1]), bytes.fromhex(new3)),
        (b"commit", with_parent(raw(ws, c[5]), new3), bytes.fromhex(new5)),
        (b"commit", with_parent(raw(ws, c[6]), new5), bytes.fromhex(new6)),
        (b"tag", new_tag, tag_id))
    assert planned.tags == {"refs/tags/old": (c[2], None),
                            "refs/tags/v3": (history.v3, tag_id.hex()),
                            "refs/tags/v5": (c[5], new5)}
    assert planned.others == ("refs/attic/blob", "refs/heads/backup", "refs/kernos/source",
                              "refs/tags/side")
    assert planned.intent() == Intent(
        old_head=c[6], new_head=new6,
        tags={"refs/tags/old": None, "refs/tags/v3": tag_id.hex(), "refs/tags/v5": new5},
        pruned=(c[2], c[4]), replaced=(c[3], c[5], c[6]))


def test_a_policy_that_keeps_everything_plans_nothing(durable: Workspace) -> None:
    c = linear(durable, 3)
    git(durable, "tag", "v1", c[0])
    kept_all = plan(durable, Policy(keep_last=3, keep_tags=("v*",)))
    assert kept_all.pruned == () and kept_all.rewritten == {} and kept_all.objects == ()
    assert kept_all.new_head == c[2] and kept_all.tags == {} and kept_all.others == ()
    assert kept_all.selection.kept[c[0]] == ("last", "tag v1")
    assert measure(durable, kept_all) == Freed(objects=(), bytes=0)


def test_pruning_the_root_makes_the_first_kept_commit_a_root(durable: Workspace) -> None:
    c = linear(durable, 3)
    planned = plan(durable, Policy(keep_last=1))
    new_head = with_parent(raw(durable, c[2]), None)
    assert planned.objects == ((b"commit", new_head, object_id(b"commit", new_head)),)
    assert planned.new_head == object_id(b"commit", new_head).hex()
    assert planned.tags == {}


def test_measure_counts_what_only_the_pruned_snapshots_reach(history: History) -> None:
    ws, c = history.workspace, history.c
    planned = plan(ws, POLICY)
    freed = measure(ws, planned)
    # c2 and c4 with their trees and c4's blob (c2's is held by the tag ``side``, the one they
    # all share by the kept ones), the old ids of c3, c5, c6 and the tag object v3 named.
    expected = sorted({c[2], history.trees[2], c[4], history.trees[4], history.blobs[4],
                       c[3], c[5], c[6], history.v3})
    assert freed.objects == tuple(expected)
    # Every object here is loose: its size on disk is its file's.
    assert freed.bytes == sum((ws.git_dir / "objects" / sha[:2] / sha[2:]).stat().st_size
                              for sha in expected)


def test_measure_without_other_refs(durable: Workspace) -> None:
    c = linear(durable, 2)
    tree1 = git(durable, "rev-parse", f"{c[0]}^{{tree}}")
    blob1 = git(durable, "rev-parse", f"{c[0]}:x1")
    freed = measure(durable, plan(durable, Policy(keep_last=1)))
    assert freed.objects == tuple(sorted({c[0], tree1, blob1, c[1]}))
    assert freed.bytes > 0


def test_the_whole_prune_moves_the_branch_and_tags_and_deletes_what_was_pruned(
        history: History, points_passed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    ws, c = history.workspace, history.c
    planned = plan(ws, POLICY)
    freed = measure(ws, planned)
    synced: list[Path] = []
    real_fsync_dir = retention.fsync_dir
    monkeypatch.setattr(retention, "fsync_dir",
                        lambda path: (synced.append(path), real_fsync_dir(path))[1])
    written: list[tuple[Path, bool]] = []
    real_replace = retention.replace_file

    def replace_file(path: Path, data: bytes, *, durable: bool) -> None:
        written.append((path, durable))
        real_replace(path, data, durable=durable)

    monkeypatch.setattr(retention, "replace_file", replace_file)

    write(ws, planned)
    # The batch is sealed: its journal names the new head, and it can be read already.
    assert (ws.path / "pending").read_text().splitlines()[-1] == f"commit {planned.new_head}"
    assert ws.read_commit(bytes.fromhex(planned.new_head)).parents == (
        bytes.fromhex(planned.rewritten[c[5]]),)
    intend(ws, planned)
    assert written == [(ws.path / INTENT, True)]
    assert json.loads((ws.path / INTENT).read_bytes()) == {
        "from": c[6], "to": planned.new_head,
        "tags": {ref: new for ref, (_old, new) in planned.tags.items()},
        "pruned": [c[2], c[4]], "replaced": [c[3], c[5], c[6]]}
    assert git(ws, "rev-parse", "refs/heads/main") == c[6]  # not before the commit point
    publish(ws, planned)
    assert git(ws, "rev-parse", "refs/heads/main") == planned.new_head
    assert ws.head() == bytes.fromhex(planned.new_head)
    assert (ws.path / "pending").read_bytes() == b""  # the batch is finished
    assert (ws.path / INTENT).exists()
    finish(ws, planned.intent(), freed=freed.objects)
    assert [point for point in points_passed if point.startswith("prune.")] == [
        "prune.written", "prune.intent", "prune.published", "prune.tags", "prune.repacked"]
    assert not (ws.path / INTENT).exists()
    assert synced[-1] == ws.path
    # The tags: deleted with their snapshot, moved with it, or (annotated) rewritten.
    refs = dict(line.split(" ") for line in git(
        ws, "for-each-ref", "--format=%(refname) %(objectname)").splitlines())
    assert refs == {"refs/heads/main": planned.new_head, "refs/heads/backup": c[1],
                    "refs/kernos/source": c[1], "refs/attic/blob": history.attic,
                    "refs/tags/side": history.side, "refs/tags/v3": planned.tags[
                        "refs/tags/v3"][1], "refs/tags/v5": planned.rewritten[c[5]]}
    assert git(ws, "rev-parse", "refs/tags/v3^{commit}") == planned.rewritten[c[3]]
    # Nothing the pruned snapshots alone reached is left, loose or packed; the rest is.
    assert [sha for sha in freed.objects if present(ws, sha)] == []
    assert present(ws, history.blobs[2]) and present(ws, history.attic)  # held by refs
    assert present(ws, history.base)  # held by the kept snapshots
    assert git(ws, "rev-list", "refs/heads/main").split() == [
        planned.new_head, planned.rewritten[c[5]], planned.rewritten[c[3]], c[1]]
    # The workspace reads the new history from the packs the repack wrote.
    assert [sha.hex() for sha, _commit in ws.history()] == [
        planned.new_head, planned.rewritten[c[5]], planned.rewritten[c[3]], c[1]]


def test_finish_without_tags_or_durability_deletes_and_syncs_nothing_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Workspace.open(tmp_path / "w", durable=False) as ws:
        c = linear(ws, 3)
        for sha in c:  # reflogs (a user's git may write them) would keep the pruned commits
            git(ws, "update-ref", "--create-reflog", "-m", "moved", "refs/heads/main", sha)
        assert len(git(ws, "reflog", "show", "refs/heads/main").splitlines()) == 3
        planned = plan(ws, Policy(keep_last=1))
        synced: list[Path] = []
        monkeypatch.setattr(retention, "fsync_dir", synced.append)
        write(ws, planned)
        intend(ws, planned)
        publish(ws, planned)
        finish(ws, planned.intent())
        assert synced == []
        assert not (ws.path / INTENT).exists()
        assert [present(ws, sha) for sha in c] == [False, False, False]
        assert git(ws, "for-each-ref", "--format=%(refname)") == "refs/heads/main"


def test_a_failed_write_leaves_nothing_behind(durable: Workspace,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    linear(durable, 3)
    planned = plan(durable, Policy(keep_last=1))
    objects = durable.objects
    real_seal = objects.seal

    def seal(commit: bytes) -> None:
        real_seal(commit)  # the pack is written, then the disk refuses
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(objects, "seal", seal)
    with pytest.raises(OSError, match="No space"):
        write(durable, planned)
    assert not objects.exists(bytes.fromhex(planned.new_head))
    assert list((durable.git_dir / "objects" / "pack").glob("*.pack")) == []
    assert (durable.path / "pending").read_bytes() == b""


def test_abandon_undoes_the_written_batch_and_the_intent(durable: Workspace) -> None:
    c = linear(durable, 3)
    planned = plan(durable, Policy(keep_last=1))
    write(durable, planned)
    intend(durable, planned)
    retention.abandon(durable)
    assert not (durable.path / INTENT).exists()
    assert not durable.objects.exists(bytes.fromhex(planned.new_head))
    assert durable.head() == bytes.fromhex(c[2])
    retention.abandon(durable)  # twice: nothing left to undo, no error


def test_finish_deletes_pruned_objects_from_the_packs_too(durable: Workspace) -> None:
    c = linear(durable, 3)
    git(durable, "repack", "-a", "-d", "-q")  # as a `kernos gc` or git's own gc leaves them
    assert not any(present_loose(durable, sha) for sha in c)
    planned = plan(durable, Policy(keep_last=1))
    write(durable, planned)
    intend(durable, planned)
    publish(durable, planned)
    finish(durable, planned.intent())
    assert [present(durable, sha) for sha in c] == [False, False, False]
    assert len(list((durable.git_dir / "objects" / "pack").glob("*.pack"))) == 1
    assert durable.read_commit(bytes.fromhex(planned.new_head)).parents == ()


def present_loose(workspace: Workspace, sha: str) -> bool:
    return (workspace.git_dir / "objects" / sha[:2] / sha[2:]).exists()


def test_a_ref_that_vanished_meanwhile_needs_nothing_and_the_others_still_count(
        history: History) -> None:
    ws, c = history.workspace, history.c
    on_chain = set(c[1:])
    assert retention._needed(ws, ["refs/heads/gone", "refs/heads/backup", "refs/tags/side"],
                             on_chain) == {c[1]: "refs/heads/backup"}


def test_finish_tries_twice_then_names_what_is_left(
        durable: Workspace, points_passed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    c = linear(durable, 3)
    planned = plan(durable, Policy(keep_last=1))
    write(durable, planned)
    intend(durable, planned)
    publish(durable, planned)
    asked: list[list[str]] = []
    left = ["ab" * 20, "cd" * 20]
    monkeypatch.setattr(retention, "_present",
                        lambda _ws, ids: (asked.append(list(ids)), left)[1])
    with pytest.raises(KernosError) as raised:
        finish(durable, planned.intent(), freed=["ef" * 20])
    assert str(raised.value) == (
        f"the history was pruned, but 2 of the pruned objects (first abababababab) are still "
        f"in {durable.git_dir}: another process copied them while they were deleted (a "
        "`kernos gc`, or the background repack of a kernel that died). Run `kernos prune` "
        "again once it has finished, to delete them.")
    assert points_passed.count("prune.repacked") == 2
    # What must be gone: the pruned, the replaced and the freed objects, sorted, once each.
    assert asked == [sorted({c[0], c[1], c[2], "ef" * 20})] * 2
    assert (durable.path / INTENT).exists()  # kept: the next open tries again
    # A second try that finds nothing left succeeds.
    answers = [["ab" * 20], []]
    points_passed.clear()
    monkeypatch.setattr(retention, "_present", lambda _ws, ids: answers.pop(0))
    finish(durable, planned.intent())
    assert points_passed == ["prune.tags", "prune.repacked", "prune.repacked"]
    assert not (durable.path / INTENT).exists()


def test_present_lists_only_the_objects_that_are_there(durable: Workspace) -> None:
    c = linear(durable, 1)
    assert retention._present(durable, []) == []
    assert retention._present(durable, ["0" * 40, c[0], "1" * 40]) == [c[0]]


def test_a_failing_git_command_names_itself_and_what_git_said(durable: Workspace) -> None:
    name = "z" * 700
    expected = subprocess.run(["git", f"--git-dir={durable.git_dir}", "cat-file", "-t", name],
                              capture_output=True, text=True).stderr.strip()
    assert len(expected) > 500
    with pytest.raises(KernosError) as raised:
        retention._git(durable, "cat-file", "-t", name)
    assert str(raised.value) == f"git cat-file failed in {durable.git_dir}: {expected[:500]}"


# -- what plan refuses ---------------------------------------------------------------------------


def test_an_empty_history_has_nothing_to_prune(durable: Workspace) -> None:
    with pytest.raises(UsageError) as raised:
        plan(durable, Policy(keep_last=1))
    assert str(raised.value) == (f"the history of {durable.path} is empty: there is nothing "
                                 "to prune")


def test_a_merge_on_the_branch_is_refused(durable: Workspace) -> None:
    c = linear(durable, 2)
    other = commit(durable, 7, at("2026-03-07"))
    merge = commit(durable, 8, at("2026-03-08"), c[1], other)
    git(durable, "update-ref", "refs/heads/main", merge)
    with pytest.raises(UsageError) as raised:
        plan(durable, Policy(keep_last=1))
    assert str(raised.value) == (
        f"the commit {merge[:12]} on the branch has 2 parents: Kernos never writes a merge, "
        "and prune does not rewrite one. Nothing was changed.")


def test_a_branch_naming_a_tree_is_corruption(durable: Workspace) -> None:
    c = linear(durable, 1)
    tree1 = git(durable, "rev-parse", f"{c[0]}^{{tree}}")
    (durable.git_dir / "refs" / "heads" / "main").write_text(tree1 + "\n")
    with pytest.raises(WorkspaceCorrupt) as raised:
        plan(durable, Policy(keep_last=1))
    assert raised.value.problem == f"{tree1} is a tree, not a commit"
    assert raised.value.path == str(durable.path)


# -- the intent file and an interrupted prune ----------------------------------------------------


def test_the_intent_file_round_trips_and_older_ones_lack_replaced() -> None:
    intent = Intent(old_head="a" * 40, new_head="b" * 40,
                    tags={"refs/tags/x": None, "refs/tags/y": "c" * 40},
                    pruned=("d" * 40,), replaced=("e" * 40,))
    assert Intent.from_json(intent.to_json()) == intent
    older = json.dumps({"from": "a" * 40, "to": "b" * 40, "tags": {"refs/tags/y": 7},
                        "pruned": [1]}).encode()
    assert Intent.from_json(older) == Intent(old_head="a" * 40, new_head="b" * 40,
                                             tags={"refs/tags/y": "7"}, pruned=("1",))


@pytest.mark.parametrize("content", [
    b"{not json", json.dumps({"from": "a", "to": "b", "tags": {}}).encode(),
    json.dumps({"from": "a", "to": "b", "tags": 5, "pruned": []}).encode()])
def test_an_unreadable_intent_file_is_removed(durable: Workspace, content: bytes) -> None:
    (durable.path / INTENT).write_bytes(content)
    assert finish_interrupted(durable) == "removed an unreadable prune intent file"
    assert not (durable.path / INTENT).exists()
    assert finish_interrupted(durable) is None


def test_an_intent_whose_branch_never_moved_is_forgotten(durable: Workspace) -> None:
    (durable.path / INTENT).write_bytes(Intent(old_head="a" * 40, new_head="b" * 40).to_json())
    message = "an interrupted prune had not moved the branch: nothing was pruned"
    assert finish_interrupted(durable) == message  # an empty history
    assert not (durable.path / INTENT).exists()
    c = linear(durable, 2)
    planned = plan(durable, Policy(keep_last=1))
    write(durable, planned)
    intend(durable, planned)
    path = durable.path
    durable.close()  # a crash before the commit point
    with Workspace.open(path) as reopened:
        assert reopened.recovery_note is not None and message in reopened.recovery_note
        assert not (path / INTENT).exists()
        assert reopened.head() == bytes.fromhex(c[1])
        assert present(reopened, c[0])


def test_a_published_prune_is_finished_at_the_next_open(history: History) -> None:
    ws, c = history.workspace, history.c
    planned = plan(ws, POLICY)
    write(ws, planned)
    intend(ws, planned)
    publish(ws, planned)
    path = ws.path
    ws.close()  # a crash after the commit point
    with Workspace.open(path) as reopened:
        assert reopened.recovery_note == (
            "finished an interrupted prune (2 snapshots pruned, their objects deleted)")
        assert not (path / INTENT).exists()
        assert [present(reopened, sha) for sha in (c[2], c[3], c[4], c[5], c[6])] == [False] * 5
        assert git(reopened, "rev-parse", "refs/tags/v5") == planned.rewritten[c[5]]
        assert not present(reopened, "refs/tags/old")


def test_a_published_prune_whose_clean_up_fails_says_so(
        durable: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    linear(durable, 2)
    planned = plan(durable, Policy(keep_last=1))
    write(durable, planned)
    intend(durable, planned)
    publish(durable, planned)

    def failing(workspace: Workspace, intent: Intent, *, freed: object = ()) -> None:
        assert workspace is durable and intent == planned.intent()
        raise KernosError("git repack failed")

    monkeypatch.setattr(retention, "finish", failing)
    assert finish_interrupted(durable) == (
        "an interrupted prune was published, but its clean-up failed: git repack failed")
    assert (durable.path / INTENT).exists()


# -- the policy ----------------------------------------------------------------------------------


def test_policy_counts_must_not_be_negative_and_its_record() -> None:
    for bad in ({"keep_last": -1}, {"keep_daily": -1}):
        with pytest.raises(UsageError) as raised:
            Policy(**bad)  # type: ignore[arg-type]
        assert str(raised.value) == "keep_last and keep_daily are counts: give 0 or more"
    assert [Policy(keep_last=1).empty, Policy(keep_daily=1).empty,
            Policy(keep_tags=("v*",)).empty, Policy().empty] == [False, False, False, True]
    assert Policy(keep_last=3, keep_daily=2, keep_tags=("v*", "r*")).to_json() == {
        "keep_last": 3, "keep_daily": 2, "keep_tags": ["v*", "r*"]}


def test_a_tag_counts_once_for_its_first_matching_pattern_and_tags_in_name_order() -> None:
    chain = [Snapshot(commit=f"c{n}", time=at(f"2026-03-0{n}")) for n in (1, 2, 3)]
    selection = select(chain, Policy(keep_tags=("v*", "*1", "r*")),
                       tags={"v1": "c1", "b-release": "c2", "a-release": "c2"})
    assert selection.kept == {"c1": ("tag v1",), "c3": ("HEAD",)}
    assert selection.unmatched == ("*1", "r*")
    both = select(chain, Policy(keep_tags=("*-release",)),
                  tags={"b-release": "c2", "a-release": "c2"})
    assert both.kept["c2"] == ("tag a-release", "tag b-release")
    needed = select(chain, Policy(keep_last=1), needed={"elsewhere": "refs/heads/x",
                                                         "c1": "refs/heads/y"})
    assert needed.kept == {"c1": ("needed by refs/heads/y",), "c3": ("HEAD", "last")}
    assert needed.pruned == ("c2",)


def test_keep_last_at_the_chain_length_keeps_it_all_and_zero_keeps_only_head() -> None:
    chain = [Snapshot(commit=f"c{n}", time=at("2026-03-01")) for n in (1, 2, 3)]
    assert list(select(chain, Policy(keep_last=3)).kept) == ["c1", "c2", "c3"]
    assert list(select(chain, Policy(keep_last=2)).kept) == ["c2", "c3"]
    assert select(chain, Policy(keep_daily=1)).kept == {"c3": ("HEAD", "daily 2026-03-01")}
    assert select([], Policy(keep_tags=("v*",))) == Selection(kept={}, pruned=(), unmatched=())


def test_with_parent_leaves_the_message_alone_whatever_it_holds() -> None:
    # A message with blank lines and a line that looks like a header: only the header's
    # parent lines are the commit's.
    message = b"parent of the results\n\nparent 9\n\nKernos-Op: 3\n"
    head = b"tree " + b"4" * 40 + b"\nparent " + b"1" * 40 + b"\nauthor a <a@b> 1 +0000\n"
    assert with_parent(head + b"\n" + message, "2" * 40) == (
        head.replace(b"1" * 40, b"2" * 40) + b"\n" + message)
    assert with_parent(head + b"\n" + message, None) == (
        b"tree " + b"4" * 40 + b"\nauthor a <a@b> 1 +0000\n\n" + message)


def test_with_parent_replaces_every_parent_line_of_a_merge() -> None:
    merge = (b"tree " + b"4" * 40 + b"\nparent " + b"1" * 40 + b"\nparent " + b"2" * 40 +
             b"\nauthor a <a@b> 1 +0000\ncommitter a <a@b> 1 +0000\n\nmessage\n")
    assert with_parent(merge, "3" * 40) == (
        b"tree " + b"4" * 40 + b"\nparent " + b"3" * 40 +
        b"\nauthor a <a@b> 1 +0000\ncommitter a <a@b> 1 +0000\n\nmessage\n")
