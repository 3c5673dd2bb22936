"""One client connection of the daemon's socket: line framing, timeouts, back-pressure.

Each accepted connection is one :class:`Connection`, an :class:`asyncio.Protocol` with
``__slots__`` on asyncio's socket transport, which the server's own accept makes
(:meth:`Acceptor._accepted <schedswitchd.daemon.acceptor.Acceptor._accepted>`). It splits what
the transport delivers into ``\\n``-terminated request lines itself and keeps its timeouts
as timer handles, so an idle connection costs the transport, this object and one timer
handle. A request is answered in the loop step that read its line, as far as it goes
without waiting (a standby hit, a malformed line: all of it); a task goes on with it only
from its first wait, so a task exists only while a request waits for something, and a
standby hit's reply waits for no extra loop step (docs/performance.md, "Standby hit").
asyncio's streams cost several objects per connection instead (stream reader, writer, their
protocol, the handler's task and the helper tasks and futures of each wait), which a flood
of clients turned into pymalloc arenas that stayed mapped after it (docs/performance.md,
"Memory").

The rules, per connection (limits from ``[limits]``):

- the idle timeout (``idle_timeout_s``) runs from the end of the previous request, or from
  the accept, while the connection holds no lease; blank lines are not requests and do not
  reset it;
- a begun request (its first byte that is not a blank line's ``\\n``) must end with its
  ``\\n`` within ``read_timeout_s``, and be at most ``max_message_bytes`` long;
- one request is answered at a time, in order; what a client sends meanwhile waits in the
  buffer, and reading pauses while that holds more than a request can be;
- a reply the client does not take within ``read_timeout_s`` cuts the connection off;
- after a reply a switch released while it goes on (``early_reply``: a hint answered the
  moment the kernel runs its scheduler), the connection does nothing more -- in that loop
  step or after it -- until its client took the reply from the socket, at most
  ``reply_taken_wait_s`` (:meth:`ConnectionOwner.reply_taken_wait_s`); then it tells the
  owner (``reply_sent``), which lets the switch go on. On a machine with few cores what
  the daemon did right after the write ran instead of the client reading
  (docs/performance.md, "Standby hit");
- an end of file inside a request gets ``incomplete``; a too long line ``too_large``; a
  timeout ``timeout``; each is the connection's last line. So is the
  :class:`~schedswitchd.daemon.protocol.LeaseEnded` sent when the connection's last lease
  ended on its own (:meth:`Connection.end_with`).

Time: every timeout is armed on the owner's :class:`~schedswitchd.daemon.timer.Timer`, which
is the event loop (``loop.time()``, seconds on the monotonic clock; ``loop.call_at``) unless a
test gives one it moves by hand.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Protocol, cast

from schedswitchd.cpython_internals import release_transport, unread_bytes
from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.config import Config
from schedswitchd.daemon.launcher_wire import LIMIT
from schedswitchd.daemon.peer import Peer, peer_of
from schedswitchd.daemon.reply_gate import give_way
from schedswitchd.daemon.timer import Cancellable, Timer

if TYPE_CHECKING:
    from schedswitchd.daemon.feed import Subscription
    from schedswitchd.daemon.passed_fds import PassingSocket

log = logging.getLogger("schedswitchd")

#: A connection's peer until its credentials are read at the accept.
_UNKNOWN = Peer(-1, -1, -1, frozenset())
# Which timeout the connection's one timer handle stands for.
_NONE, _IDLE, _READ, _WRITE, _FLUSH = range(5)

#: How often a connection that wrote a reply its switch released looks whether its client
#: took it (``SIOCOUTQ``), s; the first look is one interval after the write, when the
#: client has had the CPU.
REPLY_TAKEN_POLL_S = 0.002
#: How long it waits for that at most, s (the default of ``Server(reply_taken_wait_s=...)``):
#: a client that reads at once (any machine with a core to spare) is not waited for; one
#: that never reads holds its switch no longer than this.
REPLY_TAKEN_WAIT_S = 0.05


class ConnectionOwner(Protocol):
    """What a :class:`Connection` asks of the front end that accepted it (the daemon's
    :class:`~schedswitchd.daemon.server.Server`; a test may give its own): the only names a
    connection uses of it."""

    @property
    def config(self) -> Config:
        """The daemon's configuration; a connection reads ``limits`` (message size, idle,
        read and write timeouts)."""
        ...

    @property
    def timer(self) -> Timer:
        """Where the connection's timeouts are armed."""
        ...

    def admit(self, conn: Connection) -> proto.Reply | None:
        """Take ``conn`` in at the accept (``peer`` read), or the refusal to send it before
        it is closed."""
        ...

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone and no request of it is being answered (its leases end)."""
        ...

    async def dispatch(self, line: bytes, conn: Connection) -> proto.Reply | bytes:
        """The reply to one request ``line`` (without its newline) of ``conn``: its model,
        or its line already encoded (``bytes``, newline included)."""
        ...

    @property
    def reply_taken_wait_s(self) -> float:
        """How long a connection waits, at most, for its client to take a reply marked
        ``early_reply`` before it goes on (s)."""
        ...

    def reply_sent(self) -> None:
        """A reply marked ``early_reply`` was written and its client took it (or did not
        within ``reply_taken_wait_s``, or is gone): the switch that released it may go on."""
        ...


class Connection(asyncio.Protocol):
    """One client connection: who it is (``peer``, from ``SO_PEERCRED`` at the accept), the
    leases it created (``leases``, lease ids) and its framing state. ``early_reply``: the
    reply being made waited for its switch only until the scheduler ran, so the switch's
    worker waits until its client took it (:meth:`ConnectionOwner.reply_sent`, the module
    docstring's rule); ``on_taken``: called once, when the client took such a reply, before
    the connection goes on (the accept's step hands the connection to asyncio's transport
    there).

    ``owner`` (a :class:`ConnectionOwner`, the server) decides the rest: ``admit`` at the
    accept (a refusal is sent and the connection closed), ``dispatch`` per request line,
    ``forget`` once the connection is gone and its handler done (its leases end there)."""

    __slots__ = (
        "_buf",
        "_busy",
        "_closing",
        "_drained",
        "_eof",
        "_final",
        "_idle_since",
        "_lost",
        "_parked",
        "_paused",
        "_task",
        "_timer",
        "_timer_kind",
        "_transport",
        "early_reply",
        "id",
        "leases",
        "on_taken",
        "owner",
        "passed",
        "peer",
        "watching",
    )

    def __init__(self, owner: ConnectionOwner, conn_id: int) -> None:
        self.owner = owner
        self.id = conn_id
        self.peer = _UNKNOWN  # replaced at the accept, before any use
        self.leases: set[str] = set()
        #: The socket, where it keeps descriptors the client passed (the server's accept
        #: sets it; ``None`` on a transport of asyncio's own accept).
        self.passed: PassingSocket | None = None
        self.early_reply = False
        self.on_taken: Callable[[], object] | None = None
        #: The change feed's subscription of a ``watch`` request, streamed after its reply
        #: (:meth:`stream`); ``None`` for any other connection.
        self.watching: Subscription | None = None
        self._transport: asyncio.Transport | None = None
        self._buf = b""
        self._idle_since = 0.0
        self._timer: Cancellable | None = None
        self._timer_kind = _NONE
        self._task: asyncio.Task[None] | None = None
        #: ``_serve`` stepped by hand and waiting for its client to take a reply (no task,
        #: :meth:`_park`).
        self._parked: Coroutine[Any, Any, None] | None = None
        self._busy = False  # a request is being answered (in this step, or by _task)
        self._drained: asyncio.Future[bool] | None = None
        self._final: proto.LeaseEnded | None = None
        self._paused = False
        self._eof = False
        self._closing = False
        self._lost = False

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Accepted: read the peer's credentials, let the server admit it, start the idle
        timeout. A socket without credentials (gone already) is dropped unanswered. The
        server's accept calls it at once (:meth:`Acceptor._accepted
        <schedswitchd.daemon.acceptor.Acceptor._accepted>`); the transport's own later call
        then does nothing."""
        assert isinstance(transport, asyncio.Transport)
        if self._transport is transport:
            return
        self._transport = transport
        try:
            self.peer = peer_of(transport.get_extra_info("socket"))
        except OSError:
            self._closing = True
            transport.abort()
            return
        refusal = self.owner.admit(self)
        if refusal is not None:
            self._finish(refusal)
            return
        self._idle_since = self.owner.timer.time()
        if not isinstance(transport, _AcceptStep):
            self._advance()
        # else the accept's step reads next (Acceptor._accepted), then data_received arms
        # what is due: no idle timeout armed and cancelled again in one step

    def data_received(self, data: bytes) -> None:
        """Buffer ``data``; start the next request if none is being answered."""
        if self._closing:
            return
        self._buf += data
        if not self._busy:
            self._start_next()
        elif len(self._buf) > self.owner.config.limits.max_message_bytes + 1:
            # a request is being answered: hold the client back until it is
            assert self._transport is not None
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        """The client is done writing: answer what it sent, then close. Returns True to
        keep the transport open for those replies."""
        self._eof = True
        if self.watching is not None:
            # A watch takes no more requests: the client's end is its leaving (stream()
            # ends and closes).
            self.watching.close()
        if not self._busy and not self._closing:
            self._start_next()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        """Gone (closed by either side, or cut off): cancel the timeout; the server forgets
        the connection now or, while a request is being answered, once it is."""
        self._lost = self._closing = True
        self._cancel_timer()
        release_transport(self._transport)
        if self.watching is not None:
            self.watching.close()  # ends stream()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(False)
        if not self._busy:
            self.owner.forget(self)

    def pause_writing(self) -> None:
        """The transport's send buffer is over its high-water mark."""
        self._paused = True

    def resume_writing(self) -> None:
        """The transport's send buffer drained below its low-water mark."""
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(True)

    # --- for the server -----------------------------------------------------------------------

    def hand_over(self, transport: asyncio.Transport) -> None:
        """The connection's first step is over (:meth:`Acceptor._accepted
        <schedswitchd.daemon.acceptor.Acceptor._accepted>` and, for one that sent nothing
        by its accept, ``Acceptor._first_bytes``, which served it on an :func:`accept_step`
        stand-in until here): ``transport``, asyncio's for the same
        socket, carries it from now on, and takes over what the step left (reply bytes the
        socket did not take at once, paused reading, a close). Its own ``connection_made``
        call, a loop step later, then does nothing."""
        step = self._transport
        self._transport = transport
        if isinstance(step, _AcceptStep):
            step.pass_on(transport)

    def end_with(self, final: proto.LeaseEnded) -> None:
        """The connection's last lease ended on its own: send ``final`` as its last line
        and close it, now if it waits for a request, else after the reply being made."""
        if self._closing:
            return
        self._final = final
        if not self._busy:
            self._finish(final)

    def close(self) -> None:
        """Close without another line (what the transport still holds is sent first; a
        client that does not take it within ``read_timeout_s`` is cut off)."""
        self._closing = True
        self._cancel_timer()
        transport = self._transport
        if transport is not None and not self._lost:
            transport.close()
            self._bound_flush(transport)
        if self._parked is not None:
            self._unpark()  # the reply's wait ends with the connection

    @property
    def closing(self) -> bool:
        """The connection is finished or closed (its last line may still be going out)."""
        return self._closing

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task answering a request that waits for something, else ``None``."""
        return self._task

    @property
    def parked(self) -> bool:
        """The connection waits, with no task, for its client to take a reply marked
        ``early_reply``; it goes on by itself (``on_taken`` first)."""
        return self._parked is not None

    # --- framing ------------------------------------------------------------------------------

    def _start_next(self) -> None:
        line = self._advance()
        if line is not None:
            self._serve_now(line)

    def _serve_now(self, line: bytes) -> None:
        """Answer ``line`` (and the lines after it) in this loop step as far as that goes
        without waiting; from its first wait on (a reconcile pass, the worker, a reply the
        client does not take) a task goes on with it. A task would be first run a loop
        step later, then the request answered in a step of its own: loop steps a standby
        hit's reply would wait for (docs/performance.md, "Standby hit")."""
        self._busy = True
        self._step(self._serve(line))

    def _step(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` (:meth:`_serve`) by hand up to its next wait: parked when that is
        for its client to take a reply, else a task goes on with it."""
        try:
            waits_for = coro.send(None)
        except StopIteration:
            return  # answered; _serve reset _busy
        if isinstance(waits_for, _UntilTaken):
            self._park(coro, waits_for.sock)
            return
        self._task = asyncio.get_running_loop().create_task(_resume(self, coro, waits_for))

    def _park(self, coro: Coroutine[Any, Any, None], sock: socket.socket) -> None:
        """``coro`` waits, with no task, for the client to take what was written to
        ``sock`` (:meth:`_when_taken`); then it goes on (:meth:`_unpark`)."""
        self._parked = coro
        self._when_taken(sock, self._unpark)

    def _unpark(self) -> None:
        """The parked wait is over (the client took its reply, the bound passed, or the
        connection closes): ``on_taken``, then the request's coroutine goes on. Once: a
        later call does nothing."""
        coro, self._parked = self._parked, None
        if coro is None:
            return
        on_taken, self.on_taken = self.on_taken, None
        if on_taken is not None:
            try:
                on_taken()
            except Exception:  # a defect: the connection goes on regardless
                log.exception("connection %d: after its reply was taken", self.id)
        self._step(coro)

    def _taken_future(self, sock: socket.socket) -> asyncio.Future[None]:
        """For a request answered in a task (it waited before its reply): a future done
        once the client took what was written to ``sock`` (:meth:`_when_taken`)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def taken() -> None:
            if not fut.done():  # else the task was cancelled meanwhile
                fut.set_result(None)

        self._when_taken(sock, taken)
        return fut

    def _when_taken(self, sock: socket.socket, then: Callable[[], object]) -> None:
        """``then()`` once the client took what was written to ``sock`` (``SIOCOUTQ``,
        looked at every :data:`REPLY_TAKEN_POLL_S` on the loop), the connection closes or
        ``reply_taken_wait_s`` passed. Nothing else is set up now: this runs right after
        the write, while the client is woken."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        loop.call_at(
            now + REPLY_TAKEN_POLL_S,
            self._look_taken,
            sock,
            then,
            now + self.owner.reply_taken_wait_s,
        )

    def _look_taken(self, sock: socket.socket, then: Callable[[], object], deadline: float) -> None:
        # A method with its state in the timer's arguments, not a closure that re-arms
        # itself: such a closure refers to itself, and would keep the connection in a
        # reference cycle (tests/daemon/test_connection_garbage.py).
        loop = asyncio.get_running_loop()
        now = loop.time()
        if not self._closing and now < deadline and unread_bytes(sock):
            loop.call_at(now + REPLY_TAKEN_POLL_S, self._look_taken, sock, then, deadline)
            return
        then()

    def _advance(self) -> bytes | None:
        """The next whole request line in the buffer (without its ``\\n``) or ``None``;
        with ``None`` the right timeout is armed, or the connection was finished."""
        limits = self.owner.config.limits
        if self._final is not None:
            self._finish(self._final)
            return None
        buf = self._buf.lstrip(b"\n")  # blank lines: skipped, the idle timeout goes on
        end = buf.find(b"\n")
        if end > limits.max_message_bytes or (end < 0 and len(buf) > limits.max_message_bytes):
            self._buf = b""
            self._finish(
                proto.error_reply(
                    proto.TOO_LARGE, f"request longer than {limits.max_message_bytes} bytes"
                )
            )
            return None
        if end >= 0:
            self._buf = buf[end + 1 :]
            self._cancel_timer()
            return buf[:end]
        self._buf = buf
        if self._eof:
            if buf:
                self._finish(
                    proto.error_reply(proto.INCOMPLETE, "connection ended inside a request")
                )
            else:
                self.close()
            return None
        assert self._transport is not None
        if not self._transport.is_reading():
            self._transport.resume_reading()
        timer = self.owner.timer
        if buf:
            if self._timer_kind != _READ:  # from the request's first byte
                self._arm(_READ, timer.time() + limits.read_timeout_s)
        elif self.leases:
            self._cancel_timer()
        elif self._timer_kind != _IDLE:
            self._arm(_IDLE, self._idle_since + limits.idle_timeout_s)
        return None

    async def _serve(self, line: bytes | None) -> None:
        """Answer ``line`` and the whole lines that came after it, one at a time."""
        owner = self.owner
        try:
            while line is not None and not self._closing:
                # The reply goes out as bytes at once: a reply model (a history or status
                # is hundreds of small objects) kept while the connection waits for its
                # next request would stay alive per idle connection (docs/performance.md,
                # "Memory").
                reply = await owner.dispatch(line, self)
                data = reply if isinstance(reply, bytes) else proto.encode(reply)
                del reply
                line = None
                sent = await self._send(data)
                del data
                if self.early_reply:  # a hint answered while its switch goes on
                    self.early_reply = False
                    transport = self._transport
                    sock = transport.get_extra_info("socket") if transport is not None else None
                    if sent and sock is not None and not self._closing:
                        # Nothing more in this step: the client reads now (the module's rule),
                        # ahead of the loop's parking of this connection.
                        give_way()
                        await _UntilTaken(sock)
                    owner.reply_sent()
                if not sent or self._closing:
                    break
                if self.watching is not None:
                    await self.stream(self.watching)
                    break
                self._idle_since = owner.timer.time()
                line = self._advance()
        except Exception:  # a defect: this connection ends, the daemon goes on
            log.exception("connection %d: request handling failed", self.id)
            self.close()
        finally:
            self._task = None
            self._busy = False
            if self.early_reply:
                # Its reply never went out (the handling failed, or was cancelled): the
                # switch that waits for it goes on all the same.
                self.early_reply = False
                owner.reply_sent()
            if self._lost:
                owner.forget(self)

    async def stream(self, sub: Subscription) -> None:
        """A ``watch``: send each change of ``sub`` as a
        :class:`~schedswitchd.daemon.protocol.WatchEvent` line until the client leaves or
        ``sub`` is dropped (then an error line says so, if it can still go out), and close.
        A client that does not take a line in ``read_timeout_s`` is cut off (:meth:`_send`);
        one whose queue fills meanwhile is dropped by the feed: neither holds the daemon."""
        try:
            async for change in sub:
                event = proto.WatchEvent(
                    seq=change.seq,
                    time=change.time,
                    kind=cast(Any, change.kind),  # one of feed.KINDS, checked by publish()
                    data=sub.view(change),
                )
                if not await self._send(proto.encode(event)):
                    return
            if sub.dropped and not self._lost:
                log.warning("connection %d: watch dropped, %d changes behind", self.id, sub.maxsize)
                self._finish(
                    proto.error_reply(
                        LIMIT,
                        f"watch dropped: fell {sub.maxsize} changes behind",
                        op="watch",
                    )
                )
            else:
                self.close()
        finally:
            sub.close()
            self.watching = None

    async def _send(self, data: bytes) -> bool:
        """Write one reply line; False if the client did not take it within
        ``read_timeout_s`` (then it is cut off) or is gone."""
        transport = self._transport
        assert transport is not None
        if self._lost:
            return False
        transport.write(data)
        if not self._paused:
            return True
        self._drained = asyncio.get_running_loop().create_future()
        self._arm(_WRITE, self.owner.timer.time() + self.owner.config.limits.read_timeout_s)
        try:
            return await self._drained
        finally:
            self._drained = None
            if self._timer_kind == _WRITE:
                self._cancel_timer()

    def _finish(self, reply: proto.Reply) -> None:
        """Send ``reply`` as the last line and close; a client that does not take it within
        ``read_timeout_s`` is cut off."""
        transport = self._transport
        assert transport is not None
        self._closing = True
        self._cancel_timer()
        if self._lost:
            return
        transport.write(proto.encode(reply))
        transport.close()
        self._bound_flush(transport)

    def _bound_flush(self, transport: asyncio.Transport) -> None:
        """``transport`` is closing: the bytes it still holds must be taken within
        ``read_timeout_s``, else it is aborted. Without this bound a client that shut its
        side after its requests and never reads the replies would keep the connection
        (and its slot in the connection caps) for ever, asyncio waiting for the flush."""
        if transport.get_write_buffer_size():
            self._arm(_FLUSH, self.owner.timer.time() + self.owner.config.limits.read_timeout_s)

    # --- the timer ----------------------------------------------------------------------------

    def _arm(self, kind: int, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_kind = kind
        self._timer = self.owner.timer.call_at(when, self._timed_out, kind)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_kind = _NONE

    def _timed_out(self, kind: int) -> None:
        if kind != self._timer_kind:  # a call that was already cancelled (fake timers)
            return
        self._timer = None
        self._timer_kind = _NONE
        limits = self.owner.config.limits
        if kind == _IDLE:
            self._finish(proto.error_reply(proto.TIMEOUT, "idle connection closed"))
        elif kind == _READ:
            self._finish(
                proto.error_reply(
                    proto.TIMEOUT, f"request not finished within {limits.read_timeout_s} s"
                )
            )
        elif self._transport is not None:  # _WRITE, _FLUSH: the client does not read
            self._transport.abort()


def accept_step(sock: socket.socket, conn: Connection) -> asyncio.Transport:
    """A stand-in transport for ``conn`` on a just-accepted ``sock`` (non-blocking) while
    the acceptor serves its first step -- the accept's loop step, or for a connection that
    sent nothing by then the step that reads its first bytes --
    (:meth:`Connection.hand_over` ends it): asyncio's own transport takes CPU to make (far
    more in the emulated sched_ext VM), which a standby hit's reply need not wait for
    (docs/performance.md, "Standby hit")."""
    return _AcceptStep(sock, conn)


def set_on_end(step: asyncio.Transport, on_end: Callable[[], object] | None) -> None:
    """Have the stand-in transport ``step`` (:func:`accept_step`) call ``on_end`` once, when
    its connection closes or aborts it, while the acceptor waits for the connection's first
    bytes (the stand-in only remembers a close, for :meth:`Connection.hand_over`); ``None``
    takes it back."""
    assert isinstance(step, _AcceptStep)
    step.on_end = on_end


class _AcceptStep(asyncio.Transport):
    """What a :class:`Connection` uses of a transport, on a socket in its first step (see
    :func:`accept_step`):
    ``write`` sends at once what the socket takes; what it does not take waits for the real
    transport, and the connection is told to pause writing (as asyncio's transport tells
    it past its high-water mark: the next reply then waits for the drain, in a task, so a
    burst of requests in the first read is not all answered into memory). ``close``,
    ``abort`` and reading paused or resumed are remembered and passed on
    (:meth:`pass_on`). A send that fails (the client is gone) drops the bytes: the real
    transport's first read meets the same end and loses the connection."""

    __slots__ = (
        "_aborted",
        "_closed",
        "_conn",
        "_paused",
        "_pending",
        "_sock",
        "_stalled",
        "on_end",
    )

    def __init__(self, sock: socket.socket, conn: Connection) -> None:
        super().__init__()
        self._sock = sock
        self._conn = conn
        self._pending = b""
        self._closed = self._aborted = self._paused = self._stalled = False
        self.on_end: Callable[[], object] | None = None  # set_on_end

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed or self._aborted:
            return
        data = bytes(data)
        if not self._pending:
            try:
                data = data[self._sock.send(data) :]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                return
        if data:
            self._pending += data
            if not self._stalled:
                self._stalled = True
                self._conn.pause_writing()

    def get_write_buffer_size(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self._closed = True
        self._ended()

    def abort(self) -> None:
        self._aborted = True
        self._ended()

    def _ended(self) -> None:
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end()

    def is_closing(self) -> bool:
        return self._closed or self._aborted

    def is_reading(self) -> bool:
        return not self._paused

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sock if name == "socket" else default

    def pass_on(self, transport: asyncio.Transport) -> None:
        """Leave ``transport`` as this step left the connection."""
        if self._aborted:
            transport.abort()
            return
        if self._pending:
            transport.write(self._pending)  # past its high-water mark, it pauses conn too
            self._pending = b""
        if (
            self._stalled
            and transport.get_write_buffer_size() <= (transport.get_write_buffer_limits()[1])
        ):
            self._conn.resume_writing()  # what the socket did not take fits its buffer
        if self._paused:
            transport.pause_reading()
        if self._closed:
            transport.close()


class _UntilTaken:
    """Awaited by :meth:`Connection._serve` once it wrote a reply marked ``early_reply`` to
    ``sock``: until the client took it. Yields itself, which only a connection's own
    stepping understands: :meth:`Connection._step` parks the coroutine (no task), and
    :class:`_Resumed` (the request already runs in a task) waits on
    :meth:`Connection._taken_future` instead."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def __await__(self) -> Generator[Any, Any, None]:
        yield self


class _Resumed:
    """Awaiting it goes on with ``coro``, a coroutine stepped by hand that is waiting for
    ``waits_for`` (what its last step yielded: a future, or ``None`` for a bare yield):
    that is yielded to the task first, then every value, exception and cancellation is
    passed through, as ``await coro`` would have from the start; an :class:`_UntilTaken`
    becomes ``conn``'s future for it."""

    __slots__ = ("_conn", "_coro", "_waits_for")

    def __init__(self, conn: Connection, coro: Coroutine[Any, Any, None], waits_for: Any) -> None:
        self._conn = conn
        self._coro = coro
        self._waits_for = waits_for

    def __await__(self) -> Generator[Any, Any, None]:
        coro, value = self._coro, self._waits_for
        while True:
            try:
                if isinstance(value, _UntilTaken):
                    yield from self._conn._taken_future(value.sock)
                    sent = None
                else:
                    sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation, or the future's exception
                try:
                    value = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    value = coro.send(sent)
                except StopIteration:
                    return


async def _resume(conn: Connection, coro: Coroutine[Any, Any, None], waits_for: Any) -> None:
    await _Resumed(conn, coro, waits_for)
