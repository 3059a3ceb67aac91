"""This copy of a workspace as a writer: its id and its signing key.

A workspace directory is one *writer*: it appends to its audit chain, pushes
to remotes and holds their leases.  ``<workspace>/identity.json`` (mode 0600,
never pushed, never forked, never cloned) says who it is::

    {"v": 1, "id": "<16 hex digits>", "key": "ed25519:...", "secret": "<base64url seed>",
     "directory": {"inode": N, "path": "/where/it/was/made"},
     "previous": ["ed25519:...", ...], "created_at": "..."}

(``"secret": null, "operator": FILE`` for an identity made under an operator's key.)

``id`` names the copy in leases and in the pusher trailers of a push;
``key`` is the public half of ``secret``, the Ed25519 key that signs every
audit record this copy appends (:mod:`kernos.audit.signing`).

**A copy made by hand is not the original writer.**  The identity is bound to
the directory it was made for, by the directory's inode: ``cp -r`` or a
restore from a backup makes a new directory, a ``mv`` on the same
filesystem does not.  When :func:`load_identity` finds the inode changed, the
directory is a copy: it gets a new id and a new key (the copied secret is
overwritten), keeps the old key in ``previous`` (its records before the copy
are still its own, and trusted), and says so in :attr:`Identity.note`.  So a
copy can neither take the original's lease nor sign as it.

**An operator's key.**  With ``$KERNOS_SIGNING_KEY`` naming a file that
holds an Ed25519 private key (PEM, PKCS8, as ``openssl genpkey -algorithm
ed25519`` writes it), every workspace a process opens signs with that key
instead of its own: the kernels of one deployment (a gateway's machines)
then trust each other's records, as their own, without a per-workspace
step.  The file stays the operator's; ``identity.json`` names its key
and its file, without its secret, and a process not given the key can read,
push and pull the workspace but not append to its chain (the error says
which file to give it).

Upgrading: a workspace from before identities takes the id its
``remotes.json`` already had, so a lease it holds stays its own.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from kernos._durable import fsync_dir, replace_file
from kernos._time import utc_now
from kernos.errors import WorkspaceCorrupt, WorkspaceError
from kernos.store.keys import key_id

__all__ = ["IDENTITY", "SIGNING_KEY_ENV", "Identity", "load_identity", "own_keys"]

IDENTITY = "identity.json"
SIGNING_KEY_ENV = "KERNOS_SIGNING_KEY"
_REMOTES = "remotes.json"


@dataclass(frozen=True, kw_only=True)
class Identity:
    """Who this workspace copy is as a writer (see the module docstring)."""

    id: str
    """This copy's id (leases, push trailers)."""
    key_id: str
    """The id (``ed25519:...``) of the key its audit records are signed with."""
    own: tuple[str, ...]
    """Every key this directory signed with: ``key_id`` and the ones before a copy."""
    note: str | None = None
    """What loading it found and did (a copy given a new identity), if anything."""
    private: Ed25519PrivateKey | None = None
    """The key itself; None when it is an operator's this process was not given."""
    operator: str | None = None
    """The file the operator's key was read from when this identity was made with one."""

    @property
    def key(self) -> Ed25519PrivateKey:
        """The key to sign with, or a :class:`~kernos.errors.WorkspaceError` saying where
        the operator's key is to be found."""
        if self.private is None:
            raise WorkspaceError(
                f"this workspace signs its audit records with its deployment's key "
                f"({self.key_id}, from {SIGNING_KEY_ENV}={self.operator}), which this process "
                f"was not given: set {SIGNING_KEY_ENV} to that file to write to it (reading, "
                "pushing and pulling need no key)", path=str(self.operator))
        return self.private


def load_identity(workspace: Path, environ: Mapping[str, str] | None = None) -> Identity:
    """The identity of the workspace at ``workspace``, created on first use, renewed when
    the directory turns out to be a copy (see the module docstring)."""
    environ = os.environ if environ is None else environ
    operator = _operator_key(environ)
    path = workspace / IDENTITY
    data = _read(path)
    note = None
    if data is None or _inode(workspace) != data["directory"]["inode"]:
        with _locked(workspace):  # one creator or renewer at a time; then read again
            data = _read(path)
            if data is None:
                data = _create(workspace, path, operator)
            elif _inode(workspace) != data["directory"]["inode"]:
                data, note = _renew(workspace, path, data, operator)
    key = operator.key if operator is not None else (
        None if data.get("operator") else _secret(path, data))
    current = str(data["key"]) if key is None else key_id(key)
    own = (current, *[k for k in [data["key"], *data["previous"]] if k != current])
    return Identity(id=data["id"], key_id=current, own=tuple(dict.fromkeys(own)), note=note,
                    private=key, operator=data.get("operator"))


def own_keys(workspace: Path, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The keys this directory signed with, read without creating or renewing anything (for
    readers: verify, log); empty for a workspace that never had an identity."""
    environ = os.environ if environ is None else environ
    operator = _operator_key(environ)
    data = _read(workspace / IDENTITY)
    keys = [] if operator is None else [key_id(operator.key)]
    if data is not None:
        keys += [str(data["key"]), *[str(k) for k in data["previous"]]]
    return tuple(dict.fromkeys(keys))


@dataclass(frozen=True)
class _Operator:
    """An operator's key, and the file it came from."""

    key: Ed25519PrivateKey
    file: str


def _operator_key(environ: Mapping[str, str]) -> _Operator | None:
    name = environ.get(SIGNING_KEY_ENV, "").strip()
    if not name:
        return None
    try:
        key = load_pem_private_key(Path(name).expanduser().read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as error:
        raise WorkspaceError(
            f"{SIGNING_KEY_ENV}={name} does not name a readable Ed25519 private key in PEM "
            f"({type(error).__name__}: {error}); create one with `openssl genpkey -algorithm "
            f"ed25519 -out FILE`, or unset {SIGNING_KEY_ENV}", path=name) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise WorkspaceError(f"{SIGNING_KEY_ENV}={name} holds a {type(key).__name__}, not an "
                             "Ed25519 key; create one with `openssl genpkey -algorithm ed25519`",
                             path=name)
    return _Operator(key=key, file=str(Path(name).expanduser().absolute()))


def _inode(workspace: Path) -> int:
    return os.stat(workspace).st_ino


@contextlib.contextmanager
def _locked(workspace: Path) -> Iterator[None]:
    fd = os.open(workspace, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _read(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data: dict[str, Any] = json.loads(raw)
        directory = data["directory"]
        if not (type(data["id"]) is str and type(data["key"]) is str
                and type(directory) is dict and type(directory["inode"]) is int
                and type(data["previous"]) is list):
            raise ValueError("a field has the wrong type")
    except (ValueError, KeyError, TypeError) as error:
        raise WorkspaceCorrupt(str(path.parent), f"{IDENTITY} is unreadable ({error}); move "
                               "it aside to give this copy a new writer identity (its "
                               "records so far stay valid)") from None
    return data


def _secret(path: Path, data: dict[str, Any]) -> Ed25519PrivateKey:
    secret = data.get("secret")
    try:
        if type(secret) is not str:
            raise ValueError("no secret")
        key = Ed25519PrivateKey.from_private_bytes(
            base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4)))
    except ValueError as error:
        raise WorkspaceCorrupt(str(path.parent), f"{IDENTITY} holds no usable signing key "
                               f"({error}); move it aside to give this copy a new writer "
                               "identity") from None
    if key_id(key) != data["key"]:
        raise WorkspaceCorrupt(str(path.parent), f"{IDENTITY}'s secret is not the key it "
                               "names; move it aside to give this copy a new writer identity")
    return key


def _fresh(workspace: Path, *, id: str, previous: list[object],
           operator: _Operator | None) -> dict[str, Any]:
    key = Ed25519PrivateKey.generate() if operator is None else None
    data: dict[str, Any] = {
        "v": 1, "id": id, "previous": previous, "created_at": utc_now(),
        "directory": {"inode": _inode(workspace), "path": str(workspace)},
    }
    if key is not None:
        raw = key.private_bytes_raw()
        data["key"] = key_id(key)
        data["secret"] = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    else:
        assert operator is not None
        data["key"] = key_id(operator.key)
        data["secret"] = None
        data["operator"] = operator.file
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    replace_file(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(),
                 durable=True, mode=0o600, temporary=path.with_name(f".{path.name}.tmp"))


def _create(workspace: Path, path: Path, operator: _Operator | None
            ) -> dict[str, Any]:
    try:  # a workspace from before identities keeps the id its remotes know it by
        legacy = json.loads((workspace / _REMOTES).read_text()).get("id")
    except (OSError, ValueError, AttributeError):
        legacy = None
    id = legacy if type(legacy) is str and legacy else secrets.token_hex(8)
    data = _fresh(workspace, id=id, previous=[], operator=operator)
    _write(path, data)
    fsync_dir(workspace)
    return data


def _renew(workspace: Path, path: Path, data: dict[str, Any],
           operator: _Operator | None) -> tuple[dict[str, Any], str]:
    old = data["directory"]
    where = old.get("path", "?") if isinstance(old, dict) else "?"
    previous = [*(data["previous"] if isinstance(data["previous"], list) else []),
                data["key"]]
    renewed = _fresh(workspace, id=secrets.token_hex(8), previous=previous, operator=operator)
    renewed["copied_from"] = {"id": data["id"], "path": where, "key": data["key"]}
    _write(path, renewed)
    note = (f"this workspace is a copy of {where} (writer {data['id']}): it is a new writer "
            f"now, {renewed['id']}, signing with a new key; the original's lease and key stay "
            "the original's")
    return renewed, note
