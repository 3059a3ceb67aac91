"""EventSubscription's bookkeeping, fed the comm messages of kernos.kernel.streams."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kernos.client import ClientClosed, KernelDied, RequestError
from kernos.client._subscription import EventSubscription


def event(seq: int, topic: str = "a.b") -> dict[str, Any]:
    return {"seq": seq, "topic": topic, "payload": {"n": seq}, "op": seq}


def batch(*seqs: int, cursor: int | None = None) -> dict[str, Any]:
    return {"v": 1, "type": "events", "events": [event(seq) for seq in seqs],
            "cursor": seqs[-1] if cursor is None else cursor}


def test_events_in_order_and_the_cursor_covers_only_what_was_handed_out() -> None:
    async def scenario() -> None:
        closed: list[str] = []
        subscription = EventSubscription("c1", 0, closed.append)
        subscription._receive("comm_msg", batch(1, 2))
        subscription._receive("comm_msg", {"v": 1, "type": "ready", "cursor": 5})
        await subscription._ready
        assert subscription.cursor == 0           # nothing handed out yet
        assert (await subscription.get())["seq"] == 1
        assert subscription.cursor == 1
        assert (await subscription.get())["seq"] == 2
        with pytest.raises(TimeoutError):
            await subscription.get(timeout=0.01)
        # The kernel moved past filtered-out events (3..5): resume from there.
        assert subscription.cursor == 5
        subscription._receive("comm_msg", batch(7, cursor=9))
        assert [event["seq"] async for event in _take(subscription, 1)] == [7]
        assert subscription.cursor == 9
        await subscription.close()
        assert closed == ["c1"]
        with pytest.raises(ClientClosed):
            await subscription.get()

    asyncio.run(scenario())


async def _take(subscription: EventSubscription, count: int):  # type: ignore[no-untyped-def]
    async for item in subscription:
        yield item
        count -= 1
        if not count:
            return


def test_iteration_ends_when_the_kernel_closes_the_comm() -> None:
    async def scenario() -> list[int]:
        subscription = EventSubscription("c1", None, lambda _comm: None)
        subscription._receive("comm_msg", {"v": 1, "type": "ready", "cursor": 3})
        assert subscription.cursor == 3
        subscription._receive("comm_msg", batch(4))
        subscription._receive("comm_close", {})
        return [event["seq"] async for event in subscription]

    assert asyncio.run(scenario()) == [4]


def test_a_refusal_and_a_death_reach_the_reader() -> None:
    async def scenario() -> None:
        closed: list[str] = []
        refused = EventSubscription("c1", 99, closed.append)
        refused._receive("comm_msg", {"v": 1, "type": "error", "error": "'since' is 99, ..."})
        with pytest.raises(RequestError, match="'since' is 99") as error:
            await refused._ready
        assert error.value.kind == "invalid" and closed == ["c1"]

        dead = EventSubscription("c2", None, closed.append)
        dead._receive("comm_msg", {"v": 1, "type": "ready", "cursor": 0})
        dead._receive("comm_msg", batch(1))
        dead._fail(KernelDied.exited(1234))
        assert (await dead.get())["seq"] == 1     # what arrived is still delivered
        with pytest.raises(KernelDied, match="1234"):
            await dead.get()

    asyncio.run(scenario())
