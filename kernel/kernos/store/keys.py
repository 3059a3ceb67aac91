"""Writer keys: the spelling of an Ed25519 key id, and the key a key id names.

A key id is ``ed25519:`` and the 32-byte public key in unpadded base64url (51
characters), so a record can be checked with nothing but itself and a person
can compare key ids by eye.  A workspace's identity (:mod:`kernos.store.identity`)
and its trusted keys (:mod:`kernos.store.trust`) name keys this way; the audit
chain's signatures (:mod:`kernos.audit.signing`) are built on these.  One
spelling per key: :func:`decode_base64url` refuses any other.
"""

from __future__ import annotations

import base64
import binascii
import re

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["KEY_ID", "decode_base64url", "encode_base64url", "key_id", "public_key"]

KEY_ID = re.compile(r"ed25519:[A-Za-z0-9_-]{43}")
"""The exact shape of a key id."""


def encode_base64url(data: bytes) -> str:
    """``data`` as unpadded base64url."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode_base64url(text: str, size: int) -> bytes | None:
    """``text`` as unpadded base64url of exactly ``size`` bytes, or None."""
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(data) != size or encode_base64url(data) != text:  # one spelling per key: no aliases
        return None
    return data


def key_id(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """The key id of a key (of its public half)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return "ed25519:" + encode_base64url(public.public_bytes_raw())


def public_key(identifier: str) -> Ed25519PublicKey | None:
    """The public key a key id names, or None when it is not a well-formed key id."""
    if type(identifier) is not str or not KEY_ID.fullmatch(identifier):
        return None
    raw = decode_base64url(identifier.removeprefix("ed25519:"), 32)
    if raw is None:
        return None
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None
