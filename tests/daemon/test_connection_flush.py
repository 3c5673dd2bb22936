"""A connection the daemon ends while its transport still holds reply bytes the socket did
not take (``Connection._bound_flush``): its client has ``read_timeout_s`` to take them.

What it pins, on a real server over a real Unix socket (fake backend):

- a client that takes nothing is cut off once the bound passed, and not before: the
  daemon's side of its socket is closed, the replies still held are dropped, the server
  forgets the connection and its lease ends -- at the client's end of file
  (``Connection.close``) on the loop's real clock, and at its lease's own end
  (``Connection._finish``, the ``lease_ended`` line queued behind the replies) on a
  :class:`~tests.daemon.harness.FakeTimer`, to the bound's exact length;
- a client that reads within the bound gets every reply intact and in order, then a clean
  end of file, not a reset.

Each client holds a lease and sends ``list`` requests in batches, reading none of the
replies, until the daemon's socket buffer is full and its transport holds the rest -- below
the transport's high-water mark, so that no reply waits for a drain (the write timeout's
case, test_server.py) and only the flush bound can end the wait. The client's own buffers
do not matter: a Unix stream socket's bytes in flight are charged to the sender, the
daemon's socket, until they are read. (test_daemon_defects.py has the end-of-file case on a
fake timer, the connection gone after the bound; not when it goes, nor the client's side.)
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from schedswitchd.cpython_internals import unread_bytes
from schedswitchd.daemon.connection import Connection
from schedswitchd.daemon.server import Server

from .fakes import FakeBackend
from .harness import Client, FakeTimer, Running

Start = Callable[..., Running]

#: The flush bound (``read_timeout_s``) of the test whose client never reads, s: short,
#: as the test waits it out.
BOUND_S = 0.5
#: The bound of the test whose client reads, s: far longer than the client needs (a
#: fraction of a second), so that only a client stalled that long would meet it; the test
#: never waits for it.
READER_BOUND_S = 30.0
#: How long past the bound a test waits for what must follow it, s. Generous: only a
#: failing test waits it out, and a loaded 2-core host has stretched short waits by seconds.
MARGIN_S = 10.0
#: Requests sent at once while filling the socket: their replies (about 1 KB each) stay far
#: below the transport's high-water mark (64 KiB), so the batch that fills the socket
#: cannot take the transport past it.
BATCH = 16
#: Requests sent at most while filling (about 1 MB of replies): far beyond what the
#: daemon's socket takes.
MAX_REQUESTS = 1024


@pytest.fixture
def start(start_server: Start) -> Start:
    """``start(**options)``: a server on a fresh ``FakeBackend``, its poll standing still
    (only the tests' requests start reconcile passes)."""

    def make(**options: Any) -> Running:
        return start_server(FakeBackend(), poll_timer=FakeTimer(), **options)

    return make


def _line(**fields: Any) -> bytes:
    return json.dumps({"v": 1, **fields}).encode() + b"\n"


def _held(conn: Connection) -> int:
    """Bytes ``conn``'s transport holds that its socket did not take."""
    transport = conn._transport
    return transport.get_write_buffer_size() if transport is not None else 0


def _leased_client(srv: Running, **hint: Any) -> tuple[Client, int, str]:
    """A client holding a lease (``battery``, ``hint`` its further fields), its connection
    carried by asyncio's transport (past its accept's step, whose stand-in would make any
    reply the socket does not take wait for a drain): (client, connection id, lease id)."""
    c = srv.client()
    reply = c.request(op="hint", workload="battery", **hint)
    assert reply["ok"], reply
    lease: str = reply["lease"]
    srv.wait_for(
        lambda s: (
            not s.acceptor.handing_over
            and len(s.connections) == 1
            and all(
                type(conn._transport).__name__ == "_SelectorSocketTransport"
                for conn in s.connections.values()
            )
        )
    )
    conn_id: int = srv.read(lambda s: next(iter(s.connections)))
    return c, conn_id, lease


def _fill(srv: Running, c: Client, conn_id: int) -> int:
    """Send ``list`` requests (ids 0, 1, ...) in batches of :data:`BATCH`, reading none of
    the replies, until the daemon's socket is full and its transport holds the rest;
    returns how many were sent. Each batch is waited for until the daemon read all of it
    (the client's socket has nothing unread by its peer: ``SIOCOUTQ``) and no request of
    the connection waits (``list`` is answered in the step that read it), so that what the
    transport holds then is all it will hold."""

    def answered(s: Server) -> bool:
        conn = s.connections[conn_id]
        return unread_bytes(c.sock) == 0 and conn.task is None and not conn.parked

    sent = 0
    while sent < MAX_REQUESTS:
        c.send_raw(b"".join(_line(op="list", id=i) for i in range(sent, sent + BATCH)))
        sent += BATCH
        srv.wait_for(answered)
        if srv.read(lambda s: _held(s.connections[conn_id])):
            break
    held = srv.read(lambda s: _held(s.connections[conn_id]))
    assert held > 0, f"the daemon's socket took all {sent} replies"
    # Below the high-water mark: no reply waits for a drain under the write timeout, so
    # what ends the connection's wait for its client is the flush bound alone.
    assert srv.read(lambda s: not s.connections[conn_id]._paused), (
        f"{held} bytes held took the transport past its high-water mark"
    )
    return sent


def _hung_up(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the daemon's side of ``sock`` is closed, waiting up to ``timeout_s``. Reads
    nothing: ``POLLRDHUP`` / ``POLLHUP`` say the peer closed, whatever data the socket still
    holds for the client (which makes it readable long before)."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)
    events = poller.poll(round(timeout_s * 1000))
    return any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, ev in events)


def _read_to_end(c: Client) -> tuple[bytes, bool]:
    """Everything ``c`` has not read yet, up to the daemon's end of the connection, and
    whether that end was a reset (``ECONNRESET``) rather than an end of file."""
    data, c.buf = c.buf, b""
    try:
        while chunk := c.sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        return data, True
    return data, False


def _replies(data: bytes) -> list[dict[str, Any]]:
    """The whole lines of ``data``, each parsed (a JSON object each, or the test fails);
    a last line cut short is left out."""
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def _gone(conn_id: int, lease: str) -> Callable[[Server], bool]:
    """The server forgot connection ``conn_id`` and lease ``lease`` ended."""
    return lambda s: conn_id not in s.connections and lease not in s.policy.leases


def _ended_holding_replies(srv: Running) -> tuple[Client, int, str, int, float]:
    """A leased connection of ``srv`` filled with unread replies (:func:`_fill`), then its
    client's ``shutdown(SHUT_WR)``, until the daemon closed it: ``(client, connection id,
    lease, replies sent, monotonic s just before the shutdown)``. The time is taken before
    the daemon can see the end of file, so the flush bound it arms then runs from later."""
    c, conn_id, lease = _leased_client(srv)
    sent = _fill(srv, c, conn_id)
    ended = time.monotonic()
    c.sock.shutdown(socket.SHUT_WR)
    srv.wait_for(lambda s: conn_id not in s.connections or s.connections[conn_id].closing)
    return c, conn_id, lease, sent, ended


def test_a_client_that_never_takes_the_last_replies_is_cut_off_once_the_bound_passed(
    start: Start,
) -> None:
    """Requests, then ``shutdown(SHUT_WR)``, never a read: the end of file closes the
    connection while its transport holds replies; ``read_timeout_s`` later, not before,
    the daemon aborts it -- its side of the socket closed, the replies it still held
    dropped, the connection and its lease gone."""
    srv = start(read_timeout=BOUND_S)
    # Nothing of the daemon's can make the wait below shorter than the bound: the clock
    # starts before the daemon can see the end of file.
    c, conn_id, lease, sent, ended = _ended_holding_replies(srv)
    hung_up = _hung_up(c.sock, BOUND_S + MARGIN_S)
    waited = time.monotonic() - ended
    assert hung_up, f"the daemon's side still open {waited:.1f} s after the client's end"
    # asyncio runs a timer up to its clock's resolution (1 ns) early: 1 ms covers that.
    assert waited > BOUND_S - 0.001, (
        f"cut off {waited:.3f} s after the client's end, before the {BOUND_S} s bound"
    )
    srv.wait_for(_gone(conn_id, lease), timeout=MARGIN_S)
    data, _ = _read_to_end(c)  # an end of file or a reset: either is the cut
    replies = _replies(data)
    assert len(replies) < sent, f"all {sent} replies came: the transport was flushed, not cut"
    # What came is the replies' beginning, whole and in order: only the held rest was dropped.
    assert [r["id"] for r in replies] == list(range(len(replies)))
    c.close()


def test_a_client_that_reads_within_the_bound_gets_every_reply_then_the_end(
    start: Start,
) -> None:
    """The same connection, closed by the same end of file with replies held, whose client
    then reads: every reply arrives whole and in order, then an end of file (no reset); the
    connection and its lease are gone without waiting for the bound."""
    srv = start(read_timeout=READER_BOUND_S)
    # Read only once the daemon closed: then the bytes still held are the flush's.
    c, conn_id, lease, sent, ended = _ended_holding_replies(srv)
    data, reset = _read_to_end(c)
    took = time.monotonic() - ended
    replies = _replies(data)
    end = "a reset" if reset else "an end of file"
    assert len(replies) == sent, f"{len(replies)} of {sent} replies came, then {end}"
    assert not reset, f"all {sent} replies came, then a reset instead of an end of file"
    tail = data.rpartition(b"\n")[2]
    assert not tail, f"{len(tail)} bytes after the last whole line"
    assert [r["id"] for r in replies] == list(range(sent)), "replies out of order"
    assert all(r["ok"] and r["op"] == "list" for r in replies)
    assert took < READER_BOUND_S, f"reading took {took:.1f} s, past the bound"
    srv.wait_for(_gone(conn_id, lease), timeout=MARGIN_S)
    c.close()


def test_a_lease_ending_by_itself_behind_unread_replies_waits_the_bound_exactly(
    timed: Running,
) -> None:
    """The connection ended by its lease's TTL (its ``lease_ended`` line written behind the
    replies held), on a fake timer: at 0.29 s of the 0.3 s ``read_timeout_s`` its socket is
    still open and the connection kept; at 0.31 s it is cut off and forgotten, the last line
    dropped with the replies."""
    c, conn_id, lease = _leased_client(timed, ttl_s=30)
    sent = _fill(timed, c, conn_id)
    timed.advance(30)
    assert timed.read(lambda s: lease not in s.policy.leases), "the TTL did not end the lease"
    assert timed.read(lambda s: conn_id not in s.connections or s.connections[conn_id].closing), (
        "the lease's end left the connection open"
    )
    timed.advance(0.29)
    # A round trip through the loop first: an abort closes the socket a loop step later.
    assert timed.read(lambda s: conn_id in s.connections), "forgotten before the bound"
    assert not _hung_up(c.sock, 0), "cut off before the bound"
    timed.advance(0.02)
    assert _hung_up(c.sock, MARGIN_S), "the daemon's side still open after the bound"
    timed.wait_for(lambda s: conn_id not in s.connections, timeout=MARGIN_S)
    data, _ = _read_to_end(c)
    replies = _replies(data)
    assert len(replies) < sent, f"all {sent} replies came: the transport was flushed, not cut"
    assert b"lease_ended" not in data, "the last line came, though queued behind dropped replies"
    c.close()
