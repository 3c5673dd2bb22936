"""A connection's first request, answered in the loop step that accepted it.

The server accepts on its own reader of the listening socket: the connection's transport,
credentials and admission in that step, then what the client already sent is read and its
first request answered there as far as it goes without waiting. Everything else (a line
not finished yet, a request that waits, the connection's later life) is the transport's and
the connection's as before. Each test holds the server's loop while its client connects and
sends, so that the accept finds the bytes there; real sockets, a real server, the fake
backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, cast

import pytest

from schedswitchd.cpython_internals import accept_fd
from schedswitchd.daemon import acceptor as acceptor_mod
from schedswitchd.daemon import connection as connection_mod
from schedswitchd.daemon.server import Server

from .fakes import FakeBackend
from .harness import Client, FakeTimer, Running


@pytest.fixture
def started() -> Iterator[list[Running]]:
    servers: list[Running] = []
    yield servers
    for srv in servers:
        srv.stop()


def _start(started: list[Running], **options: Any) -> Running:
    srv = Running(FakeBackend(), poll_timer=FakeTimer(), **options)
    started.append(srv)
    return srv


@contextmanager
def loop_held(srv: Running) -> Iterator[None]:
    """The server's loop blocked in one callback until the block ends: what clients
    connect and send meanwhile is all there when it next looks at its sockets."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        release.wait(10)

    srv.loop.call_soon_threadsafe(hold)
    assert holding.wait(5)
    try:
        yield
    finally:
        release.set()


def _frames() -> list[str]:
    """The names of the functions on the caller's stack, innermost first."""
    names: list[str] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


def _line(**fields: Any) -> bytes:
    return json.dumps({"v": 1, **fields}).encode() + b"\n"


class Steps:
    """How each request of the server was answered: ``accept`` (its dispatch began in the
    accept's step, :meth:`Acceptor._accepted`, with no task), ``first`` (in the step that
    read the first bytes of a connection that had sent nothing at its accept,
    :meth:`Acceptor._first_bytes`), ``task`` (in a task), ``step`` (in a loop step of its
    own without a task: the transport read its line). ``transports``: the connection's
    transport's class name at each dispatch."""

    def __init__(self, srv: Running) -> None:
        self.seen: list[tuple[str, str]] = []
        self.transports: list[str] = []
        server = srv.server
        assert server is not None
        dispatch = server.dispatch

        async def recording(line: bytes, conn: Any) -> Any:
            frames = _frames()
            how = (
                "task"
                if asyncio.current_task() is not None
                else "accept"
                if "_accepted" in frames
                else "first"
                if "_first_bytes" in frames
                else "step"
            )
            self.transports.append(type(conn._transport).__name__)
            try:
                op = str(json.loads(line).get("op", "?"))
            except ValueError:
                op = "?"
            self.seen.append((op, how))
            return await dispatch(line, conn)

        server.dispatch = recording  # type: ignore[method-assign]


def _prepared(srv: Running) -> Client:
    """A client that announced gaming (held as a standby), the daemon at rest after it."""
    c = srv.client()
    assert c.request(op="prepare", workload="gaming", ttl_s=30)["ok"]
    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle and "gaming" in s.switcher.standby.entries)
    return c


def test_a_standby_hint_sent_with_the_connect_is_answered_in_the_accept_step(
    started: list[Running],
) -> None:
    """The hint, its switch on the loop (the standby hit) and its reply all happen in the
    accept's step; then the connection does nothing until its client took the reply:
    ``reply_sent`` (once) and asyncio's transport come after the client's read. The
    connection then lives on the transport: it holds the lease until its release, on a
    later line."""
    srv = _start(started, default="fifo", reply_taken_wait_s=10.0)
    intent = _prepared(srv)
    steps = Steps(srv)
    sent: list[int] = []
    server = srv.server
    assert server is not None
    reply_sent = server.reconciler.reply_sent

    def counting() -> None:
        sent.append(1)
        reply_sent()

    server.reconciler.reply_sent = counting  # type: ignore[method-assign]
    attach_frames: list[list[str]] = []

    def on_call(call: str) -> None:
        if call == "attach gaming":
            attach_frames.append(_frames())

    srv.backend.on_call = on_call
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="hint", workload="gaming"))
    readable, _, _ = select.select([c.sock], [], [], 10)
    assert readable
    time.sleep(0.05)  # the reply waits unread: the connection is parked meanwhile
    # the intent's connection, then the hint's
    assert srv.read(lambda s: (list(sent), _parked(s))) == ([], [False, True])
    assert _transport_kind(srv)[1] == "_AcceptStep"
    hint = c.recv_line()
    assert hint is not None and hint["ok"] and hint["switch"]["standby"] is True, hint
    assert hint["active"] == "gaming" and hint["desired"] == "gaming", hint
    assert steps.seen == [("hint", "accept")]
    assert attach_frames and "_accepted" in attach_frames[0], attach_frames
    srv.wait_for(lambda s: s.switcher.history[-1].finished)
    assert sent == [1]
    assert _transport_kind(srv)[1] == "_SelectorSocketTransport"
    # the lease lives with the connection, whose later lines the transport reads
    assert srv.read(lambda s: len(s.policy.leases)) == 1
    c.send_raw(_line(op="release", lease=hint["lease"]))
    release = c.recv_line()
    assert release is not None and release["ok"] and release["active"] == "fifo", release
    assert steps.seen[1] == ("release", "step")  # begun in the step that read it
    assert srv.read(lambda s: len(s.policy.leases)) == 0
    assert sent == [1]
    c.close()
    intent.close()


def _parked(server: Server) -> list[bool]:
    return [c.parked for c in server.connections.values()]


def test_errors_of_a_first_request_are_answered_in_the_accept_step(
    started: list[Running],
) -> None:
    """A malformed first line gets its error and the connection goes on; a too large one,
    and one the client ends inside (EOF), get theirs as the connection's last line."""
    srv = _start(started)
    steps = Steps(srv)
    accepted, at_accept = srv.read(lambda s: (s.acceptor.accepted, s.acceptor.first_read_at_accept))
    with loop_held(srv):
        bad = srv.client()
        bad.send_raw(b'{"v":1,"op":\n')
        big = srv.client()
        big.send_raw(b'{"v":1,"op":"status","id":"' + b"x" * 2000 + b'"}\n')
        cut = srv.client()
        cut.send_raw(b'{"v":1,"op":"sta')
        cut.sock.shutdown(socket.SHUT_WR)
    reply = bad.recv_line()
    assert reply is not None and reply["error"]["code"] == "bad_json", reply
    assert steps.seen == [("?", "accept")]
    status = bad.request(op="status")  # the connection goes on
    assert status["ok"], status
    counters = status["status"]["counters"]
    assert counters["connections_accepted"] == accepted + 3
    assert counters["first_read_at_accept"] == at_accept + 3
    reply = big.recv_line()
    assert reply is not None and reply["error"]["code"] == "too_large", reply
    assert big.recv_line() is None
    reply = cut.recv_line()
    assert reply is not None and reply["error"]["code"] == "incomplete", reply
    assert cut.recv_line() is None
    for c in (bad, big, cut):
        c.close()
    srv.wait_for(lambda s: not s.connections)


def test_a_first_line_not_finished_at_the_accept_is_read_by_the_transport(
    started: list[Running],
) -> None:
    srv = _start(started)
    steps = Steps(srv)
    with loop_held(srv):
        c = srv.client()
        c.send_raw(b'{"v":1,"op":"li')
    srv.wait_for(lambda s: len(s.connections) == 1)
    time.sleep(0.1)
    assert steps.seen == []  # nothing answered: the line goes on
    assert srv.read(lambda s: (s.acceptor.accepted, s.acceptor.first_read_at_accept)) == (1, 1)
    c.send_raw(b'st"}\n')
    reply = c.recv_line()
    assert reply is not None and reply["ok"] and reply["op"] == "list", reply
    assert steps.seen == [("list", "step")]
    c.close()


def test_a_first_request_that_waits_goes_on_in_a_task_then_the_next_line(
    started: list[Running],
) -> None:
    """``status`` waits for the kernel's state (the executor): it begins in the accept's
    step, a task answers it, then the line the client sent with it."""
    srv = _start(started)
    steps = Steps(srv)
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="status", id=1) + _line(op="list", id=2))
    first, second = c.recv_line(), c.recv_line()
    assert first is not None and first["op"] == "status" and first["id"] == 1, first
    assert second is not None and second["op"] == "list" and second["id"] == 2, second
    assert steps.seen == [("status", "accept"), ("list", "task")]
    srv.wait_for(lambda s: all(conn.task is None for conn in s.connections.values()))
    c.close()


def test_the_connection_caps_and_the_admin_reserve_hold_at_the_accept(
    started: list[Running],
) -> None:
    """Over the per-uid cap a connection is refused (``limit``, then closed) in the
    accept's step, whatever it already sent; an admin (root) gets the reserve beyond it."""
    srv = _start(started, per_uid=2, reserve=1)
    admin = os.getuid() == 0  # [auth] admin_uids = [0]
    with loop_held(srv):
        clients = [srv.client() for _ in range(4)]
        for c in clients:
            c.send_raw(_line(op="status"))
    codes = []
    for c in clients:
        reply = c.recv_line()
        assert reply is not None
        codes.append("ok" if reply["ok"] else reply["error"]["code"])
    assert codes == ["ok", "ok", "ok" if admin else "limit", "limit"], codes
    # the refusal was its last line (a reset: the server closed with the request unread)
    with contextlib.suppress(ConnectionResetError):
        assert clients[3].recv_line() is None
    for c in clients:
        c.close()


def test_a_first_hint_with_a_ttl_ends_with_lease_ended(started: list[Running]) -> None:
    srv = _start(started, timer=FakeTimer())
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="hint", workload="battery", ttl_s=5))
    hint = c.recv_line()
    assert hint is not None and hint["ok"], hint
    srv.advance(6)
    final = c.recv_line()
    assert final is not None and final["op"] == "lease_ended" and final["why"] == "ttl", final
    assert c.recv_line() is None
    c.close()


def test_accepting_pauses_when_descriptors_run_out(
    started: list[Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``EMFILE`` from accept: no busy loop on the still-readable socket; accepting resumes
    ``ACCEPT_RETRY_S`` later and the waiting client is served."""
    monkeypatch.setattr(acceptor_mod, "ACCEPT_RETRY_S", 0.3)
    srv = _start(started)
    server = srv.server
    assert server is not None
    listener = server.acceptor._listener
    assert listener is not None
    calls: list[float] = []

    class Exhausted:
        def fileno(self) -> int:
            assert listener is not None
            return listener.fileno()

        def _accept(self) -> tuple[int, Any]:  # what the accept calls (accept_fd)
            calls.append(time.monotonic())
            assert listener is not None
            if len(calls) == 1:
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return accept_fd(listener)

        def close(self) -> None:
            assert listener is not None
            listener.close()

    srv.read(lambda s: setattr(s.acceptor, "_listener", Exhausted()))
    start = time.monotonic()
    c = srv.client()
    reply = c.request(op="status")
    assert reply["ok"], reply
    assert time.monotonic() - start >= 0.25
    assert len(calls) <= 4, calls  # once refused, then the retry's accept(s)
    c.close()


def test_a_resumed_coroutine_gets_results_errors_and_cancellation() -> None:
    """``_resume`` goes on with a coroutine stepped by hand as ``await`` would have."""

    async def body(log: list[object], futs: list[asyncio.Future[int]]) -> None:
        log.append(await futs[0])
        try:
            await futs[1]
        except ValueError as exc:
            log.append(str(exc))
        await asyncio.sleep(0)  # a bare yield
        try:
            await futs[2]
        except asyncio.CancelledError:
            log.append("cancelled")
            raise

    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[int]] = [loop.create_future() for _ in range(3)]
        log: list[object] = []
        coro: Coroutine[Any, Any, None] = body(log, futs)
        first = coro.send(None)
        assert first is futs[0]
        task = loop.create_task(connection_mod._resume(cast(Any, None), coro, first))
        futs[0].set_result(7)
        await asyncio.sleep(0)
        futs[1].set_exception(ValueError("no"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return log

    assert asyncio.run(main()) == [7, "no", "cancelled"]


def test_the_server_stops_serving_its_socket_on_close() -> None:
    srv = Running(FakeBackend(), poll_timer=FakeTimer())
    path = srv.path
    srv.stop()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with pytest.raises(OSError):
        probe.connect(path)
    probe.close()
    assert Server is not None


def test_a_standby_hit_leaves_its_decision_for_the_reply(started: list[Running]) -> None:
    """``DirectSwitch.hit_decision``: what standby_hit's policy decision was (the hint's own
    lease, its scheduler), for the reply's ``desired`` without deciding again; ``None``
    when a hit's check stopped before asking the policy."""
    srv = _start(started, default="fifo")
    c = _prepared(srv)
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["switch"]["standby"] is True, hint
    hit = srv.read(lambda s: s.reconciler.direct.hit_decision)
    assert hit is not None
    decision = hit[0]
    assert decision.scheduler == "gaming"
    assert decision.lease is not None and decision.lease.id == hint["lease"]
    assert decision.why == "lease"
    c.close()


def test_a_burst_in_the_first_read_keeps_its_back_pressure(started: list[Running]) -> None:
    """Hundreds of requests in the first read, from a client that reads nothing until it
    sent them all: the accept's step answers while the socket takes the replies, then the
    rest waits for the drain in a task, as on the transport; every reply comes, in order."""
    srv = _start(started)
    steps = Steps(srv)
    count = 1000
    with loop_held(srv):
        c = srv.client()
        c.send_raw(b"".join(_line(op="list", id=i) for i in range(count)))
    srv.wait_for(lambda s: bool(steps.seen))
    time.sleep(0.2)
    taken = len(steps.seen)
    assert 0 < taken < count, taken  # not all answered into memory
    assert steps.seen[0] == ("list", "accept")
    ids = []
    for _ in range(count):
        reply = c.recv_line()
        assert reply is not None and reply["ok"], reply
        ids.append(reply["id"])
    assert ids == list(range(count))
    assert any(how == "task" for _, how in steps.seen)
    c.close()


def test_a_defect_in_the_accept_step_ends_that_connection_only(started: list[Running]) -> None:
    """A defect after the admission (here: in it, once the connection was taken): that
    connection is closed and forgotten, the server goes on."""
    srv = _start(started)
    server = srv.server
    assert server is not None
    admit = server.admit
    calls: list[int] = []

    def broken(conn: Any) -> Any:
        refusal = admit(conn)
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a defect")
        return refusal

    server.admit = broken  # type: ignore[method-assign]
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="status"))
    with contextlib.suppress(ConnectionResetError):
        assert c.recv_line() is None  # closed unanswered
    c.close()
    srv.wait_for(lambda s: not s.connections)  # forgotten, not left behind
    other = srv.client()
    assert other.request(op="status")["ok"]
    other.close()


def _transport_kind(srv: Running) -> list[str]:
    return srv.read(lambda s: [type(c._transport).__name__ for c in s.connections.values()])


def test_the_transport_takes_over_once_the_client_took_its_first_reply(
    started: list[Running],
) -> None:
    """A reply sent in the accept's step: asyncio's transport is made once its client read
    it (nothing of the daemon's runs instead of the client meanwhile), then reads the
    connection's later lines as always."""
    srv = _start(started)
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="list"))
    srv.wait_for(lambda s: len(s.connections) == 1)
    time.sleep(0.02)
    assert _transport_kind(srv) == ["_AcceptStep"]  # the reply waits unread
    reply = c.recv_line()
    assert reply is not None and reply["ok"], reply
    srv.wait_for(lambda s: not s.acceptor.handing_over)
    assert _transport_kind(srv) == ["_SelectorSocketTransport"]
    assert c.request(op="list")["ok"]
    c.close()
    srv.wait_for(lambda s: not s.connections)


def test_a_first_reply_left_unread_is_handed_over_in_time(
    started: list[Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that does not read its reply: the transport takes over after
    ``HANDOVER_WAIT_S`` anyway, and reads the connection's end."""
    monkeypatch.setattr(acceptor_mod, "HANDOVER_WAIT_S", 0.3)
    srv = _start(started)
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="list"))
    srv.wait_for(lambda s: len(s.connections) == 1)
    assert _transport_kind(srv) == ["_AcceptStep"]
    srv.wait_for(lambda s: not s.acceptor.handing_over, timeout=2)
    assert _transport_kind(srv) == ["_SelectorSocketTransport"]
    c.close()  # the reply never read
    srv.wait_for(lambda s: not s.connections)


def test_a_connection_closed_before_its_first_reply_was_read_ends_its_lease(
    started: list[Running],
) -> None:
    """A standby hint answered in the accept's step, its client gone without reading the
    reply: the lease ends with the connection."""
    srv = _start(started, default="fifo")
    intent = _prepared(srv)
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="hint", workload="gaming"))
    srv.wait_for(lambda s: len(s.policy.leases) == 1)
    assert srv.read(lambda s: bool(s.acceptor.handing_over))
    c.close()
    srv.wait_for(lambda s: not s.policy.leases and len(s.connections) == 1)  # the intent's
    intent.close()


def test_the_server_closes_connections_still_in_their_accept_step() -> None:
    srv = Running(FakeBackend(), poll_timer=FakeTimer())
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="list"))
    srv.wait_for(lambda s: bool(s.acceptor.handing_over))
    srv.stop()
    reply = c.recv_line()
    assert reply is not None and reply["ok"], reply  # its reply, then the end
    assert c.recv_line() is None
    c.close()


def test_a_hits_reply_left_unread_holds_its_connection_only_until_the_bound(
    started: list[Running],
) -> None:
    """A standby hit whose client does not read its reply: after ``reply_taken_wait_s``
    (0.3 s here) the connection goes on anyway -- the switch finishes, asyncio's transport
    takes the connection over -- and the reply is still there to read."""
    srv = _start(started, default="fifo", reply_taken_wait_s=0.3)
    intent = _prepared(srv)
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="hint", workload="gaming"))
    srv.wait_for(lambda s: any(conn.parked for conn in s.connections.values()))
    t0 = time.monotonic()
    srv.wait_for(lambda s: s.switcher.history[-1].finished and not s.acceptor.handing_over)
    assert 0.25 <= time.monotonic() - t0 < 5.0
    assert _transport_kind(srv)[1] == "_SelectorSocketTransport"
    reply = c.recv_line()
    assert reply is not None and reply["ok"] and reply["switch"]["standby"] is True, reply
    c.close()
    intent.close()


def test_the_server_closes_a_connection_waiting_for_its_client_to_take_a_reply() -> None:
    """A standby hit's connection parked while its client has not read the reply (bound
    10 s here): the server's close ends the wait at once -- the request's coroutine runs to
    its end, no task is left behind -- and the client gets its reply, then the end."""
    srv = Running(FakeBackend(), poll_timer=FakeTimer(), default="fifo", reply_taken_wait_s=10.0)
    intent = _prepared(srv)
    with loop_held(srv):
        c = srv.client()
        c.send_raw(_line(op="hint", workload="gaming"))
    srv.wait_for(lambda s: any(conn.parked for conn in s.connections.values()))
    conn = srv.read(lambda s: next(conn for conn in s.connections.values() if conn.parked))
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 5.0
    assert not conn.parked and conn.task is None and not conn._busy
    reply = c.recv_line()
    assert reply is not None and reply["ok"] and reply["switch"]["standby"] is True, reply
    assert c.recv_line() is None
    c.close()
    intent.close()


def test_connections_waiting_behind_an_answered_one_are_accepted_in_the_next_steps(
    started: list[Running],
) -> None:
    """After a connection whose reply went out in the accept's step, the accept gives the
    loop back (its client reads meanwhile); the others waiting are accepted in the steps
    after, each answered."""
    srv = _start(started)
    server = srv.server
    assert server is not None
    ready = server.acceptor._accept_ready
    steps: list[int] = []

    def counting() -> None:
        steps.append(server.acceptor.accepted)
        ready()

    srv.read(lambda s: srv.loop.remove_reader(s.acceptor._listener.fileno()))  # type: ignore[union-attr]
    srv.read(lambda s: srv.loop.add_reader(s.acceptor._listener.fileno(), counting))  # type: ignore[union-attr]
    with loop_held(srv):
        clients = [srv.client() for _ in range(5)]
        for i, c in enumerate(clients):
            c.send_raw(_line(op="list", id=i))
    srv.wait_for(lambda s: s.acceptor.accepted == 5)  # no reply read meanwhile
    for i, c in enumerate(clients):
        reply = c.recv_line()
        assert reply is not None and reply["ok"] and reply["id"] == i, reply
        c.close()
    assert steps[:5] == [0, 1, 2, 3, 4], steps  # one connection a step


@pytest.mark.parametrize(("most", "how"), [(64, "step"), (1024, "accept")])
def test_a_first_line_longer_than_one_read_is_read_on_or_left_to_the_transport(
    started: list[Running], monkeypatch: pytest.MonkeyPatch, most: int, how: str
) -> None:
    """The accept reads ``FIRST_READ_BYTES`` at a time (a page; 16 bytes here, under the
    harness's request size limit) while its reads fill their buffer, up to
    ``FIRST_READ_MAX_BYTES`` (``most``): a longer first line is answered whole, in the
    accept's step when it was read whole there, else once the transport read the rest."""
    monkeypatch.setattr(acceptor_mod, "FIRST_READ_BYTES", 16)
    monkeypatch.setattr(acceptor_mod, "FIRST_READ_MAX_BYTES", most)
    srv = _start(started)
    steps = Steps(srv)
    line = _line(op="list", id=7).replace(b"}", b" " * 200 + b"}")
    with loop_held(srv):
        c = srv.client()
        c.send_raw(line)
    reply = c.recv_line()
    assert reply is not None and reply["ok"] and reply["id"] == 7, reply
    assert steps.seen == [("list", how)], steps.seen
    assert srv.read(lambda s: s.acceptor.first_read_at_accept) == 1
    c.close()


def _accepted_waiting(srv: Running) -> Client:
    """A client connected and accepted, nothing sent yet (its line comes after the accept)."""
    accepted = srv.read(lambda s: s.acceptor.accepted)
    c = srv.client()
    srv.wait_for(lambda s: s.acceptor.accepted == accepted + 1 and len(s.acceptor._awaiting) == 1)
    return c


def test_a_hint_sent_after_the_accept_is_answered_before_the_transport_is_made(
    started: list[Running],
) -> None:
    """A launcher whose line was not there at the accept (it had not run since its
    connect): the acceptor reads its first bytes itself and the hit is answered in that
    step, on the stand-in, as at the accept; asyncio's transport is made after the client
    took the reply, and reads the connection's later lines."""
    srv = _start(started, default="fifo", reply_taken_wait_s=10.0)
    intent = _prepared(srv)
    steps = Steps(srv)
    at_accept = srv.read(lambda s: s.acceptor.first_read_at_accept)
    c = _accepted_waiting(srv)
    assert _transport_kind(srv)[1] == "_AcceptStep"
    c.send_raw(_line(op="hint", workload="gaming"))
    hint = c.recv_line()
    assert hint is not None and hint["ok"] and hint["switch"]["standby"] is True, hint
    assert steps.seen == [("hint", "first")]
    assert steps.transports == ["_AcceptStep"]
    assert srv.read(lambda s: s.acceptor.first_read_at_accept) == at_accept
    srv.wait_for(lambda s: s.switcher.history[-1].finished and not s.acceptor.handing_over)
    assert _transport_kind(srv)[1] == "_SelectorSocketTransport"
    assert srv.read(lambda s: s.acceptor._awaiting) == {}
    c.send_raw(_line(op="release", lease=hint["lease"]))
    release = c.recv_line()
    assert release is not None and release["ok"] and release["active"] == "fifo", release
    assert steps.seen[1] == ("release", "step")
    c.close()
    intent.close()
    srv.wait_for(lambda s: not s.connections)


def test_a_first_line_begun_after_the_accept_is_finished_by_the_transport(
    started: list[Running],
) -> None:
    """First bytes after the accept that are not a whole line: read by the acceptor, then
    the transport takes the connection over and reads the rest."""
    srv = _start(started)
    steps = Steps(srv)
    c = _accepted_waiting(srv)
    c.send_raw(b'{"v":1,"op":"li')
    srv.wait_for(
        lambda s: (
            [type(x._transport).__name__ for x in s.connections.values()]
            == ["_SelectorSocketTransport"]
        )
    )
    assert srv.read(lambda s: s.acceptor._awaiting) == {}
    assert steps.seen == []
    c.send_raw(b'st"}\n')
    reply = c.recv_line()
    assert reply is not None and reply["ok"] and reply["op"] == "list", reply
    assert steps.seen == [("list", "step")]
    c.close()
    srv.wait_for(lambda s: not s.connections)


def test_a_client_gone_before_its_first_bytes_is_forgotten(started: list[Running]) -> None:
    """A client that closes without sending: the acceptor's reader meets the end, and the
    transport, handed the connection, loses it."""
    srv = _start(started)
    c = _accepted_waiting(srv)
    c.close()
    srv.wait_for(lambda s: not s.connections and not s.acceptor._awaiting)


def test_a_connection_whose_transport_cannot_be_made_is_dropped(
    started: list[Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A defect in the hand-over after the first bytes (asyncio's transport not made): the
    connection is closed and forgotten, not left on the stand-in for ever."""
    srv = _start(started)
    c = _accepted_waiting(srv)

    def failing(*args: object) -> object:
        raise RuntimeError("no transport")

    monkeypatch.setattr(acceptor_mod, "make_socket_transport", failing)
    c.send_raw(b'{"v":1,"op":"li')  # not a whole line: handed over at once
    srv.wait_for(lambda s: not s.connections and not s.acceptor._awaiting)
    assert c.recv_line() is None
    c.close()
    # the same at the accept: a first line begun, handed over in the accept's step
    with loop_held(srv):
        at_accept = srv.client()
        at_accept.send_raw(b'{"v":1,"op":"li')
    srv.wait_for(lambda s: s.acceptor.accepted == 2 and not s.connections)
    assert at_accept.recv_line() is None
    at_accept.close()


def test_a_connection_silent_since_its_accept_gets_the_idle_timeout(
    started: list[Running],
) -> None:
    """The idle timeout of a connection whose first bytes are waited for: its error line,
    then the end (the transport, made for it, sends and closes)."""
    timer = FakeTimer()
    srv = _start(started, timer=timer)
    c = _accepted_waiting(srv)
    srv.advance(31.0)
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "timeout", reply
    assert c.recv_line() is None
    srv.wait_for(lambda s: not s.connections and not s.acceptor._awaiting)
    c.close()


def test_the_acceptor_closing_hands_connections_waiting_for_their_first_bytes_over() -> None:
    """The acceptor's close gives a connection still waiting for its first bytes to
    asyncio's transport, which serves it on; the server's stop then ends it."""
    srv = Running(FakeBackend(), poll_timer=FakeTimer())
    try:
        c = _accepted_waiting(srv)
        srv.read(lambda s: s.acceptor.close())
        assert srv.read(lambda s: s.acceptor._awaiting) == {}
        assert _transport_kind(srv) == ["_SelectorSocketTransport"]
        assert c.request(op="list")["ok"]
    finally:
        srv.stop()
    assert c.recv_line() is None
    c.close()
