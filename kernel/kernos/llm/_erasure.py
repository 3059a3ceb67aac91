"""Erasing a data subject reaches the LLM recordings too.

:func:`kernos.audit.erasure.erase` destroys a subject's key and deletes what the
audit holds sealed under it; the recorded LLM requests and answers
(``<workspace>/llm/objects``) sealed under it are the LLM layer's, which sits
above the audit.  This module registers :func:`kernos.llm._store.erase_recordings`
as one of the erasure's erasers; ``kernos/__init__.py`` imports it, so every
process that can erase has it registered.
"""

from __future__ import annotations

from pathlib import Path

from kernos.audit.erasure import register_eraser
from kernos.llm._store import erase_recordings

__all__: list[str] = []


def _erase_recordings(workspace: Path, subject: str, durable: bool) -> int:
    return erase_recordings(workspace, subject, durable=durable)


register_eraser(_erase_recordings)
