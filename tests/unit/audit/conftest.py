"""Fixtures shared by the audit log's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from audit_support import new_log
from kernos.audit.log import AuditLog


@pytest.fixture
def log(tmp_path: Path) -> Iterator[AuditLog]:
    """An empty audit log of its own, closed after the test."""
    opened = new_log(tmp_path)
    yield opened
    opened.close()
