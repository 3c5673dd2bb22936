"""What an idle connection keeps alive between requests: not its last reply.

A reply model (``status``, ``history``: hundreds of small objects) that the connection's
handler kept referenced while it waited for the next request stayed alive once per idle
client; under a flood of 200 clients those were ~10 MiB of small objects spread over
allocator arenas that stayed resident afterwards (``tests/daemon/test_flood.py``).
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest

from schedswitchd.daemon import protocol as proto

from .harness import Running


def _alive(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


@pytest.mark.parametrize(
    ("op", "kind"),
    [("history", proto.HistoryReply), ("status", proto.StatusReply), ("list", proto.ListReply)],
)
def test_idle_connection_does_not_keep_its_last_reply(srv: Running, op: str, kind: type) -> None:
    clients = [srv.client() for _ in range(3)]
    try:
        for c in clients:
            assert c.request(op=op)["ok"]
        # the connections are open and idle, waiting for their next request
        assert srv.read(lambda s: len(s.connections)) == len(clients)
        assert _alive(kind) == 0
    finally:
        for c in clients:
            c.close()


def test_idle_connections_are_small_and_have_no_task(srv: Running) -> None:
    """An idle connection is its transport, its :class:`Connection` and one timer handle:
    no task, no stream objects. With asyncio's streams it was ~10.5 KB (reader, writer,
    their protocol, the handler's task, the helper tasks and futures of its idle wait), now
    ~2.8 KB (including this process's client side); 200 of them at once mapped two 1 MiB
    pymalloc arenas that stayed after the flood (tests/daemon/test_flood.py)."""
    count = 50
    warm = srv.client()
    assert warm.request(op="status")["ok"]
    warm.close()
    srv.wait_for(lambda s: not s.connections)
    tasks_before = _alive(asyncio.Task)
    tracemalloc.start()
    try:
        base = srv.read(lambda s: tracemalloc.get_traced_memory()[0])
        clients = [srv.client() for _ in range(count)]
        srv.wait_for(lambda s: len(s.connections) == count)
        gc.collect()
        per_connection = (srv.read(lambda s: tracemalloc.get_traced_memory()[0]) - base) / count
    finally:
        tracemalloc.stop()
    try:
        assert srv.read(lambda s: [c.task for c in s.connections.values()]) == [None] * count
        assert _alive(asyncio.Task) == tasks_before
        assert _alive(asyncio.StreamReader) == 0
        assert per_connection < 4096, f"{per_connection:.0f} B per idle connection"
    finally:
        for c in clients:
            c.close()
