"""A kernel's remote at start: materialize, lease, catch up, then push after commits.

``$KERNOS_REMOTE`` (set by the operator in the kernelspec's ``env``, never by a
client: a gateway forwards only ``KERNEL_*`` variables from a start request)
names the remote:

* ``NAME``: a remote already in the workspace's ``remotes.json``;
* ``NAME=URL``: a path, ``file://``, ssh or http URL.  The URL may be a
  template: ``{workspace}`` is replaced by the workspace's directory name, so
  one kernelspec serves every workspace of a gateway, each with a remote of its
  own (``origin=/srv/kernos/remotes/{workspace}.git``).  The name passed the
  workspace-name allowlist already (``kernos.store.workspace``); it is checked
  again here, since it becomes part of a URL.

What :func:`start_remote` does, before the kernel opens its workspace:

1. A local (path or ``file://``) remote that does not exist yet is created
   (``git init --bare``), so the first kernel on a new name works.  An ssh or
   http remote is the operator's to create; one that cannot be read refuses
   the start with a message that says so.
2. If the workspace is missing here, it is cloned from the remote (when the
   remote holds one; else the kernel starts an empty workspace that it pushes).
3. The writer lease is taken when the remote has ``lease`` on or
   ``$KERNOS_REMOTE_LEASE=1`` (its length: ``$KERNOS_REMOTE_LEASE_TTL``
   seconds, default 60).  Another live holder refuses the start
   (:class:`~kernos.errors.RemoteLeaseHeld`, which names it).
4. A workspace that was here already catches up with the remote
   (a fast-forward :func:`~kernos.remote.transfer.pull`): it may have been
   extended elsewhere since this machine last ran it.
5. An :class:`~kernos.remote.autopush.AutoPusher` pushes after commits, at
   most every ``$KERNOS_REMOTE_INTERVAL_MS`` (default 200).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kernos.errors import RemoteError, UsageError
from kernos.remote.autopush import AutoPusher
from kernos.remote.config import RemoteConfig, absolute_url, ensure_bare, local_path
from kernos.remote.git import ls_remote
from kernos.remote.lease import DEFAULT_TTL, Lease, acquire_lease
from kernos.remote.session import RemoteSession
from kernos.remote.transfer import META_REF, materialize, pull
from kernos.store.workspace import Workspace, check_workspace_name

__all__ = ["PLACEHOLDER", "remote_url", "start_remote"]

PLACEHOLDER = "{workspace}"
"""In ``$KERNOS_REMOTE``'s URL, the workspace's directory name."""


def remote_url(template: str, workspace: Path) -> str:
    """The URL ``template`` names for ``workspace`` (``{workspace}``: its directory name)."""
    rest = template.replace(PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise UsageError(
            f"KERNOS_REMOTE's URL {template!r} has a placeholder Kernos does not know: the "
            f"only one is {PLACEHOLDER} (the workspace's name). Fix the kernelspec's env.")
    if PLACEHOLDER not in template:
        return template
    return template.replace(PLACEHOLDER, check_workspace_name(workspace.name))


def _positive(environ: Mapping[str, str], name: str, default: float) -> float:
    """``$name`` as a positive number, ``default`` when unset; a clear error when not one."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"{name}={text!r} is not a positive number; fix the kernelspec's env "
                         f"(unset, it is {default:g})")
    return value


def _check_readable(url: str, name: str, workspace: Path) -> None:
    """An ssh or http remote must exist already: the operator creates it."""
    try:
        ls_remote(url, [META_REF])
    except RemoteError as error:
        raise RemoteError(
            f"the remote {name} of workspace {workspace.name!r} ({url}) cannot be read: "
            f"{error}. Kernos creates local remotes itself, but an ssh or http remote is "
            "the operator's to create (`git init --bare` on the server) and to let this "
            "machine reach; then start the kernel again.", remote=name) from None


def start_remote(workspace: str | os.PathLike[str], environ: Mapping[str, str] | None = None,
                 *, interval: float | None = None) -> RemoteSession | None:
    """For a kernel, before it opens its workspace (see the module doc); None: no remote.

    Raises ``RemoteLeaseHeld`` when another workspace holds the lease, and
    ``RemoteError`` (or ``RemoteDiverged``) when the remote cannot be used.
    """
    environ = os.environ if environ is None else environ
    spec = environ.get("KERNOS_REMOTE", "").strip()
    if not spec:
        return None
    if interval is None:  # a bad setting fails before anything is done
        interval = _positive(environ, "KERNOS_REMOTE_INTERVAL_MS", 200) / 1000
    ttl = _positive(environ, "KERNOS_REMOTE_LEASE_TTL", DEFAULT_TTL)
    root = Path(workspace).expanduser().absolute()
    name, _, template = spec.partition("=")
    existed = (root / "workspace.json").exists()
    if template:
        url = absolute_url(remote_url(template, root))
        if local_path(url) is not None:
            ensure_bare(url)
        else:
            _check_readable(url, name, root)
        materialize(root, url, name=name)
        if not (root / "workspace.json").exists():
            Workspace.open(root, purpose="kernos remote start").close()
        config = RemoteConfig.load(root)
        if name not in config.remotes:
            config.add(name, url)
        elif config.url(name) != url:  # the operator moved the remotes: follow them
            config.remotes[name]["url"] = url
            config.save()
    config = RemoteConfig.load(root)
    lease: Lease | None = None
    if config.leased(name) or environ.get("KERNOS_REMOTE_LEASE") == "1":
        lease = acquire_lease(root, name, ttl=ttl)
    try:  # a kernel refused here must not keep the lease
        if existed:
            pull(root, name)
        pusher = AutoPusher(root, name, interval=interval)
        pusher.start()
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    return RemoteSession(lease, pusher)
