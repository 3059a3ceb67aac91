"""LangGraph on Kernos: a checkpointer whose every checkpoint is an op of a principal.

Install with ``pip install 'kernos[langgraph]'``.  :class:`KernosSaver` is a
``BaseCheckpointSaver`` (sync and async) that talks to a real Kernos kernel
through ``kernos.client``::

    from langgraph.graph import StateGraph
    from kernos.client import KernosClient
    from kernos.integrations.langgraph import KernosSaver

    with KernosClient.start("./ws") as kernos:
        saver = KernosSaver(kernos, principal="graph")
        saver.setup()                                  # adds the agent if missing
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})

What maps to what (the kernel's side is ``kernos.harness.checkpoint_requests``):

* a **thread** of the saver's *principal* is held in the image in a few
  names, its pages (``kernos:langgraph:PRINCIPAL:THREAD:N``), as plain data:
  the serializer's ``(type, bytes)`` for each checkpoint (without its channel
  values), for each channel value at each version, and for each pending write,
  and each checkpoint's metadata and channel versions as JSON data.  The kernel
  never decodes the bytes; the saver's ``serde`` (LangGraph's
  ``JsonPlusSerializer`` unless given) does, here;
* ``put`` (the checkpoint with the values of the channels it changed),
  ``put_writes`` (one task's writes), ``delete_thread``, ``copy_thread``,
  ``prune`` and ``delete_for_runs`` are **one op each** of the principal: it
  commits whole or not at all, so a rollback or a ``kill -9`` (of the graph's
  process or of the kernel) never leaves half a checkpoint; it shows in
  ``kernos log`` as a change of the thread's last page by the principal (note
  ``langgraph put THREAD step N``), and has its audit record (the ids and
  sizes, never the bytes);
* ``get_tuple`` and ``list`` are reads: no op, as ``objects`` is;
* a put carries the changed channels only, and re-stores only the thread's
  last page (at most 256 entries or 1 MiB, then a new page begins), so its cost
  follows the checkpoint, not the thread's age: put + put_writes took the same
  time at 1,000 checkpoints as at 10 (medians, 10 then 1,000: in-process 4.1
  and 5.3 ms, through a real kernel 17.7 and 17.2 ms, on a loaded 2-core machine).

The principal.  ``principal`` (default ``"graph"``) owns the threads: another
principal's saver cannot see them, and agent code cannot reach a ``kernos:``
name at all.  A thread is the principal's own state, like its namespace, so
no grant is needed; an agent's ops pass its circuit breaker, so its policies
bound the graph (``iterations`` caps its steps, ``wall_seconds`` its time).
:meth:`KernosSaver.setup` adds the agent if the image has none of that name (an
op by the human, as ``add_agent`` always is); nothing else creates principals.
``principal="human"`` is allowed (no breaker applies then).

External effects.  LangGraph re-runs, on resume, the task that was running when
the process died.  An effect that must happen once goes through a Kernos op
keyed by :func:`task_key` (``client.op(..., key=task_key(config))``,
``client.append_file(..., key=task_key(config))``): the re-run's op is answered
as a duplicate of the committed one and does nothing again.

Clients and loops.  ``client`` is a blocking :class:`~kernos.client.KernosClient`
(usable from any thread and any event loop; the async methods run its calls in a
worker thread) or an :class:`~kernos.client.AsyncKernosClient`, whose requests
run on the loop that made it: the async methods from another loop hand them
over to it, and the sync methods (``graph.invoke``) may be called from any other
thread, but not from that loop's own thread (they would wait for themselves:
use ``ainvoke`` there), as LangGraph's own async savers do.

Lifecycle.  ``delete_thread`` removes a thread; ``copy_thread`` adds the
source's checkpoints and writes to the target (keeping what the target already
holds under the same ids); ``prune(strategy="keep_latest")`` keeps the latest
checkpoint of each namespace with its writes and the channel values it reads
(``"delete"`` removes all); ``delete_for_runs`` removes the checkpoints whose
metadata's ``run_id`` is listed, with their writes.  Like LangGraph's own savers,
prune does not keep the ancestors a ``DeltaChannel`` (beta) would replay.  What
these remove leaves the image, not the history: earlier snapshots still hold it.

Versions are strings (``"0000...0001.0.123..."``, as LangGraph's in-memory and
Postgres savers make them).  Metadata must be JSON data (it is filtered by the
kernel); a value that is not is refused before anything is sent, naming it.  A
put is one request, at most ``KERNOS_MAX_SOURCE_BYTES`` (4 MiB) with its
base64: a bigger one is refused (``RequestError`` of kind ``oversized``) and
nothing is stored.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as missing:
    raise ImportError(
        "kernos.integrations.langgraph needs LangGraph (the langgraph and "
        "langgraph-checkpoint packages), an optional extra: pip install 'kernos[langgraph]' "
        f"(the import failed: {missing})") from missing

from kernos.errors import UsageError

from ._kernel import Client, Kernel

__all__ = ["DEFAULT_PRINCIPAL", "KernosSaver", "task_key"]

DEFAULT_PRINCIPAL = "graph"
MAX_KEY_CHARS = 200
LIST_PAGE = 100
"""A thread's ``list`` asks the kernel for this many checkpoints at a time (the next
ones, lazily, as the caller iterates), so no reply holds a long history whole."""
"""The longest idempotency key the kernel takes (``kernos.harness.protocol``)."""

_TIEBREAK = random.Random()
"""A generator of the saver's own: a version's tiebreak never draws from (nor moves) the
process's global one, which a notebook may have seeded (Kernos keeps it in the image)."""


def task_key(config: RunnableConfig, label: str = "") -> str:
    """An idempotency key for an effect of the running LangGraph task (a node's call).

    Give it to the Kernos op that makes the effect (``key=``): the task a resume runs
    again has the same thread, namespace and task id, so its op is answered as a
    duplicate and the effect is not made twice.  ``label`` tells apart several
    effects of one task.  Raises :class:`UsageError` outside a task.
    """
    configurable = (config or {}).get("configurable") or {}
    task = configurable.get("__pregel_task_id")
    thread = configurable.get("thread_id")
    if not task or thread is None:
        raise UsageError("task_key(config) needs the config of a running LangGraph task "
                         "(a node's `config` argument), which names its thread and task id")
    ns = configurable.get("checkpoint_ns", "")
    key = f"langgraph:{thread}:{ns}:{task}" + (f":{label}" if label else "")
    if len(key) <= MAX_KEY_CHARS:
        return key
    return "langgraph:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KernosSaver(BaseCheckpointSaver[str]):
    """LangGraph's checkpointer over a Kernos kernel (see the module docstring).

    ``KernosSaver(client, principal="graph", serde=None)``: ``client`` is a
    :class:`KernosClient` or an :class:`AsyncKernosClient`; ``principal`` owns the
    threads (an agent of the image, see :meth:`setup`, or ``"human"``).
    """

    def __init__(self, client: Client, *, principal: str = DEFAULT_PRINCIPAL,
                 serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        if not isinstance(principal, str) or not principal:
            raise UsageError(f"principal names who owns the checkpoints (an agent, or "
                             f"'human'), not {principal!r:.80}")
        self.principal = principal
        self._kernel = Kernel(client, owner="a KernosSaver", async_way="graph.ainvoke")

    @property
    def client(self) -> Client:
        """The Kernos client the saver sends through (nodes may use it for their ops)."""
        return self._kernel.client

    # -- setting up -----------------------------------------------------------------------

    def setup(self) -> None:
        """Add the principal as an agent of the image if it has none of that name."""
        if self.principal != "human" and self.principal not in self._kernel.request(
                "agents")["agents"]:
            self._kernel.request("add_agent", agent=self.principal)

    async def asetup(self) -> None:
        """:meth:`setup`, async."""
        if self.principal != "human" and self.principal not in (
                await self._kernel.arequest("agents"))["agents"]:
            await self._kernel.arequest("add_agent", agent=self.principal)

    # -- sync ---------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = self._kernel.request("checkpoint_get", **self._get_fields(config))
        return self._tuple(found["checkpoint"])

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        fields = self._list_fields(config, filter, before, limit)
        while True:
            records = self._kernel.request("checkpoint_list", **_page(fields))["checkpoints"]
            yield from self._listed(records)
            if not _next_page(fields, records):
                return

    def put(self, config: RunnableConfig, checkpoint: Checkpoint,
            metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        fields = self._put_fields(config, checkpoint, metadata, new_versions)
        self._kernel.request("checkpoint_put", **fields)
        return _config(fields["thread"], fields["ns"], checkpoint["id"])

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        self._kernel.request("checkpoint_writes",
                             **self._writes_fields(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._kernel.request("checkpoint_delete", principal=self.principal,
                             thread=_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._kernel.request("checkpoint_delete_runs", principal=self.principal,
                             runs=_strings("run_ids", run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._kernel.request("checkpoint_copy", principal=self.principal,
                             source=_thread(source_thread_id),
                             target=_thread(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._kernel.request("checkpoint_prune", principal=self.principal,
                             threads=_strings("thread_ids", thread_ids), strategy=strategy)

    # -- async --------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = await self._kernel.arequest("checkpoint_get", **self._get_fields(config))
        return self._tuple(found["checkpoint"])

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        fields = self._list_fields(config, filter, before, limit)
        while True:
            records = (await self._kernel.arequest("checkpoint_list",
                                                   **_page(fields)))["checkpoints"]
            for listed in self._listed(records):
                yield listed
            if not _next_page(fields, records):
                return

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        fields = self._put_fields(config, checkpoint, metadata, new_versions)
        await self._kernel.arequest("checkpoint_put", **fields)
        return _config(fields["thread"], fields["ns"], checkpoint["id"])

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._kernel.arequest("checkpoint_writes",
                                    **self._writes_fields(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._kernel.arequest("checkpoint_delete", principal=self.principal,
                                    thread=_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._kernel.arequest("checkpoint_delete_runs", principal=self.principal,
                                    runs=_strings("run_ids", run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._kernel.arequest("checkpoint_copy", principal=self.principal,
                                    source=_thread(source_thread_id),
                                    target=_thread(target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *,
                     strategy: str = "keep_latest") -> None:
        await self._kernel.arequest("checkpoint_prune", principal=self.principal,
                                    threads=_strings("thread_ids", thread_ids),
                                    strategy=strategy)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The next channel version, as LangGraph's own savers make it (a string)."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:032}.{_TIEBREAK.random():016}"

    # -- to and from the kernel's shapes ------------------------------------------------

    def _get_fields(self, config: RunnableConfig) -> dict[str, Any]:
        configurable = _configurable(config)
        return {"principal": self.principal, "thread": _thread(configurable.get("thread_id")),
                "ns": configurable.get("checkpoint_ns", "") or None,
                "checkpoint_id": get_checkpoint_id(config)}

    def _list_fields(self, config: RunnableConfig | None, filter: dict[str, Any] | None,
                     before: RunnableConfig | None, limit: int | None) -> dict[str, Any]:
        fields: dict[str, Any] = {"principal": self.principal, "filter": None,
                                  "limit": limit}
        if config is not None:
            configurable = _configurable(config)
            fields["thread"] = _thread(configurable.get("thread_id"))
            fields["ns"] = configurable.get("checkpoint_ns")
            fields["checkpoint_id"] = get_checkpoint_id(config)
        if filter:
            fields["filter"] = _json("filter", filter)
        if before is not None:
            fields["before"] = get_checkpoint_id(before)
        if limit is not None and (type(limit) is not int or limit < 0):
            raise UsageError(f"list(limit=...) is an int >= 0 or None, not {limit!r:.40}")
        return fields

    def _put_fields(self, config: RunnableConfig, checkpoint: Checkpoint,
                    metadata: CheckpointMetadata,
                    new_versions: ChannelVersions) -> dict[str, Any]:
        configurable = _configurable(config)
        thread = _thread(configurable.get("thread_id"))
        ns = configurable.get("checkpoint_ns", "") or ""
        stored = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values", {})  # type: ignore[assignment]
        kind, data = self.serde.dumps_typed(stored)
        blobs = []
        for channel, version in new_versions.items():
            typed = self.serde.dumps_typed(values[channel]) if channel in values else (
                "empty", b"")
            blobs.append([channel, version, typed[0], _b64(typed[1])])
        return {"principal": self.principal, "thread": thread, "ns": ns, "blobs": blobs,
                "checkpoint": {
                    "id": checkpoint["id"], "parent": configurable.get("checkpoint_id"),
                    "type": kind, "data": _b64(data),
                    "metadata": _json("metadata", get_serializable_checkpoint_metadata(
                        config, metadata)),
                    "versions": _json("channel_versions", checkpoint["channel_versions"])}}

    def _writes_fields(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                       task_id: str, task_path: str) -> dict[str, Any]:
        configurable = _configurable(config)
        checkpoint_id = configurable.get("checkpoint_id")
        if not checkpoint_id:
            raise UsageError("put_writes needs the config of a stored checkpoint (its "
                             "'checkpoint_id'), as put returns it")
        items = []
        for index, (channel, value) in enumerate(writes):
            kind, data = self.serde.dumps_typed(value)
            items.append([WRITES_IDX_MAP.get(channel, index), channel, kind, _b64(data)])
        return {"principal": self.principal, "thread": _thread(configurable.get("thread_id")),
                "ns": configurable.get("checkpoint_ns", "") or None,
                "checkpoint_id": checkpoint_id, "task_id": task_id,
                "task_path": task_path or None, "writes": items}

    def _listed(self, records: Sequence[dict[str, Any]]) -> Iterator[CheckpointTuple]:
        return (listed for listed in map(self._tuple, records) if listed is not None)

    def _tuple(self, record: dict[str, Any] | None) -> CheckpointTuple | None:
        if record is None:
            return None
        thread, ns = record["thread"], record["ns"]
        checkpoint: Checkpoint = self.serde.loads_typed((record["type"],
                                                         _bytes(record["data"])))
        checkpoint["channel_values"] = {
            channel: self.serde.loads_typed((kind, _bytes(data)))
            for channel, kind, data in record["blobs"]}
        parent = record["parent"]
        return CheckpointTuple(
            config=_config(thread, ns, record["id"]), checkpoint=checkpoint,
            metadata=record["metadata"],
            parent_config=_config(thread, ns, parent) if parent else None,
            pending_writes=[(task, channel, self.serde.loads_typed((kind, _bytes(data))))
                            for task, channel, kind, data in record["writes"]])


def _page(fields: dict[str, Any]) -> dict[str, Any]:
    """The next request of a listing: a thread's in pages of :data:`LIST_PAGE`."""
    if fields.get("thread") is None:
        return fields  # across threads, a copied checkpoint's id is in two: one request
    limit = fields["limit"]
    return {**fields, "limit": LIST_PAGE if limit is None else min(limit, LIST_PAGE)}


def _next_page(fields: dict[str, Any], records: list[dict[str, Any]]) -> bool:
    """Move ``fields`` past ``records`` (newest first); whether there may be more."""
    if fields.get("thread") is None or len(records) < LIST_PAGE:
        return False
    if fields["limit"] is not None:
        fields["limit"] -= len(records)
        if fields["limit"] <= 0:
            return False
    fields["before"] = records[-1]["id"]
    return True


def _config(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                             "checkpoint_id": checkpoint_id}}


def _configurable(config: RunnableConfig) -> dict[str, Any]:
    configurable = (config or {}).get("configurable")
    if not isinstance(configurable, dict):
        raise UsageError("a LangGraph config has a 'configurable' dict naming the "
                         "'thread_id': {'configurable': {'thread_id': 't-1'}}")
    return configurable


def _thread(thread: object) -> str:
    if isinstance(thread, int) and not isinstance(thread, bool):
        thread = str(thread)  # LangGraph accepts numbers as thread ids
    if not isinstance(thread, str) or not thread:
        raise UsageError(f"a thread id is a non-empty string, not {thread!r:.80}; pass "
                         "{'configurable': {'thread_id': 't-1'}}")
    return thread


def _strings(what: str, values: Sequence[str]) -> list[str]:
    if isinstance(values, str) or not all(isinstance(value, str) for value in values):
        raise UsageError(f"{what} is a list of strings, not {values!r:.80}")
    return list(values)


def _json(what: str, value: Any) -> Any:
    """``value`` as JSON data (tuples become lists), or UsageError naming what is not."""
    def refuse(found: object) -> None:
        raise UsageError(f"the checkpoint's {what} must be JSON data (the kernel filters "
                         f"on it); it holds a {type(found).__name__}: {found!r:.80}")

    try:
        return json.loads(json.dumps(value, default=refuse, allow_nan=False))
    except ValueError as error:  # NaN or an infinity
        raise UsageError(f"the checkpoint's {what} must be JSON data: {error}") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))
