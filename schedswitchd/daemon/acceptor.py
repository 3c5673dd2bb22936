"""The daemon's accept: connections taken off the listening socket and answered in that step.

asyncio's own ``create_unix_server`` takes four loop steps before the first byte of a
request is read (the accept, a task that makes the transport, ``connection_made``, then
the transport's reader): a large part of a standby hit's cost in the sched_ext VM
(docs/performance.md, "Standby hit"). The :class:`Acceptor` is the daemon's own reader of
the listening socket instead: it accepts, reads what the client already sent and lets the
:class:`~schedswitchd.daemon.connection.Connection` answer its first request in the same
step, on a stand-in transport (:func:`~schedswitchd.daemon.connection.accept_step`); then
asyncio's selector transport takes the connection over -- once the client took a reply
sent in that step, so that making the transport does not run instead of the client on a
machine with one (emulated) CPU. A connection whose client had sent nothing yet at the
accept gets the same first step once its first bytes come, from a reader the acceptor
puts on its socket (:meth:`Acceptor._await_first_bytes`). A connection that waits for its
client anyway (a reply a switch released: :attr:`Connection.parked`) is handed over when
it goes on (``Connection.on_taken``); for any other the acceptor looks at the socket
itself.

The one asyncio internal this needs -- making a selector transport for an accepted socket,
``BaseSelectorEventLoop._make_socket_transport`` (no public call makes one) -- and the
``SIOCOUTQ`` look at whether the client took its reply are called through
:mod:`schedswitchd.cpython_internals` (``make_socket_transport``,
``has_socket_transport``, ``unread_bytes``), whose test fails naming them when CPython
moves them. A loop without it (not the selector loop) gets asyncio's own accept.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable

from schedswitchd.cpython_internals import has_socket_transport, make_socket_transport, unread_bytes
from schedswitchd.daemon.connection import Connection, accept_step, set_on_end
from schedswitchd.daemon.passed_fds import PassingSocket, accept_passing

log = logging.getLogger("schedswitchd")

#: The listening socket's accept queue, connections (``listen(2)``; the kernel caps it at
#: ``net.core.somaxconn``). asyncio calls ``listen()`` again with its own default of 100
#: when it starts serving on a socket, whatever the socket unit's ``Backlog=`` or the
#: daemon's own ``listen()`` said: a flood of clients then filled the queue and an admin's
#: connect failed with ``EAGAIN``.
LISTEN_BACKLOG = socket.SOMAXCONN
#: Connections accepted in one loop step at most (asyncio's own accept loop takes as many
#: as the listen backlog): the rest wait for the next step, behind what is ready by then.
ACCEPT_PER_STEP = 64
#: How long accepting pauses when the process or system is out of descriptors or memory
#: (``EMFILE``, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``), s; asyncio's ``ACCEPT_RETRY_DELAY``.
ACCEPT_RETRY_S = 1.0
#: The accept's read of a new connection's first bytes, and the most it reads of them (what
#: is left stays for the transport): one read of a page, ample for a launcher's line of
#: under 100 bytes; only a read that filled its buffer reads on, a page at a time. Each
#: read's buffer is allocated at its full size whatever comes, and one of 64 KiB made a
#: standby hit's read measurably slower in the sched_ext VM (docs/performance.md,
#: "Standby hit"). The most stays under glibc's mmap threshold (128 KiB), where asyncio's
#: own 256 KiB read buffer is an mmap and a munmap per read; a request cut off there has
#: the rest of its bytes read by the transport (closing a socket with bytes unread
#: resets its peer's connection instead of ending it).
FIRST_READ_BYTES = 4096
FIRST_READ_MAX_BYTES = 64 * 1024
#: How often the acceptor looks whether the client of a connection answered in its
#: accept's step took its reply, s, and how long it waits for that at most before asyncio's
#: transport takes the connection over anyway (its later lines and its end are read from
#: then on), s (see :meth:`Acceptor._accepted`).
HANDOVER_POLL_S = 0.002
HANDOVER_WAIT_S = 0.05


class Acceptor:
    """Accepts the connections of one listening ``AF_UNIX`` stream socket and serves each
    one's first step (see the module docstring). ``make_connection``: a new
    :class:`Connection` for the front end (the server), called once per accepted socket.

    Counters (status ``connections_accepted``, ``first_read_at_accept``): :attr:`accepted`,
    and of them :attr:`first_read_at_accept` whose first bytes were there at the accept."""

    def __init__(self, make_connection: Callable[[], Connection]) -> None:
        self.make_connection = make_connection
        self.accepted = 0
        self.first_read_at_accept = 0
        self._listener: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None  # asyncio's accept (see start)
        self._accept_retry: asyncio.TimerHandle | None = None
        #: Connections whose accept's step sent a reply not read yet: asyncio's transport
        #: takes them over once it is (:meth:`_hand_over_when_taken`).
        self._handing_over: dict[int, tuple[Connection, socket.socket, object]] = {}
        #: Connections that sent nothing before their accept: their first bytes are read
        #: by a reader of their own (:meth:`_await_first_bytes`).
        self._awaiting: dict[int, tuple[Connection, socket.socket, object]] = {}
        self._closing = False

    async def start(self, sock: socket.socket) -> None:
        """Serve ``sock`` (a listening ``AF_UNIX`` ``SOCK_STREAM`` socket) on the running
        loop: with the acceptor's own reader on asyncio's selector loop, else with
        asyncio's ``create_unix_server`` (``connection_made`` then comes a step later)."""
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        if has_socket_transport(loop):
            sock.listen(LISTEN_BACKLOG)
            self._listener = sock
            loop.add_reader(sock.fileno(), self._accept_ready)
        else:
            self._server = await loop.create_unix_server(
                self.make_connection, sock=sock, backlog=LISTEN_BACKLOG
            )

    def close(self) -> None:
        """Stop accepting and close the listening socket; a connection still waiting for
        its handover gets its transport now."""
        self._closing = True
        if self._accept_retry is not None:
            self._accept_retry.cancel()
            self._accept_retry = None
        listener, self._listener = self._listener, None
        if listener is not None:
            asyncio.get_running_loop().remove_reader(listener.fileno())
            listener.close()
        for conn_id in list(self._awaiting):
            self._first_wait_over(conn_id)
        for conn, sock, addr in list(self._handing_over.values()):
            self._hand_over(conn, sock, addr)
        if self._server is not None:
            self._server.close()

    async def wait_closed(self) -> None:
        """Until asyncio's server, if one serves, has closed (after :meth:`close`)."""
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def handing_over(self) -> int:
        """Connections whose transport waits for their client to take the first reply."""
        return len(self._handing_over)

    def _accept_ready(self) -> None:
        """The listening socket is readable: accept what waits (:meth:`_accepted` each)."""
        listener = self._listener
        if listener is None:
            return
        for _ in range(ACCEPT_PER_STEP):
            try:
                sock, addr = accept_passing(listener)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise  # the loop logs it; accepting goes on at the next readiness
                # Linux keeps the socket readable: stop asking for a while, as asyncio does.
                log.warning("accepting paused for %.0f s: %s", ACCEPT_RETRY_S, exc)
                loop = asyncio.get_running_loop()
                loop.remove_reader(listener.fileno())
                self._accept_retry = loop.call_later(ACCEPT_RETRY_S, self._accept_again)
                return
            try:
                replied = self._accepted(sock, addr)
            except Exception:  # a defect: this connection is dropped, serving goes on
                log.exception("accepting a connection failed")
                sock.close()
                continue
            if replied:
                # Its client is reading the reply: let the loop go idle for it (on one
                # emulated CPU work done now would run instead of the client) rather than
                # ask for another connection now; one waiting keeps the socket readable,
                # and the next step accepts it.
                return

    def _accept_again(self) -> None:
        self._accept_retry = None
        if self._listener is not None and not self._closing:
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept_ready)

    def _accepted(self, sock: PassingSocket, addr: object) -> bool:
        """A new connection, in the accept's loop step: its :class:`Connection`
        (credentials read, admitted or refused now, not in a later step), then what the
        client already sent is read and its first request answered here as far as that
        goes without waiting (:meth:`Connection.data_received`), on a stand-in transport
        (:func:`~schedswitchd.daemon.connection.accept_step`); then asyncio's own transport
        takes the connection over (:meth:`Connection.hand_over`), made as its accept makes
        it. A launcher connects and sends at once, so its line is usually there; if not
        (its client had not run since its connect), the first bytes are waited for as
        they would have been read here (:meth:`_first_bytes`), and the transport reads
        the rest of the connection's life. True if a reply went out in this step and its
        client has not read it yet."""
        sock.setblocking(False)
        self.accepted += 1
        conn = self.make_connection()
        conn.passed = sock
        step = accept_step(sock, conn)
        try:
            conn.connection_made(step)
            if not step.is_closing():
                data = _first_read(sock)
                if data is None:
                    # Nothing sent yet. With nothing read the connection's idle timeout is
                    # armed there (data_received); the first bytes come to _first_bytes.
                    conn.data_received(b"")
                    if not step.is_closing():
                        self._await_first_bytes(conn, sock, addr, step)
                        return False
                else:
                    if data:  # b"": the client is done writing; the transport sees that too
                        self.first_read_at_accept += 1
                    conn.data_received(data)
        except Exception:  # a defect: this connection ends (its transport closes it)
            log.exception("connection %d: its first step failed", conn.id)
            conn.close()
        try:
            return self._first_step_done(conn, sock, addr, step)
        except Exception as exc:  # a defect: without a transport it would never end
            _drop(conn, sock, exc)
            return False

    def _await_first_bytes(
        self, conn: Connection, sock: socket.socket, addr: object, step: asyncio.Transport
    ) -> None:
        """Wait for the first bytes of a connection that sent nothing before its accept
        with a reader of its own, as the accept would have read them: asyncio's transport
        costs far more to make in the sched_ext VM than this, and a launcher's line comes
        right after its connect (docs/performance.md, "Standby hit"). Meanwhile the
        stand-in stays the connection's transport; a connection the daemon ends (its idle
        timeout: the stand-in closed) is handed over to asyncio's transport, which sends
        its last line and closes (:meth:`_first_wait_over`), as is one still waiting when
        the acceptor closes."""
        loop = asyncio.get_running_loop()
        loop.add_reader(sock.fileno(), self._first_bytes, conn.id, step)
        # Held only once its reader is in place: a failed add_reader leaves nothing to undo.
        self._awaiting[conn.id] = (conn, sock, addr)
        set_on_end(step, lambda: loop.call_soon(self._first_wait_over, conn.id))

    def _first_bytes(self, conn_id: int, step: asyncio.Transport) -> None:
        """The first bytes of a connection waited for (:meth:`_await_first_bytes`) came
        (or its end): read and served as the accept serves them."""
        held = self._awaiting.get(conn_id)
        if held is None:
            return
        conn, sock, addr = held
        data = _first_read(sock)
        if data is None:
            return  # woken with nothing to read: the reader stays
        del self._awaiting[conn_id]
        asyncio.get_running_loop().remove_reader(sock.fileno())
        set_on_end(step, None)
        try:
            conn.data_received(data)
        except Exception:  # a defect: this connection ends (its transport closes it)
            log.exception("connection %d: its first step failed", conn.id)
            conn.close()
        try:
            self._first_step_done(conn, sock, addr, step)
        except Exception as exc:  # a defect: without a transport it would never end
            _drop(conn, sock, exc)

    def _first_wait_over(self, conn_id: int) -> None:
        """A connection still waiting for its first bytes goes to asyncio's transport now:
        the daemon ended it (the transport then sends what the stand-in did not, and
        closes), or the acceptor closes (the transport reads on)."""
        held = self._awaiting.pop(conn_id, None)
        if held is not None:
            conn, sock, addr = held
            asyncio.get_running_loop().remove_reader(sock.fileno())
            try:
                self._hand_over(conn, sock, addr)
            except Exception as exc:  # a defect: without a transport it would never end
                _drop(conn, sock, exc)

    def _first_step_done(
        self, conn: Connection, sock: socket.socket, addr: object, step: asyncio.Transport
    ) -> bool:
        """After the step that read a connection's first bytes: asyncio's transport takes
        it over now, or once its client took a reply sent in that step. True in the
        latter case."""
        if conn.parked:
            # Its reply was released by a switch and the connection waits for the client to
            # take it (Connection's rule): the transport is made when it goes on, nothing
            # else is set up in this step.
            self._handing_over[conn.id] = (conn, sock, addr)
            conn.on_taken = lambda: self._hand_over_held(conn.id)
            return True
        if (
            conn.task is None
            and not step.is_closing()
            and not step.get_write_buffer_size()
            and unread_bytes(sock) > 0
        ):
            # A reply went out in this step and its client has not read it yet: on one
            # emulated CPU whatever the daemon still does now runs instead of the client,
            # so the transport (costly to make there) is made once the client took the
            # reply, at most HANDOVER_WAIT_S on (docs/performance.md, "Standby hit").
            loop = asyncio.get_running_loop()
            self._handing_over[conn.id] = (conn, sock, addr)
            loop.call_later(
                HANDOVER_POLL_S, self._hand_over_when_taken, conn.id, loop.time() + HANDOVER_WAIT_S
            )
            return True
        self._hand_over(conn, sock, addr)
        return False

    def _hand_over_when_taken(self, conn_id: int, deadline: float) -> None:
        held = self._handing_over.get(conn_id)
        if held is None:
            return  # handed over already (the acceptor is closing)
        conn, sock, addr = held
        loop = asyncio.get_running_loop()
        if not conn.closing and unread_bytes(sock) > 0 and loop.time() < deadline:
            loop.call_later(HANDOVER_POLL_S, self._hand_over_when_taken, conn_id, deadline)
            return
        self._hand_over(conn, sock, addr)

    def _hand_over_held(self, conn_id: int) -> None:
        held = self._handing_over.get(conn_id)
        if held is not None:  # else handed over already (the acceptor is closing)
            self._hand_over(*held)

    def _hand_over(self, conn: Connection, sock: socket.socket, addr: object) -> None:
        """asyncio's transport for ``sock`` takes ``conn`` over from its accept's step."""
        self._handing_over.pop(conn.id, None)
        loop = asyncio.get_running_loop()
        conn.hand_over(make_socket_transport(loop, sock, conn, addr))


def _drop(conn: Connection, sock: socket.socket, exc: Exception) -> None:
    """``conn`` could not get asyncio's transport (a defect): its socket is closed and the
    connection lost, so that the server forgets it (its leases end) instead of keeping it
    on the stand-in for ever."""
    log.error("connection %d: dropped, its transport failed", conn.id, exc_info=exc)
    sock.close()
    conn.connection_lost(exc)


def _first_read(sock: socket.socket) -> bytes | None:
    """What the client of an accepted ``sock`` (non-blocking) sent so far, up to
    :data:`FIRST_READ_MAX_BYTES`, read :data:`FIRST_READ_BYTES` at a time; ``None`` when
    nothing was sent yet; ``b""`` at its end (the client shut its side) or on an error,
    which the transport meets too."""
    try:
        data = sock.recv(FIRST_READ_BYTES)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""
    while 0 < len(data) < FIRST_READ_MAX_BYTES and len(data) % FIRST_READ_BYTES == 0:
        try:
            more = sock.recv(FIRST_READ_BYTES)
        except OSError:  # nothing more yet: the transport reads what comes
            break
        if not more:
            break
        data += more
    return data
