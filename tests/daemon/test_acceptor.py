"""The one asyncio internal the daemon uses (:mod:`schedswitchd.daemon.acceptor`): the
selector loop's ``_make_socket_transport``, which makes the transport of a socket the
acceptor accepted itself. When CPython moves or changes it, this test says so by name;
the daemon's accept path (tests/daemon/test_first_request.py) would otherwise fail in
ways that do not point here."""

from __future__ import annotations

import asyncio
import inspect
import socket
import sys

from schedswitchd.daemon.acceptor import has_socket_transport, make_socket_transport

MOVED = (
    "CPython {version}: asyncio's BaseSelectorEventLoop._make_socket_transport {what}; "
    "schedswitchd.daemon.acceptor.make_socket_transport makes the transport of an accepted "
    "socket with it (CPython's asyncio/selector_events.py): adapt that one function"
)


class _Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.data = b""
        self.got = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        if b"\n" in self.data and not self.got.done():
            self.got.set_result(self.data)


def test_asyncio_still_makes_a_transport_for_an_accepted_socket() -> None:
    version = sys.version.split()[0]
    from asyncio import selector_events

    base = selector_events.BaseSelectorEventLoop
    make = vars(base).get("_make_socket_transport")
    assert make is not None, MOVED.format(version=version, what="is gone")
    params = inspect.signature(make).parameters
    for name in ("sock", "protocol", "waiter", "extra"):
        assert name in params, MOVED.format(
            version=version, what=f"takes no {name!r} any more ({list(params)})"
        )

    async def exchange() -> tuple[bytes, object, bool]:
        loop = asyncio.get_running_loop()
        assert has_socket_transport(loop), MOVED.format(
            version=version, what=f"is not on the running loop ({type(loop).__name__})"
        )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        protocol = _Recorder()
        transport = make_socket_transport(loop, ours, protocol, "peer")
        try:
            theirs.sendall(b"ping\n")
            got = await asyncio.wait_for(protocol.got, 5)
            transport.write(b"pong\n")
            await asyncio.sleep(0)
            theirs.settimeout(5)
            reply = theirs.recv(16)
            assert reply == b"pong\n", MOVED.format(
                version=version, what=f"made a transport that wrote {reply!r}"
            )
            return got, transport.get_extra_info("peername"), protocol.transport is transport
        finally:
            transport.close()
            await asyncio.sleep(0)
            theirs.close()

    got, peername, made = asyncio.run(exchange())
    assert got == b"ping\n", MOVED.format(
        version=version, what=f"made a transport that read {got!r}"
    )
    assert peername == "peer", MOVED.format(version=version, what="dropped extra={'peername'}")
    assert made, MOVED.format(version=version, what="did not call connection_made")
