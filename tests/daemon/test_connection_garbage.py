"""A closed connection leaves no reference cycle: reference counting frees its objects at
once, so the daemon needs no collection of closed connections (which held the event loop,
and a hint that came meanwhile, for all of its walk).

Each test ends connections of one kind with the cyclic collector off, then asks the
collector (``gc.DEBUG_SAVEALL``) what only it could have freed: none of it may be a
connection's object."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from schedswitchd.daemon.connection import Connection
from schedswitchd.daemon.passed_fds import PassingSocket
from schedswitchd.daemon.peer import Peer

from .fakes import FakeBackend
from .harness import FakeTimer, Running

Start = Callable[..., Running]

#: The types a connection is made of: its own, its socket, its peer, asyncio's transports.
CONNECTION_TYPES: tuple[type, ...] = (Connection, PassingSocket, Peer, asyncio.BaseTransport)

HINT = b'{"v":1,"op":"hint","workload":"gaming"}\n'
STATUS = b'{"v":1,"op":"status"}\n'


@pytest.fixture
def start(start_server: Start) -> Start:
    """``start(**options)``: a server on a fresh ``FakeBackend``, its poll standing still."""

    def make(**options: Any) -> Running:
        return start_server(FakeBackend(), poll_timer=FakeTimer(), **options)

    return make


@pytest.fixture
def cycles() -> Iterator[Callable[[], list[str]]]:
    """Collector off for the test; the returned call lists the connection objects that only
    a collection would free (``type name`` each), and clears what it found."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()

    def left_in_cycles() -> list[str]:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            found = [type(o).__qualname__ for o in gc.garbage if isinstance(o, CONNECTION_TYPES)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        return found

    try:
        yield left_in_cycles
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


def _exchange(path: str, data: bytes) -> dict[str, Any]:
    """Connect, send ``data``, read one reply line, close."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(data)
        with s.makefile("rb") as f:
            reply: dict[str, Any] = json.loads(f.readline())
    return reply


def _all_closed(srv: Running) -> None:
    srv.wait_for(lambda s: not s.connections and not s.acceptor.handing_over)
    # asyncio calls connection_lost a loop step after the close; let those steps run.
    srv.read(lambda s: None)
    srv.read(lambda s: None)


def test_requests_answered_then_closed_leave_no_cycle(
    start: Start, cycles: Callable[[], list[str]]
) -> None:
    """Status (its reply taken, the connection handed to asyncio's transport), a malformed
    line and an unknown operation (error replies), each on a connection of its own."""
    srv = start(default="fifo")
    for line in (STATUS, b"{not json\n", b'{"v":1,"op":"nope"}\n', STATUS):
        _exchange(srv.path, line)
    _all_closed(srv)
    assert cycles() == []


def test_a_standby_hit_and_a_switching_hint_leave_no_cycle(
    start: Start, cycles: Callable[[], list[str]]
) -> None:
    """A standby hit (its reply parked until the client took it) and a hint switched by a
    pass, each ended by its client's close (which ends its lease)."""
    srv = start(default="fifo")
    c = srv.client()
    assert c.request(op="prepare", workload="gaming", ttl_s=30)["ok"]
    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle and "gaming" in s.switcher.standby.entries)
    assert _exchange(srv.path, HINT)["switch"]["standby"] is True
    srv.wait_for(lambda s: s.reconciler.idle and not s.reconciler.direct.active)
    srv.passes(1)
    assert _exchange(srv.path, b'{"v":1,"op":"hint","workload":"video-call"}\n')["ok"]
    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle)
    c.close()
    _all_closed(srv)
    assert cycles() == []


def test_connections_ended_without_a_whole_request_leave_no_cycle(
    start: Start, cycles: Callable[[], list[str]]
) -> None:
    """A client that connects and closes at once, one that closes inside a line, one whose
    line comes after the accept, and one the daemon ends for sending nothing (its idle
    timeout)."""
    srv = start(default="fifo", idle_timeout=0.3)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(srv.path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(srv.path)
        s.sendall(b'{"v":1,"op":"sta')
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(srv.path)
        srv.wait_for(lambda sv: sv.acceptor.accepted >= 3)  # accepted before its line came
        s.sendall(STATUS)
        assert json.loads(s.makefile("rb").readline())["ok"] is True
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(srv.path)
        deadline = time.monotonic() + 10
        while s.recv(4096) and time.monotonic() < deadline:  # the daemon's last line, then EOF
            pass
    _all_closed(srv)
    assert cycles() == []


def test_a_refused_connection_leaves_no_cycle(
    start: Start, cycles: Callable[[], list[str]]
) -> None:
    """A client over the connection cap, refused at its accept."""
    srv = start(default="fifo", max_conn=1, reserve=0)
    held = srv.client()
    assert held.request(op="status")["ok"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(srv.path)  # refused at the accept, before it could send anything
        refused = json.loads(s.makefile("rb").readline())
    assert refused["ok"] is False and refused["error"]["code"] == "limit"
    held.close()
    _all_closed(srv)
    assert cycles() == []


def test_a_watcher_leaves_no_cycle(start: Start, cycles: Callable[[], list[str]]) -> None:
    """A client watching the daemon's changes (``watch``), one change streamed to it, then
    gone: its subscription ends with it."""
    srv = start(default="fifo")
    watcher = srv.client()
    assert watcher.request(op="watch")["op"] == "watch"
    c = srv.client()
    assert c.request(op="hint", workload="gaming")["ok"]
    srv.passes(1)
    assert watcher.recv_line() is not None
    watcher.close()
    c.close()
    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle)
    _all_closed(srv)
    assert cycles() == []
