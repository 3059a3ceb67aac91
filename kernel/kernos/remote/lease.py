"""One writer across machines: the remote's writer lease.

The lease is the ref ``refs/kernos/lease`` on the remote: a commit (empty
tree, no parent) whose message is the holder as JSON::

    {"host": ..., "workspace": <remotes.json id>, "pid": ..., "since": <epoch s>,
     "expires": <epoch s>}

Every change is a compare-and-swap on that ref: ``git push
--force-with-lease=refs/kernos/lease:<the id we read>`` (empty: the ref must
not exist), which the receiving side checks under its ref lock.  Of two
contenders that read the same lease, exactly one moves it; the other is told
who won (:class:`~kernos.errors.RemoteLeaseHeld`).

* :func:`acquire_lease` takes the lease if there is none, if it has expired,
  or if it is this workspace's own (a kernel restarted after a crash renews
  it); else it refuses, naming the holder.
* :meth:`Lease.renew` pushes a new expiry, with CAS on the one it holds; a
  lease lost meanwhile (taken over after it expired) raises.
* :meth:`Lease.release` deletes it on a clean close (CAS too);
  :func:`release_lease` with ``force`` deletes another's (``kernos remote
  release NAME --force``: the holder is known dead).
* :func:`check_lease` is what a push asks: a live lease of another workspace
  refuses the push.

Expiry compares clocks across machines: keep them in sync (NTP), and keep
``ttl`` well above the skew.  A kernel renews at a third of ``ttl``.

Kernel start (:func:`kernos.remote.start.start_remote`): with
``KERNOS_REMOTE=<name>`` in the environment, a kernel materializes its
workspace from that remote if it does not exist, takes the lease if that
remote has ``lease`` on, catches up with the remote, and pushes after its
commits (``kernos.remote.autopush.AutoPusher``); a
:class:`kernos.remote.session.RemoteSession` is what it holds.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernos.errors import RemoteError, RemoteLeaseHeld
from kernos.remote.config import RemoteConfig, ensure_bare
from kernos.remote.git import EMPTY_TREE, Staging, git

__all__ = ["DEFAULT_TTL", "LEASE_REF", "Lease", "LeaseHolder", "acquire_lease", "check_lease",
           "read_lease", "release_lease", "utc"]

LEASE_REF = "refs/kernos/lease"
"""The remote's ref that names the lease's holder."""
DEFAULT_TTL = 60.0

log = logging.getLogger("kernos.remote")


@dataclass(frozen=True, kw_only=True)
class LeaseHolder:
    """Who holds a lease, as its ref says."""

    host: str
    """The machine."""
    workspace: str
    """The holder's workspace id (``remotes.json``)."""
    pid: int
    """Its process."""
    since: float
    """When it took the lease (epoch seconds)."""
    expires: float
    """When the lease ends unless renewed (epoch seconds)."""

    def describe(self) -> str:
        return (f"workspace {self.workspace} on host {self.host} (pid {self.pid}, since "
                f"{utc(self.since)})")

    def to_json(self) -> dict[str, object]:
        return {"host": self.host, "workspace": self.workspace, "pid": self.pid,
                "since": self.since, "expires": self.expires}


def utc(when: float) -> str:
    """``when`` (epoch seconds) as an ISO UTC time, as a lease shows it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def _parse(stage: Staging, sha: bytes) -> LeaseHolder:
    try:
        data = json.loads(stage.message_of(sha))
        return LeaseHolder(host=str(data["host"]), workspace=str(data["workspace"]),
                           pid=int(data["pid"]), since=float(data["since"]),
                           expires=float(data["expires"]))
    except (ValueError, KeyError, TypeError):
        # Unreadable: treat it as expired long ago, so it can be taken over.
        return LeaseHolder(host="?", workspace="?", pid=0, since=0.0, expires=0.0)


def read_lease(stage: Staging, url: str, name: str) -> tuple[bytes, LeaseHolder] | None:
    """The lease's commit id and holder, fetched from the remote (None: no lease)."""
    found = stage.fetch(url, name, [LEASE_REF]).get(LEASE_REF)
    return None if found is None else (found, _parse(stage, found))


def check_lease(stage: Staging, config: RemoteConfig, name: str, sha: bytes | None,
                *, now: Callable[[], float] = time.time) -> None:
    """Refuse (``RemoteLeaseHeld``) when another workspace holds a live lease."""
    if sha is None:
        return
    holder = _parse(stage, sha)
    if holder.workspace != config.id and holder.expires > now():
        raise RemoteLeaseHeld(name, holder.describe(), expires=utc(holder.expires),
                              workspace=str(stage.workspace))


def _cas(stage: Staging, url: str, name: str, expected: bytes | None, new: bytes | None) -> bool:
    """Move the lease ref from ``expected`` to ``new`` (None: absent) atomically; whether it
    moved."""
    expect = expected.hex() if expected else ""
    source = new.hex() if new else ""
    done = git(stage.git_dir, "push", "--porcelain", "--quiet",
               f"--force-with-lease={LEASE_REF}:{expect}", url, f"{source}:{LEASE_REF}",
               check=False)
    if done.returncode == 0:
        return True
    text = (done.stdout + done.stderr).decode(errors="replace")
    if "stale info" in text or "rejected" in text:
        return False
    raise RemoteError(f"updating the lease on {url} failed: {' '.join(text.split())[:300]}",
                      remote=name)


class Lease:
    """A lease this process holds on one remote."""

    def __init__(self, stage: Staging, url: str, name: str, holder: LeaseHolder, sha: bytes,
                 ttl: float) -> None:
        self.stage, self.url, self.name = stage, url, name
        self.holder, self.sha, self.ttl = holder, sha, ttl
        self.held = True

    def renew(self, *, now: Callable[[], float] = time.time) -> None:
        """Push a new expiry; raises ``RemoteLeaseHeld`` if the lease was lost meanwhile."""
        with self.stage.locked():
            holder = LeaseHolder(host=self.holder.host, workspace=self.holder.workspace,
                                 pid=self.holder.pid, since=self.holder.since,
                                 expires=now() + self.ttl)
            sha = _lease_commit(self.stage, holder)
            if not _cas(self.stage, self.url, self.name, self.sha, sha):
                self.held = False
                found = read_lease(self.stage, self.url, self.name)
                who = found[1] if found else None
                raise RemoteLeaseHeld(self.name, who.describe() if who else "nobody (released)",
                                      expires=utc(who.expires) if who else "now")
            self.holder, self.sha = holder, sha

    def release(self) -> None:
        """Give the lease back (a clean close); nothing if it was lost meanwhile."""
        if not self.held:
            return
        with self.stage.locked():
            _cas(self.stage, self.url, self.name, self.sha, None)
        self.held = False


def _lease_commit(stage: Staging, holder: LeaseHolder) -> bytes:
    stage.write(b"tree", b"")
    assert stage.has(EMPTY_TREE)
    return stage.commit(EMPTY_TREE, None, json.dumps(holder.to_json(), sort_keys=True),
                        int(time.time()))


def acquire_lease(workspace: str | os.PathLike[str], name: str, *, ttl: float = DEFAULT_TTL,
                  now: Callable[[], float] = time.time) -> Lease:
    """Take the writer lease of remote ``name`` for this workspace (see the module doc)."""
    root = Path(workspace).expanduser().absolute()
    config = RemoteConfig.load(root)
    url = config.url(name)
    if not (root / "remotes.json").exists():
        config.save()  # the id must stay the same for the lease's life
    ensure_bare(url)
    stage = Staging(root)
    with stage.locked():
        found = read_lease(stage, url, name)
        expected = None
        if found is not None:
            expected, holder = found
            if holder.workspace != config.id and holder.expires > now():
                raise RemoteLeaseHeld(name, holder.describe(), expires=utc(holder.expires),
                                      workspace=str(stage.workspace))
        mine = LeaseHolder(host=socket.gethostname(), workspace=config.id, pid=os.getpid(),
                           since=now(), expires=now() + ttl)
        sha = _lease_commit(stage, mine)
        if not _cas(stage, url, name, expected, sha):
            again = read_lease(stage, url, name)
            who = again[1] if again else None
            raise RemoteLeaseHeld(name, who.describe() if who else "another contender",
                                  expires=utc(who.expires) if who else "?",
                                  workspace=str(stage.workspace))
        return Lease(stage, url, name, mine, sha, ttl)


def release_lease(workspace: str | os.PathLike[str], name: str, *, force: bool = False
                  ) -> LeaseHolder | None:
    """Delete the remote's lease if it is this workspace's (or, with ``force``, anyone's);
    the holder it had (None: there was none)."""
    root = Path(workspace).expanduser().absolute()
    config = RemoteConfig.load(root)
    url = config.url(name)
    stage = Staging(root)
    with stage.locked():
        found = read_lease(stage, url, name)
        if found is None:
            return None
        sha, holder = found
        if holder.workspace != config.id and not force:
            raise RemoteLeaseHeld(name, holder.describe(), expires=utc(holder.expires),
                                      workspace=str(stage.workspace))
        if not _cas(stage, url, name, sha, None):
            raise RemoteError(f"the lease on {name} changed while it was being released; "
                              "run the command again", remote=name)
        return holder
