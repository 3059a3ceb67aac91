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

Key ids and the keys they name are the store's (:mod:`kernos.store.keys`): a
workspace's identity and trust list name keys too.  Trust is not decided
here: a valid signature says which key wrote a record, the workspace's list
of trusted keys (:mod:`kernos.store.trust`) says whether that key may.
Signing and checking use the ``cryptography`` package, never hand-made
primitives.
"""

from __future__ import annotations

from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernos.audit.canonical import canonical
from kernos.store.keys import KEY_ID, key_id, public_key
from kernos.store.keys import decode_base64url as _decode
from kernos.store.keys import encode_base64url as _encode

__all__ = ["DOMAIN", "KEY_ID", "SIGNATURE", "SIGNER", "key_id", "public_key", "sign",
           "signature_problem", "signer_of"]

SIGNER = "signer"
"""The record field that names the key that signed it."""
SIGNATURE = "sig"
"""The record field that holds the signature."""
DOMAIN = b"kernos audit record v1\n"
"""What every signed message starts with, so a record's signature can never be taken for
a signature over anything else this key signs."""


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
