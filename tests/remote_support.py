"""What the tests of remotes share: whose records a bare remote holds.

Tests about something other than trust clone as a person would who checked the
writers' keys first: they trust the signers the remote's chain names
(:func:`signers_of`, read with plain git), and pass them with ``trust=`` (or
``--trust``).  The tests of trust itself (tests/security/test_hostile_remotes.py)
never do.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

__all__ = ["operator_key", "signers_of", "trust_flags"]


def _git(url: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(url), *args], check=True,
                          capture_output=True).stdout


def signers_of(url: Path | str) -> list[str]:
    """The key ids that signed the audit records on the remote at ``url``."""
    remote = Path(url)
    listing = _git(remote, "ls-tree", "-r", "refs/kernos/audit").decode().splitlines()
    signers: set[str] = set()
    for line in listing:
        meta, _, path = line.partition("\t")
        if path.startswith("chain/"):
            for record in _git(remote, "cat-file", "blob", meta.split()[2]).splitlines():
                signer = json.loads(record).get("signer")
                if isinstance(signer, str):
                    signers.add(signer)
    return sorted(signers)


def trust_flags(url: Path | str) -> list[str]:
    """``--trust KEY`` for each signer of the remote at ``url`` (for ``kernos clone``)."""
    return [f"--trust={key}" for key in signers_of(url)]


def operator_key(directory: Path) -> Path:
    """A new Ed25519 key in PEM at ``directory/signing.pem``: what an operator gives every
    kernel of one deployment as ``$KERNOS_SIGNING_KEY``, so their machines trust each
    other's records as their own."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "signing.pem"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    path.chmod(0o600)
    return path
