"""The remotes' side of a workspace's recovery, registered with the store.

A pull lands in one step a ``kill -9`` cannot leave half done
(:mod:`kernos.remote.land`); a crash in that step is finished, or what it
fetched deleted, at the next writable open.  The store calls what is
registered for ``"pull"`` (``kernos.store.workspace.finish_at_open``) without
knowing what a pull is.  Imported by ``kernos/__init__.py``, so every
``import kernos...`` wires it before a workspace can be opened.
"""

from __future__ import annotations

from kernos.remote import land
from kernos.store.workspace import finish_at_open

__all__: list[str] = []

finish_at_open("pull", lambda workspace: land.finish_interrupted(workspace))
