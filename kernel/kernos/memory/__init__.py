"""The agents' searchable memory (issue 20): recall, remember, context.

Three layers, one full-text index:

``working``
    The readable names of a namespace: name, type and a short preview.  Fed
    by the caller (:meth:`MemoryIndex.sync_working`): the human's from the
    image's per-name facts, an agent's from its namespace (plain values only
    previewed); the index keeps only the newest view.
``episodic``
    Each past op of a principal, from the audit chain: one entry for the op
    (op number, status, error, code), one per event (topic and payload), one
    per LLM exchange (the request and answer from ``<workspace>/llm/objects``).
    Each belongs to the principal that made it, not to the op's: an agent's
    subscriber runs inside the emitter's op, and what it emits or asks a model
    is the subscriber's (:mod:`kernos.memory.episodes`).
``semantic``
    Facts an agent stored with :func:`remember`.  **They live in the image**,
    as a :class:`Facts` value under ``kernos:memory:<principal>`` (see
    :data:`facts_name`), so they commit and roll back with the op that stored
    them and survive restarts like any other name.  The index holds a copy,
    replaced from the image by :meth:`MemoryIndex.sync_semantic`.

The index (:mod:`kernos.memory.index`) is a **cache**: SQLite FTS5 in
``<workspace>/memory/index.sqlite``.  It is never pushed to a remote (it is not
in :data:`kernos.remote.transfer.ALLOWED`), never copied by a fork, and can be
deleted at any time.  It records the audit chain's head (index and hash) it
was built to; on open it is rebuilt when missing, unreadable, of another
format, or when the record at that index no longer has that hash, and
otherwise caught up incrementally from the next record.

Who sees what (:meth:`MemoryIndex.recall`): a principal sees its own episodic
and semantic entries, the working entries of its own namespace, and the
working entries of the *human's* namespace only when the ``may_read(name)``
predicate given at the boundary says so (the runtime builds it from the
principal's ``read:``/``write:`` grants); another agent's namespace never.
Query text is never passed to FTS5 as syntax: it is split into words and
each is quoted.

Recall by meaning (optional): when the human set an embedding model
(``agents.memory_embeddings``, :mod:`kernos.memory.embeddings`), recall also
embeds the query and, a bounded number per recall, the entries the asker may
read, and fuses the two rankings (:mod:`kernos.memory.vectors`).  Visibility
is the same single rule (:class:`~kernos.memory.index.Scope`) for both.

The runtime's side (:mod:`kernos.memory.service`; agent code calls it through
:mod:`kernos.agents._memory`):
the grants ``memory:read`` / ``memory:write``, freshness before each answer,
and recording each recall with its op so that a replay answers the same.

Erasure (I8): entries built from a data subject's sealed payloads (sealed
code, events with personal values, sealed LLM recordings) carry the subject.
An ``erasure`` record in the chain deletes every such entry at the next
catch-up, under ``secure_delete``, then merges the FTS segments and vacuums,
so the file no longer holds the text; :meth:`MemoryIndex.erase_subject`
does it at once (call it right after :func:`kernos.audit.erase`).

Nothing here imports Jupyter.
"""

from __future__ import annotations

from kernos.memory.context import count_tokens, render
from kernos.memory.facts import Fact, Facts, facts_name, remember
from kernos.memory.index import INDEX_PATH, KINDS, Memory, MemoryIndex, WorkingItem

__all__ = [
    "INDEX_PATH",
    "KINDS",
    "Fact",
    "Facts",
    "Memory",
    "MemoryIndex",
    "WorkingItem",
    "count_tokens",
    "facts_name",
    "remember",
    "render",
]
