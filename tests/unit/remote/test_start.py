"""A kernel's remote at start (``kernos.remote.start``): the URL template a gateway's
kernelspec gives, the local remote created for a new name, the clear refusal of an ssh or
http remote nobody created, and the catch-up of a workspace that was extended elsewhere.

Real git (bare repositories on disk); the workspaces are driven in process (``CoreEnv``),
and ``start_remote`` gets the environment a kernelspec would give the kernel.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from core_support import CoreEnv
from kernos import Workspace
from kernos.audit import verify
from kernos.errors import RemoteDiverged, RemoteError, RemoteLeaseHeld, UsageError, WorkspaceError
from kernos.remote.start import remote_url, start_remote
from kernos.remote.transfer import RemoteConfig
from remote_support import operator_key


@pytest.fixture(autouse=True)
def _one_deployment(tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The machines of these tests are one deployment: their kernels sign with the
    operator's key, so a machine resuming another's workspace trusts its records."""
    monkeypatch.setenv("KERNOS_SIGNING_KEY",
                       str(operator_key(tmp_path_factory.mktemp("operator"))))


def head_of(path: Path) -> str | None:
    with Workspace.open(path, writable=False) as view:
        head = view.head()
    return head.hex() if head else None


def remote_head(url: Path) -> str | None:
    done = subprocess.run(["git", "--git-dir", str(url), "for-each-ref",
                           "--format=%(objectname)", "refs/heads/main"],
                          check=True, capture_output=True, text=True)
    return done.stdout.strip() or None


def kernel_session(workspace: Path, template: str, **extra: str):  # type: ignore[no-untyped-def]
    environ = {"KERNOS_REMOTE": f"origin={template}", "KERNOS_REMOTE_LEASE": "1", **extra}
    return start_remote(workspace, environ, interval=0.05)


def test_the_template_names_each_workspace_its_own_remote(tmp_path: Path) -> None:
    assert remote_url("/srv/r/{workspace}.git", Path("/w/alpha")) == "/srv/r/alpha.git"
    assert remote_url("file:///srv/r/{workspace}.git", Path("/w/b-2")) == "file:///srv/r/b-2.git"
    assert (remote_url("ssh://git@host/k/{workspace}.git", Path("/w/x"))
            == "ssh://git@host/k/x.git")
    assert remote_url("/srv/one.git", Path("/w/x")) == "/srv/one.git"  # no template: as is
    with pytest.raises(UsageError, match=r"placeholder Kernos does not know.*\{workspace\}"):
        remote_url("/srv/{user}/{workspace}.git", Path("/w/x"))
    with pytest.raises(WorkspaceError, match="cannot name a workspace"):
        remote_url("/srv/r/{workspace}.git", Path("/w/.hidden"))


def test_first_kernels_on_new_names_create_their_remotes_and_push(tmp_path: Path) -> None:
    template = str(tmp_path / "remotes" / "{workspace}.git")
    for name in ("alpha", "beta"):
        workspace = tmp_path / "machine-a" / name
        session = kernel_session(workspace, template)
        assert session is not None and session.lease is not None
        url = tmp_path / "remotes" / f"{name}.git"
        assert (url / "HEAD").exists()  # created (git init --bare) at the kernel's start
        env = CoreEnv(workspace)
        env.run(f"owner = {name!r}")
        env.close()
        session.close()
        assert remote_head(url) == head_of(workspace)
        assert RemoteConfig.load(workspace).url("origin") == str(url)


def test_a_file_url_template_is_created_too(tmp_path: Path) -> None:
    session = kernel_session(tmp_path / "ws", f"file://{tmp_path}/r/{{workspace}}.git")
    assert session is not None
    session.close()
    assert (tmp_path / "r" / "ws.git" / "HEAD").exists()


def test_an_ssh_or_http_remote_nobody_created_refuses_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(RemoteError) as refused:
        kernel_session(tmp_path / "ws", "http://127.0.0.1:9/kernos/{workspace}.git")
    message = str(refused.value)
    assert "http://127.0.0.1:9/kernos/ws.git" in message
    assert "the operator's to create (`git init --bare` on the server)" in message


def test_a_workspace_on_another_machine_resumes_and_an_old_copy_catches_up(
        tmp_path: Path) -> None:
    template = str(tmp_path / "remotes" / "{workspace}.git")
    a, b = tmp_path / "a" / "shared", tmp_path / "b" / "shared"
    session = kernel_session(a, template)
    assert session is not None
    env = CoreEnv(a)
    env.run("x = 1")
    env.close()
    session.close()
    # Machine B: a fresh clone, then it extends the workspace and lets go.
    session = kernel_session(b, template)
    assert session is not None
    env = CoreEnv(b)
    assert env.ns["x"] == 1
    env.run("x += 1")
    env.close()
    session.close()
    # Back on A, whose copy is one op behind: it catches up before the kernel opens it.
    session = kernel_session(a, template)
    assert session is not None
    assert head_of(a) == head_of(b)
    env = CoreEnv(a)
    assert env.ns["x"] == 2
    env.run("x += 1")
    env.close()
    session.close()
    assert remote_head(tmp_path / "remotes" / "shared.git") == head_of(a)
    assert verify(str(a)).ok


def test_a_live_lease_refuses_the_second_machine_and_a_short_ttl_comes_from_the_env(
        tmp_path: Path) -> None:
    template = str(tmp_path / "remotes" / "{workspace}.git")
    holder = kernel_session(tmp_path / "a" / "w", template, KERNOS_REMOTE_LEASE_TTL="600")
    assert holder is not None and holder.lease is not None
    assert holder.lease.ttl == 600
    with pytest.raises(RemoteLeaseHeld, match="kernos remote release origin --force"):
        kernel_session(tmp_path / "b" / "w", template)
    holder.close()
    again = kernel_session(tmp_path / "b" / "w", template)
    assert again is not None
    again.close()


def test_a_copy_that_forked_is_refused_at_start_and_lets_the_lease_go(tmp_path: Path) -> None:
    template = str(tmp_path / "remotes" / "{workspace}.git")
    url = tmp_path / "remotes" / "w.git"
    a, b = tmp_path / "a" / "w", tmp_path / "b" / "w"
    for machine, code in ((a, "x = 'a1'"), (b, "x = 'b1'")):
        session = kernel_session(machine, template)
        assert session is not None
        env = CoreEnv(machine)
        env.run(code)
        env.close()
        session.close()
    # A commits without its kernel's remote (pushes never happen): its copy forks.
    env = CoreEnv(a)
    env.run("x = 'a2'")
    env.close()
    pushed = remote_head(url)
    with pytest.raises(RemoteDiverged, match="pulling would fork the history"):
        kernel_session(a, template)
    assert remote_head(url) == pushed
    lease = subprocess.run(["git", "--git-dir", str(url), "for-each-ref", "refs/kernos/lease"],
                           check=True, capture_output=True, text=True).stdout
    assert lease == ""


def test_a_bad_setting_in_the_kernelspec_env_is_named(tmp_path: Path) -> None:
    for setting in ("KERNOS_REMOTE_LEASE_TTL", "KERNOS_REMOTE_INTERVAL_MS"):
        for bad in ("soon", "0", "-5"):
            with pytest.raises(UsageError, match=f"{setting}='{bad}' is not a positive number"):
                start_remote(tmp_path / "ws", {"KERNOS_REMOTE": "origin=/nowhere/{workspace}",
                                               setting: bad})
    assert not (tmp_path / "ws").exists()  # refused before anything was done


def test_a_machine_refused_before_the_first_push_catches_up_later(tmp_path: Path) -> None:
    """B is refused while the remote is still empty (its copy is born empty); it resumes."""
    template = str(tmp_path / "remotes" / "{workspace}.git")
    a, b = tmp_path / "a" / "w", tmp_path / "b" / "w"
    holder = kernel_session(a, template)
    assert holder is not None
    with pytest.raises(RemoteLeaseHeld):
        kernel_session(b, template)
    env = CoreEnv(a)
    env.run("x = 'from a'")
    env.close()
    holder.close()
    session = kernel_session(b, template)
    assert session is not None
    env = CoreEnv(b)
    assert env.ns["x"] == "from a"
    env.run("x += ' and b'")
    env.close()
    session.close()
    assert head_of(b) == remote_head(tmp_path / "remotes" / "w.git")
    assert verify(str(b)).ok


def test_a_final_push_that_fails_keeps_the_lease_so_nobody_resumes_without_the_ops(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.remote import autopush as remote_push

    template = str(tmp_path / "remotes" / "{workspace}.git")
    url = tmp_path / "remotes" / "w.git"
    session = kernel_session(tmp_path / "a" / "w", template)
    assert session is not None and session.pusher is not None
    with monkeypatch.context() as patch:
        def unreachable(*args: object) -> None:
            raise RemoteError("the network is down")

        patch.setattr(remote_push, "push", unreachable)  # the lease's own pushes still work
        env = CoreEnv(tmp_path / "a" / "w")
        env.run("x = 1")
        env.close()
        session.close()
    assert not session.pusher.complete and session.pusher.error == "the network is down"
    assert remote_head(url) is None
    with pytest.raises(RemoteLeaseHeld):  # another machine cannot resume without x = 1
        kernel_session(tmp_path / "b" / "w", template)
    again = kernel_session(tmp_path / "a" / "w", template)  # this copy's next kernel can
    assert again is not None
    again.close()
    assert remote_head(url) == head_of(tmp_path / "a" / "w")
    resumed = kernel_session(tmp_path / "b" / "w", template)
    assert resumed is not None
    env = CoreEnv(tmp_path / "b" / "w")
    assert env.ns["x"] == 1
    env.close()
    resumed.close()
