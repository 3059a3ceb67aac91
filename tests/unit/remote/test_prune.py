"""A push (and a pull, and a clone) after ``kernos prune``: accepted when the audit chain proves
the rewrite was a prune, refused (``RemoteDiverged``, saying which) when it does not.

Real git throughout: the remotes are bare repositories on disk, the workspaces are driven in
process (``CoreEnv``), the prunes are ``kernos.prune.prune``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from core_support import CoreEnv
from kernos import Workspace
from kernos.audit import open_audit, verify
from kernos.errors import RemoteDiverged, RemoteRefused
from kernos.prune import Policy, prune
from kernos.remote import transfer as remote_module
from kernos.remote.transfer import AUDIT_REF, RemoteConfig, clone, pull, push
from remote_support import signers_of

BRANCH = "refs/heads/main"


def git(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env}).stdout


def ref_of(url: Path, ref: str = BRANCH) -> str | None:
    out = git("--git-dir", str(url), "for-each-ref", "--format=%(objectname)", ref).strip()
    return out or None


def head_of(path: Path) -> str:
    with Workspace.open(path, writable=False) as view:
        head = view.head()
    assert head is not None
    return head.hex()


def has_object(path: Path, sha: str) -> bool:
    return subprocess.run(["git", "--git-dir", str(path / "history.git"), "cat-file", "-e",
                           sha], capture_output=True).returncode == 0


def names(path: Path) -> dict[str, object]:
    env = CoreEnv(path)
    try:
        return {k: v for k, v in env.ns.items() if k.startswith("x")}
    finally:
        env.close()


def workspace(path: Path, url: Path, values: range) -> CoreEnv:
    env = CoreEnv(path)
    RemoteConfig.load(path).add("origin", str(url))
    for value in values:
        env.run(f"x{value} = {value}")
    return env


def run_ops(path: Path, values: range) -> None:
    env = CoreEnv(path)
    for value in values:
        env.run(f"x{value} = {value}")
    env.close()


def pushed_and_pruned(tmp_path: Path, keep_last: int = 2) -> tuple[Path, Path, str]:
    """Workspace a: six ops pushed, two more, then pruned to its last ``keep_last``; the
    remote's main (which the prune rewrote or deleted) is returned."""
    url, a = tmp_path / "remote.git", tmp_path / "a"
    workspace(a, url, range(1, 7)).close()
    push(a)
    pushed = head_of(a)
    run_ops(a, range(7, 9))
    report = prune(a, Policy(keep_last=keep_last))
    assert report.pruned and report.record is not None
    assert not has_object(a, pushed) or keep_last > 2
    return url, a, pushed


def test_a_pruned_workspace_pushes_and_a_clone_of_it_verifies(tmp_path: Path) -> None:
    url, a, pushed = pushed_and_pruned(tmp_path)
    assert ref_of(url) == pushed
    result = push(a)
    assert ref_of(url) == head_of(a) == result.head and result.before == pushed
    assert result.prunes and BRANCH in result.updated
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    assert head_of(tmp_path / "b") == head_of(a)
    report = verify(str(tmp_path / "b"))
    assert report.ok, report.summary()
    assert names(tmp_path / "b") == names(a) == {f"x{n}": n for n in range(1, 9)}
    # The clone holds the pruned history only as records: none of its commits came along.
    (pruning,) = [json.loads(line) for line in (a / "audit/chain.jsonl").read_bytes()
                  .splitlines() if b'"prune"' in line]
    assert pruning["pruned"] and not any(has_object(tmp_path / "b", c)
                                         for c in pruning["pruned"])
    run_ops(a, range(9, 10))
    assert push(a).prunes == ()  # the next push is a fast-forward again


def test_the_remote_head_renamed_by_the_prune_pushes_too(tmp_path: Path) -> None:
    """keep_last 4 keeps the remote's main (op 6) under a new id."""
    url, a, pushed = pushed_and_pruned(tmp_path, keep_last=4)
    assert not has_object(a, pushed)
    push(a)
    assert ref_of(url) == head_of(a)
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    assert verify(str(tmp_path / "b")).ok


@pytest.mark.parametrize("writer", ["kernos", "plain git"])
def test_a_writer_that_moves_the_remote_during_the_push_wins_the_compare_and_swap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str) -> None:
    url, a = tmp_path / "remote.git", tmp_path / "a"
    workspace(a, url, range(1, 4)).close()
    push(a)
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    run_ops(tmp_path / "b", range(10, 11))
    run_ops(a, range(4, 6))
    prune(a, Policy(keep_last=1))
    real = remote_module.push_refs
    raced: list[bool] = []

    def another_writer_first(*args: object, **kwargs: object) -> None:
        if raced:  # b's own push, inside a's
            return real(*args, **kwargs)  # type: ignore[arg-type]
        raced.append(True)
        if writer == "kernos":
            push(tmp_path / "b")
        else:  # only main moves: the audit, LLM and meta refs do not refuse the push
            git("--git-dir", str(tmp_path / "b" / "history.git"), "push", "--quiet", str(url),
                f"{head_of(tmp_path / 'b')}:{BRANCH}")
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(remote_module, "push_refs", another_writer_first)
    with pytest.raises(RemoteDiverged, match="moved while this push ran") as refused:
        push(a)
    assert ref_of(url) == head_of(tmp_path / "b")
    if writer == "kernos":
        assert RemoteConfig.load(tmp_path / "b").id in refused.value.writer
    else:
        assert "plain git" in refused.value.writer


def test_a_history_rewritten_without_a_prune_record_is_refused(tmp_path: Path) -> None:
    """The branch is reset by plain git and ops go on from there: the chain still extends
    the remote's, but nothing in it says the remote's main was pruned."""
    url, a = tmp_path / "remote.git", tmp_path / "a"
    workspace(a, url, range(1, 7)).close()
    push(a)
    pushed = head_of(a)
    history = str(a / "history.git")
    assert git("--git-dir", history, "rev-parse", BRANCH).strip() == pushed  # no tail left
    git("--git-dir", history, "update-ref", BRANCH, f"{pushed}~2")
    run_ops(a, range(10, 12))
    with pytest.raises(RemoteDiverged, match="no prune record since the last push"):
        push(a)
    assert ref_of(url) == pushed


def test_a_voided_prune_record_does_not_authorize(tmp_path: Path) -> None:
    url, a, pushed = pushed_and_pruned(tmp_path)
    with Workspace.open(a) as writer:
        log = open_audit(writer)
        prune_index = len(log.entries) - 1
        log.append({"type": "void", "voids": prune_index,
                    "reason": "the prune failed before the branch moved; nothing was pruned"})
    with pytest.raises(RemoteDiverged, match="no prune record"):
        push(a)
    assert ref_of(url) == pushed


def test_a_prune_that_does_not_map_the_remote_head_is_refused(tmp_path: Path) -> None:
    """The remote's main was moved by plain git (no audit record) to a commit a never had;
    a's prune records cannot account for it."""
    url, a = tmp_path / "remote.git", tmp_path / "a"
    workspace(a, url, range(1, 4)).close()
    push(a)
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    run_ops(tmp_path / "b", range(10, 11))
    git("--git-dir", str(tmp_path / "b" / "history.git"), "push", "--quiet", str(url),
        f"{head_of(tmp_path / 'b')}:{BRANCH}")
    run_ops(a, range(4, 6))
    prune(a, Policy(keep_last=1))
    with pytest.raises(RemoteDiverged, match="do not account for the remote origin's main"):
        push(a)
    assert ref_of(url) == head_of(tmp_path / "b")


def test_a_pruned_push_over_another_kernos_writers_ops_is_refused_as_a_fork(
        tmp_path: Path) -> None:
    url, a = tmp_path / "remote.git", tmp_path / "a"
    workspace(a, url, range(1, 4)).close()
    push(a)
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    run_ops(tmp_path / "b", range(10, 11))
    push(tmp_path / "b")
    run_ops(a, range(4, 6))
    prune(a, Policy(keep_last=1))
    with pytest.raises(RemoteDiverged, match="audit chain is not a prefix") as refused:
        push(a)
    assert RemoteConfig.load(tmp_path / "b").id in refused.value.writer
    assert ref_of(url) == head_of(tmp_path / "b")


def test_two_prunes_between_pushes_compose(tmp_path: Path) -> None:
    """The remote's main is renamed by the first prune and renamed again by the second."""
    url, a = tmp_path / "remote.git", tmp_path / "a"
    workspace(a, url, range(1, 4)).close()
    push(a)
    pushed = head_of(a)
    run_ops(a, range(4, 5))
    first = prune(a, Policy(keep_last=3))
    renamed = {kept.snapshot.commit: kept.commit for kept in first.kept}
    assert renamed[pushed] != pushed
    run_ops(a, range(5, 6))
    second = prune(a, Policy(keep_last=3))
    again = {kept.snapshot.commit: kept.commit for kept in second.kept}
    assert again[renamed[pushed]] != renamed[pushed]  # renamed twice
    assert not has_object(a, pushed) and not has_object(a, renamed[pushed])
    result = push(a)
    assert result.prunes == (first.record, second.record)
    assert ref_of(url) == head_of(a)
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    assert verify(str(tmp_path / "b")).ok
    assert names(tmp_path / "b") == {f"x{n}": n for n in range(1, 6)}


def test_a_pull_on_an_old_copy_follows_the_prune_and_drops_the_pruned_history(
        tmp_path: Path) -> None:
    url, a = tmp_path / "remote.git", tmp_path / "a"
    workspace(a, url, range(1, 7)).close()
    push(a)
    clone(str(url), tmp_path / "old", trust=signers_of(url))
    clone(str(url), tmp_path / "busy", trust=signers_of(url))
    run_ops(tmp_path / "busy", range(20, 21))  # an op of its own since the clone
    old_head = head_of(tmp_path / "old")
    run_ops(a, range(7, 9))
    report = prune(a, Policy(keep_last=2))
    push(a)

    result = pull(tmp_path / "old")
    assert head_of(tmp_path / "old") == head_of(a) == result.head
    assert result.before == old_head and result.prunes == (report.record,)
    assert result.dropped == len(report.pruned)  # all of them were here
    assert (tmp_path / "old" / "audit/chain.jsonl").read_bytes() == \
        (a / "audit/chain.jsonl").read_bytes()
    assert not any(has_object(tmp_path / "old", s.commit) for s in report.pruned)
    assert not (tmp_path / "old" / "pruning").exists()
    checked = verify(str(tmp_path / "old"))
    assert checked.ok, checked.summary()
    assert names(tmp_path / "old") == names(a)

    busy_head = head_of(tmp_path / "busy")
    with pytest.raises(RemoteDiverged, match="audit chain is not a prefix of the remote"):
        pull(tmp_path / "busy")
    assert head_of(tmp_path / "busy") == busy_head
    assert names(tmp_path / "busy")["x20"] == 20


def test_tags_on_the_remote_follow_the_prune(tmp_path: Path) -> None:
    url, a = tmp_path / "remote.git", tmp_path / "a"
    env = workspace(a, url, range(1, 7))
    assert env.workspace is not None
    env.close()
    push(a)
    history = str(a / "history.git")
    commits = git("--git-dir", history, "rev-list", "--reverse", BRANCH).split()
    git("--git-dir", history, "tag", "keep", commits[2])  # kept by --keep-tag: renamed
    git("--git-dir", history, "tag", "gone", commits[3])  # pruned: deleted
    git("--git-dir", history, "tag", "-a", "-m", "v", "kept-annotated", commits[2],
        env={"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@kernos.invalid"})
    git("--git-dir", history, "push", "--quiet", str(url), "refs/tags/*:refs/tags/*")
    git("--git-dir", history, "push", "--quiet", str(url), f"{commits[3]}:refs/tags/theirs")
    report = prune(a, Policy(keep_last=2, keep_tags=("keep", "kept-annotated")))
    assert report.tags["refs/tags/gone"] is None and report.tags["refs/tags/keep"]
    push(a)
    for tag in ("keep", "kept-annotated"):
        moved = ref_of(url, f"refs/tags/{tag}")
        assert moved == report.tags[f"refs/tags/{tag}"] == ref_of(a / "history.git",
                                                                   f"refs/tags/{tag}")
    assert ref_of(url, "refs/tags/gone") is None
    assert ref_of(url, "refs/tags/theirs") == commits[3]  # no record names it: left alone
    assert ref_of(url) == head_of(a)


def test_the_audit_ref_the_pruned_push_moved_still_grows_by_commits(tmp_path: Path) -> None:
    url, a, _pushed = pushed_and_pruned(tmp_path)
    before = ref_of(url, AUDIT_REF)
    push(a)
    assert git("--git-dir", str(url), "rev-parse", f"{AUDIT_REF}^").strip() == before


def test_a_pull_whose_prunes_do_not_map_this_copys_head_is_refused(tmp_path: Path) -> None:
    """The remote was pruned, then its main moved by plain git to an unrelated history: the
    prunes map the old copy's head to a's, which that main does not contain."""
    url, a = tmp_path / "remote.git", tmp_path / "a"
    workspace(a, url, range(1, 4)).close()
    push(a)
    clone(str(url), tmp_path / "old", trust=signers_of(url))
    old_head = head_of(tmp_path / "old")
    run_ops(a, range(4, 6))
    prune(a, Policy(keep_last=1))
    push(a)
    run_ops(tmp_path / "stranger", range(30, 31))
    git("--git-dir", str(tmp_path / "stranger" / "history.git"), "push", "--quiet", str(url),
        f"+{head_of(tmp_path / 'stranger')}:{BRANCH}")
    # The records (a's, signed and trusted) name snapshots that main does not hold: the
    # workspace the pull would make does not verify, so nothing lands.
    with pytest.raises(RemoteRefused, match="is missing or unreadable"):
        pull(tmp_path / "old")
    assert head_of(tmp_path / "old") == old_head and has_object(tmp_path / "old", old_head)
