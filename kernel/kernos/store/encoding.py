"""JSON as snapshots store it, and a manifest assembled from members encoded before.

A manifest (``kernos.json``) holds every name's facts.  A commit encodes only
the members whose facts changed (``ImageState.manifest_names`` keeps the
others) and splices them into the rest; the bytes are those of encoding the
whole manifest at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["encode_json", "manifest_json", "manifest_member"]


def encode_json(value: object) -> bytes:
    """JSON as snapshots store it: keys sorted, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def manifest_member(name: str, entry: object) -> bytes:
    """One member of a manifest's ``"names"`` object, encoded (see :func:`manifest_json`)."""
    return encode_json(name) + b":" + encode_json(entry)


def manifest_json(manifest: dict[str, Any], names: Iterable[bytes]) -> bytes:
    """``encode_json`` of ``manifest`` with ``"names"`` holding ``names``: its members, each
    from :func:`manifest_member`, in sorted order."""
    head = encode_json({**manifest, "names": {}})
    at = head.rindex(b'"names":{}')  # the last: what follows it are plain fields
    return head[:at] + b'"names":{' + b",".join(names) + b"}" + head[at + len(b'"names":{}'):]
