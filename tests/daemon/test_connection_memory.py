"""What an idle connection keeps alive between requests (issue 14.10): not its last reply.

A reply model (``status``, ``history``: hundreds of small objects) that the connection's
handler kept referenced while it waited for the next request stayed alive once per idle
client; under a flood of 200 clients those were ~10 MiB of small objects spread over
allocator arenas that stayed resident afterwards (``tests/daemon/test_flood.py``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from schedswitchd.daemon import protocol as proto

from .harness import Running


@pytest.fixture
def srv() -> Iterator[Running]:
    running = Running()
    yield running
    running.stop()


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
