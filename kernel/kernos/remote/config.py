"""The records of a workspace's remotes: ``<workspace>/remotes.json`` (never pushed).

See :mod:`kernos.remote.transfer` for what it means; this module only reads and
writes it, and turns what a user typed into a URL git takes.  The file names
the writer it was written for (``id`` and ``key``, from
:mod:`kernos.store.identity`); the writer id a push or lease uses is always the
identity's, so a copy made by hand acts as a writer of its own.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kernos._durable import replace_file
from kernos.errors import RemoteError, UsageError
from kernos.remote.git import git
from kernos.store.identity import load_identity

__all__ = ["REMOTES", "RemoteConfig", "absolute_url", "ensure_bare", "local_path"]

REMOTES = "remotes.json"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(kw_only=True)
class RemoteConfig:
    """``remotes.json``: this copy's remotes, and the writer it was written for."""

    path: Path
    """The workspace directory."""
    remotes: dict[str, dict[str, object]] = field(default_factory=dict)
    """Name -> ``{"url": ..., "lease": bool}``."""
    written_for: str | None = None
    """The writer id the file names (``id``): a copy made by hand names the original."""

    @classmethod
    def load(cls, workspace: Path) -> RemoteConfig:
        try:
            data = json.loads((workspace / REMOTES).read_text())
        except FileNotFoundError:
            return cls(path=workspace)
        except (OSError, ValueError) as error:
            raise RemoteError(f"{workspace / REMOTES} is unreadable ({error}); fix it, or "
                              "delete it and add the remotes again") from None
        return cls(path=workspace, remotes=dict(data.get("remotes") or {}),
                   written_for=data.get("id") if type(data.get("id")) is str else None)

    @property
    def id(self) -> str:
        """This copy's writer id, from its identity (``kernos.store.identity``), never
        from the file: a directory copied by hand keeps the original's ``remotes.json``,
        but gets an identity of its own, so it cannot take the original's lease."""
        return load_identity(self.path).id

    def save(self) -> None:
        identity = load_identity(self.path)
        data = {"id": identity.id, "key": identity.key_id, "remotes": self.remotes}
        path = self.path / REMOTES
        replace_file(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(),
                     durable=True, temporary=path.with_name(path.name + ".tmp"))
        self.written_for = identity.id

    def add(self, name: str, url: str, *, lease: bool = False) -> None:
        if not _NAME.fullmatch(name):
            raise UsageError(f"{name!r} cannot name a remote: use letters, digits, '.', '_' "
                             "and '-'")
        if name in self.remotes:
            raise UsageError(f"the remote {name!r} exists already ({self.url(name)}); "
                             f"remove it first (kernos remote remove {name})")
        self.remotes[name] = {"url": absolute_url(url), "lease": lease}
        self.save()

    def remove(self, name: str) -> None:
        self.url(name)
        del self.remotes[name]
        self.save()
        shutil.rmtree(self.path / "remote.git" / "refs" / "remotes" / name, ignore_errors=True)

    def url(self, name: str) -> str:
        try:
            return str(self.remotes[name]["url"])
        except KeyError:
            known = ", ".join(sorted(self.remotes)) or "none yet"
            raise UsageError(f"this workspace has no remote {name!r} (remotes: {known}); add "
                             f"one with `kernos remote add {name} URL`") from None

    def leased(self, name: str) -> bool:
        self.url(name)
        return bool(self.remotes[name].get("lease"))


def absolute_url(url: str) -> str:
    """A local path made absolute (the CLI may run from elsewhere later); URLs as given."""
    if "://" in url or re.match(r"^[\w.-]+@[\w.-]+:", url):
        return url
    return str(Path(url).expanduser().absolute())


def local_path(url: str) -> Path | None:
    if url.startswith("file://"):
        return Path(url[len("file://"):])
    if "://" in url or re.match(r"^[\w.-]+@[\w.-]+:", url):
        return None
    return Path(url)


def ensure_bare(url: str) -> None:
    """A local path that does not exist yet becomes an empty bare repository."""
    local = local_path(url)
    if local is not None and not local.exists():
        # Built aside and renamed: two processes creating it at once both succeed.
        temporary = local.with_name(f".{local.name}.{os.getpid()}.{secrets.token_hex(4)}")
        git(None, "init", "--quiet", "--bare", str(temporary), what=f"creating {local}")
        try:
            os.rename(temporary, local)
        except OSError:
            shutil.rmtree(temporary, ignore_errors=True)
            if not local.is_dir():
                raise
