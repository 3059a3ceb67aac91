"""A remote is untrusted input: every refused pull leaves the workspace byte for byte as it was.

Real workspaces, the real ``kernos`` CLI in processes of its own, a bare remote that an
attacker edits with plain git (``remotes.py``).  Each numbered defect of issue 32 has its
test here, each red before its fix:

1. a refused pull moved the local branch (and a 64 MiB non-JSON line crashed the pull);
2. a record that hashes to itself but does not link was accepted;
3. a commit with no audit record was accepted;
4. a forged prune record deleted local history;
5. files Kernos never pushes were written locally.

Then what a remote may not do either: records signed by a key this workspace does not
trust, unsigned records, malformed and oversized segments, a ref moving during the pull, a
``kill -9`` at each step of a pull, a clone that would run the remote's code, and a copy of
a workspace made by hand acting as the original writer.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from core_support import CoreEnv
from kernos import Image, Workspace
from kernos.audit import log as log_module
from kernos.audit import verify
from kernos.audit.canonical import canonical
from kernos.audit.signing import key_id
from kernos.errors import WorkspaceUntrusted
from security.remotes import Scene, cli, fingerprint, ok, run_ops, sealed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def behind(tmp_path_factory: pytest.TempPathFactory) -> Scene:
    """One scene for the refusals: B one push behind A.  Each refusal leaves B as it was
    (the tests check it, file for file), and the remote is put back after each test."""
    return Scene(tmp_path_factory.mktemp("behind"))


@pytest.fixture(scope="module")
def level(tmp_path_factory: pytest.TempPathFactory) -> Scene:
    """The same, B up to date with A (for forged prunes of everything B has)."""
    made = Scene(tmp_path_factory.mktemp("level"))
    ok(made.pull_b())
    return made


@pytest.fixture
def scene(behind: Scene) -> Iterator[Scene]:
    with behind.restored():
        yield behind


@pytest.fixture
def synced(level: Scene) -> Iterator[Scene]:
    with level.restored():
        yield level


@pytest.fixture
def fresh(tmp_path: Path) -> Scene:
    """A scene of its own, for tests whose pull lands (or that change B)."""
    return Scene(tmp_path)


def a_secret(workspace: Path) -> Ed25519PrivateKey:
    """The signing key of ``workspace`` (an attacker who stole it, for the tests that need
    one)."""
    secret = json.loads((workspace / "identity.json").read_text())["secret"]
    return Ed25519PrivateKey.from_private_bytes(base64.urlsafe_b64decode(secret + "="))


def refused(scene: Scene | Path, result: subprocess.CompletedProcess[str],
            before: dict[str, str], *needles: str, code: int = 2) -> None:
    """The pull exited ``code`` with one line naming what was wrong, and B is as it was."""
    b = scene if isinstance(scene, Path) else scene.b
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("kernos pull: "), line
    assert "bug in Kernos" not in line
    for needle in needles:
        assert needle in line, (needle, line)
    assert fingerprint(b) == before
    assert verify(b).ok


# -- the five defects -----------------------------------------------------------------------


def test_1_a_tampered_record_is_refused_and_the_branch_stays(scene: Scene) -> None:
    before, head = fingerprint(scene.b), scene.head(scene.b)
    chain = scene.attacker.chain()
    chain[-1]["principal"] = "mallory"  # its hash no longer matches
    scene.attacker.set_chain(chain)
    refused(scene, scene.pull_b(), before, f"record {len(chain) - 1}", "hash does not match")
    assert scene.head(scene.b) == head


def test_1_a_64_mib_line_that_is_not_json_is_refused_without_reading_it(scene: Scene) -> None:
    before = fingerprint(scene.b)
    files = scene.attacker.files("refs/kernos/audit")
    last = sorted(path for path in files if path.startswith("chain/"))[-1]
    huge = scene.attacker.blob(files[last]) + b"x" * (64 << 20) + b"\n"
    scene.attacker.rewrite("refs/kernos/audit", {last: huge})
    refused(scene, scene.pull_b(), before, "MiB")


def test_1_a_line_that_is_not_json_is_a_clear_refusal(scene: Scene) -> None:
    before = fingerprint(scene.b)
    chain = scene.attacker.chain()
    scene.attacker.set_chain([canonical(r) + b"\n" for r in chain] + [b"{not json\n"])
    refused(scene, scene.pull_b(), before, f"line {len(chain)}", "not JSON")


def test_2_a_record_that_hashes_to_itself_but_does_not_link_is_refused(scene: Scene) -> None:
    before = fingerprint(scene.b)
    chain = scene.attacker.chain()
    chain[-1] = sealed({**chain[-1], "prev": "0" * 64}, a_secret(scene.a))
    scene.attacker.set_chain(chain)
    refused(scene, scene.pull_b(), before, f"record {len(chain) - 1}", "prev does not match")


def test_3_a_commit_with_no_audit_record_is_refused(scene: Scene) -> None:
    before = fingerprint(scene.b)
    planted = scene.attacker.commit_on_main()
    refused(scene, scene.pull_b(), before, "no audit record", planted[:12])


def test_3_without_new_records_a_commit_on_main_is_still_refused(tmp_path: Path) -> None:
    scene = Scene(tmp_path, more=0)
    before = fingerprint(scene.b)
    planted = scene.attacker.commit_on_main()
    refused(scene, scene.pull_b(), before, "no audit record", planted[:12])


def _forged_prune(scene: Scene, key: Ed25519PrivateKey | None) -> dict[str, Any]:
    """A linked prune record naming every commit of B as pruned and an unrelated root as the
    new head (the root pushed to the remote so it exists there)."""
    chain = scene.attacker.chain()
    commits = scene.attacker.git("rev-list", "refs/heads/main").split()
    tree = scene.attacker.git("rev-parse", "refs/heads/main^{tree}")
    root = scene.attacker.git("commit-tree", tree, "-m", "unrelated",
                              env={"GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x",
                                   "GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x"})
    scene.attacker.git("update-ref", "refs/heads/main", root)
    record = sealed({"v": 1, "at": chain[-1]["at"], "type": "prune",
                     "from": commits[0], "to": root, "pruned": commits[1:],
                     "rewritten": [[commits[0], root]], "tags": {"moved": [], "deleted": []},
                     "policy": {"keep_last": 1}, "kept": 1, "index": len(chain),
                     "prev": chain[-1]["hash"]}, key)
    scene.attacker.set_chain([*chain, record])
    return record


def test_4_a_forged_prune_without_the_writers_key_is_refused(synced: Scene) -> None:
    scene = synced  # B has every commit A pushed
    before = fingerprint(scene.b)
    record = _forged_prune(scene, None)
    refused(scene, scene.pull_b(), before, "unsigned", f"record {record['index']}")
    mallory = Ed25519PrivateKey.generate()
    _forged_prune_again(scene, mallory)
    refused(scene, scene.pull_b(), before, key_id(mallory), "neither owns nor trusts")


def _forged_prune_again(scene: Scene, key: Ed25519PrivateKey) -> None:
    chain = scene.attacker.chain()
    chain[-1] = sealed(chain[-1], key)
    scene.attacker.set_chain(chain)


def test_4_a_prune_signed_by_a_trusted_key_must_still_match_the_history(
        synced: Scene) -> None:
    """Even with the writer's key (stolen, or a writer gone bad), a prune is honoured only if
    it is consistent with the history it rewrites."""
    scene = synced
    before = fingerprint(scene.b)
    _forged_prune(scene, a_secret(scene.a))
    refused(scene, scene.pull_b(), before, "fails the checks a pull makes")
    assert scene.verified(scene.b)


@pytest.mark.parametrize("path", ["keys/c-1.key", "chain/00000/00000000.jsonl.bak",
                                  "payloads/zz/" + "ab" * 32, "settings.json",
                                  "payloads/ab/" + "ab" * 32 + "/x"])
def test_5_a_path_kernos_never_pushes_refuses_the_pull(scene: Scene, path: str) -> None:
    before = fingerprint(scene.b)
    scene.attacker.rewrite("refs/kernos/audit", {path: b"planted"})
    refused(scene, scene.pull_b(), before, "never pushes")
    assert not (scene.b / "audit" / "keys").exists()


def test_5_a_payload_must_hash_to_its_name_and_be_a_plain_file(scene: Scene) -> None:
    before = fingerprint(scene.b)
    name = "ab" * 32
    scene.attacker.rewrite("refs/kernos/audit", {f"payloads/ab/{name}": b"not its content"})
    refused(scene, scene.pull_b(), before, "does not hash to its name")
    data = b"a payload"
    import hashlib

    named = hashlib.sha256(data).hexdigest()
    scene.attacker.rewrite("refs/kernos/audit", {f"payloads/ab/{name}": None})
    scene.attacker.rewrite("refs/kernos/audit", {f"payloads/{named[:2]}/{named}": data},
                           mode="120000")
    refused(scene, scene.pull_b(), before, "plain file")


def test_5_a_planted_llm_recording_is_refused(scene: Scene) -> None:
    before = fingerprint(scene.b)
    scene.attacker.rewrite("refs/kernos/llm", {f"recordings/ab/{'ab' * 32}": b"a forged answer"})
    refused(scene, scene.pull_b(), before, "recordings/ab/")


# -- trust -----------------------------------------------------------------------------------


def test_records_of_a_writer_not_trusted_are_refused_until_the_human_trusts_it(
        tmp_path: Path) -> None:
    scene = Scene(tmp_path, more=0)
    c = tmp_path / "c"
    ok(cli("clone", str(scene.remote), str(c), f"--trust={scene.a_key}"))
    run_ops(c, "x = 'from c'")
    ok(cli("push", "-w", str(c)))
    before = fingerprint(scene.b)
    c_key = Scene.key(c)
    refused(scene, scene.pull_b(), before, c_key, "neither owns nor trusts",
            f"kernos remote trust {c_key}")
    trusted = json.loads(ok(cli("remote", "trust", c_key, "--json", "-w", str(scene.b))))
    assert trusted["changed"] == [c_key]
    ok(scene.pull_b())
    assert scene.verified(scene.b)
    shown = ok(cli("audit", "verify", "-w", str(scene.b)))
    assert f"signed by {c_key}" in shown and "NOT TRUSTED" not in shown


def test_a_record_signed_by_a_key_nobody_trusts_is_refused(scene: Scene) -> None:
    before = fingerprint(scene.b)
    mallory = Ed25519PrivateKey.generate()
    chain = scene.attacker.chain()
    failed = sealed({"v": 1, "at": chain[-1]["at"], "type": "op", "op": 999,
                     "kind": "cell", "principal": "human", "status": "rolled back",
                     "error": "x", "code": {"sha256": "0" * 64, "text": ""},
                     "grants": {"used": [], "denied": []}, "changes": [], "events": [],
                     "effects": [], "commit": None, "started_at": chain[-1]["at"],
                     "finished_at": chain[-1]["at"], "index": len(chain),
                     "prev": chain[-1]["hash"]}, mallory)
    scene.attacker.set_chain([*chain, failed])
    refused(scene, scene.pull_b(), before, key_id(mallory), f"record {len(chain)}")


def test_a_clone_of_an_untrusted_remote_restores_and_runs_nothing(tmp_path: Path) -> None:
    """The remote's writer put a value whose unpickling runs a command; a clone without
    trust must not run it, and says how to trust."""
    mark = tmp_path / "PWNED"
    evil = tmp_path / "evil"
    run_ops(evil, "import os\nclass Evil:\n    def __reduce__(self):\n"
                  f"        return (os.system, ('touch {mark}',))\n"
                  "e = Evil()")
    # The writer's own commit tried loading it in a child (kernos.serialize.trial), as its
    # own restore would: that ran the command on the writer's side.  The victim must not.
    mark.unlink(missing_ok=True)
    remote = tmp_path / "remote.git"
    ok(cli("remote", "add", "origin", str(remote), "-w", str(evil)))
    ok(cli("push", "-w", str(evil)))
    victim = tmp_path / "victim"
    cloned = json.loads(ok(cli("clone", str(remote), str(victim), "--json")))
    evil_key = Scene.key(evil)
    assert cloned["untrusted"] == [evil_key]
    assert cli("audit", "verify", "-w", str(victim)).returncode == 0  # readable, checkable
    assert cli("log", "-w", str(victim)).returncode == 0
    w = ("-w", str(victim))
    for command in (["run", "x = 1", *w], ["replay", *w],
                    ["fork", str(victim), str(tmp_path / "fork")]):
        done = cli(*command, timeout=120)
        assert done.returncode != 0, (command, done.stdout, done.stderr)
        assert "does not trust" in done.stderr and evil_key in done.stderr, done.stderr
    assert not mark.exists()
    pulled = cli("pull", "-w", str(victim))
    assert pulled.returncode == 2 and "not trusted yet" in pulled.stderr
    assert not mark.exists()


def test_a_clone_trusting_the_wrong_key_is_left_untrusted(tmp_path: Path) -> None:
    scene = Scene(tmp_path, more=0)
    other = key_id(Ed25519PrivateKey.generate())
    copy = tmp_path / "copy"
    cloned = json.loads(ok(cli("clone", str(scene.remote), str(copy), f"--trust={other}",
                               "--json")))
    assert cloned["untrusted"] == [scene.a_key]
    ok(cli("remote", "trust", scene.a_key, "-w", str(copy)))
    listed = json.loads(ok(cli("remote", "trust", "--json", "-w", str(copy))))
    assert listed["untrusted"] is None
    assert {entry["key"] for entry in listed["trusted"]} >= {scene.a_key, other}


def test_a_bad_key_id_is_a_usage_error(scene: Scene) -> None:
    done = cli("remote", "trust", "ed25519:short", "-w", str(scene.b))
    assert done.returncode == 2 and "is not a writer key id" in done.stderr
    done = cli("clone", str(scene.remote), str(scene.root / "x"), "--trust=nope")
    assert done.returncode == 2 and "is not a writer key id" in done.stderr
    assert not (scene.root / "x").exists()


def test_an_older_kernos_unsigned_records_need_the_humans_word(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer from before signing: its records travel unsigned.  A clone of them restores
    nothing, and a pull takes none of them, until the human accepts them; once the writer
    upgrades, its records are signed by its key, which must be trusted like any other."""
    a, remote, b = tmp_path / "a", tmp_path / "remote.git", tmp_path / "b"
    with monkeypatch.context() as older:
        older.setattr(log_module, "sign", lambda body, key: dict(body))
        run_ops(a, "x = 1", "y = 2")
    ok(cli("remote", "add", "origin", str(remote), "-w", str(a)))
    ok(cli("push", "-w", str(a)))
    cloned = json.loads(ok(cli("clone", str(remote), str(b), "--json")))
    assert cloned["untrusted"] == [] and cloned["unsigned_pending"] == cloned["records"] > 0
    with Workspace.open(b) as opened, pytest.raises(WorkspaceUntrusted,
                                                    match="accept-unsigned"):
        Image(opened, {})
    ok(cli("remote", "trust", "--accept-unsigned", "-w", str(b)))
    env = CoreEnv(b)
    assert env.ns["y"] == 2
    env.close()
    with monkeypatch.context() as older:
        older.setattr(log_module, "sign", lambda body, key: dict(body))
        run_ops(a, "x = 3")
    ok(cli("push", "-w", str(a)))
    before = fingerprint(b)
    result = cli("pull", "-w", str(b))
    refused(b, result, before, "unsigned", "--accept-unsigned")
    ok(cli("pull", "--accept-unsigned", "-w", str(b)))
    shown = ok(cli("audit", "verify", "-w", str(b)))
    assert "unsigned:" in shown and "from before signing" in shown
    run_ops(a, "x = 4")  # upgraded: signed from now on
    ok(cli("push", "-w", str(a)))
    a_key = Scene.key(a)
    before = fingerprint(b)
    refused(b, cli("pull", "-w", str(b)), before, a_key)
    ok(cli("remote", "trust", a_key, "-w", str(b)))
    ok(cli("pull", "-w", str(b)))
    assert cli("audit", "verify", "-w", str(b)).returncode == 0
    env = CoreEnv(b)
    assert env.ns["x"] == 4
    env.close()


# -- malformed and oversized ---------------------------------------------------------------


def test_a_segment_gap_is_refused(scene: Scene) -> None:
    before = fingerprint(scene.b)
    chain = scene.attacker.chain()
    files = scene.attacker.files("refs/kernos/audit")
    segment = sorted(path for path in files if path.startswith("chain/"))[-1]
    scene.attacker.rewrite("refs/kernos/audit", {
        segment: None, "chain/00000/00000002.jsonl": canonical(chain[-1]) + b"\n"})
    refused(scene, scene.pull_b(), before, "segment")


def test_an_overfull_segment_is_refused(scene: Scene) -> None:
    before = fingerprint(scene.b)
    chain = scene.attacker.chain()
    lines = [canonical(r) + b"\n" for r in chain]
    scene.attacker.rewrite("refs/kernos/audit", {
        "chain/00000/00000000.jsonl": b"".join(lines + lines[-1:] * 64)})
    refused(scene, scene.pull_b(), before, "lines")


def test_a_json_value_that_is_not_an_object_is_refused(scene: Scene) -> None:
    before = fingerprint(scene.b)
    chain = scene.attacker.chain()
    scene.attacker.set_chain([canonical(r) + b"\n" for r in chain] + [b"[1, 2]\n"])
    refused(scene, scene.pull_b(), before, "not a JSON object")


def test_a_malformed_ledger_line_is_refused(scene: Scene) -> None:
    before = fingerprint(scene.b)
    scene.attacker.rewrite("refs/kernos/llm", {"calls/00000/00000000.jsonl": b"nope\n"})
    refused(scene, scene.pull_b(), before, "LLM ledger")


# -- races and crashes -------------------------------------------------------------------


def test_a_push_during_a_pull_leaves_a_consistent_workspace(fresh: Scene) -> None:
    """The remote moves while the pull checks what it fetched: the pull lands the state it
    fetched (one reading of the remote's refs), whole, and the next pull the rest."""
    scene = fresh
    fetched = scene.attacker.ref("refs/heads/main")
    pulling = subprocess.Popen(
        [*_kernos(), "pull", "-w", str(scene.b)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "KERNOS_PAUSE_AT": "pull.fetched:4"})
    time.sleep(1.5)
    run_ops(scene.a, "x = 'while b pulled'")
    ok(cli("push", "-w", str(scene.a)))
    moved = scene.attacker.ref("refs/heads/main")
    out, err = pulling.communicate(timeout=120)
    assert pulling.returncode == 0, (out, err)
    assert scene.verified(scene.b)
    assert scene.head(scene.b) in (fetched, moved)
    ok(scene.pull_b())
    assert scene.head(scene.b) == moved and scene.verified(scene.b)


def _kernos() -> list[str]:
    import sys

    script = Path(sys.executable).with_name("kernos")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kernos.cli"]


POINTS = ["pull.fetched", "pull.checked", "pull.staged", "pull.intent", "pull.objects",
          "pull.files", "pull.chain", "pull.ledger", "pull.ref", "pull.dropped"]


@pytest.mark.parametrize("point", POINTS)
def test_a_pull_killed_at_each_step_is_all_or_nothing(fresh: Scene, point: str) -> None:
    """``kill -9`` at ``point``: B is as it was or as the pull leaves it, never between;
    the next writable command (a pull) finds out which and finishes."""
    scene = fresh
    before = fingerprint(scene.b)
    old, new = scene.head(scene.b), scene.attacker.ref("refs/heads/main")
    killed = scene.pull_b(env={"KERNOS_CRASH_AT": point})
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    landed = point not in ("pull.fetched", "pull.checked", "pull.staged")
    after_crash = {path: digest for path, digest in fingerprint(scene.b).items()
                   if not path.startswith("incoming/")}
    if not landed:
        assert after_crash == before  # only incoming/, which the next open deletes
    assert scene.head(scene.b) in (old, new)
    again = json.loads(ok(cli("pull", "--json", "-w", str(scene.b))))
    assert again["head"] == new and scene.head(scene.b) == new
    assert scene.verified(scene.b)
    assert not (scene.b / "pulling").exists() and not (scene.b / "incoming").exists()


def test_a_crash_after_the_commit_point_is_finished_by_the_next_kernel_open(
        fresh: Scene) -> None:
    scene = fresh
    new = scene.attacker.ref("refs/heads/main")
    assert scene.pull_b(env={"KERNOS_CRASH_AT": "pull.chain"}).returncode == -9
    env = CoreEnv(scene.b)  # a writable open, as a kernel's
    try:
        assert env.workspace is not None
        assert "finished a pull" in (env.workspace.recovery_note or "")
        assert env.ns["x"] == 3
    finally:
        env.close()
    assert scene.head(scene.b) == new and scene.verified(scene.b)


# -- a copy made by hand ----------------------------------------------------------------------


def test_a_copy_made_by_hand_is_a_writer_of_its_own(fresh: Scene) -> None:
    scene = fresh
    copy = scene.root / "a-copy"
    subprocess.run(["cp", "-a", str(scene.a), str(copy)], check=True)
    listed = json.loads(ok(cli("remote", "trust", "--json", "-w", str(copy))))
    assert listed["key"] != scene.a_key
    assert any(e["key"] == scene.a_key and e["how"] == "own" for e in listed["trusted"])
    a_id = json.loads(ok(cli("remote", "list", "--json", "-w", str(scene.a))))["id"]
    copy_id = json.loads(ok(cli("remote", "list", "--json", "-w", str(copy))))["id"]
    assert copy_id != a_id
    secret = json.loads((scene.a / "identity.json").read_text())["secret"]
    assert secret not in (copy / "identity.json").read_text()  # the copied key is gone
    from kernos.remote.lease import acquire_lease

    lease = acquire_lease(scene.a, "origin", ttl=60)
    try:
        pushed = cli("push", "-w", str(copy))
        assert pushed.returncode == 3 and "leased to" in pushed.stderr and a_id in \
            pushed.stderr, pushed.stderr
    finally:
        lease.release()


def _clone_on_a_terminal(url: Path, into: Path, answer: bytes) -> tuple[int, str]:
    """``kernos clone`` on a pseudo-terminal, answering its question with ``answer``."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: the real CLI, on the terminal
        os.execv(_kernos()[0], [*_kernos(), "clone", str(url), str(into)])
    seen = b""
    answered = False
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal closed: the child is done
            break
        if not chunk:
            break
        seen += chunk
        if not answered and b"Trust them? [y/N]" in seen:
            os.write(fd, answer)
            answered = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), seen.decode(errors="replace")


@pytest.mark.parametrize("answer", [b"y\n", b"\n"])
def test_a_clone_on_a_terminal_shows_the_signers_and_asks(tmp_path: Path,
                                                          answer: bytes) -> None:
    scene = Scene(tmp_path, more=0)
    copy = tmp_path / "copy"
    code, shown = _clone_on_a_terminal(scene.remote, copy, answer)
    assert code == 0, shown
    assert scene.a_key in shown and "Restoring a snapshot runs code" in shown
    listed = json.loads(ok(cli("remote", "trust", "--json", "-w", str(copy))))
    if answer.strip() == b"y":
        assert listed["untrusted"] is None
        assert any(e["key"] == scene.a_key and e["how"] == "clone" for e in listed["trusted"])
    else:  # the default is no: nothing trusted, nothing restored
        assert listed["untrusted"]["signers"] == [scene.a_key]
        assert "Not trusted yet" in shown
