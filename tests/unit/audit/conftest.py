"""Fixtures shared by the audit log's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from audit_support import SIGNER, new_log
from kernos.audit.log import AuditLog


@pytest.fixture(autouse=True)
def _one_signing_key(tmp_path_factory: pytest.TempPathFactory,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Every workspace these tests open signs with ``SIGNER``, the key the forgers' tools
    (``audit_support.reseal``) sign with: a forger who holds the writer's key."""
    path = tmp_path_factory.mktemp("signing") / "key.pem"
    path.write_bytes(SIGNER.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    monkeypatch.setenv("KERNOS_SIGNING_KEY", str(path))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[AuditLog]:
    """An empty audit log of its own, closed after the test."""
    opened = new_log(tmp_path)
    yield opened
    opened.close()
