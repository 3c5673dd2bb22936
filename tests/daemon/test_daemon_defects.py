"""The daemon's defences against its peers and its inputs: a connection's life is bounded
whatever the client does, a status shows others' leases only as counts, and so on."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from schedswitchd.daemon.server import Server

from .harness import FakeTimer, Running


@pytest.fixture
def timed() -> Iterator[Running]:
    """Timeouts on a :class:`FakeTimer`: read timeout 0.3 s, idle timeout 0.4 s."""
    running = Running(timer=FakeTimer(), read_timeout=0.3, idle_timeout=0.4)
    yield running
    running.stop()


def test_a_client_that_shuts_its_side_and_never_reads_is_let_go(timed: Running) -> None:
    """Requests, then ``shutdown(SHUT_WR)``, never a read: the replies the socket did not
    take wait in the transport below its high-water mark, then the end of file closes the
    connection; the close's flush is bounded by ``read_timeout_s`` as any reply is, so
    the connection's slot is freed."""
    c = timed.client()
    timed.wait_for(lambda s: len(s.connections) == 1)

    def held(s: Server) -> int:
        transport = next(iter(s.connections.values()))._transport
        return transport.get_write_buffer_size() if transport is not None else 0

    for _ in range(100):  # batches of 20 replies (~12 KB) until the socket is full
        c.send_raw(b'{"v":1,"op":"status"}\n' * 20)
        timed.wait_for(lambda s: all(not conn._busy for conn in s.connections.values()))
        if timed.read(held):
            break
    assert timed.read(held), "the socket took every reply"
    assert timed.read(lambda s: not any(conn._paused for conn in s.connections.values()))
    c.sock.shutdown(socket.SHUT_WR)
    timed.wait_for(lambda s: all(conn.closing for conn in s.connections.values()))
    timed.advance(0.31)
    timed.wait_for(lambda s: not s.connections)
    c.close()
