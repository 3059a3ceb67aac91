"""Events: emitted by ops, delivered inside the transaction, published once committed.

* ``kernos.audit.topics``: topic and pattern syntax (the audit log filters by it too);
* ``kernos.events.bus``: :class:`EventBus`, emit/subscribe and in-op delivery;
* ``kernos.events.human``: :class:`Events`, the ``events`` object of notebooks.

Committed events are read back from the audit log (``AuditLog.events_since``).
Nothing here imports Jupyter.
"""

from __future__ import annotations

from kernos.audit.topics import check_topic, compile_pattern, covers, matches
from kernos.events.bus import Event, EventBus, Subscription
from kernos.events.human import Events

__all__ = ["Event", "EventBus", "Events", "Subscription", "check_topic", "compile_pattern",
           "covers", "matches"]
