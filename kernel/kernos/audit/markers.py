"""Personal values inside stored payloads: the ``$personal`` marker.

An event's payload may hold personal values (:mod:`kernos.personal`).  The
audit log stores such a payload with each personal value replaced by a
marker, sealed under its data subject's key::

    {"$personal": {"subject": "c-1042", "sealed": "<base64>"}}

:func:`seal_markers` writes the markers (the event bus, as an op emits),
:func:`subjects_of` lists the subjects a stored payload holds (the op's audit
record names them, so an erasure finds them), and :func:`open_personal_markers`
reads them back (``{"value": ...}``, or ``{"erased": true}`` once the subject's
key is destroyed).  The keys ``$personal`` and ``$erased`` are reserved.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from kernos.audit.canonical import canonical, check_json
from kernos.errors import EventError
from kernos.personal import Keyring, Personal

__all__ = ["RESERVED", "open_personal_markers", "seal_markers", "subjects_of"]

RESERVED = frozenset({"$personal", "$erased"})
"""Keys a payload may not use: the markers'."""


def seal_markers(value: Any, keyring: Keyring | None, path: str, depth: int = 0) -> Any:
    """``value`` as the audit log stores it: each personal value sealed for its subject
    (``{"$personal": {"subject": ..., "sealed": ...}}``); ``path`` names it in errors."""
    if isinstance(value, Personal):
        if keyring is None:
            raise EventError("personal values can be sent only from a workspace")
        inner = value.reveal()
        check_json(inner, what=f"{path} (a personal value)")
        sealed = keyring.seal([value.subject], canonical(inner))
        return {"$personal": {"subject": value.subject,
                              "sealed": base64.b64encode(sealed).decode()}}
    if depth > 40:
        return value  # check_json reports the depth
    if type(value) is dict:
        for key in value:
            if key in RESERVED:
                raise EventError(f"{path} uses the key {key!r}, which Kernos reserves for "
                                 "personal values; rename it")
        return {key: seal_markers(item, keyring, f"{path}[{str(key)[:40]!r}]", depth + 1)
                for key, item in value.items()}
    if type(value) is list:
        return [seal_markers(item, keyring, f"{path}[{index}]", depth + 1)
                for index, item in enumerate(value)]
    return value


def subjects_of(stored: Any) -> set[str]:
    """The data subjects whose sealed values a stored payload holds."""
    found: set[str] = set()
    stack = [stored]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            marker = item.get("$personal")
            if type(marker) is dict and "subject" in marker and len(item) == 1:
                found.add(str(marker["subject"]))
                continue
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
    return found


def open_personal_markers(value: Any, keyring: Keyring) -> Any:
    """Replace sealed markers by the plain value, or by ``erased: true`` once erased."""
    if type(value) is dict:
        marker = value.get("$personal")
        if type(marker) is dict and len(value) == 1 and "sealed" in marker:
            subject = str(marker["subject"])
            opened = keyring.open([subject], base64.b64decode(marker["sealed"]))
            if opened is None:
                return {"$personal": {"subject": subject, "erased": True}}
            return {"$personal": {"subject": subject, "value": json.loads(opened)}}
        return {key: open_personal_markers(item, keyring) for key, item in value.items()}
    if type(value) is list:
        return [open_personal_markers(item, keyring) for item in value]
    return value
