"""A workspace moves through a git remote: real kernels, the real ``kernos`` CLI, bare repos.

* a kernel's workspace (plain values, a cell-defined class, a numpy array and
  an agent's LLM call through litellm's ``mock_response``) is pushed while the
  kernel runs, cloned elsewhere, verified there with ``kernos audit verify``,
  and a kernel on the clone holds the same values, digest for digest;
* two clones of one remote both commit: the second push is refused (exit 3)
  naming the first writer, and neither side loses anything;
* ``kill -9`` after a commit: the op still reaches the remote (the push reads
  the commit tail the dead kernel left), and after a restart nothing is lost;
* ``KERNOS_REMOTE``: a kernel materializes its workspace from the remote,
  takes the lease (a second kernel elsewhere is refused, naming the first) and
  pushes its commits with a bounded lag.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cli_support import kernos, ok
from remote_support import signers_of, trust_flags

if TYPE_CHECKING:
    from conftest import Kernel

DIGESTS = ("import hashlib, pickle\n"
           "print(repr({n: hashlib.sha256(pickle.dumps(v)).hexdigest() for n, v in "
           "sorted(globals().items()) if n in ('x', 'table', 'grid', 'point_sum')}))")


def remote_ref(url: Path, ref: str = "refs/heads/main") -> str | None:
    if not (url / "HEAD").exists():
        return None
    out = subprocess.run(["git", "--git-dir", str(url), "for-each-ref",
                          "--format=%(objectname)", ref], capture_output=True, text=True,
                         check=True).stdout.strip()
    return out or None


def head(workspace: Path) -> str:
    return json.loads(ok(kernos("log", "-n", "1", "--json", "-w", str(workspace))))[
        "snapshots"][0]["commit"]


def committed(kernel: Kernel, code: str) -> None:
    result = kernel.run(code)
    assert result.committed, (result.kernos, result.errors)


def test_a_pushed_workspace_clones_verifies_and_restores_hash_for_hash(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    source, url, copy = tmp_path / "source", tmp_path / "remote.git", tmp_path / "copy"
    kernel = kernel_factory(source)
    here = kernel.run("import kernos; print(kernos.__file__)").stdout.strip()
    assert here == str(Path(__file__).parents[2] / "kernel/kernos/__init__.py")
    committed(kernel, "x = 41\ntable = {'k': [1, 2, 3]}")
    committed(kernel, "import numpy as np\ngrid = np.arange(12.0).reshape(3, 4)")
    committed(kernel, "class Point:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
                      "p = Point(1, 2)\npoint_sum = p.a + p.b")
    committed(kernel, "agents.add('alice')\nagents.grant('alice', 'llm:gpt-4o-mini', 1000)")
    committed(kernel, "agents.run('alice', \"a = llm('gpt-4o-mini', [{'role': 'user', "
                      "'content': 'colour of the sea?'}], max_tokens=20, "
                      "mock_response='Blue.')\\nanswer = a['content']\")")
    committed(kernel, "x += 1")
    digests = _digests(kernel)  # a cell too (it imports): before the push
    ok(kernos("remote", "add", "origin", str(url), "-w", str(source)))
    ok(kernos("push", "-w", str(source)))  # beside the running kernel
    assert remote_ref(url) == head(source)
    kernel.stop()

    ok(kernos("clone", str(url), str(copy), *trust_flags(url)))
    verified = kernos("audit", "verify", "-w", str(copy))
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified
    assert head(copy) == head(source)
    for name in ("audit/chain.jsonl", "llm/calls.jsonl"):
        assert (copy / name).read_bytes() == (source / name).read_bytes()
    assert sorted(p.name for p in (copy / "llm" / "recordings").iterdir()) == \
        sorted(p.name for p in (source / "llm" / "recordings").iterdir())
    objects = [json.loads(ok(kernos("objects", "--json", "-w", str(w)))) for w in (source, copy)]
    assert objects[0] == objects[1]

    again = kernel_factory(copy)
    assert _digests(again) == digests
    assert again.value("x") == 42 and again.value("p.a + p.b") == 3
    assert again.value("agents.namespace('alice')['answer']") == "Blue."
    committed(again, "x += 1")  # the clone is a workspace of its own, and moves on


def _digests(kernel: Kernel) -> dict[str, str]:
    result = kernel.run(DIGESTS)
    assert result.status == "ok", result.errors
    found: dict[str, str] = eval(result.stdout.strip())  # a dict of str: a literal
    assert set(found) == {"x", "table", "grid", "point_sum"}
    return found


def test_two_clones_commit_and_the_second_push_is_refused_naming_the_first(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    url = tmp_path / "remote.git"
    first = kernel_factory(tmp_path / "seed")
    committed(first, "x = 1")
    first.stop()
    ok(kernos("remote", "add", "origin", str(url), "-w", str(tmp_path / "seed")))
    ok(kernos("push", "-w", str(tmp_path / "seed")))
    ok(kernos("clone", str(url), str(tmp_path / "a"), *trust_flags(url)))
    ok(kernos("clone", str(url), str(tmp_path / "b"), *trust_flags(url)))
    a, b = kernel_factory(tmp_path / "a"), kernel_factory(tmp_path / "b")
    committed(a, "x = 'written on a'")
    committed(b, "x = 'written on b'")
    ok(kernos("push", "-w", str(tmp_path / "a")))
    pushed = remote_ref(url)
    refused = kernos("push", "-w", str(tmp_path / "b"), "--json")
    assert refused.returncode == 3, refused
    a_id = json.loads((tmp_path / "a" / "remotes.json").read_text())["id"]
    line = refused.stderr.strip()
    assert line.startswith("kernos push: Refused: pushing would fork the history"), line
    assert a_id in line and "kernos fork" in line
    assert json.loads(refused.stdout)["error"]["kind"] == "remote_diverged"
    assert remote_ref(url) == pushed  # the remote kept a's op
    assert a.value("x") == "written on a" and b.value("x") == "written on b"
    b.stop()
    assert kernos("pull", "-w", str(tmp_path / "b")).returncode == 3  # both moved: no pull
    assert kernos("audit", "verify", "-w", str(tmp_path / "b")).returncode == 0


def test_an_op_committed_before_kill9_still_reaches_the_remote(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace, url = tmp_path / "ws", tmp_path / "remote.git"
    kernel = kernel_factory(workspace)
    committed(kernel, "x = 1")
    ok(kernos("remote", "add", "origin", str(url), "-w", str(workspace)))
    ok(kernos("push", "-w", str(workspace)))
    committed(kernel, "x = 2")
    kernel.kill9()
    assert (workspace / "tail").stat().st_size > 0, "the op under test must be in the tail"
    ok(kernos("push", "-w", str(workspace)))  # from disk: the tail the kernel left
    ok(kernos("clone", str(url), str(tmp_path / "copy"), *trust_flags(url)))
    assert kernel_factory(tmp_path / "copy").value("x") == 2
    restarted = kernel_factory(workspace)
    assert restarted.value("x") == 2
    restarted.stop()
    ok(kernos("push", "-w", str(workspace)))  # the restart folded the tail: same head
    assert remote_ref(url) == head(workspace) == head(tmp_path / "copy")


@pytest.mark.parametrize("lease", [True])
def test_a_kernel_with_kernos_remote_materializes_leases_and_pushes(
        kernel_factory: Callable[..., Kernel], tmp_path: Path, lease: bool) -> None:
    url = tmp_path / "remote.git"
    seed = kernel_factory(tmp_path / "seed")
    committed(seed, "x = 1")
    seed.stop()
    ok(kernos("remote", "add", "origin", str(url), "-w", str(tmp_path / "seed")))
    ok(kernos("push", "-w", str(tmp_path / "seed")))
    env = {"KERNOS_REMOTE": f"origin={url}", "KERNOS_REMOTE_LEASE": "1" if lease else "0",
           "KERNOS_REMOTE_INTERVAL_MS": "50",
           "KERNOS_TRUST": ",".join(signers_of(url))}  # the operator pins the seed's writer
    machine_a = kernel_factory(tmp_path / "machine-a", env)  # materialized from the remote
    assert machine_a.value("x") == 1
    assert remote_ref(url, "refs/kernos/lease") is not None
    machine_b = kernel_factory(tmp_path / "machine-b", env)
    refused = machine_b.run("x")
    assert refused.status == "error"
    a_id = json.loads((tmp_path / "machine-a" / "remotes.json").read_text())["id"]
    message = " ".join(e["evalue"] for e in refused.errors)
    assert "leased to" in message and a_id in message, message
    committed(machine_a, "x = 2")
    expected = head(tmp_path / "machine-a")
    deadline = time.monotonic() + 60
    while remote_ref(url) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert remote_ref(url) == expected  # pushed by the kernel, no command typed
    committed(machine_a, "x = 3")
    machine_a.manager.shutdown_kernel(now=False)  # clean: a final push, the lease goes back
    assert remote_ref(url) == head(tmp_path / "machine-a")
    assert remote_ref(url, "refs/kernos/lease") is None


def test_the_remote_commands_list_remove_release_and_fail_clearly(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace, url = tmp_path / "ws", tmp_path / "remote.git"
    kernel = kernel_factory(workspace)
    committed(kernel, "x = 1")
    kernel.stop()
    w = ("-w", str(workspace))
    ok(kernos("remote", "add", "origin", str(url), "--lease", *w))
    again = kernos("remote", "add", "origin", str(url), *w)
    assert again.returncode == 2 and "exists already" in again.stderr
    listed = json.loads(ok(kernos("remote", "list", "--json", *w)))
    assert listed["remotes"] == [{"name": "origin", "url": str(url), "lease": True}]
    unknown = kernos("push", "elsewhere", *w)
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("kernos push: this workspace has no remote 'elsewhere'")
    ok(kernos("push", *w))
    ok(kernos("clone", str(url), str(tmp_path / "other"), *trust_flags(url)))
    env = {"KERNOS_REMOTE": "origin", "KERNOS_REMOTE_LEASE": "1"}
    holder = kernel_factory(tmp_path / "other", env)  # the other copy holds the lease
    assert holder.value("x") == 1
    refused = kernos("push", *w)
    assert refused.returncode == 3 and "is leased to" in refused.stderr, refused
    assert kernos("remote", "release", "origin", *w).returncode == 3
    released = json.loads(ok(kernos("remote", "release", "origin", "--force", "--json", *w)))
    other_id = json.loads((tmp_path / "other" / "remotes.json").read_text())["id"]
    assert released["released"]["workspace"] == other_id
    ok(kernos("remote", "remove", "origin", *w))
    assert json.loads(ok(kernos("remote", "list", "--json", *w)))["remotes"] == []
    clone_again = kernos("clone", str(url), str(workspace), *trust_flags(url))
    assert clone_again.returncode == 2 and "not empty" in clone_again.stderr


def test_a_kernel_killed_before_its_push_pushes_the_op_when_it_comes_back(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    workspace, url = tmp_path / "ws", tmp_path / "remote.git"
    # A long interval: the pusher pushes at start, then not before the kill.
    env = {"KERNOS_REMOTE": f"origin={url}", "KERNOS_REMOTE_LEASE": "1",
           "KERNOS_REMOTE_INTERVAL_MS": "600000"}
    kernel = kernel_factory(workspace, env)
    committed(kernel, "x = 1")
    committed(kernel, "x = 2")
    acknowledged = head(workspace)
    kernel.kill9()
    assert remote_ref(url) != acknowledged  # the op under test had not been pushed
    back = kernel_factory(workspace, env)  # its own lease (same workspace id) is renewed
    assert back.value("x") == 2
    deadline = time.monotonic() + 60
    while remote_ref(url) != acknowledged and time.monotonic() < deadline:
        time.sleep(0.05)
    assert remote_ref(url) == acknowledged
    ok(kernos("clone", str(url), str(tmp_path / "copy"), *trust_flags(url)))
    assert kernos("audit", "verify", "-w", str(tmp_path / "copy")).returncode == 0


def test_a_pruned_workspace_pushes_and_an_old_copy_pulls_through_the_cli(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    """kernos push, kernos prune, kernos push again (over the prune), then a clone and an
    old copy's pull both verify and hold the same names as the source."""
    source, url = tmp_path / "source", tmp_path / "remote.git"
    kernel = kernel_factory(source)
    for value in range(1, 5):
        committed(kernel, f"x = {value}\ntable = {{'k': list(range({value}))}}")
    kernel.stop()
    w = ("-w", str(source))
    ok(kernos("remote", "add", "origin", str(url), *w))
    ok(kernos("push", *w))
    pushed = remote_ref(url)
    ok(kernos("clone", str(url), str(tmp_path / "old"), *trust_flags(url)))
    pruned = json.loads(ok(kernos("prune", "--keep-last", "2", "--json", *w)))
    assert pruned["pruned"] and pruned["head"]["to"] != pushed
    result = json.loads(ok(kernos("push", "--json", *w)))
    assert result["prunes"] == [pruned["record"]] and result["before"] == pushed
    assert remote_ref(url) == head(source) == result["head"]

    ok(kernos("clone", str(url), str(tmp_path / "fresh"), *trust_flags(url)))
    pulled = json.loads(ok(kernos("pull", "--json", "-w", str(tmp_path / "old"))))
    renamed = [kept for kept in pruned["kept"] if kept["new_commit"] != kept["commit"]]
    assert renamed  # the old copy had those under their old ids: they go too
    assert pulled["prunes"] == [pruned["record"]]
    assert pulled["dropped"] == len(pruned["pruned"]) + len(renamed)
    objects = json.loads(ok(kernos("objects", "--json", *w)))
    for copy in (tmp_path / "fresh", tmp_path / "old"):
        verified = kernos("audit", "verify", "-w", str(copy))
        assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified
        assert head(copy) == head(source)
        assert json.loads(ok(kernos("objects", "--json", "-w", str(copy)))) == objects
    again = kernel_factory(tmp_path / "old")
    assert again.value("x") == 4 and again.value("table") == {"k": [0, 1, 2, 3]}
