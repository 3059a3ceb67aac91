"""Signed records: the key ids, the signatures, and what verify finds when either is wrong.

The workspaces of tests/unit/audit sign with ``audit_support.SIGNER`` (their conftest
says so); ``mallory`` is a key no workspace owns or trusts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_support import SIGNER
from core_support import CoreEnv, abort
from kernos.audit import record_hash, verify
from kernos.audit.canonical import canonical
from kernos.audit.signing import (
    DOMAIN,
    key_id,
    public_key,
    sign,
    signature_problem,
    signer_of,
)
from kernos.store.trust import Trust

MALLORY = Ed25519PrivateKey.generate()


def chain_file(path: Path) -> Path:
    return path / "audit" / "chain.jsonl"


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in chain_file(path).read_bytes().splitlines()]


def write(path: Path, chain: list[dict[str, Any]]) -> None:
    chain_file(path).write_bytes(b"".join(canonical(record) + b"\n" for record in chain))


def resigned(chain: list[dict[str, Any]], start: int, key: Ed25519PrivateKey | None
             ) -> list[dict[str, Any]]:
    """Records ``start`` on signed with ``key`` (None: left unsigned), relinked and rehashed,
    as a forger holding ``key`` would leave them."""
    out = chain[:start]
    for record in chain[start:]:
        body = {k: v for k, v in record.items() if k not in ("hash", "signer", "sig")}
        body["prev"] = out[-1]["hash"] if out else "0" * 64
        if key is not None:
            body = sign(body, key)
        out.append({**body, "hash": record_hash(body)})
    return out


@pytest.fixture
def failed(tmp_path: Path) -> Path:
    """Records 0 (genesis) to 5, five failed ops: a chain with no snapshot to check."""
    env = CoreEnv(tmp_path / "ws")
    for n in range(1, 6):
        abort(env, f"z{n} = 1 / 0")
    env.close()
    return env.path


def test_a_key_id_is_the_public_key_and_has_one_spelling() -> None:
    key = Ed25519PrivateKey.generate()
    identifier = key_id(key)
    assert identifier.startswith("ed25519:") and len(identifier) == 51
    assert key_id(key.public_key()) == identifier
    found = public_key(identifier)
    assert found is not None and found.public_bytes_raw() == key.public_key().public_bytes_raw()
    for bad in ("ed25519:short", identifier[:-1] + "=", "rsa:" + identifier[8:],
                identifier + "A", 42, identifier.replace("ed25519:", "ED25519:")):
        assert public_key(bad) is None  # type: ignore[arg-type]


def test_a_signature_covers_everything_but_the_hash_and_itself() -> None:
    body = {"v": 1, "type": "erasure", "subject": "c-1", "index": 3, "prev": "a" * 64}
    signed = sign(body, SIGNER)
    assert signer_of(signed) == key_id(SIGNER) and signature_problem(signed) is None
    assert signature_problem({**signed, "hash": "whatever"}) is None
    for field, value in (("subject", "c-2"), ("index", 4), ("prev", "b" * 64),
                         ("signer", key_id(MALLORY))):
        assert signature_problem({**signed, field: value}) is not None, field
    assert "without the other" in str(signature_problem(
        {k: v for k, v in signed.items() if k != "signer"}))
    assert "not 64 bytes" in str(signature_problem({**signed, "sig": "AAAA"}))
    # The message is domain-separated: the same key signing the bare canonical bytes
    # does not make a record signature.
    bare = {k: v for k, v in signed.items() if k != "sig"}
    raw = SIGNER.sign(canonical(bare))
    import base64

    forged = {**bare, "sig": base64.urlsafe_b64encode(raw).rstrip(b"=").decode()}
    assert signature_problem(forged) is not None
    assert DOMAIN.startswith(b"kernos audit record")


def test_every_record_the_log_appends_is_signed_and_verify_lists_the_signer(
        failed: Path) -> None:
    chain = records(failed)
    assert all(signer_of(record) == key_id(SIGNER) for record in chain)
    report = verify(failed)
    assert report.ok, report.summary()
    assert [(s.key, s.records, s.trusted) for s in report.signers] == [
        (key_id(SIGNER), len(chain), True)]
    assert report.unsigned == 0
    assert f"signed by {key_id(SIGNER)}: {len(chain)} records" in report.summary()


def test_a_record_rewritten_by_someone_without_the_key_is_caught(failed: Path) -> None:
    """The forger changes record 2 and rehashes everything after it, keeping the signer
    fields: the signatures no longer verify (the run's last one is checked)."""
    chain = records(failed)
    chain[2]["error"] = "nothing happened"
    for index in range(2, len(chain)):
        if index > 2:
            chain[index]["prev"] = chain[index - 1]["hash"]
        chain[index]["hash"] = record_hash(chain[index])
    write(failed, chain)
    report = verify(failed)
    assert not report.ok
    assert any("does not verify" in p.what for p in report.problems), report.summary()


def test_records_signed_by_a_key_nobody_trusts_are_named(failed: Path) -> None:
    write(failed, resigned(records(failed), 3, MALLORY))
    report = verify(failed)
    assert [p.index for p in report.problems] == [3]
    assert key_id(MALLORY) in report.problems[0].what
    assert "neither owns nor trusts" in report.problems[0].what
    assert [s.trusted for s in report.signers] == [True, False]
    trust = Trust.load(failed)
    trust.add(key_id(MALLORY), how="human")
    trust.save()
    assert verify(failed).ok  # a writer the human trusts is no tampering


def test_an_unsigned_record_after_signing_began_is_named(failed: Path) -> None:
    write(failed, resigned(records(failed), 4, None))
    report = verify(failed)
    assert [p.index for p in report.problems] == [4, 5]
    assert all("unsigned" in p.what for p in report.problems)


def test_records_from_before_signing_come_first_and_are_counted(failed: Path) -> None:
    chain = resigned(records(failed), 0, None)
    chain = resigned(chain, 3, SIGNER)
    write(failed, chain)
    report = verify(failed)
    assert report.ok, report.summary()
    assert report.unsigned == 3 and "unsigned: 3 records" in report.summary()


def test_a_signature_in_the_middle_of_another_signers_run_is_checked(failed: Path) -> None:
    """Record 3 claims SIGNER but carries mallory's signature; record 4 is mallory's: the
    run of SIGNER ends at 3, so 3's own signature is checked."""
    chain = records(failed)
    body = {k: v for k, v in chain[3].items() if k not in ("hash", "sig")}
    chain[3] = {**body, "sig": sign(body, MALLORY)["sig"]}
    chain[3]["hash"] = record_hash(chain[3])
    chain = chain[:4] + resigned(chain, 4, MALLORY)[4:]
    trust = Trust.load(failed)
    trust.add(key_id(MALLORY), how="human")
    trust.save()
    write(failed, chain)
    report = verify(failed)
    assert [p.index for p in report.problems] == [3], report.summary()
    assert "does not verify" in report.problems[0].what
