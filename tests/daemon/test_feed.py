"""The change feed: fan-out in order, bounded queues that drop a slow subscriber without
holding back the publisher or the others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from schedswitchd.daemon.feed import Change, ChangeFeed, Subscription


def test_every_subscriber_gets_every_change_in_order() -> None:
    async def run() -> None:
        feed = ChangeFeed(clock=lambda: 5.0)
        a, b = feed.subscribe(), feed.subscribe()
        feed.publish("override", override="vtime", why="admin")
        feed.publish("lease_added", lease="1-ab", workload="gaming", uid=0, pid=None)
        for sub in (a, b):
            first, second = await sub.get(), await sub.get()
            assert first is not None and second is not None
            assert (first.seq, first.kind, first.time) == (1, "override", 5.0)
            assert first.fields == {"override": "vtime", "why": "admin"}
            assert (second.seq, second.kind) == (2, "lease_added")
        late = feed.subscribe()  # only what comes after its subscription
        feed.publish("switch", previous="kernel", target="vtime", ok=True)
        got = await late.get()
        assert got is not None and got.seq == 3

    asyncio.run(run())


def test_a_full_queue_drops_that_subscriber_only() -> None:
    async def run() -> None:
        feed = ChangeFeed()
        slow, fast = feed.subscribe(maxsize=2), feed.subscribe(maxsize=10)
        for i in range(3):
            feed.publish("override", override=None, why=str(i))
        assert slow.dropped and slow.closed and not fast.dropped
        assert feed.subscribers == 1 and feed.dropped == 1
        assert await slow.get() is None  # a dropped subscriber's queue is discarded
        assert [c.fields["why"] async for c in _take(fast, 3)] == ["0", "1", "2"]

    asyncio.run(run())


async def _take(sub: Subscription, n: int) -> AsyncIterator[Change]:
    for _ in range(n):
        change = await sub.get()
        assert change is not None
        yield change


def test_close_wakes_a_waiting_reader_and_ends_iteration() -> None:
    async def run() -> None:
        feed = ChangeFeed()
        sub = feed.subscribe()
        seen: list[str] = []

        async def read() -> None:
            async for change in sub:
                seen.append(change.kind)

        task = asyncio.create_task(read())
        await asyncio.sleep(0)
        feed.publish("ejection", scheduler="fifo")
        await asyncio.sleep(0)
        sub.close()
        await asyncio.wait_for(task, 1)
        assert seen == ["ejection"] and feed.subscribers == 0

    asyncio.run(run())


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown change kind"):
        ChangeFeed().publish("reboot")
