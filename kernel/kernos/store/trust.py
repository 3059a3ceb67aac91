"""Whose audit records this workspace accepts, and whether its snapshots may be opened.

``<workspace>/trust.json`` (never pushed, never pulled)::

    {"v": 1,
     "keys": {"ed25519:...": {"how": "clone", "since": "...", "note": "..."}, ...},
     "untrusted": {"url": "...", "signers": ["ed25519:..."], "unsigned": 3, "since": "..."}}

``keys`` are the writer keys (:mod:`kernos.audit.signing`) whose records a
pull or clone accepts, besides this copy's own (:mod:`kernos.store.identity`,
always trusted) and those in ``$KERNOS_TRUST`` (comma-separated key ids: an
operator's pin for the processes it starts).  A key gets here by ``kernos
remote trust KEY``, by a clone's ``--trust KEY``, or by the human answering
yes when a clone shows its signers.

``untrusted`` is set by a clone whose signers were not all trusted: its
history is on disk, readable by ``kernos log`` and checkable by ``kernos audit
verify``, but restoring a snapshot runs pickle, which runs code, so nothing is
restored (:func:`require_trusted`, asked before any snapshot is loaded) until
the human trusts every signer listed, and accepts the records written before
signing existed (``unsigned``) if there are any.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernos._durable import replace_file
from kernos._time import utc_now
from kernos.errors import UsageError, WorkspaceCorrupt, WorkspaceUntrusted
from kernos.store.keys import KEY_ID, public_key

__all__ = ["TRUST", "TRUST_ENV", "Trust", "check_key_id", "require_trusted"]

TRUST = "trust.json"
TRUST_ENV = "KERNOS_TRUST"


def check_key_id(text: str) -> str:
    """``text`` if it is a key id; else a :class:`UsageError` that says what one looks like."""
    candidate = text.strip()
    if not KEY_ID.fullmatch(candidate) or public_key(candidate) is None:
        raise UsageError(f"{text[:80]!r} is not a writer key id: one is 'ed25519:' and 43 "
                         "characters of base64url, as `kernos remote trust` prints it in the "
                         "writer's workspace")
    return candidate


@dataclass(kw_only=True)
class Trust:
    """``trust.json`` of one workspace (see the module docstring)."""

    path: Path
    keys: dict[str, dict[str, str]] = field(default_factory=dict)
    """Key id -> how and when it was trusted."""
    untrusted: dict[str, Any] | None = None
    """What a clone left untrusted (None: nothing)."""
    own: tuple[str, ...] = ()
    """This copy's own keys (always trusted; not stored here)."""
    pinned: tuple[str, ...] = ()
    """The keys ``$KERNOS_TRUST`` names (for this process)."""

    @classmethod
    def load(cls, workspace: Path, *, own: Iterable[str] = (),
             environ: Mapping[str, str] | None = None) -> Trust:
        environ = os.environ if environ is None else environ
        pinned = tuple(check_key_id(text) for text in
                       environ.get(TRUST_ENV, "").split(",") if text.strip())
        path = workspace / TRUST
        try:
            data = json.loads(path.read_bytes())
            keys = data.get("keys") or {}
            untrusted = data.get("untrusted")
            if type(keys) is not dict or not (untrusted is None or type(untrusted) is dict):
                raise ValueError("a field has the wrong type")
        except FileNotFoundError:
            keys, untrusted = {}, None
        except (OSError, ValueError, AttributeError) as error:
            raise WorkspaceCorrupt(str(workspace), f"{TRUST} is unreadable ({error}); fix it, "
                                   "or delete it and trust the writers again") from None
        return cls(path=path, keys={k: dict(v) for k, v in keys.items()
                                    if KEY_ID.fullmatch(str(k)) and type(v) is dict},
                   untrusted=untrusted, own=tuple(own), pinned=pinned)

    def trusts(self, key: str | None) -> bool:
        return key is not None and (key in self.own or key in self.pinned or key in self.keys)

    def add(self, key: str, *, how: str, note: str = "") -> bool:
        """Trust ``key`` (and clear it from what a clone left untrusted); whether it is new."""
        key = check_key_id(key)
        new = not self.trusts(key)
        if key not in self.keys and key not in self.own:
            self.keys[key] = {"how": how, "since": utc_now(), **({"note": note} if note else {})}
        if self.untrusted is not None:
            self.untrusted["signers"] = [k for k in self.untrusted.get("signers", [])
                                         if k != key]
            self._settle()
        return new

    def accept_unsigned(self) -> int:
        """Accept the unsigned records a clone brought; how many there were."""
        if self.untrusted is None:
            return 0
        count = int(self.untrusted.get("unsigned") or 0)
        self.untrusted["unsigned"] = 0
        self._settle()
        return count

    def _settle(self) -> None:
        if self.untrusted is not None and not self.untrusted.get("signers") and not \
                self.untrusted.get("unsigned"):
            self.untrusted = None

    def mark_untrusted(self, *, url: str, signers: Iterable[str], unsigned: int) -> None:
        self.untrusted = {"url": url, "signers": sorted(set(signers)), "unsigned": unsigned,
                          "since": utc_now()}
        self._settle()

    def document(self) -> dict[str, Any]:
        """What ``trust.json`` holds (the keys of ``$KERNOS_TRUST`` and this copy's own are
        not stored)."""
        return {"v": 1, "keys": self.keys, "untrusted": self.untrusted}

    def save(self, *, durable: bool = True) -> None:
        replace_file(self.path,
                     (json.dumps(self.document(), indent=2, sort_keys=True) + "\n").encode(),
                     durable=durable, temporary=self.path.with_name(f".{self.path.name}.tmp"))


def require_trusted(workspace: Path) -> None:
    """Raise :class:`WorkspaceUntrusted` while a clone's signers are not all trusted
    (asked before anything in the workspace is unpickled)."""
    trust = Trust.load(workspace)
    if trust.untrusted is None:
        return
    raise WorkspaceUntrusted(str(workspace), url=str(trust.untrusted.get("url", "?")),
                             signers=list(trust.untrusted.get("signers", [])),
                             unsigned=int(trust.untrusted.get("unsigned") or 0))
