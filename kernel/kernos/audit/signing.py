"""Who wrote an audit record: Ed25519 signatures over the record, and key ids.

The chain's hashes prove order: a record names its predecessor's hash, so
nothing can be removed or reordered unseen.  They do not prove authorship:
anyone who can write to a copy of the chain (a git remote, say) can extend it
with a record that hashes and links correctly.  A signature does.

Every writer (a workspace copy: :mod:`kernos.store.identity`) holds an
Ed25519 private key that never leaves its machine.  A record it appends
carries two fields:

``signer``
    the writer's key id: ``ed25519:`` and the 32-byte public key in unpadded
    base64url (51 characters), so a record can be checked with nothing but
    itself, and a person can compare key ids by eye or by copy and paste;
``sig``
    the Ed25519 signature, unpadded base64url, over :data:`DOMAIN` followed by
    the canonical form of the record without ``hash`` and ``sig``.

Both are part of what ``hash`` covers (it covers everything but itself), so
the next record's ``prev`` pins the signature too: stripping or replacing a
signature breaks the chain like any other edit.

Records written before signing existed carry neither field; their hashes are
unchanged, so they stay valid (:func:`signature_problem` returns None for
them, and :func:`signer_of` None).  Whether an unsigned record is acceptable
where it stands is the caller's rule (verify: not after the chain's first
signed record; a pull: only when the human says so).

Trust is not decided here: a valid signature says which key wrote a record,
the workspace's list of trusted keys (:mod:`kernos.store.trust`) says
whether that key may.  Signing and checking use the ``cryptography``
package, never hand-made primitives.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kernos.audit.canonical import canonical

__all__ = ["DOMAIN", "KEY_ID", "SIGNATURE", "SIGNER", "key_id", "public_key", "sign",
           "signature_problem", "signer_of"]

SIGNER = "signer"
"""The record field that names the key that signed it."""
SIGNATURE = "sig"
"""The record field that holds the signature."""
DOMAIN = b"kernos audit record v1\n"
"""What every signed message starts with, so a record's signature can never be taken for
a signature over anything else this key signs."""
KEY_ID = re.compile(r"ed25519:[A-Za-z0-9_-]{43}")
"""The exact shape of a key id."""


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _decode(text: str, size: int) -> bytes | None:
    """``text`` as unpadded base64url of exactly ``size`` bytes, or None."""
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(data) != size or _encode(data) != text:  # one spelling per key: no aliases
        return None
    return data


def key_id(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """The key id of a key (of its public half)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return "ed25519:" + _encode(public.public_bytes_raw())


def public_key(identifier: str) -> Ed25519PublicKey | None:
    """The public key a key id names, or None when it is not a well-formed key id."""
    if type(identifier) is not str or not KEY_ID.fullmatch(identifier):
        return None
    raw = _decode(identifier.removeprefix("ed25519:"), 32)
    if raw is None:
        return None
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None


def _message(record: dict[str, Any]) -> bytes:
    return DOMAIN + canonical({key: value for key, value in record.items()
                               if key not in ("hash", SIGNATURE)})


def sign(body: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """``body`` (a record without ``hash``) with ``signer`` and ``sig`` added."""
    signed = {**body, SIGNER: key_id(key)}
    signed[SIGNATURE] = _encode(key.sign(_message(signed)))
    return signed


def signer_of(record: dict[str, Any]) -> str | None:
    """The key id a record claims as its signer (None: an unsigned record)."""
    value = record.get(SIGNER)
    return value if type(value) is str else None


def signature_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with a record's signature, or None: it is valid, or the record is
    unsigned (it carries neither field)."""
    signer, signature = record.get(SIGNER), record.get(SIGNATURE)
    if signer is None and signature is None:
        return None
    if signer is None or signature is None:
        return "it carries a signer or a signature without the other (a field was removed)"
    public = public_key(signer)
    if public is None:
        return f"its signer {str(signer)[:60]!r} is not a key id (ed25519:...)"
    raw = _decode(signature, 64) if type(signature) is str else None
    if raw is None:
        return "its signature is not 64 bytes of base64url"
    try:
        public.verify(raw, _message(record))
    except InvalidSignature:
        return f"its signature does not verify with its signer's key {signer} (it was altered " \
               "or forged)"
    return None
