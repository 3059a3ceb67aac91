"""``kernos fork`` (``kernos.fork``): shared objects, any ref, the tail, the origin, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from audit_support import chain_lines, resealed, write_chain_lines
from core_support import CoreEnv
from kernos.audit import verify
from kernos.errors import UnknownRef, UsageError, WorkspaceError, WorkspaceFormatError
from kernos.fork import fork, split_source
from kernos.prune import prune
from kernos.store.maintenance import gc
from kernos.store.retention import Policy
from kernos.store.workspace import Workspace


def _values(env: CoreEnv) -> dict[str, object]:
    return {name: value for name, value in env.ns.items()
            if not name.startswith("__") and name != "bus"}


def _source(path: Path, ops: int = 4) -> CoreEnv:
    env = CoreEnv(path)
    for number in range(ops):
        env.run(f"x = {number}\nrows{number} = list(range({number}))")
    return env


def _restored(path: Path) -> dict[str, object]:
    env = CoreEnv(path)
    try:
        return _values(env)
    finally:
        env.close()


def _packs(workspace: Path) -> dict[str, os.stat_result]:
    return {pack.name: pack.stat()
            for pack in (workspace / "history.git" / "objects" / "pack").glob("pack-*.pack")}


def test_objects_are_shared_by_hard_link_not_copied(tmp_path: Path) -> None:
    _source(tmp_path / "src").close()  # closing folds the tail into packs
    made = fork(tmp_path / "src", tmp_path / "dst")
    source, dest = _packs(tmp_path / "src"), _packs(tmp_path / "dst")
    assert source and set(source) <= set(dest)
    for name, stat in source.items():
        assert dest[name].st_ino == stat.st_ino, name  # one file, two names
    assert made.linked >= 2 * len(source) and made.copied == 0
    assert not (tmp_path / "dst" / "history.git" / "objects" / "info" / "alternates").exists()


def test_a_fork_at_an_old_ref_restores_it_and_goes_its_own_way(tmp_path: Path) -> None:
    _source(tmp_path / "src").close()
    made = fork(tmp_path / "src", tmp_path / "dst", "@2")
    assert made.op == 2
    assert _restored(tmp_path / "dst") == {"x": 1, "rows0": [], "rows1": [0]}
    with Workspace.open(tmp_path / "dst", writable=False) as dst:
        assert dst.head() is not None and dst.head().hex() == made.commit
    # Both take new ops independently.
    src, dst_env = CoreEnv(tmp_path / "src"), CoreEnv(tmp_path / "dst")
    try:
        src.run("side = 'source'")
        dst_env.run("side = 'fork'")
    finally:
        src.close()
        dst_env.close()
    assert _restored(tmp_path / "src")["side"] == "source"
    forked = _restored(tmp_path / "dst")
    assert forked["side"] == "fork" and forked["x"] == 1
    for path in ("src", "dst"):
        report = verify(tmp_path / path)
        assert report.ok, report.summary()


def test_a_commit_only_the_tail_holds_is_forked(tmp_path: Path) -> None:
    env = _source(tmp_path / "src")  # open: its commits are frames of the tail, unfolded
    try:
        assert env.workspace is not None and env.workspace.tail.frames
        head = env.workspace.head()
        assert head is not None and env.workspace.git_ref() != head
        made = fork(tmp_path / "src", tmp_path / "dst")  # while a writer holds the lock
        assert made.commit == head.hex() and made.tail_objects > 0
    finally:
        env.close()
    assert _restored(tmp_path / "dst") == {"x": 3, "rows0": [], "rows1": [0], "rows2": [0, 1],
                                           "rows3": [0, 1, 2]}
    fsck = subprocess.run(["git", "--git-dir", str(tmp_path / "dst" / "history.git"), "fsck",
                           "--no-dangling"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr


def test_a_fork_keeps_its_objects_when_the_source_is_pruned_gced_and_deleted(
        tmp_path: Path) -> None:
    _source(tmp_path / "src", ops=6).close()
    fork(tmp_path / "src", tmp_path / "dst", "@2")
    expected = _restored(tmp_path / "dst")
    report = prune(tmp_path / "src", Policy(keep_last=1))  # deletes @2 from the source
    assert report.pruned
    gc(tmp_path / "src")
    with Workspace.open(tmp_path / "src", writable=False) as src, pytest.raises(UnknownRef):
        src.resolve("@2")
    shutil.rmtree(tmp_path / "src")
    assert _restored(tmp_path / "dst") == expected
    verdict = verify(tmp_path / "dst")
    assert verdict.ok, verdict.summary()
    assert verdict.origin is not None and "not there any more" in verdict.origin
    # Another workspace at the source's path is not taken for the source.
    _source(tmp_path / "src", ops=1).close()
    meta = tmp_path / "src" / "workspace.json"  # made within the same second, maybe
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "created_at": "another"}))
    verdict = verify(tmp_path / "dst")
    assert verdict.ok, verdict.summary()
    assert verdict.origin is not None and "now is another one" in verdict.origin


def test_the_genesis_names_the_source_and_is_checked_against_its_chain(
        tmp_path: Path) -> None:
    _source(tmp_path / "src").close()
    made = fork(tmp_path / "src", tmp_path / "dst", "HEAD~1")
    genesis = json.loads(chain_lines(tmp_path / "dst")[0])
    source_last = json.loads(chain_lines(tmp_path / "src")[-1])
    assert genesis["type"] == "genesis" and genesis["hash"] == made.genesis
    assert genesis["adopts"] == made.commit
    origin = genesis["forked_from"]
    assert origin["workspace"] == str(tmp_path / "src")
    assert origin["commit"] == made.commit and origin["op"] == 3
    assert origin["audit"] == {"index": source_last["index"], "hash": source_last["hash"]}
    report = verify(tmp_path / "dst")
    assert report.ok and report.origin is not None and "confirmed" in report.origin
    # A genesis that names another record of the source is found out.
    genesis["forked_from"]["audit"]["hash"] = "0" * 64
    write_chain_lines(tmp_path / "dst", [resealed(genesis)])
    report = verify(tmp_path / "dst")
    assert not report.ok and report.first_bad == 0
    assert "another hash" in report.problems[0].what


def test_keys_are_copied_and_erasure_in_the_source_leaves_the_fork(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "src")
    env.run("from kernos import personal\ncard = personal('4111', subject='c-7')")
    env.close()
    fork(tmp_path / "src", tmp_path / "dst")
    keys = {key.name: key for key in (tmp_path / "src" / "keys").glob("*.key")}
    for name, key in keys.items():
        copy = tmp_path / "dst" / "keys" / name
        assert copy.read_bytes() == key.read_bytes()
        assert copy.stat().st_ino != key.stat().st_ino  # a copy: erasure overwrites in place
    erased = subprocess.run([sys.executable, "-m", "kernos.cli", "erase", "c-7", "-w",
                             str(tmp_path / "src")], capture_output=True, text=True)
    assert erased.returncode == 0, erased.stderr
    assert not list((tmp_path / "src" / "keys").glob("*.key"))
    env = CoreEnv(tmp_path / "dst")
    try:
        assert env.ns["card"].reveal() == "4111"
    finally:
        env.close()


def test_outside_the_history_only_what_a_fork_needs_is_copied(tmp_path: Path) -> None:
    env = _source(tmp_path / "src")
    env.close()
    with Workspace.open(tmp_path / "src") as src:
        src.set_setting("on_error", "keep")
    ledger = tmp_path / "src" / "llm" / "calls.jsonl"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"type": "reserve", "call": 1, "op": 1, "keys": [], "tokens": 3, "cost": "0"},
             {"type": "settle", "call": 1, "tokens": 3, "cost": "0"},
             {"type": "reserve", "call": 2, "op": 4, "keys": [], "tokens": 5, "cost": "0"},
             {"type": "settle", "call": 2, "tokens": 5, "cost": "0"}]
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))
    recording = tmp_path / "src" / "llm" / "recordings" / ("ab" * 32)
    recording.parent.mkdir()
    recording.write_text("cd" * 32)
    fork(tmp_path / "src", tmp_path / "dst", "@2")
    dst = tmp_path / "dst"
    with Workspace.open(dst, writable=False) as opened:
        assert opened.setting("on_error") == "keep"
    kept = [json.loads(line) for line in (dst / "llm" / "calls.jsonl").read_text().splitlines()]
    assert [line["call"] for line in kept] == [1, 1]  # the spending of op 4 is not the fork's
    assert (dst / "llm" / "recordings" / recording.name).read_text() == "cd" * 32
    for absent in ("lock", "tail", "buffers", "pending", "kernel.json"):
        assert not (dst / absent).exists(), absent
    assert not list(tmp_path.glob(".dst.forking-*"))


def test_errors_name_what_is_wrong_and_leave_nothing(tmp_path: Path) -> None:
    _source(tmp_path / "src", ops=2).close()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(WorkspaceError, match="exists and is not empty"):
        fork(tmp_path / "src", busy)
    assert [path.name for path in busy.iterdir()] == ["notes.txt"]
    (tmp_path / "plain").mkdir()
    with pytest.raises(WorkspaceFormatError, match="not a Kernos workspace"):
        fork(tmp_path / "plain", tmp_path / "dst")
    with pytest.raises(UnknownRef):
        fork(tmp_path / "src", tmp_path / "dst", "@99")
    with pytest.raises(UsageError, match="inside its source"):
        fork(tmp_path / "src", tmp_path / "src" / "inner")
    assert not (tmp_path / "dst").exists()
    assert not list(tmp_path.glob(".dst.forking-*"))
    empty = tmp_path / "empty"
    empty.mkdir()
    fork(tmp_path / "src", empty)  # an empty directory is fine
    assert (empty / "workspace.json").exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("ws", ("ws", "HEAD")),
    ("ws@HEAD~2", ("ws", "HEAD~2")),
    ("ws@@3", ("ws", "@3")),
    ("/a@b/ws@1f2e", ("/a@b/ws", "1f2e")),
    ("/a@b/ws", ("/a@b/ws", "HEAD")),
    ("ws@", ("ws", "HEAD")),
])
def test_split_source(text: str, expected: tuple[str, str]) -> None:
    assert split_source(text) == expected


def test_the_cli_forks_and_reports(tmp_path: Path) -> None:
    _source(tmp_path / "src", ops=3).close()
    done = subprocess.run([sys.executable, "-m", "kernos.cli", "fork",
                           f"{tmp_path / 'src'}@@2", str(tmp_path / "dst"), "--json"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["op"] == 2
    again = subprocess.run([sys.executable, "-m", "kernos.cli", "fork", str(tmp_path / "src"),
                            str(tmp_path / "dst")], capture_output=True, text=True)
    assert again.returncode == 2
    assert again.stderr.startswith("kernos fork: ") and "not empty" in again.stderr
