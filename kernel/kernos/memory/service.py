"""Memory for one image: recall, remember and context as a principal, fresh and recorded.

:class:`ImageMemory` is what the runtime (``AgentRuntime.memory``) and the
human's API (``agents.recall``, the harness, MCP, the CLI) go through.  It
owns the workspace's :class:`~kernos.memory.index.MemoryIndex` and keeps it
current before every answer:

* **episodic**: the index catches up with the audit chain (only the records
  after the head it was built to; a missing, stale or damaged index is
  rebuilt, see :meth:`MemoryIndex.open`);
* **working**: the human's names as the image's per-name facts hold them
  (re-fed when the head moves), and the asking agent's own namespace as it is
  in the running op (types and a preview of plain values only: no agent
  ``__repr__`` runs in host code);
* **semantic**: the asking principal's :class:`~kernos.memory.facts.Facts`
  as the image holds them now (so a fact stored in a rolled-back op is gone).

Who may ask (agents): ``recall`` and ``context`` need ``memory:read``,
``remember`` needs ``memory:write``; none of them runs inside a tool another
agent wrote (it would act on its caller's memory).  An agent recalls its own
ops and facts, its own names, and the human's names its ``read:``/``write:``
grants cover (revoked grants cover nothing).  Arguments are checked by exact
type and bounded (:data:`MAX_QUERY_CHARS`, :data:`MAX_K`, :data:`MAX_TOKENS`);
answers are plain data (lists of dicts of str, int, float, None).

Recall by meaning (optional, :mod:`kernos.memory.embeddings`): when the human
configured an embedding model (``agents.memory_embeddings``) and this is not a
replay, each recall with a query embeds it through :attr:`ImageMemory.embed`
(the runtime's recorded, budgeted model call, as the asking principal: it needs
``llm:MODEL``), embeds up to :data:`~kernos.memory.embeddings.EMBED_PER_RECALL`
of the entries it may read that have no vector yet (newest first, each text
paid once), and fuses the words' and the vectors' rankings
(:mod:`kernos.memory.vectors`).  The vectors are written only after every call
succeeded: a failing call raises (and vetoes the op) with the index as it was.

Replay (I7): an op's recalls are recorded in its audit record (``memory``: the
request and the answer, sealed for the data subjects whose text it holds, see
:mod:`kernos.audit.record`).  A replay sets :attr:`ImageMemory.replaying` to
them, and each recall of the re-run op is answered from them, in order,
after checking it asks the same; one the original did not make fails loudly
(and the op rolls back).  The index is not read in a replay.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kernos.errors import UsageError
from kernos.memory import vectors
from kernos.memory.embeddings import (
    CONFIG_NAME,
    EMBED_PER_RECALL,
    OFF,
    EmbeddingConfig,
    check_config,
)
from kernos.memory.facts import Facts, facts_name, remember
from kernos.memory.index import KINDS, Memory, MemoryIndex, Scope, WorkingItem
from kernos.memory.vectors import Meaning
from kernos.op import AGENT_NAMESPACE

if TYPE_CHECKING:
    from kernos.audit.log import AuditLog
    from kernos.image import Image
    from kernos.op import Op

__all__ = [
    "HUMAN",
    "MAX_K",
    "MAX_QUERY_CHARS",
    "MAX_TOKENS",
    "Embed",
    "ImageMemory",
    "check_request",
    "recorded_recalls",
]

HUMAN = "human"
MAX_QUERY_CHARS = 4096
MAX_K = 100
MAX_TOKENS = 100_000
PREVIEW_CHARS = 120
_PLAIN = (int, float, bool, str, bytes, type(None))


def check_request(query: object, k: object, kinds: object, *,
                  query_required: bool = True) -> tuple[str | None, int, list[str] | None]:
    """``(query, k, kinds)`` checked by exact type and bounded, or UsageError saying what."""
    if query is None and not query_required:
        pass
    elif type(query) is not str:
        raise UsageError(f"recall() takes the query as a str, not {type(query).__name__}")
    elif len(query) > MAX_QUERY_CHARS:
        raise UsageError(f"a recall query is at most {MAX_QUERY_CHARS} characters, not "
                         f"{len(query)}; ask with fewer words")
    if type(k) is not int or not 1 <= k <= MAX_K:
        raise UsageError(f"recall() takes k from 1 to {MAX_K}, not {str(k)[:40]!r}")
    chosen: list[str] | None = None
    if kinds is not None:
        items = [kinds] if type(kinds) is str else kinds
        if (not isinstance(items, (list, tuple)) or type(items) not in (list, tuple)
                or not all(type(kind) is str for kind in items)):
            raise UsageError("kinds must be None or a list of 'working', 'episodic', "
                             "'semantic'")
        chosen = sorted(set(items[:8]))
        unknown = [kind for kind in chosen if kind not in KINDS]
        if unknown or len(items) > 8:
            raise UsageError(f"recall() knows the kinds {sorted(KINDS)}, not "
                             f"{[kind[:40] for kind in unknown] or 'so many'}")
    assert query is None or isinstance(query, str)
    return query, k, chosen


class Embed(Protocol):
    """The runtime's embedding call (``AgentRuntime.embed_texts``): checks ``principal``'s
    ``llm:MODEL`` grant, budgets and records the call; one vector per text."""

    def __call__(self, principal: str, model: str, texts: list[str], *,
                 params: dict[str, Any] | None = None) -> list[list[float]]: ...


@runtime_checkable
class AgentNames(Protocol):
    """An agent's namespace as memory reads it (``kernos.agents.runtime.AgentNamespace``,
    held in the image as ``kernos:ns:NAME``): its own names without the dunders."""

    def user_items(self) -> dict[str, Any]: ...


def plain(memory: Memory) -> dict[str, Any]:
    """One memory as plain data (what agents, the harness and MCP are given)."""
    found = asdict(memory)
    found.pop("entry")
    return found


class ImageMemory:
    """The memory of one image (see the module docstring)."""

    def __init__(self, image: Image) -> None:
        self.image = image
        self._index: MemoryIndex | None = None
        self._fed: dict[tuple[str, str], str] = {}
        """(layer, principal) -> the fingerprint of what was last fed to the index."""
        self.replaying: list[dict[str, Any]] | None = None
        """Set by a replay: the recorded recalls of the op being re-run, in order."""
        self.embed: Embed | None = None
        """The runtime's embedding call, once wired (None: this runtime cannot call models)."""

    # -- the index ------------------------------------------------------------------

    def index(self) -> MemoryIndex:
        """The index, caught up with the chain (opened, or rebuilt, on first use)."""
        if self._index is None:
            self._index = MemoryIndex.open(self.image.workspace.path, self.image.audit)
            self._fed.clear()
        else:
            self._index.catch_up(self.image.audit)
        if self._index.rebuilt:  # a rebuild empties the working and semantic layers
            self._index.rebuilt = False
            self._fed.clear()
        return self._index

    def rebuild(self) -> dict[str, int]:
        """Rebuild the index from the chain and the image; entries per kind."""
        if self._index is not None:
            self._index.close()
            self._index = None
        path = self.image.workspace.path / "memory" / "index.sqlite"
        path.unlink(missing_ok=True)
        index = self.index()
        self._feed_human(index)
        for agent in self._agents():
            self._feed_agent(index, agent)
        for principal in self._fact_holders():
            self._feed_facts(index, principal)
        return index.count()

    def stats(self) -> dict[str, Any]:
        index = self.index()
        built, digest = index.built_to()
        config = self.embeddings()
        embeddings = {"on": config is not None,
                      "model": None if config is None else config.model,
                      "dimensions": None if config is None else config.dimensions,
                      "vectors": 0 if config is None else vectors.count(
                          index, config.model, config.dimensions)}
        return {"entries": index.count(), "built_to": {"index": built, "hash": digest},
                "path": str(index.path), "bytes": index.path.stat().st_size,
                "embeddings": embeddings}

    # -- the embedding config -----------------------------------------------------------

    def embeddings(self) -> EmbeddingConfig | None:
        """The embedding config the image holds (None: recall matches words only)."""
        found = self.image.system.get(CONFIG_NAME)
        return found if isinstance(found, EmbeddingConfig) else None

    def configure_embeddings(self, model: object, *, dimensions: object = None,
                             mock_response: object = None) -> dict[str, Any]:
        """Set (or, with ``model=None``, remove) the embedding config, in the running op of
        the human; returns it as a dict."""
        op = self.image.current
        if op is None or op.principal != HUMAN:
            raise UsageError("memory_embeddings() changes the image: call it from a cell (an "
                             "op of the human)")
        config = check_config(model, dimensions, mock_response)
        if config is None:
            if CONFIG_NAME in self.image.system:
                self.image.unbind(CONFIG_NAME)
                op.touch(CONFIG_NAME)
            return dict(OFF)
        self.image.bind(CONFIG_NAME, config)
        op.touch(CONFIG_NAME)
        return config.describe()

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    # -- feeding the working and semantic layers ------------------------------------------

    def _fresh(self, principal: str) -> MemoryIndex:
        index = self.index()
        self._feed_human(index)
        if principal != HUMAN:
            self._feed_agent(index, principal)
        self._feed_facts(index, principal)
        return index

    def _changed(self, layer: str, principal: str, fingerprint: str) -> bool:
        key = (layer, principal)
        if self._fed.get(key) == fingerprint:
            return False
        self._fed[key] = fingerprint
        return True

    def _feed_human(self, index: MemoryIndex) -> None:
        # Marked by what is fed, not by the head: an agent's op moves the head without
        # changing the human's names, and rewriting them all (90-160 ms for 10,000 names)
        # before every recall in a loop costs more than this digest (4 ms).
        shown = [(name, meta.type, meta.summary) for name, meta in sorted(self.image.meta.items())
                 if not name.startswith("kernos:")]
        if self._changed("working", HUMAN, _digest(shown)):
            index.sync_working(HUMAN, [WorkingItem(name=name, type=type_, preview=summary)
                                       for name, type_, summary in shown])

    def _feed_agent(self, index: MemoryIndex, agent: str) -> None:
        found = self.image.system.get(AGENT_NAMESPACE + agent)
        items = []
        if isinstance(found, AgentNames):
            for name, value in sorted(found.user_items().items())[:10_000]:
                items.append(WorkingItem(name=name, type=type(value).__name__,
                                         preview=_preview(value)))
        if self._changed("working", agent, _digest([(i.name, i.type, i.preview)
                                                    for i in items])):
            index.sync_working(agent, items)

    def _facts(self, principal: str) -> Facts | None:
        found = self.image.system.get(facts_name(principal))
        return found if isinstance(found, Facts) else None

    def _feed_facts(self, index: MemoryIndex, principal: str) -> None:
        facts = self._facts(principal)
        shown = [] if facts is None else [(f.id, f.text, f.tags, f.op, f.at) for f in facts.items]
        if self._changed("semantic", principal, _digest(shown)):
            index.sync_semantic(principal, facts)

    def _agents(self) -> list[str]:
        prefix = AGENT_NAMESPACE
        return sorted(name[len(prefix):] for name in self.image.system
                      if name.startswith(prefix))

    def _fact_holders(self) -> list[str]:
        prefix = facts_name("")
        return sorted(name[len(prefix):] for name in self.image.system
                      if name.startswith(prefix))

    # -- asking -------------------------------------------------------------------------

    def recall(self, principal: str, query: object, *, k: object = 5, kinds: object = None,
               may_read: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
        """The ``k`` best memories for ``query`` that ``principal`` may read, as plain data."""
        text, count, chosen = check_request(query, k, kinds)
        assert text is not None
        request = {"what": "recall", "principal": principal, "query": text, "k": count,
                   "kinds": chosen}
        scope = Scope(principal=principal, kinds=KINDS if chosen is None else frozenset(chosen),
                      may_read=may_read)
        return self._answer(request, scope, lambda index, meaning: index.recall(
            text, principal=principal, k=count, kinds=chosen, may_read=may_read,
            meaning=meaning))

    def context(self, principal: str, max_tokens: object, query: object = None, *,
                may_read: Callable[[str], bool] | None = None) -> str:
        """The most relevant memories (the newest, without ``query``) within ``max_tokens``."""
        from kernos.memory.context import count_tokens, render

        if type(max_tokens) is not int or not 1 <= max_tokens <= MAX_TOKENS:
            raise UsageError(f"context() takes max_tokens from 1 to {MAX_TOKENS}, not "
                             f"{str(max_tokens)[:40]!r}")
        text, _, _ = check_request(query, 5, None, query_required=False)
        request = {"what": "context", "principal": principal, "query": text,
                   "max_tokens": max_tokens}

        def ask(index: MemoryIndex, meaning: Meaning | None) -> list[Memory]:
            found = (index.recent(principal=principal, k=50) if text is None else
                     index.recall(text, principal=principal, k=50, may_read=may_read,
                                  meaning=meaning))
            chosen, used = [], 0
            for memory in found:
                cost = count_tokens(render(memory) + "\n")
                if used + cost <= max_tokens:
                    chosen.append(memory)
                    used += cost
            return chosen

        answer = self._answer(request, Scope(principal=principal, kinds=KINDS,
                                             may_read=may_read), ask)
        return "\n".join(render(Memory(entry=0, **memory)) for memory in answer)

    def _answer(self, request: dict[str, Any], scope: Scope,
                ask: Callable[[MemoryIndex, Meaning | None], list[Memory]]
                ) -> list[dict[str, Any]]:
        op = self.image.current
        if self.replaying is not None:
            answer, subjects = self._replayed(request), frozenset[str]()
        else:
            index = self._fresh(scope.principal)
            query = request.get("query")
            meaning = (self._meaning(index, scope, query)
                       if type(query) is str and query.strip() and scope.kinds else None)
            found = ask(index, meaning)
            answer = [plain(memory) for memory in found]
            subjects = frozenset(index.subjects_of(memory.entry for memory in found))
        if op is not None:
            op.recalls.append((request, json.dumps(answer, ensure_ascii=False),
                               subjects))
        return answer

    def _meaning(self, index: MemoryIndex, scope: Scope, query: str) -> Meaning | None:
        """The query's vector, when embeddings are on; first embeds up to EMBED_PER_RECALL of
        the entries ``scope`` admits that have none.  Writes nothing unless every call
        succeeded."""
        config = self.embeddings()
        if config is None:
            return None
        if self.embed is None:
            raise UsageError("embeddings are configured but this runtime cannot call models "
                             "(install kernos[llm])")
        vectors.numpy()  # before anything is paid for
        params = config.params()
        [vector] = vectors.check_vectors(
            self.embed(scope.principal, config.model, [query], params=params), 1,
            config.dimensions)
        dims = len(vector)
        pending = vectors.missing(index, scope, config.model, dims, EMBED_PER_RECALL)
        if pending:
            made = vectors.check_vectors(
                self.embed(scope.principal, config.model, [text for _, text in pending],
                           params=params), len(pending), dims)
            vectors.store(index, config.model, dims,
                          [(entry, made[n]) for n, (entry, _) in enumerate(pending)])
        return Meaning(model=config.model, dims=dims, vector=vector)

    def _replayed(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        assert self.replaying is not None
        if not self.replaying:
            raise UsageError(f"the replayed op asked memory {request['what']} "
                             f"({str(request.get('query'))[:80]!r}), which the original did "
                             "not: a replay answers only the recalls that were recorded")
        recorded = self.replaying.pop(0)
        if recorded.get("request") != request:
            raise UsageError(f"the replayed op asked memory {json.dumps(request)[:300]}, but the "
                             f"original asked {json.dumps(recorded.get('request'))[:300]}")
        answer = recorded.get("answer")
        if not isinstance(answer, list):
            raise UsageError("the original op's recall answer cannot be read any more (it held "
                             "an erased data subject's text, or its payload is missing)")
        return answer

    # -- storing --------------------------------------------------------------------------

    def remember(self, principal: str, fact: object, tags: object = ()) -> dict[str, Any]:
        """Store ``fact`` as ``principal``'s, in the running op (rolled back with it)."""
        from datetime import UTC, datetime

        from kernos import determinism

        op = self._op()
        name = facts_name(principal)
        facts = self._facts(principal)
        if facts is None:
            facts = Facts()
            self.image.bind(name, facts)
        op.touch(name)
        stamp = datetime.fromtimestamp(determinism.op_time_ns() / 1e9, UTC)
        made = remember(facts, fact, tags=tags,
                        op=op.id, at=stamp.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z")
        return {"id": made.id, "text": made.text, "tags": list(made.tags), "op": made.op,
                "at": made.at}

    def _op(self) -> Op:
        op = self.image.current
        if op is None:
            raise UsageError("remember() stores a fact in an op: call it from a cell, agent "
                             "code, or the harness action `remember`")
        return op


def _digest(fed: list[tuple[Any, ...]]) -> str:
    """What was fed to a layer, hashed (plain data: its repr is stable)."""
    return hashlib.sha256(repr(fed).encode("utf-8", "surrogatepass")).hexdigest()


def _preview(value: object) -> str:
    """A preview of plain values only (an agent's object could run code in its repr)."""
    kind = type(value)
    if kind in _PLAIN:
        return repr(value)[:PREVIEW_CHARS]
    if kind in (list, tuple, dict, set, frozenset):
        size = len(value)  # type: ignore[arg-type]
        return f"{kind.__name__} of {size}"
    return ""


def recorded_recalls(log: AuditLog, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The recalls an op's audit ``record`` holds, as :attr:`ImageMemory.replaying` takes
    them (an answer sealed for an erased subject, or whose payload is gone, is None)."""
    found: list[dict[str, Any]] = []
    for item in record.get("memory") or []:
        field = item.get("answer") if isinstance(item, dict) else None
        answer: Any = None
        if isinstance(field, dict):
            if "text" in field:
                data: bytes | None = str(field["text"]).encode("utf-8", "surrogatepass")
            else:
                data = log.payload(str(field.get("ref")))
                if data is not None and field.get("sealed"):
                    data = log.keyring.open([str(s) for s in field["sealed"]], data)
            if data is not None:
                answer = json.loads(data)
        found.append({"request": item.get("request") if isinstance(item, dict) else None,
                      "answer": answer})
    return found
