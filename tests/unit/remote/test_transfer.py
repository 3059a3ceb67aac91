"""A workspace through a git remote: push, pull, clone, refusals, the lease, the pusher.

Real git repositories and the git CLI throughout; the workspaces are driven in
process (``CoreEnv``), the remotes are bare repositories on disk.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from core_support import CoreEnv
from kernos import Workspace, WorkspaceLocked
from kernos.audit import verify
from kernos.errors import RemoteDiverged, RemoteLeaseHeld, UsageError
from kernos.remote import lease as remote_lease
from kernos.remote import start as remote_start
from kernos.remote import transfer as remote_module
from kernos.remote.autopush import AutoPusher
from kernos.remote.lease import acquire_lease, release_lease
from kernos.remote.transfer import (
    AUDIT_REF,
    RemoteConfig,
    clone,
    materialize,
    pull,
    push,
)
from remote_support import signers_of


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def remote_head(url: Path, ref: str = "refs/heads/main") -> str | None:
    if not (url / "HEAD").exists():
        return None  # not created yet (the first push creates a local remote)
    out = git("--git-dir", str(url), "for-each-ref", "--format=%(objectname)", ref).strip()
    return out or None


def workspace_with_remote(path: Path, url: Path, *, lease: bool = False) -> CoreEnv:
    env = CoreEnv(path)
    RemoteConfig.load(path).add("origin", str(url), lease=lease)
    return env


def head_of(path: Path) -> str:
    with Workspace.open(path, writable=False) as view:
        head = view.head()
    assert head is not None
    return head.hex()


def test_clone_restores_the_same_history_audit_and_values(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    env.run("def double(v):\n    return 2 * v\n")
    env.run("y = {'k': [1, 2, 3]}")
    llm = tmp_path / "a" / "llm" / "objects"
    llm.mkdir(parents=True)
    stored = b'{"a":1}'  # named by its hash, as the LLM store names what it keeps
    (llm / (hashlib.sha256(stored).hexdigest() + ".json")).write_bytes(stored)
    (tmp_path / "a" / "llm" / "calls.jsonl").write_text('{"call": 1}\n')
    push(tmp_path / "a")
    env.close()

    clone(str(url), tmp_path / "b", trust=signers_of(url))
    assert head_of(tmp_path / "b") == head_of(tmp_path / "a")
    for name in ("audit/chain.jsonl", "llm/calls.jsonl",
                 "llm/objects/" + hashlib.sha256(stored).hexdigest() + ".json",
                 "workspace.json"):
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()
    assert verify(str(tmp_path / "b")).ok
    copy = CoreEnv(tmp_path / "b")
    assert copy.ns["x"] == 1 and copy.ns["y"] == {"k": [1, 2, 3]}
    assert copy.ns["double"](4) == 8
    copy.close()


def test_push_beside_the_writer_carries_commits_still_in_the_tail(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    env.run("x = 2")
    assert env.workspace is not None
    assert env.workspace.tail.frames, "the commits under test must still be in the tail"
    assert env.workspace.git_ref() != env.workspace.head()
    push(tmp_path / "a")  # the lock is held by env: a push only reads
    assert remote_head(url) == env.workspace.head().hex()  # type: ignore[union-attr]
    env.close()
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    with CoreEnv(tmp_path / "b") as b:
        assert b.ns["x"] == 2


def _remote_bytes(url: Path) -> bytes:
    """Every object of the remote, uncompressed, and every other file in it."""
    objects = subprocess.run(["git", "--git-dir", str(url), "cat-file", "--batch-all-objects",
                              "--batch"], check=True, capture_output=True).stdout
    files = b"".join(p.read_bytes() for p in url.rglob("*") if p.is_file())
    return objects + files


def test_secrets_never_reach_the_remote(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("from kernos import personal\np = personal('the card 4111', subject='c-1')")
    keys = list((tmp_path / "a" / "keys").glob("*.key"))
    assert keys, "the personal value must have made a subject key"
    key = bytes.fromhex(json.loads(keys[0].read_text())["key"])
    connection = {"key": "a1b2c3d4-hmac-connection-secret", "transport": "ipc"}
    (tmp_path / "a" / "kernel.json").write_text(json.dumps(connection))
    push(tmp_path / "a")
    env.close()
    pushed = _remote_bytes(url)
    assert b'"type": "op"' in pushed or b'"type":"op"' in pushed  # the scan sees the chain
    signing = json.loads((tmp_path / "a" / "identity.json").read_text())["secret"]
    for secret in (key, key.hex().encode(), connection["key"].encode(), signing.encode()):
        assert secret not in pushed
    assert b"the card 4111" not in pushed
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    assert not (tmp_path / "b" / "keys").exists()
    assert not (tmp_path / "b" / "kernel.json").exists()
    copied = json.loads((tmp_path / "b" / "identity.json").read_text())
    assert copied["secret"] != signing  # the clone is a writer of its own


def test_a_push_that_would_fork_the_history_is_refused_naming_the_writer(
        tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    push(tmp_path / "a")
    env.close()
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    a, b = CoreEnv(tmp_path / "a"), CoreEnv(tmp_path / "b")
    a.run("x = 'from a'")
    b.run("x = 'from b'")
    push(tmp_path / "a")
    pushed_by_a = remote_head(url)
    with pytest.raises(RemoteDiverged) as refused:
        push(tmp_path / "b")
    a_id = RemoteConfig.load(tmp_path / "a").id
    assert a_id in refused.value.writer and a_id in str(refused.value)
    assert "kernos fork" in str(refused.value)
    assert remote_head(url) == pushed_by_a  # nothing lost on either side
    assert b.ns["x"] == "from b" and head_of(tmp_path / "b") != pushed_by_a
    a.close()
    b.close()
    with pytest.raises(RemoteDiverged):
        pull(tmp_path / "b")


def test_a_push_behind_the_remote_says_pull_and_pull_fast_forwards(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    push(tmp_path / "a")
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    env.run("x = 2")
    push(tmp_path / "a")
    env.close()
    with pytest.raises(RemoteDiverged, match="kernos pull"):
        push(tmp_path / "b")
    result = pull(tmp_path / "b")
    assert result.records == 1 and result.head == remote_head(url)
    assert (tmp_path / "b" / "audit/chain.jsonl").read_bytes() == \
        (tmp_path / "a" / "audit/chain.jsonl").read_bytes()
    assert verify(str(tmp_path / "b")).ok
    with CoreEnv(tmp_path / "b") as b:
        assert b.ns["x"] == 2


def test_pull_refuses_while_a_writer_holds_the_workspace(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    push(tmp_path / "a")
    with pytest.raises(WorkspaceLocked):
        pull(tmp_path / "a")
    env.close()


def test_a_chain_that_does_not_extend_the_remotes_is_refused(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    push(tmp_path / "a")
    env.close()
    chain = tmp_path / "a" / "audit" / "chain.jsonl"
    lines = chain.read_bytes().splitlines(keepends=True)
    lines[0] = lines[0].replace(b'"genesis"', b'"genesis" ')
    chain.write_bytes(b"".join(lines))
    before = remote_head(url, AUDIT_REF)
    with pytest.raises(RemoteDiverged, match="audit chain"):
        push(tmp_path / "a")
    assert remote_head(url, AUDIT_REF) == before


def test_each_push_adds_only_the_last_chain_segment(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_module, "SEGMENT_LINES", 2)
    monkeypatch.setattr(remote_module, "SEGMENT_GROUP", 2)
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    for value in range(4):
        env.run(f"x = {value}")
    push(tmp_path / "a")

    def segments() -> dict[str, str]:
        listing = git("--git-dir", str(url), "ls-tree", "-r", AUDIT_REF, "chain/")
        return {line.split("\t")[1]: line.split()[2] for line in listing.splitlines()}

    def full_group() -> str:
        return git("--git-dir", str(url), "rev-parse", f"{AUDIT_REF}:chain/00000").strip()

    first, group = segments(), full_group()
    env.run("x = 10")
    push(tmp_path / "a")
    second = segments()
    assert full_group() == group  # a full directory of segments is never rewritten
    assert sorted(second)[-1].startswith("chain/00001/")
    env.close()
    assert len(first) == 3 and len(second) == 3  # 5 records, then 6, in twos
    last = sorted(first)[-1]
    assert {k: v for k, v in second.items() if k != last} == \
        {k: v for k, v in first.items() if k != last}
    assert second[last] != first[last]
    parent = git("--git-dir", str(url), "rev-parse", f"{AUDIT_REF}^").strip()
    assert parent  # the remote's audit ref grows by commits, never rewritten


def test_two_contenders_for_the_lease_one_wins(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every contender reads "no lease" before any of them writes: only CAS saves it."""
    url = tmp_path / "remote.git"
    contenders = 4
    for index in range(contenders):
        workspace_with_remote(tmp_path / f"w{index}", url).close()
    barrier = threading.Barrier(contenders)
    real = remote_lease.read_lease
    first = threading.local()

    def read_then_wait(*args: object, **kwargs: object) -> object:
        found = real(*args, **kwargs)  # type: ignore[arg-type]
        if not getattr(first, "done", False):  # the first read only, not the loser's re-read
            first.done = True
            barrier.wait(timeout=60)
        return found

    monkeypatch.setattr(remote_lease, "read_lease", read_then_wait)
    results: dict[int, object] = {}

    def contend(index: int) -> None:
        try:
            results[index] = acquire_lease(tmp_path / f"w{index}", "origin", ttl=60)
        except RemoteLeaseHeld as error:
            results[index] = error

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i, r in results.items() if isinstance(r, remote_lease.Lease)]
    assert len(winners) == 1, results
    winner_id = RemoteConfig.load(tmp_path / f"w{winners[0]}").id
    for index, result in results.items():
        if index != winners[0]:
            assert isinstance(result, RemoteLeaseHeld)
            assert winner_id in result.holder


def test_an_expired_lease_is_taken_over_and_its_old_holder_learns_it(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    workspace_with_remote(tmp_path / "a", url).close()
    workspace_with_remote(tmp_path / "b", url).close()
    old = acquire_lease(tmp_path / "a", "origin", ttl=5)
    with pytest.raises(RemoteLeaseHeld, match="remote release origin --force") as held:
        acquire_lease(tmp_path / "b", "origin")
    assert RemoteConfig.load(tmp_path / "a").id in held.value.holder
    later = time.time() + 10
    new = acquire_lease(tmp_path / "b", "origin", now=lambda: later)
    with pytest.raises(RemoteLeaseHeld):
        old.renew()
    assert not old.held
    new.renew()
    new.release()
    assert remote_head(url, "refs/kernos/lease") is None


def test_a_live_lease_refuses_another_pusher_until_force_released(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    push(tmp_path / "a")
    env.close()
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    lease = acquire_lease(tmp_path / "a", "origin")
    push(tmp_path / "a")  # its own lease does not stop it
    b = CoreEnv(tmp_path / "b")
    b.run("x = 2")
    with pytest.raises(RemoteLeaseHeld):
        push(tmp_path / "b")
    with pytest.raises(RemoteLeaseHeld):
        release_lease(tmp_path / "b", "origin")
    holder = release_lease(tmp_path / "b", "origin", force=True)
    assert holder is not None and holder.workspace == RemoteConfig.load(tmp_path / "a").id
    push(tmp_path / "b")
    b.close()
    lease.release()  # its lease is gone: nothing to do, and no error


def test_the_auto_pusher_pushes_after_commits_and_on_close(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    pusher = AutoPusher(tmp_path / "a", "origin", interval=0.05)
    pusher.start()
    env.run("x = 1")
    pusher.notify()
    assert env.workspace is not None
    expected = env.workspace.head().hex()  # type: ignore[union-attr]
    for _ in range(600):
        if remote_head(url) == expected:
            break
        time.sleep(0.05)
    assert remote_head(url) == expected
    for value in range(5):
        env.run(f"x = {value}")
    pusher.close()
    assert remote_head(url) == env.workspace.head().hex()  # type: ignore[union-attr]
    assert pusher.error is None and pusher.pushes
    env.close()


def test_materialize_clones_once(tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    push(tmp_path / "a")
    env.close()
    assert materialize(tmp_path / "fresh", str(url)) is not None
    assert materialize(tmp_path / "fresh", str(url)) is None
    assert head_of(tmp_path / "fresh") == head_of(tmp_path / "a")


def test_unknown_remote_and_bad_clone_targets_say_what_to_do(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "a")
    env.close()
    with pytest.raises(UsageError, match="kernos remote add"):
        push(tmp_path / "a", "nowhere")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    with pytest.raises(UsageError, match="not empty"):
        clone(str(tmp_path / "remote.git"), tmp_path / "full")
    git("init", "--quiet", "--bare", str(tmp_path / "empty.git"))
    with pytest.raises(Exception, match="no Kernos workspace"):
        clone(str(tmp_path / "empty.git"), tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_a_record_whose_commit_is_not_published_yet_waits_for_the_next_push(
        tmp_path: Path) -> None:
    """An op's record is written before its commit point: a push between the two must not
    carry a record naming a snapshot the remote does not have."""
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    env.close()
    chain = tmp_path / "a" / "audit" / "chain.jsonl"
    published = chain.read_bytes()
    last = json.loads(published.splitlines()[-1])
    in_flight = {"type": "op", "status": "committed", "commit": "ab" * 20,
                 "index": last["index"] + 1, "prev": last["hash"], "hash": "0" * 64}
    chain.write_bytes(published + json.dumps(in_flight).encode() + b"\n")
    result = push(tmp_path / "a")
    assert result.records == last["index"] + 1
    chain.write_bytes(published)  # the op never committed: the crash recovery would void it
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    assert (tmp_path / "b" / "audit" / "chain.jsonl").read_bytes() == published
    assert verify(str(tmp_path / "b")).ok


def test_a_first_kernel_on_a_new_remote_starts_empty_and_pushes(tmp_path: Path) -> None:
    url = tmp_path / "new.git"
    assert materialize(tmp_path / "ws", str(url)) is None  # nothing there yet: nothing done
    session = remote_start.start_remote(tmp_path / "ws", {"KERNOS_REMOTE": f"origin={url}",
                                                          "KERNOS_REMOTE_LEASE": "1"},
                                        interval=0.05)
    assert session is not None and session.lease is not None
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    env.close()
    session.close()
    assert remote_head(url) == head_of(tmp_path / "ws")
    assert remote_head(url, "refs/kernos/lease") is None


def test_the_staging_repository_stays_a_handful_of_files(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.remote import git as remote_git

    monkeypatch.setattr(remote_git, "LOOSE_LIMIT", 8)
    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    for value in range(12):
        env.run(f"x = {value}")
        push(tmp_path / "a")
    staged = tmp_path / "a" / "remote.git" / "objects"
    loose = [p for p in staged.glob("??/*")]
    assert len(loose) < 8 + 8  # packed at least once (a push adds ~6)
    assert len(list(staged.glob("pack/*.pack"))) == 1
    env.run("x = 'after'")
    push(tmp_path / "a")  # what the next push needs was kept
    env.close()
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    with CoreEnv(tmp_path / "b") as b:
        assert b.ns["x"] == "after"
    assert verify(str(tmp_path / "b")).ok


def test_a_rolled_back_op_pushed_elsewhere_still_refuses_the_other_chain(
        tmp_path: Path) -> None:
    """The history did not move (a rolled-back op writes no snapshot), the chain did."""
    from core_support import abort

    url = tmp_path / "remote.git"
    env = workspace_with_remote(tmp_path / "a", url)
    env.run("x = 1")
    push(tmp_path / "a")
    clone(str(url), tmp_path / "b", trust=signers_of(url))
    abort(env, "x = 2\nraise ValueError('no')")
    push(tmp_path / "a")
    env.close()
    b = CoreEnv(tmp_path / "b")
    b.run("y = 1")
    with pytest.raises(RemoteDiverged, match="audit chain") as refused:
        push(tmp_path / "b")
    assert RemoteConfig.load(tmp_path / "a").id in refused.value.writer
    b.close()
