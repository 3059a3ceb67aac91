"""The audit log's side of a workspace's recovery, registered with the store.

A small commit's frame in the commit tail carries a copy of its op's audit
record (``kernos.store.tail``); when a crash kept a record from the chain, a
writable open puts it back from that copy.  The store knows only the shape of
that call (``kernos.store.workspace.restore_records_with``); this module gives
it :func:`kernos.audit.log.restore_records`.  Imported by ``kernos/__init__.py``,
so every ``import kernos...`` wires it before a workspace can be opened.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kernos.audit import log
from kernos.store.workspace import restore_records_with

__all__: list[str] = []


def _restore(chain: Path, records: Sequence[bytes], durable: bool) -> int:
    return log.restore_records(chain, records, durable=durable)


restore_records_with(_restore)
