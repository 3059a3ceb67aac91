"""The fields of the checkpoint requests (``kernos.harness.checkpoint_requests``), as data.

``kernos.harness.protocol`` allowlists each request's fields; the eight
checkpoint actions' are here, in plain types, so that the protocol module
stays a size a reader can hold (it joins them into its ``ACTIONS``).  Each
field is ``(types, required)``; every action also takes ``principal``.
"""

from __future__ import annotations

__all__ = ["CHECKPOINT_CHANGES", "CHECKPOINT_FIELDS"]

_TEXT, _LIST, _OBJECT, _INT = (str,), (list,), (dict,), (int,)

CHECKPOINT_FIELDS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "checkpoint_put": {"thread": (_TEXT, True), "ns": (_TEXT, False),
                       "checkpoint": (_OBJECT, True), "blobs": (_LIST, False)},
    "checkpoint_writes": {"thread": (_TEXT, True), "ns": (_TEXT, False),
                          "checkpoint_id": (_TEXT, True), "task_id": (_TEXT, True),
                          "task_path": (_TEXT, False), "writes": (_LIST, True)},
    "checkpoint_get": {"thread": (_TEXT, True), "ns": (_TEXT, False),
                       "checkpoint_id": (_TEXT, False)},
    "checkpoint_list": {"thread": (_TEXT, False), "ns": (_TEXT, False),
                        "checkpoint_id": (_TEXT, False), "filter": (_OBJECT, False),
                        "before": (_TEXT, False), "limit": (_INT, False)},
    "checkpoint_delete": {"thread": (_TEXT, True)},
    "checkpoint_copy": {"source": (_TEXT, True), "target": (_TEXT, True)},
    "checkpoint_prune": {"threads": (_LIST, True), "strategy": (_TEXT, False)},
    "checkpoint_delete_runs": {"runs": (_LIST, True)},
}
"""Per checkpoint action, its fields besides ``principal``: ``name: (types, required)``."""

CHECKPOINT_CHANGES = frozenset(CHECKPOINT_FIELDS) - {"checkpoint_get", "checkpoint_list"}
"""The checkpoint actions that run as an op of their principal (the others are reads)."""
